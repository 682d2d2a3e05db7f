"""Find the window of a workload in which Reservation wastes the most GPU-hours.

Waste at time t is what Reservation holds minus what is training: the GPU requests of all live sessions
minus the GPUs of all running tasks, both taken straight from the workload (every task at its submission
time, as Reservation runs it when capacity suffices). This is the saving an ideal policy could capture.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jupyter_notebookos.simulator.workload import Workload


@dataclass(frozen=True, slots=True)
class WasteWindow:
    """A window and the reserved, busy and wasted GPU-hours inside it (ideal, no delays)."""

    start_s: float
    hours: float
    reserved_gpu_hours: float
    busy_gpu_hours: float

    @property
    def waste_gpu_hours(self) -> float:
        """Reserved minus busy GPU-hours: the most any policy can save in this window."""
        return self.reserved_gpu_hours - self.busy_gpu_hours


def _per_step_gpu_seconds(
    workload: Workload, origin: float, steps: int, step_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """GPU-seconds reserved and busy in each step of `step_s`, exactly (intervals are cut at the edges)."""

    def accumulate(starts: np.ndarray, ends: np.ndarray, weights: np.ndarray) -> np.ndarray:
        # The integral of a sum of boxes is piecewise linear; sample it at step edges and difference.
        edges = origin + step_s * np.arange(steps + 1)
        order_s = np.argsort(starts)
        order_e = np.argsort(ends)
        cum_w_s = np.concatenate([[0.0], np.cumsum(weights[order_s])])
        cum_ws_s = np.concatenate([[0.0], np.cumsum((weights * starts)[order_s])])
        cum_w_e = np.concatenate([[0.0], np.cumsum(weights[order_e])])
        cum_we_e = np.concatenate([[0.0], np.cumsum((weights * ends)[order_e])])
        i_s = np.searchsorted(starts[order_s], edges, side="right")
        i_e = np.searchsorted(ends[order_e], edges, side="right")
        # integral up to x = sum_{start<=x} w (x - start) - sum_{end<=x} w (x - end)
        integral = (cum_w_s[i_s] * edges - cum_ws_s[i_s]) - (cum_w_e[i_e] * edges - cum_we_e[i_e])
        return np.diff(integral)

    sessions = workload.sessions
    reserved = accumulate(
        np.array([s.start_s for s in sessions]),
        np.array([s.end_s for s in sessions]),
        np.array([float(s.gpus) for s in sessions]),
    )
    tasks = [t for s in sessions for t in s.tasks]
    busy = accumulate(
        np.array([t.submit_s for t in tasks]),
        np.array([t.end_s for t in tasks]),
        np.array([float(t.gpus) for t in tasks]),
    )
    return reserved, busy


def most_wasteful_window(workload: Workload, hours: float, step_s: float = 60.0) -> WasteWindow:
    """The window of `hours`, starting on a `step_s` grid, with the most reservation waste."""
    if not workload.sessions:
        raise ValueError("the workload has no sessions")
    origin = max(0.0, workload.span_s[0])
    origin -= origin % step_s
    end = workload.span_s[1]
    steps = max(1, int(np.ceil((end - origin) / step_s)))
    width = max(1, round(hours * 3600.0 / step_s))
    reserved, busy = _per_step_gpu_seconds(workload, origin, steps, step_s)
    # Only windows that lie inside the trace's span count; a short trace gives one window at its start.
    waste = np.concatenate([[0.0], np.cumsum(reserved - busy)])
    if steps <= width:
        best = 0
    else:
        sums = waste[width:] - waste[:-width]
        best = int(np.argmax(sums))
    lo, hi = best, min(best + width, steps)
    return WasteWindow(
        start_s=origin + best * step_s,
        hours=hours,
        reserved_gpu_hours=float(reserved[lo:hi].sum()) / 3600.0,
        busy_gpu_hours=float(busy[lo:hi].sum()) / 3600.0,
    )
