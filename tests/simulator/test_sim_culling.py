"""The idle-culling model of the life the trace does not show, and the waste window."""

from __future__ import annotations

import pytest

from jupyter_notebookos.simulator.culling import apply_idle_culling
from jupyter_notebookos.simulator.trace import read_job_csv
from jupyter_notebookos.simulator.windows import most_wasteful_window
from jupyter_notebookos.simulator.workload import Session, Task, Workload, clip_to_window


def test_timeout_widens_both_ends_and_lead_can_be_set(write_csv):
    workload = read_job_csv(write_csv([(1, 100, 10), (1, 200, 10)]))
    (s,) = apply_idle_culling(workload, 30 * 60).sessions
    assert (s.start_s, s.end_s) == ((100 - 30) * 60, (210 + 30) * 60)
    (s,) = apply_idle_culling(workload, 30 * 60, lead_s=0).sessions
    assert s.start_s == 100 * 60
    (s,) = apply_idle_culling(workload, 0).sessions
    assert (s.start_s, s.end_s) == (100 * 60, 210 * 60)


def test_cull_gaps_splits_at_gaps_longer_than_the_timeout(write_csv):
    workload = read_job_csv(write_csv([(4, 0, 10), (4, 20, 10), (4, 200, 10)]))
    sessions = apply_idle_culling(workload, 30 * 60, cull_gaps=True).sessions
    assert [len(s.tasks) for s in sessions] == [2, 1]
    assert sessions[0].end_s == 60 * 60 and sessions[1].start_s == 170 * 60


def test_given_lives_are_kept_and_bad_values_refused():
    s = Session("a", (Task(600, 60, 1),), start_s=0, end_s=5000, life_known=True)
    assert apply_idle_culling(Workload("w", (s,)), 1800).sessions == (s,)
    with pytest.raises(ValueError):
        apply_idle_culling(Workload("w", (s,)), -1)


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
