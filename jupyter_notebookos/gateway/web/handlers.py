"""Our REST endpoints beside Enterprise Gateway's: ``/api/notebookos/*``, ``/metrics`` and the dashboard's page.

They identify the requester as EG's handlers do in this gateway (:mod:`jupyter_notebookos.gateway.web.authorization`):
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

from jupyter_notebookos.gateway.control.draining import DrainRequestError, drain_host, undrain_host
from jupyter_notebookos.gateway.control.readings import process_memory
from jupyter_notebookos.gateway.web.authorization import IdentifiedHandlerMixin, cluster_view, kernel_owner
from jupyter_notebookos.gateway.web.dashboard import cluster_totals, dashboard_handlers
from jupyter_notebookos.gateway.web.dashboard.notebooks import add_notebooks, kernel_env, notebook_of, session_paths


class _NotebookOSHandler(IdentifiedHandlerMixin, CORSMixin, JSONErrorsMixin, APIHandler):
    """Base of our API handlers: the requester's identity and kernel ownership, EG's CORS and JSON errors."""

    @property
    def platform(self) -> Any:
        """The gateway's :class:`~jupyter_notebookos.gateway.control.gatewayplatform.GatewayPlatform`."""
        return self.settings["notebookos_platform"]

    @property
    def history(self) -> Any:
        """The gateway's :class:`~jupyter_notebookos.gateway.control.history.ClusterHistory` (None: not kept)."""
        return self.settings.get("notebookos_history")

    def write_json(self, payload: object, status: int = 200) -> None:
        """Finish the request with ``payload`` as JSON."""
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(payload))


class ClusterHandler(_NotebookOSHandler):
    """``GET /api/notebookos/cluster``: hosts, GPUs, the subscription ratio, the kernels, and their ``totals``."""

    async def get(self) -> None:
        assert self.identity is not None
        snapshot = self.platform.views.cluster_snapshot()
        if self.history is not None:
            self.history.annotate(snapshot)
        await add_notebooks(snapshot, self.settings)
        view = cluster_view(snapshot, self.identity, lambda kernel_id: kernel_owner(self.settings, kernel_id))
        view["totals"] = cluster_totals(view, unowned="(admin)" if self.identity.is_admin else "(other users)")
        self.write_json(view)


class EventsHandler(_NotebookOSHandler):
    """``GET /api/notebookos/events?since=N``: migrations, scaling rounds and hosts joining or leaving, after
    event N (0: all the gateway keeps). A user sees other users' kernels' events without their kernel ids."""

    async def get(self) -> None:
        assert self.identity is not None
        raw = self.get_query_argument("since", "0")
        try:
            since = int(raw)
        except ValueError:
            raise web.HTTPError(400, f"since={raw!r} is not an event number (a whole number)") from None
        events = self.platform.events.since(since)
        if not self.identity.is_admin:
            events = [e if self._mine(e) else _anonymous_event(e) for e in events]
        self.write_json({"events": events, "last": self.platform.events.last})

    def _mine(self, event: dict[str, Any]) -> bool:
        assert self.identity is not None
        return not event.get("kernel_id") or kernel_owner(self.settings, event["kernel_id"]) == self.identity.name


def _anonymous_event(event: dict[str, Any]) -> dict[str, Any]:
    """An event of another user's kernel, as a user may see it: where and why, not whose."""
    where = f"{event.get('source')} -> {event.get('target')}"
    return {**event, "kernel_id": None, "summary": f"a replica of another user's kernel: {where} ({event['action']})"}


class MetricsHandler(_NotebookOSHandler):
    """``GET /metrics``: Prometheus text format, for the admin token or the read-only metrics token."""

    reads_metrics = True

    async def get(self) -> None:
        self.platform.views.refresh_metrics()
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(self.platform.metrics.registry))


class KernelHandler(_NotebookOSHandler):
    """``GET /api/notebookos/kernels/{kernel_id}``: replicas, executor, cells, GPU-seconds."""

    async def get(self, kernel_id: str) -> None:
        if kernel_id not in self.platform.kernels:
            raise web.HTTPError(404, f"no NotebookOS kernel {kernel_id}")
        summary = self.platform.views.kernel_summary(kernel_id)
        summary["owner"] = kernel_owner(self.settings, kernel_id) or None  # None: the admin's
        add_memory(summary)
        if self.history is not None:
            self.history.annotate_kernel(summary)
        paths = await session_paths(self.settings)
        summary.update(notebook_of(kernel_env(self.settings, kernel_id), paths.get(kernel_id)))
        self.write_json(summary)


