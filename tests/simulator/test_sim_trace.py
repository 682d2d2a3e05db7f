"""Reading the job-list CSV and rebuilding its sessions; the JSON template; bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_notebookos.simulator.trace import TraceFormatError, read_job_csv, read_workload


def test_time_going_back_starts_a_new_session(write_csv):
    # two sessions: minutes 100..130, then one that starts earlier (50)
    path = write_csv([(1, 100, 5), (1, 110, 5), (1, 130, 2), (4, 50, 10), (4, 70, 1)])
    sessions = read_job_csv(path).sessions
    assert [len(s.tasks) for s in sessions] == [3, 2]
    assert [s.gpus for s in sessions] == [1, 4]
    assert sessions[1].tasks[0].submit_s == 50 * 60
    assert sessions[0].start_s == 100 * 60 and sessions[0].end_s == 132 * 60


def test_overlapping_events_belong_to_different_kernels(write_csv):
    # the second event starts before the first ends: a kernel runs one cell at a time
    path = write_csv([(1, 0, 10), (1, 5, 1), (1, 6, 1)])
    assert [len(s.tasks) for s in read_job_csv(path).sessions] == [1, 2]


def test_an_event_starting_exactly_when_the_previous_ends_stays_in_the_session(write_csv):
    path = write_csv([(8, 0, 10), (8, 10, 3)])
    assert [len(s.tasks) for s in read_job_csv(path).sessions] == [2]


def test_gpu_changes_stay_in_the_session_and_the_request_is_the_maximum(write_csv):
    path = write_csv([(1, 0, 2), (8, 3, 2), (4, 6, 2)])
    (session,) = read_job_csv(path).sessions
    assert session.gpus == 8
    assert [t.gpus for t in session.tasks] == [1, 8, 4]


def test_split_on_gpu_change_applies_the_readme_reading(write_csv):
    path = write_csv([(1, 0, 2), (8, 3, 2), (8, 6, 2), (1, 9, 1)])
    sessions = read_job_csv(path, split_on_gpu_change=True).sessions
    assert [(s.gpus, len(s.tasks)) for s in sessions] == [(1, 1), (8, 2), (1, 1)]


def test_rows_are_taken_in_job_id_order(tmp_path: Path):
    path = tmp_path / "shuffled.csv"
    path.write_text(
        "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n1,1,20,0,vgg11,5,0\n0,1,10,0,vgg11,5,0\n"
    )
    (session,) = read_job_csv(path).sessions
    assert [t.submit_s for t in session.tasks] == [600, 1200]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("0,1,ten,0,vgg11,5,0\n", "column 'submit_time' is 'ten'"),
        ("0,0,10,0,vgg11,5,0\n", "column 'num_gpu' is 0, expected at least 1"),
        ("0,1,10,0,vgg11\n", "wrong number of fields"),
        ("", "no rows"),
    ],
)
def test_malformed_rows_name_the_line_and_the_problem(tmp_path: Path, body: str, message: str):
    path = tmp_path / "bad.csv"
    path.write_text("job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n" + body)
    with pytest.raises(TraceFormatError, match=message) as info:
        read_workload(path)
    if body:
        assert "bad.csv:2" in str(info.value)


def test_missing_file_and_missing_columns(tmp_path: Path):
    with pytest.raises(TraceFormatError, match="no such file"):
        read_workload(tmp_path / "nope.csv")
    path = tmp_path / "cols.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(TraceFormatError, match="missing column"):
        read_workload(path)


def test_json_template_sessions_keep_their_given_life(tmp_path: Path):
    path = tmp_path / "t.json"
    path.write_text(
        json.dumps(
            {
                "sessions": [
                    {
                        "id": "a",
                        "start_tick": 2,
                        "stop_tick": 50,
                        "trainings": [
                            {"start_tick": 10, "duration_in_ticks": 5, "gpus": 2},
                            {"start_tick": 20, "duration_in_ticks": 3, "gpus": 1},
                        ],
                    },
                    {"id": "idle", "start_tick": 0, "stop_tick": 9, "trainings": []},
                ]
            }
        )
    )
    (session,) = read_workload(path).sessions
    assert session.life_known and session.gpus == 2
    assert (session.start_s, session.end_s) == (120, 3000)
    assert [(t.submit_s, t.duration_s) for t in session.tasks] == [(600, 300), (1200, 180)]
    path.write_text(json.dumps({"sessions": [{"trainings": [{"start_tick": "x"}]}]}))
    with pytest.raises(TraceFormatError, match="expected a number"):
        read_workload(path)


def test_real_june_trace(real_trace: Path):
    workload = read_workload(real_trace)
    assert workload.tasks == 30909
    assert len(workload.sessions) == 339
    assert round(workload.busy_gpu_seconds() / 3600) == 155502
    assert len(read_workload(real_trace, split_on_gpu_change=True).sessions) == 8435
