"""`notebookos simulate` as a user runs it: one JSON object, a table, plots, one-line errors."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from jupyter_notebookos.simulator.cli import add_arguments, main, run

SYNTHETIC = ["--synthetic", "--sessions", "12", "--hours", "3", "--seed", "1", "--no-progress"]


def test_json_is_exactly_one_object_in_the_issue_schema(capsys):
    assert main([*SYNTHETIC, "--json"]) == 0
    out = capsys.readouterr().out
    document = json.loads(out)
    assert out.count("\n") == 1
    assert set(document) == {"window", "model", "policies", "saved_gpu_hours_vs_reservation"}
    assert document["model"]["culling"] == "production" and document["model"]["idle_timeout_min"] == 30
    assert set(document["window"]) == {"start_hour", "hours", "sessions", "tasks"}
    assert set(document["policies"]) == {"notebookos", "reservation", "batch"}
    for figures in document["policies"].values():
        assert set(figures) == {
            "provisioned_gpu_hours",
            "busy_gpu_hours",
            "utilization",
            "delay_s",
            "immediate_fraction",
            "migrations",
            "scale_outs",
            "scale_ins",
            "restores",
            "restored_gb",
            "late_by_cause",
            "p99_tail_by_cause",
        }
        assert set(figures["delay_s"]) == {"p50", "p95", "p99", "max"}
    assert set(document["model"]["state"]) == {"mean_gb", "p99_gb", "restore_mean_s", "restore_p99_s"}
    assert 0.39 < document["model"]["state"]["mean_gb"] < 2.3  # the models the synthetic workload draws
    assert document["saved_gpu_hours_vs_reservation"]["reservation"] == 0.0


def test_window_of_a_trace_and_policy_subset(write_csv, capsys):
    rows = [(1, 0, 30), (1, 40, 30), (8, 10, 120), (4, 300, 10)]
    path = write_csv(rows)
    code = main(
        [
            "--trace",
            str(path),
            "--policies",
            "reservation,batch",
            "--window-hours",
            "2",
            "--start-hour",
            "max-waste",
            "--idle-timeout-min",
            "0",
            "--culling",
            "keep-alive",
            "--json",
            "--no-progress",
        ]
    )
    assert code == 0
    document = json.loads(capsys.readouterr().out)
    assert list(document["policies"]) == ["reservation", "batch"]
    assert document["window"]["hours"] == 2
    # the second session (8 GPUs) idles from minute 130 to 300: the 2-hour window lies in that gap
    assert 130 / 60 <= document["window"]["start_hour"] <= 180 / 60
    assert document["window"]["tasks"] == 0
    reservation = document["policies"]["reservation"]
    assert reservation["busy_gpu_hours"] < 0.1 and reservation["provisioned_gpu_hours"] >= 2 * 8


def test_table_output_and_plots(tmp_path: Path, capsys):
    assert main([*SYNTHETIC, "--plot", str(tmp_path / "img")]) == 0
    captured = capsys.readouterr()
    assert "notebookos" in captured.out and "provisioned" in captured.out
    for name in ("gpus_over_time.png", "delay_cdf.png"):
        assert (tmp_path / "img" / name).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("columns", [72, 80, 100, 110, 120, 160])
def test_the_table_fits_the_terminal_without_cutting_a_column(columns: int, capsys, monkeypatch):
    """At 120 columns, at 80 and between, every header and figure shows whole, in a table no wider than the terminal
    (turned on its side where one row per policy does not fit)."""
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich draws for a terminal of that width, as a user sees it
    monkeypatch.setenv("TTY_INTERACTIVE", "0")
    assert main(SYNTHETIC) == 0
    out = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)  # (styles)
    assert "…" not in out, out
    assert max(len(line) for line in out.splitlines()) <= columns, out
    for word in ("notebookos", "reservation", "batch", "provisioned", "migrations", "saved", "p99"):
        assert word in out, (word, out)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trace", "/nonexistent/trace.csv"], "no such file"),
        ([*SYNTHETIC, "--window-hours", "-1"], "--window-hours must be > 0"),
        ([*SYNTHETIC, "--gpus-per-host", "0"], "--gpus-per-host must be >= 1"),
        ([*SYNTHETIC, "--start-hour", "max-waste"], "needs --window-hours"),
        ([*SYNTHETIC, "--restore-s", "-3"], "--restore-s must be >= 0"),
        ([*SYNTHETIC, "--host-release-s", "-1"], "--host-release-s must be >= 0"),
        ([*SYNTHETIC, "--restart-lead-min", "-1"], "--restart-lead-min must be >= 0"),
        ([*SYNTHETIC, "--prewarm-quantile", "1.5"], "--prewarm-quantile must be between 0 and 1"),
        ([*SYNTHETIC, "--prewarm-margin", "0.5"], "--prewarm-margin must be >= 1"),
    ],
)
def test_bad_input_gives_one_line_and_status_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.count("\n") == 0 and "Traceback" not in err


def test_malformed_csv_row_is_one_line(tmp_path: Path, capsys):
    path = tmp_path / "bad.csv"
    path.write_text("job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n0,1,x,0,a,1,0\n")
    assert main(["--trace", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "bad.csv:2" in err and err.count("\n") == 0


def test_unknown_policy_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as info:
        main([*SYNTHETIC, "--policies", "notebookos,slurm"])
    assert info.value.code == 2
    assert "unknown policy slurm" in capsys.readouterr().err


def test_the_parser_can_be_mounted_as_a_subcommand(capsys):
    parser = argparse.ArgumentParser(prog="notebookos")
    sub = parser.add_subparsers(dest="command")
    add_arguments(sub.add_parser("simulate"))
    args = parser.parse_args(["simulate", *SYNTHETIC, "--policies", "notebookos", "--json"])
    assert run(args) == 0
    assert list(json.loads(capsys.readouterr().out)["policies"]) == ["notebookos"]


def test_the_production_culler_is_the_default_and_keep_alive_is_the_sensitivity_option(capsys):
    documents = {}
    for model in ("production", "keep-alive"):
        assert main([*SYNTHETIC, "--culling", model, "--json"]) == 0
        documents[model] = json.loads(capsys.readouterr().out)
    production, keep_alive = documents["production"], documents["keep-alive"]
    assert production["model"]["culling"] == "production" and production["model"]["kernel_restarts"] > 0
    assert keep_alive["model"]["kernel_restarts"] == 0
    # the culler frees the GPUs Reservation held through long gaps: its bill falls
    reserved = {m: d["policies"]["reservation"]["provisioned_gpu_hours"] for m, d in documents.items()}
    assert reserved["production"] < reserved["keep-alive"]
    # a restarted NotebookOS kernel restores its state from the store (counted), unless pre-warmed before
    assert production["policies"]["notebookos"]["restores"] > 0
    assert keep_alive["policies"]["notebookos"]["restores"] == 0