def add_memory(summary: dict[str, Any]) -> None:
    """What the kernel costs while idle: each replica's resident memory (``memory_bytes``) and their sum.

    An idle NotebookOS kernel holds no GPU (GPUs are bound only while a cell runs), so its replicas' memory is its
    cost, and what an idle-culling timeout weighs. Known for replicas that are processes of this machine (the
    embedded mode; with the processes they started); ``None`` for pods, whose memory the gateway does not see (the
    cluster's metrics do).
    """
    total: int | None = None
    for replica in summary["replicas"]:
        replica["memory_bytes"] = None
        if replica.get("pod") or not replica.get("pid"):
            continue
        replica["memory_bytes"] = process_memory(replica["pid"])
        if replica["memory_bytes"] is not None:
            total = (total or 0) + replica["memory_bytes"]
    summary["memory_bytes"] = total


class MigrateHandler(_NotebookOSHandler):
    """``POST /api/notebookos/kernels/{kernel_id}/replicas/{replica_id}/migrate`` (optional ``{"host"}``)."""

    async def post(self, kernel_id: str, replica_id: str) -> None:
        from jupyter_notebookos.gateway.control.gatewayplatform import MigrationRequestError

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


HISTORY_ADMIN_ONLY = "the cluster's history (GPU-hours of every user) is for the gateway's admin"
HOSTS_ADMIN_ONLY = "draining a host or putting it back in service is for the gateway's admin"


class HistoryHandler(_NotebookOSHandler):
    """``GET /api/notebookos/history?since=T``: the samples after Unix time T (0: all the gateway keeps) and
    GPU-hours per user and day; the admin's."""

    admin_only = HISTORY_ADMIN_ONLY

    async def get(self) -> None:
        raw = self.get_query_argument("since", "0")
        try:
            since = float(raw)
        except ValueError:
            raise web.HTTPError(400, f"since={raw!r} is not a Unix time in seconds") from None
        if self.history is None:
            raise web.HTTPError(404, "this gateway keeps no history (ClusterHistory.interval is 0)")
        self.write_json(self.history.snapshot(since))


class DrainHandler(_NotebookOSHandler):
    """``POST /api/notebookos/hosts/{host}/drain``: move every replica off the host, now; the admin's. Answers what
    moved, what failed to move and what cannot move yet (a replica running a cell: drain again later)."""

    admin_only = HOSTS_ADMIN_ONLY

    async def post(self, host: str) -> None:
        try:
            self.write_json(await drain_host(self.platform, host))
        except DrainRequestError as err:
            raise web.HTTPError(err.status, str(err)) from None


class UndrainHandler(_NotebookOSHandler):
    """``POST /api/notebookos/hosts/{host}/undrain``: put a drained host back in service; the admin's."""

    admin_only = HOSTS_ADMIN_ONLY

    async def post(self, host: str) -> None:
        try:
            self.write_json(undrain_host(self.platform, host))
        except DrainRequestError as err:
            raise web.HTTPError(err.status, str(err)) from None


def notebookos_handlers() -> list[tuple[str, type] | tuple[str, type, dict[str, Any]]]:
    """Our URL patterns (relative to ``base_url``) and their handlers (and the handler's options, if any)."""
    return [
        *dashboard_handlers(),
        (r"/api/notebookos/cluster", ClusterHandler),
        (r"/api/notebookos/events", EventsHandler),
        (r"/api/notebookos/history", HistoryHandler),
        (r"/api/notebookos/hosts/(?P<host>[^/]+)/drain", DrainHandler),
        (r"/api/notebookos/hosts/(?P<host>[^/]+)/undrain", UndrainHandler),
        (r"/api/notebookos/kernels/(?P<kernel_id>[^/]+)", KernelHandler),
        (r"/api/notebookos/kernels/(?P<kernel_id>[^/]+)/replicas/(?P<replica_id>[^/]+)/migrate", MigrateHandler),
        (r"/metrics", MetricsHandler),
    ]
