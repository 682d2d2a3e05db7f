"""Migration planning: which replica to move, where to, and the bookkeeping of moves in flight.

While a replica moves, the kernel counts as pending on both the source and the target (the target is one
of the kernel's hosts), so no other replica of the kernel can land there. Targets must accept new replicas
(not cordoned or draining) and stay at or below the subscription ratio cap.
"""

from __future__ import annotations

from .cluster import ClusterModel, Host, Kernel
from .decisions import MigrationPlan
from .gputypes import describe
from .subscription import admits, ratio_after

# A cell-triggered move looks at this many hosts with enough idle GPUs, at most: a bounded search keeps a
# decision fast on a large, saturated cluster (the best of these is good enough).
CANDIDATES = 32


def replica_to_move(model: ClusterModel, kernel: Kernel, replicas: int) -> tuple[int, str] | None:
    """The replica whose host is the most subscribed (moving it relieves the hottest host), and why."""
    best: tuple[float, int, int] | None = None
    chosen = -1
    ratios: list[str] = []
    # Ties go to the oldest replica slot (a migrated replica keeps its predecessor's place).
    for position, (rid, host_name) in enumerate(kernel.replicas.items()):
        if rid in kernel.moving:
            continue
        host = model.hosts[host_name]
        ratio = host.subscription_ratio(replicas)
        ratios.append(f"{host_name} {ratio:.2f}")
        key = (ratio, -host.idle_for(kernel.wants), -position)
        if best is None or key > best:
            best, chosen = key, rid
    if best is None:
        return None
    rid = chosen
    why = f"r{rid} is on the most subscribed of the kernel's hosts (ratios {', '.join(ratios)})"
    return rid, why


def target_for_cell(model: ClusterModel, kernel: Kernel, gpus: int, cap: float, replicas: int) -> Host | None:
    """A host that can bind ``gpus`` now and take a replica: the most preferred GPU type first, then the most
    idle, then the least subscribed."""
    exclude = kernel.hosts_in_use()
    if kernel.wants:
        return _typed_target(model, kernel, gpus, cap, replicas, exclude)
    best: Host | None = None
    seen = 0
    for idle in range(model.max_host_gpus, max(gpus, 1) - 1, -1):
        for name in model.idle_tier(idle):
            if name in exclude:
                continue
            host = model.hosts[name]
            if host.cordoned or not admits(host, kernel.gpus, cap, replicas):
                seen += 1
                if seen >= CANDIDATES:
                    return best
                continue
            if best is None or host.pending / host.gpus < best.pending / best.gpus:
                best = host
            seen += 1
            if seen >= CANDIDATES:
                return best
        if best is not None:
            return best  # most idle tier wins; ties broken by subscription above
    return best


def _typed_target(
    model: ClusterModel, kernel: Kernel, gpus: int, cap: float, replicas: int, exclude: set[str]
) -> Host | None:
    for kind in kernel.wants:
        best: tuple[int, float, str] | None = None
        found: Host | None = None
        for name in model.by_type.get(kind, ()):
            host = model.hosts[name]
            if name in exclude or not host.runnable or host.cordoned:
                continue
            idle = host.idle_for((kind,))
            if idle < gpus or not admits(host, kernel.gpus, cap, replicas, kernel.wants):
                continue
            key = (-idle, host.pending / host.gpus, name)
            if best is None or key < best:
                best, found = key, host
        if found is not None:
            return found
    return None


def best_target(
    model: ClusterModel, kernel: Kernel, cap: float, replicas: int, exclude: set[str] | None = None
) -> Host | None:
    """The least subscribed host that accepts a replica of ``kernel`` (for drains and requests)."""
    skip = kernel.hosts_in_use() | (exclude or set())
    found = model.least_subscribed(1, lambda h: admits(h, kernel.gpus, cap, replicas, kernel.wants), skip)
    return found[0] if found else None


def unmovable(kernel: Kernel, replica_id: int) -> str:
    """Why a replica cannot be moved on request now (``""``: it can)."""
    if replica_id not in kernel.replicas:
        known = ", ".join(f"r{r}" for r in sorted(kernel.replicas)) or "none"
        return f"unknown replica (replicas: {known})"
    if replica_id in kernel.moving:
        return "this replica is already migrating"
    if kernel.hold is not None:
        return f"it holds GPUs reserved for the session on {kernel.hold[0]}"
    if kernel.running is not None and kernel.running.replica_id == replica_id:
        return f"it is running cell {kernel.running.cell_id}; retry when it ends"
    return ""


