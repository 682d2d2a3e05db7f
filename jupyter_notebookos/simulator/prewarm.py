"""Apply the scheduler's pre-warming policy to a culled workload (NotebookOS only).

For each kernel the idle culler ended (a `resumed` session, see `culling`), the scheduler's
`standby_window` decides from the trace session's own earlier returns how long standby replicas stay up
after the cull. If the user returns inside that window, the resumed kernel's life starts at the cull: its
replicas are started and restored in the background and the returning cell finds them warm. Otherwise a
task-less standby kernel lives for the window (it costs replica slots, and so hosts, but no GPUs) and the
return pays the cold start.

Reservation would hold GPUs for a standby kernel, and Batch has no kernel to keep, so neither pre-warms.
"""

from __future__ import annotations

from dataclasses import replace

from jupyter_notebookos.scheduler import PrewarmSettings, standby_window
from jupyter_notebookos.simulator.workload import Session, Workload


def apply_prewarm(workload: Workload, settings: PrewarmSettings) -> tuple[Workload, int, int]:
    """The workload with standby replicas added; also (returns found warm, standby windows that expired)."""
    sessions: list[Session] = []
    warm = expired = 0
    for session in workload.sessions:
        if not session.resumed or session.culled_at_s is None or not session.tasks:
            sessions.append(session)
            continue
        window = standby_window(session.session_id, session.return_gaps_s, settings)
        culled_at = session.culled_at_s
        if window.covers(session.tasks[0].submit_s - culled_at):
            sessions.append(replace(session, start_s=min(session.start_s, culled_at)))
            warm += 1
            continue
        if window.standby_s > 0:
            expired += 1
            sessions.append(
                Session(
                    f"{session.session_id}.standby",
                    (),
                    culled_at,
                    culled_at + window.standby_s,
                    gpus=session.gpus,
                    resumed=True,
                    restore_bytes=session.restore_bytes,  # its standby replicas restore the culled state
                    user=session.user,
                    groups=session.groups,
                    gpu_types=session.gpu_types,
                )
            )
        sessions.append(session)
    return Workload(name=workload.name, sessions=tuple(sessions)), warm, expired
