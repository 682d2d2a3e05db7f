"""The dashboard's history: the cluster sampled every few seconds into a bounded ring, and GPU-hours per user and day.

Gauges say how the cluster is now and Prometheus keeps their past where one scrapes the gateway; the dashboard
also shows the last hours without one. :class:`ClusterHistory` is a round
(:class:`~jupyter_notebookos.gateway.upkeep.rounds.PeriodicRounds`) that every ``interval`` seconds

- takes a :class:`HistorySample`: GPUs and committed GPUs, cells waiting and the longest wait, the queue-wait
  percentiles of the cells that started since the last sample (from the ``notebookos_cell_queued_seconds``
  histogram's buckets, interpolated as Prometheus' ``histogram_quantile`` does: no per-cell work), and each user's
  GPU-seconds in the interval; it keeps ``hours`` of them in memory (:class:`HistoryRing`);
- adds each kernel's new GPU-seconds (finished cells and the running one so far) to :class:`~.usage.GpuUsage`,
  which keeps them per user and UTC day, and per kernel, in etcd (written every ``usage_write_interval``, read back
  at start: they survive a gateway restart);
- reads the machines once (:class:`~.readings.MachineReadings`: replica memory, this machine's memory, NVML).

``GET /api/notebookos/history`` serves :meth:`ClusterHistory.snapshot`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import Histogram
from traitlets import Float, Integer
from traitlets.config import LoggingConfigurable

from jupyter_notebookos.coordination.client import Coordinator
from jupyter_notebookos.gateway.control.platformmetrics import PlatformMetrics
from jupyter_notebookos.gateway.control.readings import MachineReadings
from jupyter_notebookos.gateway.control.records import KernelRecord
from jupyter_notebookos.gateway.control.usage import ADMIN_NAME, GpuUsage, UsageFlush
from jupyter_notebookos.gateway.control.views import PlatformViews
from jupyter_notebookos.gateway.router import ReplicaRouter
from jupyter_notebookos.gateway.upkeep.rounds import PeriodicRounds

#: The queue-wait percentiles each sample carries.
QUANTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))

#: A histogram's buckets: (upper bound in seconds, cumulative count), ascending, ``+Inf`` last.
Buckets = list[tuple[float, float]]


def histogram_buckets(histogram: Histogram) -> Buckets:
    """The cumulative bucket counts of an unlabelled ``prometheus_client`` histogram."""
    buckets = []
    for metric in histogram.collect():
        for sample in metric.samples:
            if sample.name.endswith("_bucket"):
                buckets.append((float(sample.labels["le"]), float(sample.value)))
    return sorted(buckets)


def quantile(q: float, before: Buckets, after: Buckets) -> float | None:
    """The ``q`` quantile of the observations made between two readings of a histogram's buckets (None: none
    were made), interpolated linearly within the bucket it falls in, as Prometheus' ``histogram_quantile`` does;
    one in the ``+Inf`` bucket is the largest finite bound."""
    earlier = dict(before)
    counts = [(bound, count - earlier.get(bound, 0.0)) for bound, count in after]
    total = counts[-1][1] if counts else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, cumulative in counts:
        if cumulative >= rank:
            if math.isinf(bound):
                return lower
            if cumulative == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (cumulative - below)
        lower, below = bound, cumulative
    return lower


@dataclass(frozen=True)
class HistorySample:
    """The cluster at one moment, and what happened since the previous sample."""

    at: float  # Unix time
    gpus: int
    gpus_committed: int
    gpus_pending: int
    queued_cells: int
    longest_wait_seconds: float  # of the cells waiting now
    cells_started: int  # since the previous sample
    queue_wait_seconds: dict[str, float | None]  # p50, p95, p99 of the cells that started since the previous sample
    gpu_seconds_by_user: dict[str, float] = field(default_factory=dict)  # since the previous sample

    def to_json(self) -> dict[str, Any]:
        return {
            "at": round(self.at, 3),
            "gpus": self.gpus,
            "gpus_committed": self.gpus_committed,
            "gpus_pending": self.gpus_pending,
            "queued_cells": self.queued_cells,
            "longest_wait_seconds": round(self.longest_wait_seconds, 3),
            "cells_started": self.cells_started,
            "queue_wait_seconds": {k: None if v is None else round(v, 6) for k, v in self.queue_wait_seconds.items()},
            "gpu_seconds_by_user": {k: round(v, 3) for k, v in self.gpu_seconds_by_user.items()},
        }


class HistoryRing:
    """The last ``capacity`` samples, oldest first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a history keeps at least one sample, not {capacity}")
        self._samples: deque[HistorySample] = deque(maxlen=capacity)

    @property
    def capacity(self) -> int:
        return self._samples.maxlen or 0

    def __len__(self) -> int:
        return len(self._samples)

    def add(self, sample: HistorySample) -> None:
        self._samples.append(sample)

    def since(self, at: float) -> list[HistorySample]:
        """The samples taken after Unix time ``at``, oldest first."""
        return [s for s in self._samples if s.at > at]


