"""The routers' planner: the scheduler decides where each cell runs, the planner turns that into actions.

Every :class:`~jupyter_notebookos.gateway.router.ReplicaRouter` asks :meth:`Planner.place` for a
grant (executor and GPUs), waiting in the scheduler's queue or for a migration when it must, and calls
:meth:`Planner.release` when the cell is over; :meth:`Planner.dispatch` starts queued cells that fit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

from jupyter_notebookos.gateway.control.autoscaler import Autoscaler
from jupyter_notebookos.gateway.control.decisionlog import log, log_decision, now
from jupyter_notebookos.gateway.control.migrator import MigrationRunner
from jupyter_notebookos.gateway.control.platformmetrics import PlatformMetrics
from jupyter_notebookos.gateway.control.records import KernelRegistry
from jupyter_notebookos.gateway.control.residency import GpuResidency
from jupyter_notebookos.gateway.router.cells import CellGrant, CellRejected, CellRequest
from jupyter_notebookos.gateway.router.replicas import scheduler_id
from jupyter_notebookos.scheduler import (
    CellFinished,
    Decision,
    MigrateThenRun,
    MigrationCompleted,
    MigrationFailed,
    RejectCell,
    RunCell,
    Scheduler,
)


class Planner:
    """Every router's :class:`~jupyter_notebookos.gateway.router.cells.CellPlanner`: the scheduler decides, the
    planner waits for what the decision needs (the queue, a migration, room on the GPUs, the replica catching up).

    It owns the cells waiting in the scheduler's queue (their futures); ``launch_timeout`` bounds how long a replica
    may take to catch up with the state log."""

    def __init__(
        self,
        *,
        scheduler: Scheduler,
        kernels: KernelRegistry,
        residency: GpuResidency,
        metrics: PlatformMetrics,
        migrations: MigrationRunner,
        autoscaler: Autoscaler | None,
        launch_timeout: float,
        logger: logging.Logger | Any = log,
    ) -> None:
        self.scheduler = scheduler
        self.kernels = kernels
        self.residency = residency
        self.metrics = metrics
        self.migrations = migrations
        self.autoscaler = autoscaler
        self.launch_timeout = launch_timeout
        self.log = logger
        self._waiting: dict[tuple[str, str], asyncio.Future[RunCell | MigrateThenRun]] = {}

    def place(self, request: CellRequest) -> CellGrant | Coroutine[Any, Any, CellGrant]:
        """Ask the scheduler where the cell runs. The grant itself when nothing stands between the cell and its
        replica (the sticky cell of every notebook: no queue, migration, eviction or earlier state to apply), with
        no event-loop turn; else the coroutine that waits for it, in the scheduler's queue or for a migration."""
        record = self.kernels.get(request.kernel_id)
        if record is None:
            raise CellRejected(f"kernel {request.kernel_id} is shutting down")
        prefer = scheduler_id(request.prefer) if request.prefer is not None else None
        decision: Decision = self.scheduler.request_cell(
            request.kernel_id, request.cell_id, now=now(), gpus=request.gpus, prefer=prefer
        )
        self._log_decision(decision)
        if isinstance(decision, RunCell):
            grant = self._grant(decision)
            in_the_way = self.residency.in_the_way(request.kernel_id, grant.replica_id, grant.host, grant.devices)
            if in_the_way or not record.router.caught_up(grant.replica_id):
                return self._ready(request, grant)
            self.metrics.queued_seconds.observe(time.monotonic() - request.arrived)
            return grant
        return self._acquire(request, decision)

    def _grant(self, decision: RunCell) -> CellGrant:
        grant = CellGrant(str(decision.replica_id), decision.host, tuple(decision.device_ids), decision.detail)
        if self.autoscaler is not None:  # kernels this cell stranded move now, off its critical path
            self.autoscaler.start_moves(self.scheduler.prepare_moves(now()))
        return grant

    async def _acquire(self, request: CellRequest, decision: Decision) -> CellGrant:
        """The rest of :meth:`place` when the scheduler did not run the cell at once: wait in its queue, or for a
        migration; then as :meth:`_ready`."""
        while not isinstance(decision, RunCell):
            if isinstance(decision, RejectCell):
                raise CellRejected(decision.reason)
            if isinstance(decision, MigrateThenRun):
                outcome = await self._migrate_for(request, decision)
                if isinstance(outcome, MigrationCompleted) and outcome.run is not None:
                    decision = outcome.run
                    continue
                # The move failed: the scheduler put the cell back at the queue's front.
            decision = await self._wait_in_queue(request)
        return await self._ready(request, self._grant(decision))

    async def _ready(self, request: CellRequest, grant: CellGrant) -> CellGrant:
        """Make room on the granted GPUs and wait until the replica holds every earlier cell's state."""
        await self._make_room(request.kernel_id, grant)
        await self._wait_up_to_date(request, grant)
        self.metrics.queued_seconds.observe(time.monotonic() - request.arrived)
        return grant

    async def _make_room(self, kernel_id: str, grant: CellGrant) -> None:
        """Another replica's state still on the granted GPUs (sticky release) moves to host memory first."""

        async def evict(owner: str, replica_id: str) -> dict[str, Any]:
            record = self.kernels.get(owner)
            if record is None:
                return {"status": "error", "evalue": f"kernel {owner} is gone"}
            return await record.router.evict(replica_id)

        for eviction in await self.residency.make_room(kernel_id, grant.replica_id, grant.host, grant.devices, evict):
            self.metrics.gpu_evictions.labels("ok" if eviction.status == "ok" else "failed").inc()
            self.metrics.gpu_eviction_seconds.observe(eviction.seconds)

    def note_resident(self, kernel_id: str, replica_id: str, host: str, devices: list[int]) -> None:
        """A replica's reply said which devices still hold its GPU state (see :mod:`.residency`)."""
        self.residency.note(kernel_id, replica_id, host, devices)

    def queue_position(self, kernel_id: str, cell_id: str) -> int | None:
        """The cell's 1-based place in the scheduler's queue; ``None`` when it is not queued (a migration)."""
        for position, queued in enumerate(self.scheduler.queued_cells(), start=1):
            if queued.kernel_id == kernel_id and queued.cell_id == cell_id:
                return position
        return None

    async def _migrate_for(
        self, request: CellRequest, decision: MigrateThenRun
    ) -> MigrationCompleted | MigrationFailed:
        """Run the migration a cell waits for; an interrupted cell lets it finish and gives the GPUs back."""
        move = asyncio.ensure_future(self.migrations.run(decision.migration))
        try:
            return await asyncio.shield(move)
        except asyncio.CancelledError:
            move.add_done_callback(lambda _: self.release(request.kernel_id, request.cell_id))
            raise

    async def _wait_in_queue(self, request: CellRequest) -> RunCell | MigrateThenRun:
        """Wait until the scheduler's queue dispatches this cell."""
        key = (request.kernel_id, request.cell_id)
        future: asyncio.Future[RunCell | MigrateThenRun] = asyncio.get_running_loop().create_future()
        self._waiting[key] = future
        self.metrics.queued_cells.set(len(self._waiting))
        try:
            self.dispatch()  # it may run right away (e.g. a failed migration freed its reservation)
            return await future
        finally:
            self._waiting.pop(key, None)
            self.metrics.queued_cells.set(len(self._waiting))

    async def _wait_up_to_date(self, request: CellRequest, grant: CellGrant) -> None:
        """The chosen replica must hold the state of every earlier cell before it runs this one (if it dies or
        does not catch up in time, the router notices and asks again)."""
        record = self.kernels.get(request.kernel_id)
        if record is not None:
            await record.router.wait_caught_up(grant.replica_id, self.launch_timeout)

    def release(self, kernel_id: str, cell_id: str) -> None:
        """A cell finished: release its GPUs in the scheduler and start queued cells that now fit."""
        decision = self.scheduler.cell_finished(kernel_id, cell_id, now=now())
        self._log_decision(decision)
        if isinstance(decision, CellFinished) and not decision.was_queued:
            self.metrics.cells.labels("finished").inc()
            self.metrics.gpu_seconds_used.inc(decision.ran_s * len(decision.released_devices))
        self.dispatch()

    def dispatch(self) -> None:
        """Start the queued cells that can run now (after GPUs were released or capacity added)."""
        dispatch = self.scheduler.dispatch_queued(now=now())
        for started in dispatch.started:
            self._log_decision(started)
            future = self._waiting.get((started.kernel_id, started.cell_id))
            if isinstance(started, MigrateThenRun):
                self.scheduler.migration_finished(started.migration.migration_id, now=now(), ok=False)
                continue
            if future is not None and not future.done():
                future.set_result(started)
            else:
                self.scheduler.cell_finished(started.kernel_id, started.cell_id, now=now())
        for rejected in dispatch.rejected:  # their user's GPU-hours ran out while they waited
            self._log_decision(rejected)
            future = self._waiting.get((rejected.kernel_id, rejected.cell_id))
            if future is not None and not future.done():
                future.set_exception(CellRejected(rejected.reason))

    def kernel_stopped(self, kernel_id: str) -> None:
        """The kernel is stopping: its cells waiting in the queue are refused."""
        for key in [k for k in self._waiting if k[0] == kernel_id]:
            future = self._waiting.pop(key)
            if not future.done():
                future.set_exception(CellRejected("the kernel is shutting down"))

    def _log_decision(self, decision: Decision) -> None:
        log_decision(self.log, decision)
