"""The autoscaler loop: every ``interval`` seconds, ask the scheduler for a scaling decision and carry it out.

Scale-out asks the host provisioner for hosts (they join the scheduler when ready); scale-in drains idle hosts
by migration first (the scheduler plans the moves, :class:`~jupyter_notebookos.gateway.control.migrator.MigrationRunner`
runs them) and gives them back only once empty. Each round that does something logs its decision as one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Iterable
from typing import Any, Protocol

from jupyter_notebookos.gateway.control.migrator import MigrationRunner, SchedulingHost
from jupyter_notebookos.launchers.provisioning import HostProvisioner
from jupyter_notebookos.scheduler import MigrationPlan, ScalingDecision


class ScalingHost(SchedulingHost, Protocol):
    """What autoscaling needs of the gateway platform (which implements it)."""

    @property
    def migrations(self) -> MigrationRunner: ...

    async def add_host(self, name: str, gpus: int, *, simulated: bool = True) -> None:
        """A new host is ready: the scheduler may use it."""

    async def remove_host(self, name: str) -> None:
        """A drained host leaves the cluster."""


class Autoscaler:
    """Runs scaling rounds for the platform."""

    def __init__(self, platform: ScalingHost, provisioner: HostProvisioner, interval: float) -> None:
        self.platform = platform
        self.provisioner = provisioner
        self.interval = interval
        self.history: deque[dict[str, Any]] = deque(maxlen=20)
        self._task: asyncio.Task[None] | None = None
        self._moves: set[asyncio.Task[Any]] = set()

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for move in list(self._moves):
            move.cancel()
        await self.provisioner.close()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.round()
            except Exception:  # one bad round must not end autoscaling
                self.platform.log.exception("autoscaling round failed")

    async def round(self) -> ScalingDecision:
        """One scaling round, carried out."""
        platform = self.platform
        decision = platform.scheduler.autoscale(platform.now(), hosts_provisioning=self.provisioner.provisioning)
        if decision.action == "none" and not decision.remove:
            return decision
        platform.log.info("%s", decision)
        self.history.append({"at": time.time(), "decision": str(decision), "action": decision.action})
        platform.events.record(
            "scaling", decision.action, str(decision), add_hosts=decision.add_hosts, remove=list(decision.remove)
        )
        if decision.add_hosts:
            platform.metrics.scaling_events.labels("out").inc(decision.add_hosts)
            await self.provisioner.provision(decision.add_hosts, platform.add_host)
        self.start_moves(decision.migrations)
        for host in decision.remove:
            platform.metrics.scaling_events.labels("in").inc()
            await platform.remove_host(host)
            await self.provisioner.release(host)
        if decision.undrain or decision.add_hosts:
            platform.dispatch()
        return decision

    def start_moves(self, plans: Iterable[MigrationPlan]) -> None:
        """Run migrations the scheduler planned (scale-in drains, ahead-of-time moves) in the background."""
        for plan in plans:
            move = asyncio.ensure_future(self.platform.migrations.run(plan))
            self._moves.add(move)
            move.add_done_callback(self._moves.discard)

    def snapshot(self) -> dict[str, Any]:
        """Scaling activity, for the REST API and ``notebookos status``."""
        return {
            "enabled": self._task is not None,
            "provisioning": self.provisioner.provisioning,
            "draining": sorted(h.name for h in self.platform.scheduler.hosts() if h.draining),
            "recent": list(self.history)[-5:],
        }