class GpuSecondsCounter:
    """Each kernel's GPU-seconds since it was last counted, from its router's running total.

    A router counts its kernel's GPU-seconds from its own start (finished cells, and the running cell so far). A
    kernel that ended, or was restarted (a new router), is read one last time from its old router, so no second
    is lost between samples. ``owner_of`` names a kernel's owner (``""``: the admin).
    """

    def __init__(self, owner_of: Callable[[KernelRecord], str]) -> None:
        self._owner_of = owner_of
        self._seen: dict[str, tuple[ReplicaRouter, str, float]] = {}  # kernel -> router, owner, seconds counted

    def counted(self, kernel_id: str) -> float:
        """What the kernel's current router had counted at the last call of :meth:`take`."""
        seen = self._seen.get(kernel_id)
        return seen[2] if seen is not None else 0.0

    def take(self, kernels: Mapping[str, KernelRecord]) -> list[tuple[str, str, float]]:
        """``(kernel, owner, new GPU-seconds)`` of every kernel now running or gone since the last call."""
        out: list[tuple[str, str, float]] = []
        current = dict(kernels.items())
        for kernel_id in [k for k in self._seen if k not in current or current[k].router is not self._seen[k][0]]:
            router, owner, counted = self._seen.pop(kernel_id)
            out.append((kernel_id, owner, max(0.0, _router_gpu_seconds(router) - counted)))
        for kernel_id, record in current.items():
            total = _router_gpu_seconds(record.router)
            seen = self._seen.get(kernel_id)
            owner = seen[1] if seen is not None else self._owner_of(record)
            out.append((kernel_id, owner, max(0.0, total - (seen[2] if seen is not None else 0.0))))
            self._seen[kernel_id] = (record.router, owner, total)
        return out


def _router_gpu_seconds(router: ReplicaRouter) -> float:
    summary = router.summary()
    return float(summary["gpu_seconds_used"]) + float(summary.get("gpu_seconds_running") or 0.0)


class HistoryHost(Protocol):
    """What the history reads of the gateway platform (which implements it)."""

    @property
    def views(self) -> PlatformViews: ...

    @property
    def kernels(self) -> Mapping[str, KernelRecord]: ...

    @property
    def metrics(self) -> PlatformMetrics: ...

    @property
    def coordinator(self) -> Coordinator | None: ...


@dataclass(frozen=True)
class HistoryRound:
    """What one round did (one debug line; a warning only when it wrote to etcd and found something odd)."""

    sample: HistorySample
    flushed: UsageFlush | None = None

    @property
    def acted(self) -> bool:
        return False

    def __str__(self) -> str:
        s = self.sample
        line = f"history: {s.gpus_committed}/{s.gpus} GPUs committed, {s.queued_cells} cell(s) waiting"
        return f"{line}; {self.flushed}" if self.flushed is not None else line


