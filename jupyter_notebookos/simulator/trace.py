"""Readers for the workload files in `../shared/data/notebookos-trace/` (see its README).

Job-list CSV (`sensei_june_60sec.csv`, `tiresias.csv`), header
`job_id,num_gpu,submit_time,iterations,model_name,duration,interval`, one row per training event, times in
whole minutes. The file has no session ids; `read_job_csv` rebuilds sessions with this rule:

    Rows are taken in `job_id` order. A row starts a new session when it is the first row, or when its
    `submit_time` is earlier than the previous row's `submit_time` (time goes back), or when it starts
    before the previous row ends (`submit_time < previous submit_time + duration`: a kernel runs one cell
    at a time, so overlapping events belong to different kernels). A session's GPU request is the largest
    `num_gpu` of its rows; each task keeps its own row's `num_gpu`.

Each task's state size (what a restore reads) comes from its row's `model_name` (see `statesize`); a name the
size table does not know is an error unless `state_gb` gives every task one size. Without the column, restores
cost their fixed part only.

Why not also split where `num_gpu` changes: the trace README calls `num_gpu` the session's maximum, but in
`sensei_june_60sec.csv` it changes 8,270 times, mostly inside time-ordered runs, and the synthetic
`model_name` column (drawn anew per session, switched with 15 % chance per event by the converter) changes
at 90 % of the time-goes-back boundaries but at 13.4 % of the `num_gpu` changes, the in-session switching
rate. So `num_gpu` is per event there. `split_on_gpu_change=True` applies the README's reading anyway.
The rule cannot see a boundary between two sessions of which the second starts after the first ended; the
model-name statistics suggest about 30 of 370 boundaries in the June file are of that kind.

Per-session JSON template (`Template-*.json`): `sessions[]` with `id`, `start_tick`, `stop_tick` and
`trainings[]` (`start_tick`, `duration_in_ticks`, `gpus`, and optionally `vram` in GB, taken as the state
size); one tick is 60 s of trace time. The dashboard's
`timescaleAdjustmentFactor` only speeds up its live replay and is ignored here. Session lives are given, so
these sessions are marked `life_known`.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from jupyter_notebookos.simulator.statesize import GB, UnknownModelError, fixed_state_bytes, model_state_bytes
from jupyter_notebookos.simulator.workload import Session, Task, Workload

TRACE_COLUMNS = ("job_id", "num_gpu", "submit_time", "iterations", "model_name", "duration", "interval")
MINUTE_S = 60.0
TICK_S = 60.0
#: A job-list row: (job_id, num_gpu, submit_min, duration_min, state_bytes).
Row = tuple[int, int, int, int, int]


class TraceFormatError(ValueError):
    """The workload file cannot be read; the message names the file, the place and what to fix."""


def read_workload(path: str | Path, *, split_on_gpu_change: bool = False, state_gb: float | None = None) -> Workload:
    """Read a job-list CSV or a JSON template, chosen by the file's suffix.

    ``state_gb`` gives every task that state size instead of the file's (model names, or `vram`).
    """
    path = Path(path)
    if not path.is_file():
        raise TraceFormatError(f"{path}: no such file (give a job-list .csv or a template .json)")
    if path.suffix.lower() == ".json":
        return read_template_json(path, state_gb=state_gb)
    return read_job_csv(path, split_on_gpu_change=split_on_gpu_change, state_gb=state_gb)


def _int_field(row: dict[str, str], column: str, where: str, minimum: int) -> int:
    raw = row.get(column)
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise TraceFormatError(f"{where}: column {column!r} is {raw!r}, expected an integer") from None
    if value < minimum:
        raise TraceFormatError(f"{where}: column {column!r} is {value}, expected at least {minimum}")
    return value


def read_job_csv(path: str | Path, *, split_on_gpu_change: bool = False, state_gb: float | None = None) -> Workload:
    """Read a job-list CSV and rebuild its sessions with the rule in this module's docstring."""
    path = Path(path)
    fixed = None if state_gb is None else fixed_state_bytes(state_gb)
    rows: list[Row] = []
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [
                c for c in ("job_id", "num_gpu", "submit_time", "duration") if c not in (reader.fieldnames or [])
            ]
            if missing:
                raise TraceFormatError(
                    f"{path}: missing column(s) {', '.join(missing)}; expected header {','.join(TRACE_COLUMNS)}"
                )
            for row in reader:
                where = f"{path}:{reader.line_num}"
                if None in row or any(v is None for v in row.values()):
                    expected = len(reader.fieldnames or [])
                    raise TraceFormatError(f"{where}: wrong number of fields, expected {expected}")
                rows.append(
                    (
                        _int_field(row, "job_id", where, 0),
                        _int_field(row, "num_gpu", where, 1),
                        _int_field(row, "submit_time", where, 0),
                        _int_field(row, "duration", where, 1),
                        _state_bytes(row, where, fixed),
                    )
                )
    except UnicodeDecodeError as exc:
        raise TraceFormatError(f"{path}: not a text CSV file ({exc.reason})") from None
    if not rows:
        raise TraceFormatError(f"{path}: no rows after the header")
    rows.sort(key=lambda r: r[0])
    return Workload(name=path.name, sessions=tuple(sessions_from_rows(rows, split_on_gpu_change)))


