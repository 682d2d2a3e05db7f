"""What one simulated policy run measured, and its summary in the `--json` schema.

Integrals (GPU-hours) are exact: the simulator reports every change of a level (hosts up, GPUs training)
with its time, and each piecewise-constant level is integrated over the measurement interval
[`measure_start_s`, `measure_end_s`). Delays count for cells submitted inside that interval; migrations,
hosts added (`scale_outs`) and removed (`scale_ins`) and restores (Batch: every cell; NotebookOS: kernels
restarted after the idle culler) count when they begin inside it; `restored_gb` is the state that restores and
migrations begun inside it read from the object store. `late_by_cause` counts the cells later than
`IMMEDIATE_S` by what they waited for (`TAIL_CAUSES`), `p99_tail_by_cause` those of them at or above p99.

With users (sessions that have owners), `users` gives each user's cells, GPU-hours and delay percentiles, and
`jain_index` is Jain's fairness index, (sum x)^2 / (n sum x^2), over the users' service ratios: x is the mean
over a user's cells of run / (run + wait), the share of a cell's time to result spent running (1: it never
waited; a 10 ms cell that waits 10 ms: 0.5). 1 when every user's cells wait the same share of their time,
1/n when one user's cells never wait and everyone else's wait forever.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

IMMEDIATE_S = 1.0  # a cell that starts within this many seconds of submission counts as immediate

# What a late cell waited for, coarsely, for the tail breakdown. A cell that waited for several things is
# counted under the first of these its causes name (the order is that of their usual cost).
TAIL_CAUSES = (
    ("host provisioning", ("scale-out",)),
    ("migration", ("migration",)),
    ("kernel start / restore", ("kernel start", "kernel restart", "fresh replica")),
    ("queueing", ("queue",)),
)


def tail_cause(cause: str) -> str:
    """The coarse category (see `TAIL_CAUSES`) of a cell's detailed wait description."""
    for name, markers in TAIL_CAUSES:
        if any(marker in cause for marker in markers):
            return name
    return "other"


class Level:
    """A piecewise-constant quantity over time, integrated over [lo, hi) and sampled for plots."""

    __slots__ = ("_hi", "_lo", "_t", "integral", "samples_t", "samples_v", "value")

    def __init__(self, lo: float, hi: float, start: float, value: float = 0.0) -> None:
        self._lo = lo
        self._hi = hi
        self._t = start
        self.value = value
        self.integral = 0.0
        self.samples_t: list[float] = [start]
        self.samples_v: list[float] = [value]

    def set(self, now: float, value: float) -> None:
        """The level is `value` from `now` on (times never go back)."""
        if value == self.value:
            return
        self._advance(now)
        self.value = value
        self.samples_t.append(now)
        self.samples_v.append(value)

    def add(self, now: float, delta: float) -> None:
        """Change the level by `delta` at `now`."""
        self.set(now, self.value + delta)

    def _advance(self, now: float) -> None:
        lo = max(self._t, self._lo)
        hi = min(now, self._hi)
        if hi > lo:
            self.integral += self.value * (hi - lo)
        self._t = max(self._t, now)

    def close(self, now: float) -> None:
        """Integrate up to `now` (the end of the run)."""
        self._advance(now)
        self.samples_t.append(now)
        self.samples_v.append(self.value)


