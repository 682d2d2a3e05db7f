"""The idle-culling models of the life the trace does not show, and the waste window."""

from __future__ import annotations

import pytest

from jupyter_notebookos.simulator.culling import apply_idle_culling
from jupyter_notebookos.simulator.trace import read_job_csv
from jupyter_notebookos.simulator.windows import most_wasteful_window
from jupyter_notebookos.simulator.workload import Session, Task, Workload, clip_to_window


def test_keep_alive_widens_both_ends_and_lead_can_be_set(write_csv):
    workload = read_job_csv(write_csv([(1, 100, 10), (1, 200, 10)]))
    (s,) = apply_idle_culling(workload, 30 * 60, cull_gaps=False).sessions
    assert (s.start_s, s.end_s) == ((100 - 30) * 60, (210 + 30) * 60)
    (s,) = apply_idle_culling(workload, 30 * 60, lead_s=0, cull_gaps=False).sessions
    assert s.start_s == 100 * 60
    (s,) = apply_idle_culling(workload, 0, cull_gaps=False).sessions
    assert (s.start_s, s.end_s) == (100 * 60, 210 * 60)
    assert not s.resumed


def test_production_culler_ends_the_kernel_and_the_next_cell_starts_a_resumed_one(write_csv):
    # gaps: 10 min (kept), 160 min (culled at 60), then 100 min (culled at 240)
    workload = read_job_csv(write_csv([(4, 0, 10), (4, 20, 10), (4, 200, 10), (4, 340, 10)]))
    first, second, third = apply_idle_culling(workload, 30 * 60).sessions
    assert [len(s.tasks) for s in (first, second, third)] == [2, 1, 1]
    assert (first.start_s, first.end_s) == (-30 * 60, 60 * 60) and not first.resumed
    # the returning cell starts the new kernel itself (restart lead 0): the kernel was not there before it
    assert second.resumed and second.start_s == 200 * 60 and second.end_s == 240 * 60
    assert second.culled_at_s == 60 * 60 and second.return_gaps_s == ()
    # the third kernel knows its session's own history: the first return came 140 minutes after the cull
    assert third.culled_at_s == 240 * 60 and third.return_gaps_s == (140 * 60,)
    assert len({first.session_id, second.session_id, third.session_id}) == 3


def test_restart_lead_never_reaches_back_before_the_cull(write_csv):
    workload = read_job_csv(write_csv([(1, 0, 10), (1, 100, 10)]))
    _, resumed = apply_idle_culling(workload, 30 * 60, restart_lead_s=20 * 60).sessions
    assert resumed.start_s == 80 * 60
    _, resumed = apply_idle_culling(workload, 30 * 60, restart_lead_s=600 * 60).sessions
    assert resumed.start_s == 40 * 60  # the previous kernel was culled at minute 40


def test_given_lives_are_kept_and_bad_values_refused():
    s = Session("a", (Task(600, 60, 1),), start_s=0, end_s=5000, life_known=True)
    assert apply_idle_culling(Workload("w", (s,)), 1800).sessions == (s,)
    with pytest.raises(ValueError):
        apply_idle_culling(Workload("w", (s,)), -1)
    with pytest.raises(ValueError, match="restart lead"):
        apply_idle_culling(Workload("w", (s,)), 1800, restart_lead_s=-1)


def test_most_wasteful_window_finds_the_long_idle_reservation():
    busy_all_day = Session.from_tasks("busy", (Task(0, 86400, 8),))
    idle_afternoon = Session("idle", (Task(0, 60, 4),), start_s=0, end_s=86400).with_life(0, 86400)
    # a third session whose reservation is idle only between hours 10 and 14
    gap = Session.from_tasks("gap", (Task(0, 36000, 8), Task(50400, 36000, 8)))
    window = most_wasteful_window(Workload("w", (busy_all_day, idle_afternoon, gap)), hours=4)
    assert window.start_s == 36000
    assert window.waste_gpu_hours == pytest.approx(4 * 4 + 4 * 8)
    assert window.busy_gpu_hours == pytest.approx(4 * 8)


def test_clip_to_window_keeps_sessions_alive_in_it_even_without_tasks_there():
    long = Session("long", (Task(0, 60, 8), Task(90000, 60, 8)), start_s=0, end_s=90060)
    later = Session.from_tasks("later", (Task(200000, 60, 1),))
    clipped = clip_to_window(Workload("w", (long, later)), 40000, 50000, warmup_s=3600)
    (kept,) = clipped.sessions
    assert kept.session_id == "long" and kept.tasks == () and kept.gpus == 8
    assert kept.start_s == 40000 - 3600
