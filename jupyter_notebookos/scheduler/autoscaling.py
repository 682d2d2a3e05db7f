"""Autoscaling: a periodic decision from the GPUs in use.

target = max(min_hosts, ceil(committed x scaling_factor / gpus_per_host) + idle_host_buffer, hosts the
subscription cap needs for the pending GPUs, and under NotebookOS the hosts that cannot bind the largest
kernel request plus ``ready_host_buffer`` that can). Queued cells' GPUs count as committed when
``scale_for_queued_cells`` is set (otherwise a saturated cluster could never see it needs more). Scale out
at once by the difference (putting draining hosts back first); scale in slowly: only after being over the
target for ``scale_in_delay_s``, at most ``max_scale_in_per_round`` idle hosts per round, each drained by
migration first and removed once empty. ``max_hosts`` (when set) bounds the target.

With host pools (see ``pools``) each pool is one such cluster: its hosts, the GPUs committed on them, the cells
waiting whose kernel's home it is, the largest request among those kernels, its own ``min_hosts`` and
``max_hosts``; the idle-host buffer is kept only in pools some kernel calls home. The rounds of all pools make
one decision, with ``add_by_pool`` saying which pools to grow.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from . import migration
from .cluster import ClusterModel, Host
from .decisions import MigrationPlan, ScalingDecision
from .gputypes import Wants
from .pools import HostPool, home_pool
from .queue import QueuedCell
from .settings import SchedulerSettings
from .subscription import admits


@dataclass(frozen=True, slots=True)
class PoolView:
    """What one round looks at in one pool (without pools: the whole cluster as the one pool ``""``)."""

    name: str
    hosts: tuple[Host, ...]
    gpus_per_host: int
    min_hosts: int
    max_hosts: int
    busy: int
    queued: int
    largest: int
    homed: bool
    ready_for: Callable[[int], list[Host]]  # in-service hosts that can bind that many GPUs now

    @staticmethod
    def whole(model: ClusterModel, settings: SchedulerSettings, queued: int) -> PoolView:
        """The cluster as one pool (no pools configured)."""
        return PoolView(
            "",
            tuple(model.hosts.values()),
            settings.gpus_per_host,
            settings.min_hosts,
            settings.max_hosts,
            model.busy,
            queued,
            model.largest_request,
            True,
            model.hosts_with_idle,
        )

    @staticmethod
    def of(model: ClusterModel, pool: HostPool, queued: int, largest: int, wants: Wants) -> PoolView:
        """One configured pool; ``largest`` and ``wants``: the largest request among the kernels it is home to."""
        hosts = tuple(h for h in model.hosts.values() if h.pool == pool.name)

        def ready_for(gpus: int) -> list[Host]:
            return [h for h in hosts if h.runnable and h.idle_for(wants) >= gpus]

        busy = sum(h.committed for h in hosts)
        return PoolView(
            pool.name, hosts, pool.gpus, pool.min_hosts, pool.max_hosts, busy, queued, largest, largest > 0, ready_for
        )


def pool_views(
    model: ClusterModel, pools: Sequence[HostPool], heads: list[QueuedCell], quota_waits: Collection[str]
) -> list[PoolView]:
    """Each pool's share of the cluster: the cells waiting for it (``heads`` of the queue, but not those a quota
    holds back) and the largest request among the kernels it is home to."""
    queued: dict[str, int] = {}
    for cell in heads:
        home = home_pool(pools, cell.gpus, model.kernels[cell.kernel_id].wants)
        if home is not None and cell.kernel_id not in quota_waits:
            queued[home.name] = queued.get(home.name, 0) + cell.gpus
    largest: dict[str, tuple[int, Wants]] = {}
    for kernel in model.kernels.values():
        home = home_pool(pools, kernel.gpus, kernel.wants)
        if home is not None and kernel.gpus > largest.get(home.name, (0, ()))[0]:
            largest[home.name] = (kernel.gpus, kernel.wants)
    return [PoolView.of(model, p, queued.get(p.name, 0), *largest.get(p.name, (0, ()))) for p in pools]


def target_hosts(view: PoolView, settings: SchedulerSettings, ready_buffer: int | None = None) -> tuple[int, str]:
    """The host count the pool should have, and how it was computed.

    ``ready_buffer`` replaces ``settings.ready_host_buffer`` when given (sized from observed arrivals).
    """
    gph = max(1, view.gpus_per_host)
    queued_gpus = view.queued
    used = view.busy + (queued_gpus if settings.scale_for_queued_cells else 0)
    idle_buffer = settings.idle_host_buffer if view.homed else 0
    for_gpus = math.ceil(used * settings.scaling_factor / gph) + idle_buffer
    why = (
        f"{view.busy} GPUs committed"
        + (f" + {queued_gpus} queued" if settings.scale_for_queued_cells and queued_gpus else "")
        + f" x {settings.scaling_factor:g} / {gph} per host + {idle_buffer} idle = {for_gpus}"
    )
    target = max(view.min_hosts, for_gpus)
    largest = view.largest
    buffer = settings.ready_host_buffer if ready_buffer is None else ready_buffer
    if settings.policy == "notebookos" and buffer > 0 and largest > 0:
        # Hosts that cannot bind the largest request stay (they hold work); on top, keep the buffer of
        # hosts that can. Scale-in therefore only removes ready hosts beyond the buffer.
        # Ready: can bind the largest request and take one more replica of it (else no kernel can move there).
        cap, replicas = settings.subscription_ratio_cap, settings.replicas
        ready = sum(1 for h in view.ready_for(largest) if not h.cordoned and admits(h, largest, cap, replicas))
        in_service = sum(1 for h in view.hosts if not h.draining)
        for_ready = in_service - ready + buffer
        why += f"; {in_service - ready} hosts not ready for {largest} GPUs + {buffer} ready"
        why += f" = {for_ready}"
        target = max(target, for_ready)
    if settings.policy == "notebookos":
        pending = sum(h.pending for h in view.hosts)
        per_host = gph * settings.replicas * settings.subscription_ratio_cap
        for_ratio = math.ceil(pending / per_host) if per_host > 0 else 0
        why += f"; subscription cap needs {for_ratio}"
        target = max(target, for_ratio)
    why += f"; minimum {view.min_hosts}"
    if view.max_hosts and target > view.max_hosts:
        target = max(view.min_hosts, view.max_hosts)
        why += f"; maximum {view.max_hosts}"
    return target, why


def plan_round(
    model: ClusterModel,
    settings: SchedulerSettings,
    now: float,
    over_since: float | None,
    hosts_provisioning: int,
    view: PoolView,
    ready_buffer: int | None = None,
) -> tuple[ScalingDecision, float | None]:
    """One autoscaling round of one pool; returns the decision and the new 'over target since' time.

    Drains are recorded in the model (hosts marked draining, migrations begun).
    """
    in_service = [h for h in view.hosts if not h.draining]
    draining = sorted((h for h in view.hosts if h.draining), key=lambda h: h.name)
    current = len(in_service) + hosts_provisioning
    target, why = target_hosts(view, settings, ready_buffer)
    empty = tuple(h.name for h in draining if not h.replicas and h.committed == 0)

    if target > current:
        need = target - current
        undrain = [h for h in draining if h.name not in empty][:need] or draining[:need]
        for host in undrain:
            model.set_draining(host, False)
        return (
            ScalingDecision(
                "scale-out",
                current,
                target,
                why,
                add_hosts=need - len(undrain),
                undrain=tuple(h.name for h in undrain),
            ),
            None,
        )
    if target == current:
        action = "scale-in" if empty else "none"
        return ScalingDecision(action, current, target, why or "at target", remove=empty), None

    over_since = now if over_since is None else over_since
    if now - over_since < settings.scale_in_delay_s:
        wait = settings.scale_in_delay_s - (now - over_since)
        action = "scale-in" if empty else "none"
        return ScalingDecision(
            action, current, target, f"{why}; over target, waiting {wait:.0f}s more", remove=empty
        ), over_since

    budget = min(settings.max_scale_in_per_round, current - target)
    candidates = sorted(
        (h for h in in_service if h.committed == 0 and not _has_incoming(model, h)),
        key=lambda h: (len(h.replicas), h.name),
    )
    chosen: list[Host] = []
    plans: list[MigrationPlan] = []
    # Try a few candidates only: a failed drain is planned and undone, and the hosts beyond the first few
    # have more replicas, so they rarely succeed where those failed (the next round tries again).
    candidates = candidates[: budget * 4]
    leaving = {h.name for h in candidates}  # do not move replicas onto hosts about to go
    for host in candidates:
        if len(chosen) >= budget:
            break
        moved = _drain(model, host, settings, leaving)
        if moved is None:
            continue
        chosen.append(host)
        plans.extend(moved)
    if not chosen:
        action = "scale-in" if empty else "none"
        return ScalingDecision(
            action, current, target, f"{why}; over target but no idle host can be drained", remove=empty
        ), over_since
    now_empty = tuple(h.name for h in chosen if not h.replicas)
    return (
        ScalingDecision(
            "scale-in",
            current,
            target,
            why,
            drain=tuple(h.name for h in chosen),
            remove=empty + now_empty,
            migrations=tuple(plans),
        ),
        None,
    )


def plan_pools(
    model: ClusterModel,
    settings: SchedulerSettings,
    now: float,
    over_since: Mapping[str, float | None],
    provisioning: Mapping[str, int],
    views: list[PoolView],
) -> tuple[ScalingDecision, dict[str, float | None]]:
    """One round over every pool (see the module), as one decision."""
    parts: list[tuple[str, ScalingDecision]] = []
    since: dict[str, float | None] = {}
    for view in views:
        part, since[view.name] = plan_round(
            model, settings, now, over_since.get(view.name), provisioning.get(view.name, 0), view
        )
        parts.append((view.name, part))
    decisions = [d for _, d in parts]
    add_by_pool = tuple((name, d.add_hosts) for name, d in parts if d.add_hosts)
    if any(d.action == "scale-out" for d in decisions):
        action = "scale-out"
    elif any(d.action == "scale-in" for d in decisions):
        action = "scale-in"
    else:
        action = "none"
    reason = "; ".join(f"pool {name}: {d.target_hosts} ({d.reason})" for name, d in parts)
    return (
        ScalingDecision(
            action,
            sum(d.current_hosts for d in decisions),
            sum(d.target_hosts for d in decisions),
            reason,
            add_hosts=sum(d.add_hosts for d in decisions),
            undrain=tuple(n for d in decisions for n in d.undrain),
            drain=tuple(n for d in decisions for n in d.drain),
            remove=tuple(n for d in decisions for n in d.remove),
            migrations=tuple(m for d in decisions for m in d.migrations),
            add_by_pool=add_by_pool,
        ),
        since,
    )


def _has_incoming(model: ClusterModel, host: Host) -> bool:
    return any(plan.target == host.name or plan.source == host.name for plan in model.migrations.values())


def _drain(
    model: ClusterModel, host: Host, settings: SchedulerSettings, leaving: set[str]
) -> list[MigrationPlan] | None:
    """Begin moves for every replica on an idle host, or None (undoing them) if one cannot move."""
    cap = settings.subscription_ratio_cap
    plans: list[MigrationPlan] = []
    model.set_draining(host, True)
    for kernel_id, rid in list(host.replicas):
        kernel = model.kernels[kernel_id]
        target = (
            None
            if rid in kernel.moving or kernel.hold is not None
            else migration.best_target(model, kernel, cap, settings.replicas, leaving | {host.name})
        )
        if target is None:
            for plan in plans:
                migration.abort(model, model.kernels[plan.kernel_id], plan)
            model.set_draining(host, False)
            return None
        why = f"draining {host.name} for scale-in; {target.name} is the least subscribed host that accepts it"
        plans.append(migration.begin(model, kernel, rid, target, "drain", why))
    return plans
