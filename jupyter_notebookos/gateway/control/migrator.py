"""Executing the scheduler's migration plans: move one replica of a kernel to another host.

The scheduler decides *what* moves where (:class:`~jupyter_notebookos.scheduler.MigrationPlan`); this module
does it, in an order that never leaves the kernel with fewer than two up-to-date replicas:

1. start a new replica process on the target (the launcher: a local process, or a pod pinned to the node);
2. it restores from the checkpoint plus the log and registers; wait until it has applied every record;
3. switch: the new replica (a new id, handed out by the scheduler with the plan) takes the old one's place
   in the scheduler and the router sends it the next cells;
4. retire the old replica.

A move that fails part-way (the new replica does not come up, dies, or cannot catch up) stops the new
process and leaves the old replica serving; the decision says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from jupyter_notebookos.gateway.control.events import EventLog
from jupyter_notebookos.gateway.control.platformmetrics import PlatformMetrics
from jupyter_notebookos.launchers.base import Launcher, LaunchError, ReplicaHandle
from jupyter_notebookos.scheduler import MigrationCompleted, MigrationFailed, MigrationPlan, Scheduler

if TYPE_CHECKING:
    from jupyter_notebookos.gateway.control.records import KernelRecord


class SchedulingHost(Protocol):
    """What the gateway's background workers (migrations, autoscaling) need of the platform, at the least."""

    @property
    def scheduler(self) -> Scheduler: ...

    @property
    def metrics(self) -> PlatformMetrics: ...

    @property
    def events(self) -> EventLog: ...

    @property
    def log(self) -> logging.Logger | Any: ...

    def now(self) -> float:
        """The scheduler's clock."""

    def dispatch(self) -> None:
        """Start the queued cells that can run now."""


class MigrationHost(SchedulingHost, Protocol):
    """What a migration needs of the gateway platform (which implements it)."""

    @property
    def kernels(self) -> Mapping[str, KernelRecord]: ...

    @property
    def launcher(self) -> Launcher: ...

    async def start_replica_process(self, record: KernelRecord, replica_id: str, host: str) -> None:
        """Start replica process ``replica_id`` of the kernel on ``host``."""


class MigrationError(RuntimeError):
    """A migration could not complete; the message says at which step and why."""


class MigrationRunner:
    """Runs migrations for the platform and keeps track of those in flight; a new replica may take
    ``launch_timeout`` seconds to register, and as long again to catch up with the state log."""

    def __init__(self, platform: MigrationHost, *, launch_timeout: float) -> None:
        self.platform = platform
        self.launch_timeout = launch_timeout
        self.in_flight: dict[int, dict[str, object]] = {}
        self._retiring: set[asyncio.Task[None]] = set()

    async def run(self, plan: MigrationPlan) -> MigrationCompleted | MigrationFailed:
        """Execute ``plan``; the scheduler hears the outcome (``migration_finished``) before this returns."""
        platform = self.platform
        scheduler = platform.scheduler
        began = time.monotonic()
        record = platform.kernels.get(plan.kernel_id)
        self.in_flight[plan.migration_id] = {
            "migration_id": plan.migration_id,
            "kernel_id": plan.kernel_id,
            "replica_id": plan.replica_id,
            "source": plan.source,
            "target": plan.target,
            "trigger": plan.trigger,
            "started_at": time.time(),
        }
        platform.log.info("scheduler: %s", plan)
        replica_id = str(plan.replica_id)

        def event(what: str, text: str, **extra: object) -> None:
            platform.events.record(
                "migration",
                what,
                text,
                kernel_id=plan.kernel_id,
                replica_id=replica_id,
                migration_id=plan.migration_id,
                source=plan.source,
                target=plan.target,
                reason=plan.trigger,
                **extra,
            )

        event(
            "started",
            f"replica {replica_id} of kernel {plan.kernel_id}: {plan.source} -> {plan.target} ({plan.trigger})",
        )
        try:
            if record is None:
                raise MigrationError("the kernel is gone")
            await self._bring_up(record, plan)
        except (MigrationError, LaunchError, OSError) as err:
            decision: MigrationCompleted | MigrationFailed = scheduler.migration_finished(
                plan.migration_id, now=platform.now(), ok=False, error=str(err)
            )  # type: ignore[assignment]
            outcome = "failed"
        else:
            assert record is not None
            record.replicas.retire(replica_id)  # the new replica serves from now on (the scheduler's too)
            decision = scheduler.migration_finished(plan.migration_id, now=platform.now(), ok=True)  # type: ignore[assignment]
            old = record.replicas.release(replica_id)
            if old is not None:  # retired: nothing waits for it to exit
                task = asyncio.ensure_future(self._retire(old))
                self._retiring.add(task)
                task.add_done_callback(self._retiring.discard)
            outcome = "ok"
        finally:
            self.in_flight.pop(plan.migration_id, None)
        seconds = time.monotonic() - began
        platform.metrics.migrations.labels(plan.trigger, outcome).inc()
        platform.metrics.migration_seconds.observe(seconds)
        platform.log.info("scheduler: %s (%.2f s)", decision, seconds)
        event(outcome, f"{decision} ({seconds:.2f} s)", seconds=round(seconds, 3))
        platform.dispatch()
        return decision

    async def _retire(self, handle: ReplicaHandle) -> None:
        with contextlib.suppress(Exception):
            await self.platform.launcher.stop_replica(handle)

    async def _bring_up(self, record: KernelRecord, plan: MigrationPlan) -> None:
        """Start the new replica (the id the scheduler gave it) on the target and wait until it holds the whole
        state."""
        platform = self.platform
        router = record.router
        timeout = self.launch_timeout
        new_rid = str(plan.new_replica_id)
        try:
            await platform.start_replica_process(record, new_rid, plan.target)
            missing = await router.wait_registered({new_rid}, timeout)
            if missing:
                raise MigrationError(
                    f"the new replica {new_rid} on {plan.target} did not register within {timeout:.0f} s"
                )
            if not await router.wait_caught_up(new_rid, timeout):
                raise MigrationError(f"the new replica {new_rid} on {plan.target} did not catch up with the state log")
        except BaseException:
            record.replicas.retire(new_rid)
            handle = record.replicas.release(new_rid)
            if handle is not None:
                with contextlib.suppress(Exception):
                    await platform.launcher.stop_replica(handle, now=True)
            raise

    def snapshot(self) -> list[dict[str, object]]:
        """Migrations in flight, for the REST API and ``notebookos status``."""
        now = time.time()
        return [
            {**m, "seconds": round(now - float(m["started_at"]), 3)}  # type: ignore[arg-type]
            for m in self.in_flight.values()
        ]

    async def wait_idle(self, timeout: float) -> None:
        """Wait until no migration is in flight (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
