"""Our REST endpoints beside Enterprise Gateway's: ``/api/notebookos/*`` and ``/metrics``.

They use Enterprise Gateway's own token authorization, CORS and JSON-error mixins, so a client that can
reach ``/api/kernels`` reaches these with the same token, and errors look like EG's.
"""

from __future__ import annotations

import json
from typing import Any

from enterprise_gateway.mixins import CORSMixin, JSONErrorsMixin, TokenAuthorizationMixin
from jupyter_server.base.handlers import APIHandler
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from tornado import web


class _NotebookOSHandler(TokenAuthorizationMixin, CORSMixin, JSONErrorsMixin, APIHandler):
    """Base of our API handlers: EG's auth, CORS and JSON errors."""

    @property
    def platform(self) -> Any:
        """The gateway's :class:`~jupyter_notebookos.gateway.platform.GatewayPlatform`."""
        return self.settings["notebookos_platform"]

    def write_json(self, payload: object, status: int = 200) -> None:
        """Finish the request with ``payload`` as JSON."""
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(payload))


class ClusterHandler(_NotebookOSHandler):
    """``GET /api/notebookos/cluster``: hosts, GPUs, the subscription ratio and the kernels."""

    async def get(self) -> None:
        self.write_json(self.platform.cluster_snapshot())


class MetricsHandler(_NotebookOSHandler):
    """``GET /metrics``: Prometheus text format, behind the same token as the rest of the API."""

    async def get(self) -> None:
        self.platform.refresh_metrics()
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(self.platform.metrics.registry))


class KernelHandler(_NotebookOSHandler):
    """``GET /api/notebookos/kernels/{kernel_id}``: replicas, executor, cells, GPU-seconds."""

    async def get(self, kernel_id: str) -> None:
        if kernel_id not in self.platform.kernels:
            raise web.HTTPError(404, f"no NotebookOS kernel {kernel_id}")
        self.write_json(self.platform.kernel_summary(kernel_id))


class MigrateHandler(_NotebookOSHandler):
    """``POST /api/notebookos/kernels/{kernel_id}/replicas/{replica_id}/migrate`` (optional ``{"host"}``)."""

    async def post(self, kernel_id: str, replica_id: str) -> None:
        from jupyter_notebookos.gateway.platform import MigrationRequestError

        target = None
        if self.request.body:
            try:
                body = json.loads(self.request.body)
            except ValueError:
                raise web.HTTPError(400, 'the body must be JSON, e.g. {"host": "host-3"}') from None
            if not isinstance(body, dict) or not isinstance(body.get("host", ""), str | None):
                raise web.HTTPError(400, 'the body must be a JSON object with an optional string "host"')
            target = body.get("host") or None
        try:
            result = await self.platform.migrate(kernel_id, replica_id, target)
        except MigrationRequestError as err:
            raise web.HTTPError(err.status, str(err)) from None
        self.write_json(result)


def notebookos_handlers() -> list[tuple[str, type]]:
    """Our URL patterns (relative to ``base_url``) and their handlers."""
    return [
        (r"/api/notebookos/cluster", ClusterHandler),
        (r"/api/notebookos/kernels/(?P<kernel_id>[^/]+)", KernelHandler),
        (r"/api/notebookos/kernels/(?P<kernel_id>[^/]+)/replicas/(?P<replica_id>[^/]+)/migrate", MigrateHandler),
        (r"/metrics", MetricsHandler),
    ]
