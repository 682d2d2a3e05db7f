"""Ahead-of-time moves: keep every idle kernel within reach of GPUs it can bind at once.

A cell starts without delay only if one of its kernel's replica hosts has the kernel's GPUs idle when it
arrives; otherwise it pays a whole migration (container start, state restore, catch-up) while the user
waits. Large requests suffer most: an 8-GPU cell needs one of three hosts fully idle. So each autoscaling
round looks for idle kernels (no cell running or queued, no move in flight) whose replica hosts cannot
bind their request now, and moves one replica each, in the background, to a host that can. The kernel
keeps its other replicas serving meanwhile, so the move costs the user nothing.

Largest requests first (they are hardest to serve), at most ``max_prepare_migrations_per_round`` per
round and never past ``max_concurrent_migrations`` in flight. A host that one move (of this round, or
still in flight) counts on is not offered to another kernel unless it still has room for both.
"""

from __future__ import annotations

from . import migration
from .cluster import ClusterModel, Kernel
from .decisions import MigrationPlan
from .placement import host_with_headroom
from .settings import SchedulerSettings


def ready(model: ClusterModel, kernel: Kernel) -> bool:
    """Whether a cell of ``kernel`` asking for its full request could start now without a migration."""
    hosts = model.hosts
    for rid, name in kernel.replicas.items():
        if rid in kernel.moving:
            continue
        host = hosts[name]
        if host.runnable and host.idle_for(kernel.wants) >= kernel.gpus:
            return True
    return False


def plan_moves(model: ClusterModel, settings: SchedulerSettings, queued: set[str]) -> list[MigrationPlan]:
    """Begin (and record in the model) the ahead-of-time moves of one round."""
    budget = min(settings.max_prepare_migrations_per_round, settings.max_concurrent_migrations - len(model.migrations))
    if budget <= 0 or settings.policy != "notebookos" or not settings.migration_enabled:
        return []
    threshold = max(1, settings.prepare_min_gpus)
    stranded = [
        k
        for k in model.kernels.values()
        if k.gpus >= threshold
        and k.running is None
        and not k.moving
        and k.hold is None
        and k.replicas
        and k.kernel_id not in queued
        and not ready(model, k)
    ]
    if not stranded:
        return []
    stranded.sort(key=lambda k: (-k.gpus, k.kernel_id))
    claimed: dict[str, int] = {}  # host -> idle GPUs that moves (this round's or in flight) count on
    for plan in model.migrations.values():
        if plan.trigger == "prepare":
            claimed[plan.target] = claimed.get(plan.target, 0) + model.kernels[plan.kernel_id].gpus
    plans: list[MigrationPlan] = []
    cap, replicas = settings.subscription_ratio_cap, settings.replicas
    for kernel in stranded:
        if len(plans) >= budget:
            break
        target = host_with_headroom(model, kernel, cap, replicas, claimed)
        if target is None:
            continue
        choice = migration.replica_to_move(model, kernel, replicas)
        if choice is None:
            continue
        rid, why_replica = choice
        claimed[target.name] = claimed.get(target.name, 0) + kernel.gpus
        why = (
            f"ahead of time: none of the idle kernel's hosts can bind its {kernel.gpus} GPUs; {why_replica}; "
            f"{target.name} has {target.idle_for(kernel.wants)} of {target.capacity(kernel.wants)} GPUs idle"
        )
        plans.append(migration.begin(model, kernel, rid, target, "prepare", why))
    return plans
