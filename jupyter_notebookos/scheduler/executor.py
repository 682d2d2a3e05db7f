"""Executor choice for a cell under the NotebookOS policy.

In order: the previous executor if its host can bind the GPUs now (sticky: no state to move); else the
replica whose host has the most idle GPUs; else migrate the replica on the most subscribed host to a host
that can bind them (the GPUs there are reserved for the cell); else the cell must wait.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import migration
from .cluster import Cell, ClusterModel, Host, Kernel
from .decisions import MigrateThenRun, RunCell
from .gputypes import Wants, describe
from .settings import SchedulerSettings


@dataclass(frozen=True, slots=True)
class Blocked:
    """Why a cell cannot start now (internal; the engine turns it into ``WaitInQueue``). ``would_migrate``: it
    could start by a migration, which the caller did not allow."""

    reason: str
    scale_out_would_help: bool
    would_migrate: bool = False


def _idle_text(host: Host, wants: Wants = ()) -> str:
    if wants:
        return f"{host.idle_for(wants)} of {host.capacity(wants)} GPUs of type {describe(wants)} idle"
    return f"{host.idle} of {host.gpus} GPUs idle"


def choose_executor(
    model: ClusterModel,
    kernel: Kernel,
    cell_id: str,
    gpus: int,
    requested_at: float,
    now: float,
    settings: SchedulerSettings,
    prefer: int | None = None,
    migrate: bool = True,
) -> RunCell | MigrateThenRun | Blocked:
    """Decide where the cell runs and commit its GPUs in the model (or say why it cannot start).

    ``prefer`` is a replica the client asked for (``metadata.notebookos.replica``): it wins when its host can
    bind the GPUs now; otherwise the usual order applies. ``migrate=False``: only a replica that can run it in
    place will do (the fair-share dispatch offers GPUs to such cells first).
    """
    hosts = model.hosts
    wants = kernel.wants
    if prefer is not None and prefer in kernel.replicas and prefer not in kernel.moving:
        wanted = hosts[kernel.replicas[prefer]]
        if wanted.runnable and wanted.idle_for(wants) >= gpus:
            detail = f"requested by the client: {wanted.name} has {_idle_text(wanted, wants)}"
            return _run(model, kernel, cell_id, prefer, wanted, gpus, requested_at, now, "requested", detail)
    previous = kernel.last_executor
    prev_host: Host | None = None
    if settings.executor_fit == "best-fit":
        fit = _best_fit(model, kernel, gpus)
        if fit is not None:
            rid, host = fit
            sticky = "; also the previous executor" if rid == previous else ""
            detail = f"best fit: {host.name} has the fewest idle GPUs that suffice ({_idle_text(host, wants)}){sticky}"
            reason = "sticky" if rid == previous else "best-fit"
            return _run(model, kernel, cell_id, rid, host, gpus, requested_at, now, reason, detail)
    if previous is not None and previous in kernel.replicas and previous not in kernel.moving:
        prev_host = hosts[kernel.replicas[previous]]
        if prev_host.runnable and prev_host.idle_for(wants) >= gpus:
            detail = f"sticky: previous executor's host {prev_host.name} has {_idle_text(prev_host, wants)}"
            return _run(model, kernel, cell_id, previous, prev_host, gpus, requested_at, now, "sticky", detail)

    best: tuple[int, Host] | None = None
    for rid, host_name in kernel.replicas.items():
        if rid in kernel.moving or rid == previous:
            continue
        host = hosts[host_name]
        idle = host.idle_for(wants)
        if host.runnable and idle >= gpus and (best is None or idle > best[1].idle_for(wants)):
            best = (rid, host)
    if best is not None:
        rid, host = best
        if prev_host is not None:
            why = (
                f"previous executor's host {prev_host.name} has {_idle_text(prev_host, wants)}, "
                f"{host.name} has {host.idle_for(wants)}"
            )
        else:
            why = f"{host.name} has the most idle GPUs of the kernel's hosts ({_idle_text(host, wants)})"
        return _run(model, kernel, cell_id, rid, host, gpus, requested_at, now, "most-idle", why)

    if not kernel.replicas:
        return Blocked(f"kernel {kernel.kernel_id} has no live replica (a replacement must be placed)", True)
    busy = ", ".join(
        f"{h} {hosts[h].idle_for(wants)}/{hosts[h].capacity(wants)}" for h in sorted(set(kernel.replicas.values()))
    )
    of_type = f" of type {describe(wants)}" if wants else ""
    no_local = f"no replica's host can bind {gpus} GPUs{of_type} now (idle: {busy})"
    if not settings.migration_enabled:
        return Blocked(f"{no_local} and migration is disabled", True)
    if len(model.migrations) >= settings.max_concurrent_migrations:
        return Blocked(f"{no_local} and {len(model.migrations)} migrations are already in flight", False)
    choice = migration.replica_to_move(model, kernel, settings.replicas)
    if choice is None:
        return Blocked(f"{no_local} and every replica is already moving", False)
    cap = settings.subscription_ratio_cap
    target = migration.target_for_cell(model, kernel, gpus, cap, settings.replicas)
    if target is None:
        return Blocked(f"{no_local} and no other host can bind them and take a replica", True)
    if not migrate:
        return Blocked(f"{no_local}; a migration to {target.name} waits for cells that can run in place", False, True)
    rid, why_replica = choice
    why = f"{no_local}; {why_replica}; {target.name} has {_idle_text(target, wants)}"
    plan = migration.begin(model, kernel, rid, target, "cell", why, cell_id)
    devices = model.commit(target, gpus, wants)
    kernel.running = Cell(
        kernel.kernel_id,
        cell_id,
        rid,
        target.name,
        devices,
        requested_at,
        None,
        migration_id=plan.migration_id,
    )
    return MigrateThenRun(kernel.kernel_id, cell_id, gpus, devices, plan, now - requested_at)


def _best_fit(model: ClusterModel, kernel: Kernel, gpus: int) -> tuple[int, Host] | None:
    """The replica whose host binds ``gpus`` of the most preferred type, leaving the fewest idle GPUs (previous
    executor on ties)."""
    best: tuple[tuple[int, int, bool, int], int, Host] | None = None
    # Then the oldest replica slot (a migrated replica keeps its predecessor's place).
    for position, (rid, name) in enumerate(kernel.replicas.items()):
        if rid in kernel.moving:
            continue
        host = model.hosts[name]
        if not host.runnable:
            continue
        if kernel.wants:
            kind = host.bind_type(gpus, kernel.wants)
            if kind is None:
                continue
            preference = kernel.wants.index(kind)
            idle = host.idle_for((kind,))
        else:
            preference, idle = 0, host.idle
            if idle < gpus:
                continue
        key = (preference, idle, rid != kernel.last_executor, position)
        if best is None or key < best[0]:
            best = (key, rid, host)
    return None if best is None else (best[1], best[2])


def _run(
    model: ClusterModel,
    kernel: Kernel,
    cell_id: str,
    replica_id: int,
    host: Host,
    gpus: int,
    requested_at: float,
    now: float,
    reason: str,
    detail: str,
) -> RunCell:
    devices = model.commit(host, gpus, kernel.wants)
    kernel.running = Cell(kernel.kernel_id, cell_id, replica_id, host.name, devices, requested_at, now)
    kernel.last_executor = replica_id
    return RunCell(kernel.kernel_id, cell_id, replica_id, host.name, gpus, devices, reason, detail, now - requested_at)
