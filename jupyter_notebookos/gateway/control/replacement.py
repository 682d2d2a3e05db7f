"""Replacing a kernel's lost replicas.

A replica whose registration vanishes is lost (after a grace period for a live process whose etcd lease
ended, see :mod:`jupyter_notebookos.gateway.control.rejoin`): the scheduler hears of it and places a replacement on
another host, which this part starts. A monitor notices dead replica processes quickly and revokes their
lease instead of waiting for it to expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from jupyter_notebookos.coordination.client import Coordinator
from jupyter_notebookos.coordination.errors import CoordinationError
from jupyter_notebookos.gateway.control.decisionlog import log, log_decision, now
from jupyter_notebookos.gateway.control.records import KernelRecord, KernelRegistry
from jupyter_notebookos.gateway.control.rejoin import await_rejoin
from jupyter_notebookos.gateway.control.residency import GpuResidency
from jupyter_notebookos.gateway.router import ReplicaRouter
from jupyter_notebookos.gateway.router.replicas import scheduler_id
from jupyter_notebookos.launchers.base import Launcher, LaunchError, ReplicaHandle, ReplicaPhase
from jupyter_notebookos.replication.protocol import ReplicaRegistration
from jupyter_notebookos.scheduler import Placement, ReplicaLost, Scheduler

#: Starts replica process ``replica_id`` of a kernel on a host (the platform's ``start_replica_process``).
StartReplica = Callable[[KernelRecord, str, str], Awaitable[None]]


class ReplicaReplacer:
    """Replaces the kernels' lost replicas, and notices dead replica processes (see the module docstring).

    ``start_replica`` starts a replacement's process; ``dispatch`` starts queued cells once the scheduler freed a
    lost replica's GPUs; ``rejoin_grace`` is how long a live process whose lease ended may take to register
    again."""

    def __init__(
        self,
        *,
        kernels: KernelRegistry,
        scheduler: Scheduler,
        launcher: Launcher,
        residency: GpuResidency,
        rejoin_grace: float,
        start_replica: StartReplica,
        dispatch: Callable[[], None],
        logger: logging.Logger | Any = log,
    ) -> None:
        self.kernels = kernels
        self.scheduler = scheduler
        self.launcher = launcher
        self.residency = residency
        self.rejoin_grace = rejoin_grace
        self._start_replica = start_replica
        self._dispatch = dispatch
        self.log = logger
        self._tasks: set[asyncio.Task[None]] = set()
        self._monitor: asyncio.Task[None] | None = None

    def start(self, coordinator: Coordinator) -> None:
        """Watch the replica processes (a dead one's lease is revoked through ``coordinator``)."""
        self._monitor = asyncio.ensure_future(self._monitor_replicas(coordinator))

    def stop(self) -> None:
        """Stop watching the replica processes."""
        if self._monitor is not None:
            self._monitor.cancel()
            self._monitor = None

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def on_replica_lost(self, router: ReplicaRouter, registration: ReplicaRegistration, why: str) -> None:
        """A router's ``on_replica_lost``: a replica's registration is gone. A live process whose lease etcd ended
        (an etcd outage) gets ``rejoin_grace`` seconds to register again (see
        :mod:`jupyter_notebookos.gateway.control.rejoin`); else the scheduler hears of it now."""
        record = self.kernels.get(router.kernel_id)
        handle = record.replicas.handle(registration.replica_id) if record is not None else None
        if handle is None or self.rejoin_grace <= 0 or router.shutting_down:
            self._replica_lost(router, registration, why)
            return

        async def lost_unless_rejoined() -> None:
            assert handle is not None
            if await await_rejoin(router, self.launcher, handle, self.rejoin_grace):
                self.log.info("kernel %s: replica %s registered again", router.kernel_id, registration.replica_id)
            elif router.kernel_id in self.kernels and not router.replicas.is_registered(registration.replica_id):
                self._replica_lost(router, registration, why)

        self._spawn(lost_unless_rejoined())

    def _replica_lost(self, router: ReplicaRouter, registration: ReplicaRegistration, why: str) -> None:
        """A replica is gone: tell the scheduler now, and start the replacement it places."""
        router.replica_lost(registration.replica_id)
        self.residency.forget(router.kernel_id, registration.replica_id)  # its device memory went with it
        record = self.kernels.get(router.kernel_id)
        if record is None:
            return
        handle = record.replicas.release(registration.replica_id)
        sid = scheduler_id(registration.replica_id)
        if sid is None:
            return
        decision = self.scheduler.replica_lost(router.kernel_id, sid, now=now())
        log_decision(self.log, decision)
        self._dispatch()
        placed = decision.replacement if isinstance(decision, ReplicaLost) else None
        if not isinstance(placed, Placement):
            # No host could take it now (the decision says why); try again whenever capacity changes.
            retry = self.scheduler.place_missing_replicas(router.kernel_id, now=now())
            log_decision(self.log, retry)
            placed = retry if isinstance(retry, Placement) else None
        self.replace(record, handle, placed)

    def replace(self, record: KernelRecord, dead: ReplicaHandle | None, placed: Placement | None) -> None:
        """Stop ``dead``'s process (if any) and start the replicas ``placed`` (if any), in the background."""
        self._spawn(self._replace(record, dead, placed))

    async def _replace(self, record: KernelRecord, dead: ReplicaHandle | None, placed: Placement | None) -> None:
        if dead is not None:
            with contextlib.suppress(Exception):
                await self.launcher.stop_replica(dead, now=True)
        if placed is None or record.kernel_id not in self.kernels:
            return
        for slot in placed.replicas:
            try:
                await self._start_replica(record, str(slot.replica_id), slot.host)
            except LaunchError as err:
                self.log.error(
                    "kernel %s: could not start replacement replica %s on %s: %s",
                    record.kernel_id,
                    slot.replica_id,
                    slot.host,
                    err,
                )

    async def _monitor_replicas(self, coordinator: Coordinator) -> None:
        """Notice dead replica processes quickly: revoke their lease instead of waiting for it to expire."""
        while True:
            await asyncio.sleep(0.5)
            try:
                await self._check_replicas(coordinator)
            except Exception:  # the monitor must outlive any one failure
                self.log.exception("checking replica processes failed")

    async def _check_replicas(self, coordinator: Coordinator) -> None:
        for record in list(self.kernels.values()):
            replicas = record.replicas
            for rid, handle in replicas.handles().items():
                status = await self.launcher.status(handle)
                if status.phase not in (ReplicaPhase.EXITED, ReplicaPhase.FAILED):
                    continue
                registration = replicas.registration(rid)
                if registration is not None:
                    with contextlib.suppress(CoordinationError):
                        await coordinator.revoke(registration.lease)
                elif registration is None and replicas.is_live(rid):
                    replicas.launch_failed(rid, status.reason or status.phase.value)
                elif registration is None:
                    replicas.release(rid)

    def place_missing(self) -> None:
        """Kernels short of replicas (no host could take a replacement before) get them now."""
        for record in list(self.kernels.values()):
            placed = self.scheduler.place_missing_replicas(record.kernel_id, now=now())
            if isinstance(placed, Placement):
                log_decision(self.log, placed)
                self.replace(record, None, placed)