class ClusterHistory(PeriodicRounds, LoggingConfigurable):
    """The dashboard's history of the cluster, and GPU-seconds per user and day kept over restarts."""

    activity = "sampling the cluster's history"

    interval = Float(
        15.0,
        config=True,
        help="Seconds between two samples of the cluster for the dashboard's history (GPUs committed, cells "
        "waiting, queue-wait percentiles, GPU-seconds per user) and of replica memory and GPU utilisation. "
        "0: no history.",
    )
    hours = Float(6.0, config=True, help="Hours of samples the gateway keeps in memory (hours * 3600 / interval).")
    usage_write_interval = Float(
        60.0,
        config=True,
        help="Seconds between two writes of the GPU-seconds per user and day (and per kernel) to etcd; a gateway "
        "that dies loses at most this much of them.",
    )
    usage_days = Integer(90, config=True, help="Days (UTC) of GPU-seconds per user kept in etcd.")

    def __init__(
        self,
        platform: HistoryHost,
        *,
        owner_of: Callable[[KernelRecord], str],
        readings: MachineReadings,
        clock: Callable[[], float] = time.time,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.platform = platform
        self.readings = readings
        self.usage = GpuUsage(retention_days=self.usage_days)
        self.ring = HistoryRing(max(1, math.ceil(self.hours * 3600.0 / self.interval)) if self.interval > 0 else 1)
        self._counter = GpuSecondsCounter(owner_of)
        self._clock = clock
        self._buckets: Buckets = histogram_buckets(platform.metrics.queued_seconds)
        self._written_at = clock()

    # -- lifecycle ----------------------------------------------------------------------------------

    async def load(self) -> int:
        """Read the GPU-seconds a previous gateway wrote; forget those of kernels that ended meanwhile (call after
        the platform re-attached its kernels). Returns how many totals were read."""
        coordinator = self.platform.coordinator
        if coordinator is None:
            return 0
        loaded = await self.usage.load(coordinator)
        self.usage.keep_only(set(self.platform.kernels))
        self.usage.prune(self._clock())
        self._count(self._clock())  # re-attached kernels' routers count from their own start, after those totals
        return loaded

    async def stop(self) -> None:
        """Stop sampling; count the last GPU-seconds and write them (before the platform stops its kernels)."""
        await super().stop()
        if self.interval > 0:
            self._count(self._clock())
            coordinator = self.platform.coordinator
            if coordinator is not None:
                await self.usage.flush(coordinator)

    # -- rounds -------------------------------------------------------------------------------------

    async def run_round(self) -> HistoryRound:
        return await self.sample()

    async def sample(self) -> HistoryRound:
        """Take one sample (and write the usage totals when they are due)."""
        now = self._clock()
        view = self.platform.views.cluster_snapshot()
        # psutil and NVML read /proc and the driver: in a thread, so a large cluster's readings never hold the loop
        # (and the cells it serves) for long. The view is this round's own: nothing else touches it meanwhile.
        await asyncio.to_thread(self.readings.refresh, view["kernels"], [h["name"] for h in view["hosts"]])
        buckets = histogram_buckets(self.platform.metrics.queued_seconds)
        previous, self._buckets = self._buckets, buckets
        started = (buckets[-1][1] - dict(previous).get(buckets[-1][0], 0.0)) if buckets else 0.0
        sample = HistorySample(
            at=round(now, 3),  # as the JSON says it: ?since= that time is after this sample
            gpus=sum(h["gpus"] for h in view["hosts"]),
            gpus_committed=sum(h["gpus_committed"] for h in view["hosts"]),
            gpus_pending=sum(h["gpus_pending"] for h in view["hosts"]),
            queued_cells=len(view["queue"]),
            longest_wait_seconds=max((q["waiting_ms"] / 1000.0 for q in view["queue"]), default=0.0),
            cells_started=int(started),
            queue_wait_seconds={name: quantile(q, previous, buckets) for name, q in QUANTILES},
            gpu_seconds_by_user=self._count(now),
        )
        self.ring.add(sample)
        flushed = None
        coordinator = self.platform.coordinator
        if coordinator is not None and now - self._written_at >= self.usage_write_interval:
            self.usage.prune(now)
            flushed = await self.usage.flush(coordinator)
            self._written_at = now
        return HistoryRound(sample, flushed)

    def _count(self, now: float) -> dict[str, float]:
        by_user: dict[str, float] = {}
        for kernel_id, owner, seconds in self._counter.take(self.platform.kernels):
            self.usage.add(kernel_id, owner, seconds, now)
            if kernel_id not in self.platform.kernels:
                self.usage.forget_kernel(kernel_id)
            if seconds > 0:
                user = owner or ADMIN_NAME
                by_user[user] = by_user.get(user, 0.0) + seconds
        return by_user

    # -- reading ------------------------------------------------------------------------------------

    def snapshot(self, since: float = 0.0) -> dict[str, Any]:
        """The body of ``GET /api/notebookos/history?since=T``: the samples after Unix time ``T`` and GPU-hours per
        user and day."""
        return {
            "interval": self.interval,
            "capacity": self.ring.capacity,
            "samples": [s.to_json() for s in self.ring.since(since)],
            "gpu_hours_per_user_per_day": self.usage.per_user_per_day(),
            "usage_days": self.usage.retention_days,
        }

    def annotate(self, view: dict[str, Any]) -> None:
        """Add to ``view`` (the cluster view, before users' views are cut from it) each kernel's GPU-seconds over
        gateway restarts (``gpu_seconds_total``) and the machines' latest readings
        (:meth:`~.readings.MachineReadings.annotate`)."""
        for kernel in view["kernels"]:
            self.annotate_kernel(kernel)
        self.readings.annotate(view)

    def annotate_kernel(self, kernel: dict[str, Any]) -> None:
        """Add ``gpu_seconds_total`` to ``kernel`` (a kernel's view): its GPU-seconds over gateway restarts, now
        (the totals as of the last sample, plus what its router counted since)."""
        now_counted = float(kernel["gpu_seconds_used"]) + float(kernel.get("gpu_seconds_running") or 0.0)
        extra = max(0.0, now_counted - self._counter.counted(kernel["kernel_id"]))
        kernel["gpu_seconds_total"] = round(self.usage.kernel_total(kernel["kernel_id"]) + extra, 3)


__all__ = [
    "ClusterHistory",
    "GpuSecondsCounter",
    "HistoryRing",
    "HistorySample",
    "histogram_buckets",
    "quantile",
]
