"""The idle-culling model: the part of a session's life that the job-list trace does not show.

The trace records training events only. The kernel existed before the first one (the user opened the
notebook, loaded data) and after the last one, until the service's idle culler shut it down (30 minutes in
the production service the trace comes from). We model both ends with the idle-culling timeout T:

- after the last task ends, the kernel lives T more seconds (the culler's timeout);
- before the first task is submitted, the kernel lives `lead_s` seconds; the culler bounds that idle time
  too, so the lead defaults to T.

Between tasks of one session the kernel stays alive whatever the gap: the trace groups those events under
one session, so something (cells that use no GPU) kept it from being culled. `cull_gaps=True` instead
applies the timeout to gaps as well: a gap longer than T ends the session and the next task starts a new
kernel. T = 0 means the session's life is exactly its training span (the lower bound of reservation waste).

Sessions whose life was given by the input (`Session.life_known`) are left as they are.
"""

from __future__ import annotations

from jupyter_notebookos.simulator.workload import Session, Task, Workload


def apply_idle_culling(
    workload: Workload, timeout_s: float, lead_s: float | None = None, cull_gaps: bool = False
) -> Workload:
    """Return `workload` with each derived session life widened by the idle-culling model."""
    if timeout_s < 0:
        raise ValueError("the idle-culling timeout must be >= 0")
    lead = timeout_s if lead_s is None else lead_s
    if lead < 0:
        raise ValueError("the session lead time must be >= 0")
    sessions: list[Session] = []
    for session in workload.sessions:
        if session.life_known:
            sessions.append(session)
            continue
        for index, tasks in enumerate(_split_at_gaps(session.tasks, timeout_s) if cull_gaps else [session.tasks]):
            session_id = session.session_id if index == 0 else f"{session.session_id}.{index}"
            part = Session.from_tasks(session_id, tasks) if cull_gaps else session
            sessions.append(part.with_life(part.tasks[0].submit_s - lead, max(t.end_s for t in part.tasks) + timeout_s))
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
