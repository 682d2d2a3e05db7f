"""The workload a simulation replays: sessions (notebook kernels) and their tasks (GPU cells).

Times are seconds of trace time, counted from the start of the trace. A `Session` carries its life
(`start_s`, `end_s`): the interval during which its kernel exists. Readers that know the life (the JSON
template) set it; for the job-list CSV it is unknown, readers set it to the first submission and the last
end, and `culling.apply_idle_culling` widens it (see that module).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True, slots=True)
class Task:
    """One training event: a cell that needs `gpus` GPUs for `duration_s` seconds once it starts.

    `state_bytes` is the kernel's state while the cell trains (the model, its gradients and optimizer state;
    see `statesize`): what a restore reads from the object store. 0: unknown, a restore costs its fixed part.
    """

    submit_s: float
    duration_s: float
    gpus: int
    state_bytes: int = 0

    @property
    def end_s(self) -> float:
        """When the task would end if it started at submission (no delay)."""
        return self.submit_s + self.duration_s


@dataclass(frozen=True, slots=True)
class Session:
    """A notebook session: one kernel, its GPU request and its tasks in submission order.

    `gpus` is the kernel's GPU request (what Reservation holds for the whole life): the maximum over its
    tasks. `life_known` says whether `start_s`/`end_s` came from the input (True) or were derived from the
    tasks (False), in which case the idle-culling model may widen them.

    A kernel that the idle culler ended and that a later cell of the same trace session started again is
    `resumed`: NotebookOS restores its state from the object store before its first cell. `culled_at_s` is
    when the culler ended the previous kernel of the trace session, and `return_gaps_s` the earlier
    cull-to-return gaps of that trace session (its own history, which pre-warming may use), and
    `restore_bytes` the state the culled kernel held (its last task's), which the restore reads.

    `user` and `groups` say who owns the kernel (quotas and fair share count against them; None: nobody, as
    without `--users`), `gpu_types` the GPU types it asks for, most preferred first (see `users`).
    """

    session_id: str
    tasks: tuple[Task, ...]
    start_s: float
    end_s: float
    life_known: bool = False
    gpus: int = field(default=0)
    resumed: bool = False
    culled_at_s: float | None = None
    return_gaps_s: tuple[float, ...] = ()
    restore_bytes: int = 0
    user: str | None = None
    groups: tuple[str, ...] = ()
    gpu_types: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.gpus <= 0:
            if not self.tasks:
                raise ValueError(f"session {self.session_id} has neither tasks nor a GPU request")
            object.__setattr__(self, "gpus", max(t.gpus for t in self.tasks))

    @classmethod
    def from_tasks(cls, session_id: str, tasks: tuple[Task, ...]) -> Session:
        """A session whose life is exactly its tasks' span (first submission to last end)."""
        return cls(
            session_id=session_id,
            tasks=tasks,
            start_s=min(t.submit_s for t in tasks),
            end_s=max(t.end_s for t in tasks),
        )

    @property
    def trace_session_id(self) -> str:
        """The trace session this kernel is of: itself, or for a kernel started again after the idle culler
        (``resumed``; `culling` names it ``<trace session>.<n>``) the session it continues."""
        return self.session_id.rpartition(".")[0] if self.resumed else self.session_id

    def with_life(self, start_s: float, end_s: float) -> Session:
        """The same session with another life interval."""
        return replace(self, start_s=start_s, end_s=end_s)


@dataclass(frozen=True, slots=True)
class Workload:
    """A named set of sessions, the input of one simulation run."""

    name: str
    sessions: tuple[Session, ...]

    @property
    def tasks(self) -> int:
        """Number of tasks in all sessions."""
        return sum(len(s.tasks) for s in self.sessions)

    @property
    def span_s(self) -> tuple[float, float]:
        """(earliest session start, latest session end)."""
        if not self.sessions:
            return (0.0, 0.0)
        return (min(s.start_s for s in self.sessions), max(s.end_s for s in self.sessions))

    def busy_gpu_seconds(self) -> float:
        """Sum over tasks of GPUs x duration: the busy GPU-time any policy must deliver."""
        return sum(t.gpus * t.duration_s for s in self.sessions for t in s.tasks)


def clip_to_window(workload: Workload, start_s: float, end_s: float, warmup_s: float) -> Workload:
    """The part of `workload` a simulation of the window [start_s, end_s) needs.

    Keeps tasks submitted before `end_s` that are still running at `start_s - warmup_s` or later, and every
    session alive in that interval (even with no task kept: under Reservation it still holds its GPUs), its
    life clipped to begin no earlier than `start_s - warmup_s` (or its first kept task). The warm-up lets
    the cluster fill up before measuring starts; tasks that ended before it cannot affect the window.
    """
    horizon = start_s - warmup_s
    kept: list[Session] = []
    for session in workload.sessions:
        if session.end_s <= horizon or session.start_s >= end_s:
            continue
        tasks = tuple(t for t in session.tasks if t.submit_s < end_s and t.end_s > horizon)
        start = max(session.start_s, horizon)
        if tasks:
            start = min(start, tasks[0].submit_s)
        kept.append(replace(session, tasks=tasks, start_s=start))
    return Workload(name=workload.name, sessions=tuple(kept))
