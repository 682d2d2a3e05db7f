"""Replica placement: distinct hosts, least subscribed first, admission by the subscription ratio."""

from __future__ import annotations

from .cluster import ClusterModel, Host, Kernel
from .decisions import Placement, PlacementRefused, ReplicaSlot
from .settings import SchedulerSettings
from .subscription import admits, ratio_after


def place_replicas(
    model: ClusterModel,
    kernel: Kernel,
    count: int,
    limit: float,
    settings: SchedulerSettings,
    why: str = "least subscribed hosts",
) -> Placement | PlacementRefused:
    """Place ``count`` more replicas of ``kernel`` on hosts it does not use yet, and record them.

    All-or-nothing: if fewer than ``count`` hosts qualify, nothing is recorded and the refusal says why.
    """
    replicas = settings.replicas
    gpus = kernel.gpus
    exclude = kernel.hosts_in_use()
    widest = max(1, model.max_host_gpus)

    def fits(host: Host) -> bool:
        return admits(host, gpus, limit, replicas)

    def give_up(host: Host) -> bool:
        # The heap is ordered by pending / gpus; no later host can fit once even the widest cannot.
        return host.pending / max(1, host.gpus) + gpus / widest > limit * max(1, replicas) + 1e-9

    hosts = model.least_subscribed(count, fits, exclude, give_up)
    if len(hosts) < count:
        return _refusal(model, kernel, count, len(hosts), exclude, limit, settings)
    ratios = ", ".join(f"{ratio_after(h, gpus, replicas):.2f}" for h in hosts)
    slots = tuple(ReplicaSlot(kernel.kernel_id, model.add_replica(kernel, h), h.name) for h in hosts)
    return Placement(kernel.kernel_id, gpus, slots, f"{why} (ratios after placement {ratios}; limit {limit:.2f})")


def _refusal(
    model: ClusterModel,
    kernel: Kernel,
    count: int,
    found: int,
    exclude: set[str],
    limit: float,
    settings: SchedulerSettings,
) -> PlacementRefused:
    # Only on the refusal path: a full scan to explain precisely what is missing.
    hosts = [h for h in model.hosts.values() if h.name not in exclude]
    cordoned = sum(1 for h in hosts if h.cordoned)
    draining = sum(1 for h in hosts if h.draining and not h.cordoned)
    open_hosts = [h for h in hosts if h.placeable]
    too_small = sum(1 for h in open_hosts if h.gpus < kernel.gpus)
    over = len(open_hosts) - too_small - found
    need = f"{count} distinct hosts needed"
    if len(open_hosts) < count:
        reason = (
            f"only {len(open_hosts)} hosts accept new replicas ({cordoned} cordoned, {draining} draining, "
            f"{len(exclude)} already hold this kernel), {need}"
        )
    else:
        reason = (
            f"only {found} hosts qualify, {need}: {over} would rise above the subscription ratio limit "
            f"{limit:.2f} (cap {settings.subscription_ratio_cap:.2f})"
        )
        if too_small:
            reason += f", {too_small} have fewer than {kernel.gpus} GPUs"
    helps = kernel.gpus <= settings.gpus_per_host
    return PlacementRefused(kernel.kernel_id, kernel.gpus, reason, count - found, helps)
