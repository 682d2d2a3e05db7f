"""What the parts of the gateway platform share: its state, and the few calls one part makes on another.

:class:`~jupyter_notebookos.gateway.platform.GatewayPlatform` is assembled from parts, one job each: the
routers' planner (:mod:`~jupyter_notebookos.gateway.planner`), the REST and metrics views
(:mod:`~jupyter_notebookos.gateway.views`), re-attaching to a previous gateway's kernels
(:mod:`~jupyter_notebookos.gateway.reattach`), replacing lost replicas
(:mod:`~jupyter_notebookos.gateway.replacement`), and kernels' and hosts' lifecycle
(:mod:`~jupyter_notebookos.gateway.platform`). :class:`PlatformState` declares what they share;
``GatewayPlatform.__init__`` sets it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from jupyter_notebookos.coordination.client import Coordinator, EtcdCredentials, EtcdTls
from jupyter_notebookos.gateway.access import KernelAccessManager
from jupyter_notebookos.gateway.autoscaler import Autoscaler
from jupyter_notebookos.gateway.events import EventLog
from jupyter_notebookos.gateway.metrics import PlatformMetrics
from jupyter_notebookos.gateway.migration import MigrationRunner
from jupyter_notebookos.gateway.reconcile import LedgerReconciler
from jupyter_notebookos.gateway.residency import GpuResidency
from jupyter_notebookos.gateway.router import ReplicaRouter
from jupyter_notebookos.gateway.router.cells import CellGrant, CellRequest, RouterSettings
from jupyter_notebookos.gateway.router.ledger import LedgerReleases
from jupyter_notebookos.launchers.base import Launcher
from jupyter_notebookos.replication.protocol import ReplicaRegistration
from jupyter_notebookos.scheduler import Decision, MigrateThenRun, RunCell, Scheduler

if TYPE_CHECKING:
    from jupyter_notebookos.gateway.records import HostRecord, KernelRecord


class PlatformState:
    """The state of the gateway platform, shared by its parts (see the module docstring)."""

    etcd_endpoints: list[str]
    etcd_prefix: str
    etcd_timeout: float
    state_dir: str
    object_store_url: str
    launcher: Launcher
    router_settings: RouterSettings
    replica_lease_ttl: int
    rejoin_grace: float
    reconcile_interval: float
    reconciler: LedgerReconciler | None
    gpu_sticky: bool
    inherited_envs: frozenset[str]
    residency: GpuResidency
    log: logging.Logger | Any
    metrics: PlatformMetrics
    events: EventLog
    hosts: dict[str, HostRecord]
    scheduler: Scheduler
    kernels: dict[str, KernelRecord]
    adopted: list[dict[str, Any]]
    coordinator: Coordinator | None
    ledger: LedgerReleases | None
    etcd_tls: EtcdTls | None
    etcd_credentials: EtcdCredentials | None
    access: KernelAccessManager | None
    ready: asyncio.Event
    _waiting: dict[tuple[str, str], asyncio.Future[RunCell | MigrateThenRun]]
    _stopping: dict[str, asyncio.Future[None]]
    _monitor: asyncio.Task[None] | None
    _tasks: set[asyncio.Task[None]]
    migrations: MigrationRunner
    autoscaler: Autoscaler | None

    @staticmethod
    def now() -> float:
        """The scheduler's clock (monotonic seconds)."""
        return time.monotonic()

    def _new_router(
        self, kernel_id: str, ip: str, ports: dict[str, int], key: bytes, signature_scheme: str, gpus: int
    ) -> ReplicaRouter:
        """A router for a kernel at this connection info, planned by this platform (a new or a re-attached one)."""
        assert self.coordinator is not None and self.ledger is not None
        return ReplicaRouter(
            kernel_id=kernel_id,
            ip=ip,
            ports=ports,
            key=key,
            signature_scheme=signature_scheme,
            gpus=gpus,
            coordinator=self.coordinator,
            planner=self,
            ledger=self.ledger,
            settings=self.router_settings,
            on_replica_lost=self._on_replica_lost,
        )

    if TYPE_CHECKING:
        # Each part calls a few methods of the others; GatewayPlatform has them all.

        def place(self, request: CellRequest) -> CellGrant | Coroutine[Any, Any, CellGrant]: ...

        def release(self, kernel_id: str, cell_id: str) -> None: ...

        def queue_position(self, kernel_id: str, cell_id: str) -> int | None: ...

        def note_resident(self, kernel_id: str, replica_id: str, host: str, devices: list[int]) -> None: ...

        def dispatch(self) -> None: ...

        def _log_decision(self, decision: Decision) -> None: ...

        def _on_replica_lost(self, router: ReplicaRouter, registration: ReplicaRegistration, why: str) -> None: ...

        async def start_replica_process(self, record: KernelRecord, replica_id: str, host: str) -> None: ...
