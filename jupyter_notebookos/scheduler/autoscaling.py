"""Autoscaling: a periodic decision from the GPUs in use.

target = max(min_hosts, ceil(committed x scaling_factor / gpus_per_host) + idle_host_buffer, hosts the
subscription cap needs for the pending GPUs, and under NotebookOS the hosts that cannot bind the largest
kernel request plus ``ready_host_buffer`` that can). Queued cells' GPUs count as committed when
``scale_for_queued_cells`` is set (otherwise a saturated cluster could never see it needs more). Scale out
at once by the difference (putting draining hosts back first); scale in slowly: only after being over the
target for ``scale_in_delay_s``, at most ``max_scale_in_per_round`` idle hosts per round, each drained by
migration first and removed once empty.
"""

from __future__ import annotations

import math

from . import migration
from .cluster import ClusterModel, Host
from .decisions import MigrationPlan, ScalingDecision
from .settings import SchedulerSettings
from .subscription import admits


def target_hosts(
    model: ClusterModel, settings: SchedulerSettings, queued_gpus: int, ready_buffer: int | None = None
) -> tuple[int, str]:
    """The host count the cluster should have, and how it was computed.

    ``ready_buffer`` replaces ``settings.ready_host_buffer`` when given (sized from observed arrivals).
    """
    gph = max(1, settings.gpus_per_host)
    used = model.busy + (queued_gpus if settings.scale_for_queued_cells else 0)
    for_gpus = math.ceil(used * settings.scaling_factor / gph) + settings.idle_host_buffer
    why = (
        f"{model.busy} GPUs committed"
        + (f" + {queued_gpus} queued" if settings.scale_for_queued_cells and queued_gpus else "")
        + f" x {settings.scaling_factor:g} / {gph} per host + {settings.idle_host_buffer} idle = {for_gpus}"
    )
    target = max(settings.min_hosts, for_gpus)
    largest = model.largest_request
    buffer = settings.ready_host_buffer if ready_buffer is None else ready_buffer
    if settings.policy == "notebookos" and buffer > 0 and largest > 0:
        # Hosts that cannot bind the largest request stay (they hold work); on top, keep the buffer of
        # hosts that can. Scale-in therefore only removes ready hosts beyond the buffer.
        # Ready: can bind the largest request and take one more replica of it (else no kernel can move there).
        cap, replicas = settings.subscription_ratio_cap, settings.replicas
        ready = sum(1 for h in model.hosts_with_idle(largest) if not h.cordoned and admits(h, largest, cap, replicas))
        in_service = sum(1 for h in model.hosts.values() if not h.draining)
        for_ready = in_service - ready + buffer
        why += f"; {in_service - ready} hosts not ready for {largest} GPUs + {buffer} ready"
        why += f" = {for_ready}"
        target = max(target, for_ready)
    if settings.policy == "notebookos":
        pending = sum(h.pending for h in model.hosts.values())
        per_host = gph * settings.replicas * settings.subscription_ratio_cap
        for_ratio = math.ceil(pending / per_host) if per_host > 0 else 0
        why += f"; subscription cap needs {for_ratio}"
        target = max(target, for_ratio)
    return target, why + f"; minimum {settings.min_hosts}"


def plan_round(
    model: ClusterModel,
    settings: SchedulerSettings,
    now: float,
    over_since: float | None,
    hosts_provisioning: int,
    queued_gpus: int,
    ready_buffer: int | None = None,
) -> tuple[ScalingDecision, float | None]:
    """One autoscaling round; returns the decision and the new 'over target since' time.

    Drains are recorded in the model (hosts marked draining, migrations begun).
    """
    in_service = [h for h in model.hosts.values() if not h.draining]
    draining = sorted((h for h in model.hosts.values() if h.draining), key=lambda h: h.name)
    current = len(in_service) + hosts_provisioning
    target, why = target_hosts(model, settings, queued_gpus, ready_buffer)
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
