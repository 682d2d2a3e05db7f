"""Pre-warming from a session's own history: how long to keep a culled kernel's standby replicas.

The idle culler ends a kernel after T idle minutes, and the user's next cell then starts a new kernel and
waits for its containers and for its state to come back from the object store (seconds, against the
interactivity target of one). NotebookOS replicas hold no GPUs while idle, so the platform can afford to
restore a culled kernel into standby replicas right after the cull, and keep them for as long as the
session's own history says the user tends to come back: its earlier cull-to-return gaps. A return inside
the standby window finds the kernel warm; past it, the standby replicas are stopped and the return pays
the cold start. What standby costs is replica slots on hosts (the subscription ratio), never GPUs.

Pure policy: the caller passes the history; nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PrewarmSettings:
    """Knobs of the standby window (all seconds except `quantile` and `min_history`).

    - `quantile`: the window covers this share of the session's own earlier return gaps (0: off).
    - `max_standby_s`: never keep standby replicas longer than this.
    - `min_history`: returns a session must have shown before its history is trusted.
    - `default_standby_s`: the window of a session with less history than that.
    - `margin`: the window is the quantile times this (returns a little later than seen before).
    """

    quantile: float = 1.0
    max_standby_s: float = 7 * 24 * 3600.0
    min_history: int = 1
    default_standby_s: float = 24 * 3600.0
    margin: float = 2.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.quantile <= 1.0:
            raise ValueError(f"the pre-warm quantile must be between 0 and 1, got {self.quantile}")
        if self.max_standby_s < 0 or self.default_standby_s < 0:
            raise ValueError("pre-warm windows must be >= 0 seconds")
        if self.min_history < 0:
            raise ValueError("the pre-warm history minimum must be >= 0")
        if self.margin < 1.0:
            raise ValueError(f"the pre-warm margin must be >= 1, got {self.margin}")


@dataclass(frozen=True, slots=True)
class StandbyWindow:
    """How long a culled kernel's standby replicas stay up, and why (its `str()` is one readable line)."""

    kernel_id: str
    standby_s: float
    reason: str

    def covers(self, return_after_s: float) -> bool:
        """Whether a return this long after the cull finds the kernel warm."""
        return self.standby_s > 0 and 0 <= return_after_s <= self.standby_s

    def __str__(self) -> str:
        return f"kernel {self.kernel_id}: keep standby replicas {self.standby_s:.0f} s after the cull ({self.reason})"


def nearest_rank(values: Sequence[float], quantile: float) -> float:
    """The nearest-rank quantile of `values` (not empty): the smallest value with that share at or below."""
    ordered = sorted(values)
    rank = max(1, math.ceil(quantile * len(ordered)))
    return ordered[rank - 1]


def standby_window(kernel_id: str, return_gaps_s: Sequence[float], settings: PrewarmSettings) -> StandbyWindow:
    """The standby window of a kernel just culled, from its session's earlier cull-to-return gaps."""
    if settings.quantile <= 0 or settings.max_standby_s <= 0:
        return StandbyWindow(kernel_id, 0.0, "pre-warming off")
    history = [g for g in return_gaps_s if g >= 0 and math.isfinite(g)]
    if len(history) < max(1, settings.min_history):
        window = min(settings.default_standby_s, settings.max_standby_s)
        return StandbyWindow(kernel_id, window, f"{len(history)} earlier returns: default window")
    seen = nearest_rank(history, settings.quantile)
    window = min(seen * settings.margin, settings.max_standby_s)
    return StandbyWindow(
        kernel_id,
        window,
        f"p{100 * settings.quantile:g} of {len(history)} earlier returns is {seen:.0f} s",
    )
