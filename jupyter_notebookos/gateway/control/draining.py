"""An admin drains a host: every replica on it moves elsewhere, and no new replica or cell lands there.

The scheduler plans the moves (:meth:`~jupyter_notebookos.scheduler.Scheduler.drain_host`: replicas running a cell,
or with nowhere to go, stay and are listed as stuck; drain again later); the
:class:`~jupyter_notebookos.gateway.control.migrator.MigrationRunner` runs them, all at once. The host stays
draining until the admin puts it back in service (:func:`undrain_host`) or the autoscaler does (it needs the GPUs)
or removes it (scale-in). ``POST /api/notebookos/hosts/{host}/drain`` and ``.../undrain`` call these; each returns
what happened, for the REST answer and the dashboard.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from jupyter_notebookos.gateway.control.decisionlog import log_decision
from jupyter_notebookos.gateway.control.migrator import MigrationRunner, SchedulingHost
from jupyter_notebookos.scheduler import DrainPlan, MigrationCompleted


class DrainingHost(SchedulingHost, Protocol):
    """What draining needs of the gateway platform (which implements it)."""

    @property
    def migrations(self) -> MigrationRunner: ...


class DrainRequestError(Exception):
    """A drain request that was refused: an HTTP status and a message for the admin."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _known(platform: DrainingHost, name: str) -> None:
    if platform.scheduler.host(name) is None:
        names = sorted(h.name for h in platform.scheduler.hosts())
        raise DrainRequestError(404, f"no host {name!r} (hosts: {', '.join(names) or 'none'})")


async def drain_host(platform: DrainingHost, name: str) -> dict[str, Any]:
    """Drain host ``name`` now: its replicas' migrations run before this returns. Says what moved, what failed to
    move (the replica keeps serving where it was), and what could not move yet."""
    _known(platform, name)
    plan = platform.scheduler.drain_host(name, now=platform.now())
    log_decision(platform.log, plan)
    if not isinstance(plan, DrainPlan):
        raise DrainRequestError(409, f"cannot drain {name}: {plan}")
    platform.events.record("host", "draining", str(plan), host=name, stuck=list(plan.stuck))
    outcomes = await asyncio.gather(*(platform.migrations.run(move) for move in plan.migrations))
    moved, failed = [], []
    for move, outcome in zip(plan.migrations, outcomes, strict=True):
        entry = {
            "kernel_id": move.kernel_id,
            "replica_id": str(move.replica_id),
            "new_replica_id": str(move.new_replica_id),
            "to": move.target,
        }
        if isinstance(outcome, MigrationCompleted):
            moved.append(entry)
        else:
            failed.append({**entry, "reason": outcome.reason})
    platform.dispatch()
    host = platform.scheduler.host(name)
    left = host.replicas if host is not None else 0
    return {
        "host": name,
        "draining": True,
        "moved": moved,
        "failed": failed,
        "stuck": list(plan.stuck),
        "replicas_left": left,
        "summary": _summary(name, moved, failed, plan.stuck, left),
    }


def undrain_host(platform: DrainingHost, name: str) -> dict[str, Any]:
    """Put host ``name`` back in service: new replicas and cells may land on it again."""
    _known(platform, name)
    decision = platform.scheduler.undrain_host(name, now=platform.now())
    log_decision(platform.log, decision)
    platform.events.record("host", "in service", str(decision), host=name)
    platform.dispatch()
    return {"host": name, "draining": False, "summary": str(decision)}


def _summary(
    name: str, moved: list[dict[str, str]], failed: list[dict[str, str]], stuck: tuple[str, ...], left: int
) -> str:
    parts = [f"drained {name}: {len(moved)} replica(s) moved"]
    if failed:
        parts.append(f"{len(failed)} move(s) failed (those replicas still serve on {name})")
    if stuck:
        parts.append(f"cannot move yet: {'; '.join(stuck)}")
    parts.append(f"{left} replica(s) left on it" if left else "it holds no replica now")
    return "; ".join(parts)


__all__ = ["DrainRequestError", "DrainingHost", "drain_host", "undrain_host"]