@dataclass
class PolicyMetrics:
    """Counters and levels of one policy run."""

    policy: str
    measure_start_s: float
    measure_end_s: float
    provisioned_gpus: Level
    busy_gpus: Level
    committed_gpus: Level
    delays_s: list[float] = field(default_factory=list)
    tasks_run: int = 0
    migrations: int = 0
    scale_outs: int = 0
    scale_ins: int = 0
    rejected_cells: int = 0
    restores: int = 0
    restored_bytes: int = 0  # state read from the object store by restores and migrations
    end_s: float = 0.0
    decision_counts: dict[str, int] = field(default_factory=dict)
    late_causes: dict[str, int] = field(default_factory=dict)
    delay_causes: list[str] = field(default_factory=list)  # parallel to delays_s
    user_delays: dict[str, list[float]] = field(default_factory=dict)
    user_gpu_s: dict[str, float] = field(default_factory=dict)  # GPU-seconds of the user's measured cells
    user_ratio: dict[str, float] = field(default_factory=dict)  # sum over the user's cells of run / (run + wait)

    @classmethod
    def start(cls, policy: str, t0: float, measure_start_s: float, measure_end_s: float) -> PolicyMetrics:
        """Fresh metrics for a run that begins at `t0`."""
        lo, hi = measure_start_s, measure_end_s
        return cls(policy, lo, hi, Level(lo, hi, t0), Level(lo, hi, t0), Level(lo, hi, t0))

    def measuring(self, now: float) -> bool:
        """Whether an event at `now` counts (inside the measured interval)."""
        return self.measure_start_s <= now < self.measure_end_s

    def record_start(
        self,
        submit_s: float,
        start_s: float,
        cause: str = "",
        user: str | None = None,
        run_s: float = 0.0,
        gpus: int = 0,
    ) -> None:
        """A task started executing; its delay counts if it was submitted inside the measured interval.

        `cause` says what it waited for; cells later than `IMMEDIATE_S` are counted by cause. `user` owns it;
        it will run `run_s` seconds on `gpus` GPUs (the per-user figures).
        """
        self.tasks_run += 1
        if self.measure_start_s <= submit_s < self.measure_end_s:
            delay = start_s - submit_s
            self.delays_s.append(delay)
            self.delay_causes.append(cause)
            if user is not None:
                self.user_delays.setdefault(user, []).append(delay)
                self.user_gpu_s[user] = self.user_gpu_s.get(user, 0.0) + run_s * gpus
                share = run_s / (run_s + delay) if run_s + delay > 0 else 1.0
                self.user_ratio[user] = self.user_ratio.get(user, 0.0) + share
            if delay > IMMEDIATE_S:
                key = cause or "other"
                self.late_causes[key] = self.late_causes.get(key, 0) + 1

    def close(self, now: float) -> None:
        """End of the run: integrate every level up to `now`."""
        self.end_s = now
        for level in (self.provisioned_gpus, self.busy_gpus, self.committed_gpus):
            level.close(now)

    def summary(self) -> dict[str, Any]:
        """This run in the `policies.NAME` shape of the `--json` output."""
        provisioned = self.provisioned_gpus.integral / 3600.0
        busy = self.busy_gpus.integral / 3600.0
        delays = np.asarray(self.delays_s, dtype=float)
        if delays.size:
            p50, p95, p99 = (float(x) for x in np.percentile(delays, [50, 95, 99]))
            worst = float(delays.max())
            immediate = float(np.count_nonzero(delays <= IMMEDIATE_S)) / delays.size
        else:
            p50 = p95 = p99 = worst = 0.0
            immediate = 1.0
        late: dict[str, int] = {}
        tail: dict[str, int] = {}
        for delay, cause in zip(self.delays_s, self.delay_causes, strict=True):
            if delay > IMMEDIATE_S:
                name = tail_cause(cause)
                late[name] = late.get(name, 0) + 1
                if delay >= p99:
                    tail[name] = tail.get(name, 0) + 1
        summary: dict[str, Any] = {
            "provisioned_gpu_hours": round(provisioned, 3),
            "busy_gpu_hours": round(busy, 3),
            "utilization": round(busy / provisioned, 4) if provisioned > 0 else 0.0,
            "delay_s": {"p50": _r(p50), "p95": _r(p95), "p99": _r(p99), "max": _r(worst)},
            "immediate_fraction": round(immediate, 4),
            "migrations": self.migrations,
            "scale_outs": self.scale_outs,
            "scale_ins": self.scale_ins,
            "restores": self.restores,
            "restored_gb": round(self.restored_bytes / 1e9, 1),
            "late_by_cause": dict(sorted(late.items())),
            "p99_tail_by_cause": dict(sorted(tail.items())),
        }
        if self.user_delays:
            summary["users"], summary["jain_index"] = self._users()
        return summary

    def _users(self) -> tuple[dict[str, Any], float]:
        """Per-user figures and Jain's index over the users' service ratios (see the module)."""
        users: dict[str, Any] = {}
        ratios: list[float] = []
        for user in sorted(self.user_delays):
            delays = np.asarray(self.user_delays[user], dtype=float)
            p50, p95, p99 = (float(x) for x in np.percentile(delays, [50, 95, 99]))
            gpu_s = self.user_gpu_s.get(user, 0.0)
            users[user] = {
                "cells": int(delays.size),
                "gpu_hours": round(gpu_s / 3600.0, 3),
                "delay_s": {"p50": _r(p50), "p95": _r(p95), "p99": _r(p99), "max": _r(float(delays.max()))},
            }
            ratios.append(self.user_ratio.get(user, 0.0) / delays.size)
        x = np.asarray(ratios)
        jain = float(x.sum() ** 2 / (x.size * (x**2).sum())) if (x**2).sum() > 0 else 1.0
        return users, round(jain, 4)


def _r(x: float) -> float:
    return round(x, 3) if math.isfinite(x) else x


def saved_vs_reservation(summaries: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Provisioned GPU-hours each policy saved against Reservation (empty without a Reservation run)."""
    if "reservation" not in summaries:
        return {}
    base = summaries["reservation"]["provisioned_gpu_hours"]
    return {name: round(base - s["provisioned_gpu_hours"], 3) for name, s in summaries.items()}