def target_problem(model: ClusterModel, kernel: Kernel, target: str, cap: float, replicas: int) -> str | None:
    """Why ``target`` cannot take a replica of ``kernel``, or None if it can."""
    host = model.hosts.get(target)
    if host is None:
        known = ", ".join(sorted(model.hosts)[:5])
        return f"unknown host {target} (known hosts include {known})" if known else f"unknown host {target}"
    if target in kernel.hosts_in_use():
        return f"{target} already holds a replica of kernel {kernel.kernel_id}"
    if host.draining:
        return f"{target} is draining"
    if host.cordoned:
        return f"{target} is cordoned"
    if kernel.wants and not host.serves(kernel.wants):
        return f"{target} has no GPUs of type {describe(kernel.wants)}, which kernel {kernel.kernel_id} asks for"
    if host.capacity(kernel.wants) < kernel.gpus:
        return (
            f"{target} is full: it has {host.capacity(kernel.wants)} GPUs and the kernel needs {kernel.gpus} per cell"
        )
    if not admits(host, kernel.gpus, cap, replicas, kernel.wants):
        return (
            f"{target} is full: its subscription ratio would be "
            f"{ratio_after(host, kernel.gpus, replicas):.2f}, "
            f"above the cap {cap:.2f}"
        )
    return None


def begin(
    model: ClusterModel,
    kernel: Kernel,
    replica_id: int,
    target: Host,
    trigger: str,
    why: str,
    cell_id: str | None = None,
) -> MigrationPlan:
    """Record a migration in flight (the kernel now also counts as pending on the target)."""
    plan = MigrationPlan(
        model.next_migration_id,
        kernel.kernel_id,
        replica_id,
        kernel.replicas[replica_id],
        target.name,
        trigger,
        why,
        cell_id,
        kernel.next_replica,
    )
    kernel.next_replica += 1
    model.next_migration_id += 1
    model.migrations[plan.migration_id] = plan
    kernel.moving[replica_id] = (plan.migration_id, target.name)
    model.occupy(kernel, replica_id, target)
    return plan


def complete(model: ClusterModel, kernel: Kernel, plan: MigrationPlan) -> None:
    """The replica now lives on the target, as ``plan.new_replica_id`` (in the old one's place)."""
    del model.migrations[plan.migration_id]
    del kernel.moving[plan.replica_id]
    model.vacate(kernel, plan.replica_id, plan.source)
    model.rename_replica(kernel, plan.replica_id, plan.new_replica_id, plan.target)


def abort(model: ClusterModel, kernel: Kernel, plan: MigrationPlan) -> None:
    """Forget the move; the replica stays on the source."""
    model.migrations.pop(plan.migration_id, None)
    kernel.moving.pop(plan.replica_id, None)
    model.vacate(kernel, plan.replica_id, plan.target)


def plan_drain(model: ClusterModel, host: Host, cap: float, replicas: int) -> tuple[list[MigrationPlan], list[str]]:
    """Begin a move for every replica on a draining host that can move now; say why the others cannot."""
    plans: list[MigrationPlan] = []
    stuck: list[str] = []
    for kernel_id, rid in list(host.replicas):
        kernel = model.kernels[kernel_id]
        if kernel.replicas.get(rid) != host.name or rid in kernel.moving:
            continue  # an incoming move, or already leaving
        if kernel.running is not None and kernel.running.replica_id == rid:
            stuck.append(f"r{rid} of {kernel_id} is running cell {kernel.running.cell_id}")
            continue
        if kernel.hold is not None:
            stuck.append(f"r{rid} of {kernel_id} holds GPUs reserved for its session")
            continue
        target = best_target(model, kernel, cap, replicas)
        if target is None:
            stuck.append(f"no host accepts r{rid} of {kernel_id}")
            continue
        why = f"draining {host.name}; {target.name} is the least subscribed host that accepts it"
        plans.append(begin(model, kernel, rid, target, "drain", why))
    return plans, stuck
