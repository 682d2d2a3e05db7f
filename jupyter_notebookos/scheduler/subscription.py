"""Subscription ratios: how oversubscribed a host is, and the cluster-wide limit admission enforces.

A host's ratio is its pending GPUs / its GPUs / replicas per kernel. The cluster ratio is demand (the
GPU requests of all kernels) / busy (committed) GPUs: how many GPUs of demand each busy GPU has carried.
It is smoothed with a time-based EWMA (the caller passes the time in) and capped; a host may take a new
replica only if its ratio stays at or below that limit.
"""

from __future__ import annotations

from .cluster import Host
from .gputypes import Wants

# Float slack so that exactly reaching the limit is admitted.
_EPSILON = 1e-9


class ClusterRatio:
    """The smoothed, capped cluster subscription ratio (an EWMA over time)."""

    __slots__ = ("_half_life_s", "_last_t", "_sample", "_value", "cap")

    def __init__(self, cap: float, half_life_s: float) -> None:
        self.cap = cap
        self._half_life_s = half_life_s
        self._sample = cap
        self._value = cap
        self._last_t: float | None = None

    def observe(self, now: float, demand: int, busy: int) -> None:
        """Fold in the time since the last observation, then take a new sample."""
        if self._last_t is not None and now > self._last_t:
            if self._half_life_s > 0:
                weight = 1.0 - 2.0 ** (-(now - self._last_t) / self._half_life_s)
                self._value += weight * (self._sample - self._value)
            else:
                self._value = self._sample
        if self._last_t is None or now > self._last_t:
            self._last_t = now
        raw = demand / busy if busy else self.cap
        self._sample = min(self.cap, max(1.0, raw))
        if self._half_life_s <= 0:
            self._value = self._sample

    @property
    def limit(self) -> float:
        """The ratio no host may exceed after a placement: the smoothed value, between 1 and the cap."""
        return min(self.cap, max(1.0, self._value))

    @property
    def sample(self) -> float:
        """The latest unsmoothed (but capped) demand / busy ratio."""
        return self._sample


def admits(host: Host, extra_pending: int, limit: float, replicas_per_kernel: int, wants: Wants = ()) -> bool:
    """Whether ``host`` stays at or below ``limit`` with ``extra_pending`` more GPUs pending, and has GPUs of a
    type in ``wants`` (see ``gputypes``) to bind them."""
    if wants and not host.serves(wants):
        return False  # no device of a type the kernel asks for
    if (host.gpus if not wants and host.general else host.capacity(wants)) < extra_pending:
        return False  # a replica there could never bind the kernel's GPUs
    return host.pending + extra_pending <= limit * host.gpus * max(1, replicas_per_kernel) + _EPSILON


def ratio_after(host: Host, extra_pending: int, replicas_per_kernel: int) -> float:
    """The host's subscription ratio with ``extra_pending`` more GPUs pending."""
    if host.gpus == 0:
        return float("inf")
    return (host.pending + extra_pending) / host.gpus / max(1, replicas_per_kernel)