def _state_bytes(row: dict[str, str], where: str, fixed: int | None) -> int:
    if fixed is not None:
        return fixed
    model = row.get("model_name")
    if model is None:
        return 0
    try:
        return model_state_bytes(model)
    except UnknownModelError as exc:
        raise TraceFormatError(f"{where}: column 'model_name': {exc}") from None


def sessions_from_rows(rows: list[Row], split_on_gpu_change: bool = False) -> list[Session]:
    """Group (job_id, num_gpu, submit_min, duration_min, state_bytes) rows, in job_id order, into sessions."""
    sessions: list[Session] = []
    current: list[Task] = []
    previous: Row | None = None
    for row in rows:
        _, gpus, submit, duration, state = row
        if previous is not None:
            _, prev_gpus, prev_submit, prev_duration, _ = previous
            new_session = (
                submit < prev_submit
                or submit < prev_submit + prev_duration
                or (split_on_gpu_change and gpus != prev_gpus)
            )
            if new_session:
                sessions.append(Session.from_tasks(f"s{len(sessions)}", tuple(current)))
                current = []
        current.append(Task(submit * MINUTE_S, duration * MINUTE_S, gpus, state))
        previous = row
    sessions.append(Session.from_tasks(f"s{len(sessions)}", tuple(current)))
    return sessions


def _number(obj: dict[str, Any], key: str, where: str) -> float:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TraceFormatError(f"{where}: {key!r} is {value!r}, expected a number")
    return float(value)


def read_template_json(path: str | Path, *, state_gb: float | None = None) -> Workload:
    """Read the workload driver's per-session JSON template (sessions with explicit lives)."""
    path = Path(path)
    fixed = None if state_gb is None else fixed_state_bytes(state_gb)
    try:
        document = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(document, dict) or not isinstance(document.get("sessions"), list):
        raise TraceFormatError(f"{path}: expected an object with a 'sessions' list")
    sessions: list[Session] = []
    for index, raw in enumerate(document["sessions"]):
        where = f"{path}: sessions[{index}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("trainings"), list):
            raise TraceFormatError(f"{where}: expected an object with a 'trainings' list")
        tasks: list[Task] = []
        for t_index, training in enumerate(raw["trainings"]):
            t_where = f"{where}.trainings[{t_index}]"
            if not isinstance(training, dict):
                raise TraceFormatError(f"{t_where}: expected an object")
            duration = _number(training, "duration_in_ticks", t_where)
            gpus = int(_number(training, "gpus", t_where))
            if duration <= 0 or gpus < 0:
                raise TraceFormatError(f"{t_where}: duration must be > 0 and gpus >= 0")
            state = fixed
            if state is None:
                vram = _number(training, "vram", t_where) if "vram" in training else 0.0
                if vram < 0:
                    raise TraceFormatError(f"{t_where}: 'vram' must be >= 0 (GB)")
                state = round(vram * GB)
            tasks.append(
                Task(
                    submit_s=_number(training, "start_tick", t_where) * TICK_S,
                    duration_s=duration * TICK_S,
                    gpus=max(gpus, 1),
                    state_bytes=state,
                )
            )
        if not tasks:
            continue  # a session that never trains needs no GPU under any policy
        tasks.sort(key=lambda t: t.submit_s)
        start = min(_number(raw, "start_tick", where) * TICK_S, tasks[0].submit_s)
        end = max(_number(raw, "stop_tick", where) * TICK_S, max(t.end_s for t in tasks))
        sessions.append(
            Session(
                session_id=str(raw.get("id", f"s{index}")),
                tasks=tuple(tasks),
                start_s=start,
                end_s=end,
                life_known=True,
            )
        )
    if not sessions:
        raise TraceFormatError(f"{path}: no session has a training event")
    return Workload(name=path.name, sessions=tuple(sessions))
