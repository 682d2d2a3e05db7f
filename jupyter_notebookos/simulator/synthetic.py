"""A synthetic workload calibrated to the published statistics of the June trace.

So the simulator works without the trace files. What is drawn, and from what:

- Session arrivals: a Poisson process; `sessions` arrivals in `hours`, so the arrival times are sorted
  uniform draws over the interval (a Poisson process conditioned on its count).
- GPUs: each session draws its GPU request from the trace's mix, 1 / 4 / 8 GPUs with 49 / 20 / 31 %, and
  each of its tasks uses that many.
- Tasks per session: geometric with mean `tasks_per_session` (default 12).
- Task durations (whole minutes, at least 1): heavy-tailed, an inverse CDF through the trace's quantiles,
  log-linear between them: p25 3, p50 5, p75 12, p90 32, p95 95, p99 1,021, max 26,458 minutes; the p99.9
  knot (3,400 minutes) is set so the mean is the trace's 54.6 minutes. In the trace, tasks with more GPUs
  run longer (mean 12.9 / 112.4 / 83.5 minutes for 1 / 4 / 8 GPUs), so each draw is scaled by its GPU
  class's mean over the overall mean: that keeps the overall mean and gives the trace's ~216 busy GPUs on
  average (without it: ~150), at the price of a wider spread than the quantiles above.
- Idle gaps between a session's tasks (whole minutes): p50 3, p75 7, p90 35 minutes as measured between
  consecutive events of reconstructed sessions in the June trace, with the tail cut at p99 10 hours and a
  maximum of one day (the trace's tail goes to weeks; a synthetic run of a few hours gains nothing from it).
- Default session count: sized so the cluster-wide task arrival rate is the trace's, one task every
  1.4 minutes on average.

- State sizes: models drawn as the trace's converter drew them (one per session, switched with 15 % chance
  per task; see `statesize`), from a random stream of their own so the rest of the workload does not depend
  on them; `state_gb` gives every task that size instead.

Session lives are left to the idle-culling model (`culling`), as for the CSV trace.
"""

from __future__ import annotations

import numpy as np

from jupyter_notebookos.simulator.statesize import draw_models, fixed_state_bytes, model_state_bytes
from jupyter_notebookos.simulator.workload import Session, Task, Workload

GPU_CHOICES = (1, 4, 8)
GPU_WEIGHTS = (0.49, 0.20, 0.31)
DURATION_QUANTILES_MIN = (
    (0.0, 1.0),
    (0.25, 3.0),
    (0.5, 5.0),
    (0.75, 12.0),
    (0.9, 32.0),
    (0.95, 95.0),
    (0.99, 1021.0),
    (0.999, 3400.0),
    (1.0, 26458.0),
)
GAP_QUANTILES_MIN = ((0.0, 1.0), (0.5, 3.0), (0.75, 7.0), (0.9, 35.0), (0.99, 600.0), (1.0, 1440.0))
MEAN_DURATION_MIN = 54.6
MEAN_DURATION_BY_GPUS_MIN = {1: 12.9, 4: 112.4, 8: 83.5}
MEAN_TASK_INTERARRIVAL_MIN = 1.4
DEFAULT_TASKS_PER_SESSION = 12.0


def default_session_count(hours: float, tasks_per_session: float = DEFAULT_TASKS_PER_SESSION) -> int:
    """Sessions that give the trace's cluster-wide task arrival rate over `hours`."""
    return max(1, round(hours * 60.0 / MEAN_TASK_INTERARRIVAL_MIN / tasks_per_session))


def _draw_minutes(rng: np.random.Generator, knots: tuple[tuple[float, float], ...], size: int) -> np.ndarray:
    probabilities = np.array([p for p, _ in knots])
    log_values = np.log(np.array([v for _, v in knots]))
    minutes = np.exp(np.interp(rng.random(size), probabilities, log_values))
    return np.maximum(1.0, np.ceil(minutes - 1e-9))


def generate(
    sessions: int | None = None,
    hours: float = 24.0,
    seed: int = 0,
    tasks_per_session: float = DEFAULT_TASKS_PER_SESSION,
    state_gb: float | None = None,
) -> Workload:
    """Draw a synthetic workload; the same arguments always give the same workload."""
    if hours <= 0:
        raise ValueError("--hours must be > 0")
    if tasks_per_session < 1:
        raise ValueError("tasks per session must be >= 1")
    count = default_session_count(hours, tasks_per_session) if sessions is None else sessions
    if count < 1:
        raise ValueError("--sessions must be >= 1")
    rng = np.random.default_rng(seed)
    arrivals_min = np.sort(rng.random(count)) * hours * 60.0
    gpus = rng.choice(GPU_CHOICES, size=count, p=GPU_WEIGHTS)
    task_counts = rng.geometric(1.0 / tasks_per_session, size=count)
    total = int(task_counts.sum())
    durations = _draw_minutes(rng, DURATION_QUANTILES_MIN, total)
    gaps = _draw_minutes(rng, GAP_QUANTILES_MIN, total)
    if state_gb is None:
        models = draw_models(np.random.default_rng([seed, 1]), [int(n) for n in task_counts])
        sizes = [[model_state_bytes(m) for m in session] for session in models]
    else:
        fixed = fixed_state_bytes(state_gb)
        sizes = [[fixed] * int(n) for n in task_counts]
    result: list[Session] = []
    cursor = 0
    for index in range(count):
        clock = float(arrivals_min[index])
        scale = MEAN_DURATION_BY_GPUS_MIN[int(gpus[index])] / MEAN_DURATION_MIN
        tasks: list[Task] = []
        for k in range(int(task_counts[index])):
            duration = max(1.0, float(np.ceil(durations[cursor] * scale)))
            tasks.append(Task(clock * 60.0, duration * 60.0, int(gpus[index]), sizes[index][k]))
            clock += duration + float(gaps[cursor])
            cursor += 1
        result.append(Session.from_tasks(f"syn{index}", tuple(tasks)))
    return Workload(name=f"synthetic(sessions={count}, hours={hours:g}, seed={seed})", sessions=tuple(result))
