"""The idle-culling model: the part of a session's life that the job-list trace does not show.

The trace records training events only. It comes from a service whose idle culler ends a kernel after
T idle minutes (30 in production; the NotebookOS artifact models it as the `adobe-sensei` idle policy).
The default model, `production`, applies that culler to every policy alike:

- before a trace session's first task the kernel lives `lead_s` seconds (the user opened the notebook and
  loaded data; the culler bounds that idle time too, so the lead defaults to T);
- after a task ends, the kernel lives T more seconds; a gap longer than T between two tasks ends the
  kernel (the culler shut it down), and the next task starts a new kernel: a `resumed` session whose life
  begins `restart_lead_s` before that task (default 0: the cell itself starts the kernel and waits for
  it). What the new kernel costs is the policy's: a container start for all, a restore of the state from
  the object store for NotebookOS (Batch restores before every cell anyway), a fresh reservation for
  Reservation (see `simulation`).

The old model, `keep-alive` (`cull_gaps=False`), keeps the kernel alive through every gap of a trace
session however long, culling only after the last task: for sensitivity analysis. T = 0 means the life
is exactly the training span (the lower bound of reservation waste).

Sessions whose life was given by the input (`Session.life_known`) are left as they are.
"""

from __future__ import annotations

from dataclasses import replace

from jupyter_notebookos.simulator.workload import Session, Task, Workload

CULLING_MODELS = ("production", "keep-alive")


def apply_idle_culling(
    workload: Workload,
    timeout_s: float,
    lead_s: float | None = None,
    cull_gaps: bool = True,
    restart_lead_s: float = 0.0,
) -> Workload:
    """Return `workload` with each derived session life set by the idle-culling model.

    `cull_gaps=True` is the production culler (a gap longer than `timeout_s` ends the kernel; the next
    task starts a resumed one `restart_lead_s` before it); False keeps kernels alive through gaps.
    """
    if timeout_s < 0:
        raise ValueError("the idle-culling timeout must be >= 0")
    lead = timeout_s if lead_s is None else lead_s
    if lead < 0:
        raise ValueError("the session lead time must be >= 0")
    if restart_lead_s < 0:
        raise ValueError("the restart lead time must be >= 0")
    sessions: list[Session] = []
    for session in workload.sessions:
        if session.life_known or not session.tasks:
            sessions.append(session)
            continue
        if not cull_gaps:
            sessions.append(
                session.with_life(session.tasks[0].submit_s - lead, max(t.end_s for t in session.tasks) + timeout_s)
            )
            continue
        culled_at: float | None = None
        previous = session.tasks[0]  # the last task of the kernel the culler ended
        gaps: list[float] = []
        for index, tasks in enumerate(_split_at_gaps(session.tasks, timeout_s)):
            first = tasks[0].submit_s
            part = Session.from_tasks(session.session_id if index == 0 else f"{session.session_id}.{index}", tasks)
            part = replace(part, user=session.user, groups=session.groups, gpu_types=session.gpu_types)
            end = max(t.end_s for t in tasks) + timeout_s
            if culled_at is None:
                sessions.append(part.with_life(first - lead, end))
            else:
                # the new kernel cannot start before the culler ended the previous one
                start = max(culled_at, first - restart_lead_s)
                sessions.append(
                    replace(
                        part,
                        start_s=start,
                        end_s=end,
                        resumed=True,
                        culled_at_s=culled_at,
                        return_gaps_s=tuple(gaps),
                        restore_bytes=previous.state_bytes,
                    )
                )
                gaps.append(first - culled_at)
            culled_at = end
            previous = tasks[-1]
    return Workload(name=workload.name, sessions=tuple(sessions))


def _split_at_gaps(tasks: tuple[Task, ...], timeout_s: float) -> list[tuple[Task, ...]]:
    parts: list[list[Task]] = [[tasks[0]]]
    last_end = tasks[0].end_s
    for task in tasks[1:]:
        if task.submit_s - last_end > timeout_s:
            parts.append([])
        parts[-1].append(task)
        last_end = max(last_end, task.end_s)
    return [tuple(p) for p in parts]
