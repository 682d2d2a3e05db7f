"""Our REST endpoints beside Enterprise Gateway's: ``/api/notebookos/*`` and ``/metrics``.

They identify the requester as EG's handlers do in this gateway (:mod:`jupyter_notebookos.gateway.ownership`):
the admin token sees everything, a user sees their own kernels in full and other users' only as load, and
``/metrics`` takes the admin token or the read-only metrics token. CORS and JSON errors are EG's.
"""

from __future__ import annotations

import json
from typing import Any

from enterprise_gateway.mixins import CORSMixin, JSONErrorsMixin
from jupyter_server.base.handlers import APIHandler
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from tornado import web

from jupyter_notebookos.gateway.ownership import IdentifiedHandlerMixin, cluster_view, kernel_owner


class _NotebookOSHandler(IdentifiedHandlerMixin, CORSMixin, JSONErrorsMixin, APIHandler):
    """Base of our API handlers: the requester's identity and kernel ownership, EG's CORS and JSON errors."""

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
        assert self.identity is not None
        snapshot = self.platform.cluster_snapshot()
        self.write_json(cluster_view(snapshot, self.identity, lambda kernel_id: kernel_owner(self.settings, kernel_id)))


class MetricsHandler(_NotebookOSHandler):
    """``GET /metrics``: Prometheus text format, for the admin token or the read-only metrics token."""

    reads_metrics = True

    async def get(self) -> None:
        self.platform.refresh_metrics()
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(self.platform.metrics.registry))


class KernelHandler(_NotebookOSHandler):
    """``GET /api/notebookos/kernels/{kernel_id}``: replicas, executor, cells, GPU-seconds."""

    async def get(self, kernel_id: str) -> None:
        if kernel_id not in self.platform.kernels:
            raise web.HTTPError(404, f"no NotebookOS kernel {kernel_id}")
        summary = self.platform.kernel_summary(kernel_id)
        summary["owner"] = kernel_owner(self.settings, kernel_id) or None  # None: the admin's
        self.write_json(summary)


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
