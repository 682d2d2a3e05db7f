"""Buffer sizing from observed arrivals: how many ready hosts the next provisioning lead time needs.

A ready host (one that can bind the largest kernel request) is used up by each cell of that size that
arrives while none of its kernel's replica hosts is free, and a replacement takes a host provisioning lead
time to arrive. A fixed count of ready hosts is too many at night and too few at the busiest hour. So the
scheduler counts the recent arrivals of cells asking for the largest request, estimates their rate over a
trailing window, and keeps as many ready hosts as the arrivals during one lead time reach with the given
probability (a Poisson quantile), within a floor and a ceiling.

Pure: callers pass ``now``; nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


def poisson_quantile(mean: float, probability: float) -> int:
    """The smallest k with P(N <= k) >= ``probability`` for N ~ Poisson(``mean``)."""
    if mean <= 0:
        return 0
    if not 0 < probability < 1:
        raise ValueError(f"the probability must be between 0 and 1 (exclusive), got {probability}")
    term = math.exp(-mean)
    if term == 0.0:  # a huge mean: the normal approximation is exact enough
        return max(0, math.ceil(mean + _normal_quantile(probability) * math.sqrt(mean)))
    k, total = 0, term
    while total < probability:
        k += 1
        term *= mean / k
        total += term
    return k


def _normal_quantile(p: float) -> float:
    # Acklam's rational approximation is overkill here; bisection on erf is short and exact enough.
    lo, hi = -10.0, 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True, slots=True)
class ReadyBuffer:
    """The ready-host buffer of one autoscaling round and why (``str()`` is one readable line)."""

    hosts: int
    arrivals: int
    window_s: float
    expected: float

    def __str__(self) -> str:
        return (
            f"{self.hosts} ready (from {self.arrivals} large-cell arrivals in {self.window_s:.0f} s: "
            f"{self.expected:.2f} expected per lead time)"
        )


class ArrivalLog:
    """Times of recent arrivals of cells asking for at least a given number of GPUs (bounded by a window)."""

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError("the arrival window must be > 0 seconds")
        self.window_s = window_s
        self._times: deque[tuple[float, int]] = deque()

    def record(self, now: float, gpus: int) -> None:
        """A cell asking for ``gpus`` GPUs arrived at ``now`` (times never go back)."""
        self._times.append((now, gpus))
        self._expire(now)

    def count(self, now: float, min_gpus: int) -> int:
        """Arrivals in the trailing window that asked for at least ``min_gpus`` GPUs."""
        self._expire(now)
        return sum(1 for _, g in self._times if g >= min_gpus)

    def _expire(self, now: float) -> None:
        while self._times and self._times[0][0] <= now - self.window_s:
            self._times.popleft()

    def ready_buffer(
        self, now: float, min_gpus: int, lead_s: float, probability: float, floor: int, ceiling: int
    ) -> ReadyBuffer:
        """Ready hosts enough for the arrivals of one lead time with ``probability``, within [floor, ceiling]."""
        arrivals = self.count(now, min_gpus)
        expected = arrivals / self.window_s * lead_s
        hosts = min(max(poisson_quantile(expected, probability), floor), max(floor, ceiling))
        return ReadyBuffer(hosts, arrivals, self.window_s, expected)
