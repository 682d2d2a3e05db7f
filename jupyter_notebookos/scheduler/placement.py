"""Replica placement: distinct hosts, least subscribed first, admission by the subscription ratio.

With ``headroom_placement`` (NotebookOS), one replica of a new kernel goes where its next cell can bind
the kernel's whole request at once: a host with that many idle GPUs (best fit, so small kernels do not
break up whole hosts; the largest requests take the most idle host). Otherwise the kernel's first cell
would often find none of its three hosts free and wait for a migration, and under the production idle
culler most kernels are new. The other replicas go to the least subscribed hosts as before.
"""

from __future__ import annotations

from .cluster import ClusterModel, Host, Kernel
from .decisions import Placement, PlacementRefused, ReplicaSlot
from .gputypes import describe
from .pools import home_pool
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
    wants = kernel.wants
    exclude = kernel.hosts_in_use()
    widest = max(1, model.max_host_gpus)

    def fits(host: Host) -> bool:
        return admits(host, gpus, limit, replicas, wants)

    def give_up(host: Host) -> bool:
        # The heap is ordered by pending / gpus; no later host can fit once even the widest cannot.
        return host.pending / max(1, host.gpus) + gpus / widest > limit * max(1, replicas) + 1e-9

    hosts: list[Host] = []
    if settings.headroom_placement and settings.policy == "notebookos" and count > 0 and gpus > 0:
        roomy = host_with_headroom(model, kernel, limit, replicas, {})
        if roomy is not None:
            rest = model.least_subscribed(count - 1, fits, exclude | {roomy.name}, give_up)
            if len(rest) == count - 1:
                hosts = [roomy, *rest]
                why = f"{why}, one with {roomy.idle_for(wants)} idle GPUs for the next cell"
    if not hosts:
        hosts = model.least_subscribed(count, fits, exclude, give_up)
    if len(hosts) < count:
        return _refusal(model, kernel, count, len(hosts), exclude, limit, settings)
    ratios = ", ".join(f"{ratio_after(h, gpus, replicas):.2f}" for h in hosts)
    slots = tuple(ReplicaSlot(kernel.kernel_id, model.add_replica(kernel, h), h.name) for h in hosts)
    return Placement(kernel.kernel_id, gpus, slots, f"{why} (ratios after placement {ratios}; limit {limit:.2f})")


def host_with_headroom(
    model: ClusterModel, kernel: Kernel, limit: float, replicas: int, claimed: dict[str, int]
) -> Host | None:
    """A host, not yet used by ``kernel``, that admits a replica and can bind its whole request now.

    The largest requests take the host with the most unclaimed idle GPUs; smaller ones the host with the
    fewest that still suffice (best fit), so they do not break up the hosts the largest requests need.
    Ties go to the least subscribed host. ``claimed`` maps hosts to idle GPUs already counted on.
    """
    exclude = kernel.hosts_in_use()
    if kernel.wants:
        return _typed_headroom(model, kernel, limit, replicas, claimed, exclude)
    largest = model.max_host_gpus
    tiers = range(kernel.gpus, largest + 1)
    if kernel.gpus >= model.largest_request:
        tiers = range(largest, kernel.gpus - 1, -1)
    for idle in tiers:
        best: tuple[float, str] | None = None
        found: Host | None = None
        for name in model.idle_tier(idle):
            if name in exclude or idle - claimed.get(name, 0) < kernel.gpus:
                continue
            host = model.hosts[name]
            if not host.placeable or not admits(host, kernel.gpus, limit, replicas):
                continue
            key = (host.pending / host.gpus, name)
            if best is None or key < best:
                best, found = key, host
        if found is not None:
            return found
    return None


def _typed_headroom(
    model: ClusterModel, kernel: Kernel, limit: float, replicas: int, claimed: dict[str, int], exclude: set[str]
) -> Host | None:
    """:func:`host_with_headroom` for a kernel that names GPU types: the most preferred type first, then as
    for untyped kernels (the largest requests the most idle host, others the best fit)."""
    largest = kernel.gpus >= model.largest_request
    for kind in kernel.wants:
        best: tuple[int, float, str] | None = None
        found: Host | None = None
        for name in model.by_type.get(kind, ()):
            host = model.hosts[name]
            spare = host.idle_for((kind,)) - claimed.get(name, 0)
            if name in exclude or spare < kernel.gpus or not host.runnable or not host.placeable:
                continue
            if not admits(host, kernel.gpus, limit, replicas, kernel.wants):
                continue
            key = (-spare if largest else spare, host.pending / host.gpus, name)
            if best is None or key < best:
                best, found = key, host
        if found is not None:
            return found
    return None


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
    too_small = sum(1 for h in open_hosts if h.capacity(kernel.wants) < kernel.gpus)
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
            of_type = f" of type {describe(kernel.wants)}" if kernel.wants else ""
            reason += f", {too_small} have fewer than {kernel.gpus} GPUs{of_type}"
    if settings.pools:  # adding a host of the kernel's home pool would help
        helps = home_pool(settings.pools, kernel.gpus, kernel.wants) is not None
    else:
        helps = kernel.gpus <= settings.gpus_per_host and not kernel.wants
    return PlacementRefused(kernel.kernel_id, kernel.gpus, reason, count - found, helps)
