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
    assert set(document) - {"why_notebookos_bills_more"} == {
        "window",
        "model",
        "policies",
        "saved_gpu_hours_vs_reservation",
    }
    assert document["model"]["culling"] == "production" and document["model"]["idle_timeout_min"] == 30
    assert set(document["window"]) == {"start_hour", "hours", "sessions", "kernels", "tasks"}
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


def test_synthetic_hours_are_the_window_and_its_sessions_are_counted_once(capsys):
    """`--synthetic --sessions 12 --hours 3`: 3 hours measured (not the days the last cells run on), 12 sessions in
    the title and under the table alike; the kernels the idle culler's model starts again are counted apart."""
    assert main([*SYNTHETIC, "--json"]) == 0
    window = json.loads(capsys.readouterr().out)["window"]
    assert (window["start_hour"], window["hours"], window["sessions"]) == (0, 3, 12)
    assert window["kernels"] > window["sessions"]
    assert main(SYNTHETIC) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "sessions=12, hours=3" in out and "hour 0 + 3.0 h" in out
    restarted = window["kernels"] - 12
    assert f"hour 0 + 3 h, 12 sessions ({window['kernels']} kernels: {restarted} started again" in out


def test_where_notebookos_bills_more_than_reservation_the_output_says_why(capsys):
    """The ready-host buffer (hosts kept able to start the largest cell at once) costs more than Reservation wastes
    on a workload this small: one line says so, with the bill measured without it."""
    assert main([*SYNTHETIC, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["saved_gpu_hours_vs_reservation"]["notebookos"] < 0
    why = document["why_notebookos_bills_more"]
    assert why.startswith("NotebookOS bills ") and "keeps 3 hosts ready to start an 8-GPU cell at once" in why
    assert main([*SYNTHETIC, "--policies", "notebookos", "--ready-host-buffer", "0", "--json"]) == 0
    lean = json.loads(capsys.readouterr().out)["policies"]["notebookos"]
    assert f"without them (--ready-host-buffer 0) it bills {lean['provisioned_gpu_hours']:,.0f} GPU-h" in why
    assert main(SYNTHETIC) == 0
    assert why in " ".join(capsys.readouterr().out.split())
    # Where NotebookOS saves (the default synthetic day), nothing to explain.
    assert main(["--synthetic", "--no-progress", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["saved_gpu_hours_vs_reservation"]["notebookos"] > 0
    assert "why_notebookos_bills_more" not in document


def test_table_output_and_plots(tmp_path: Path, capsys):
    assert main([*SYNTHETIC, "--plot", str(tmp_path / "img")]) == 0
    captured = capsys.readouterr()
    assert "notebookos" in captured.out and "provisioned" in captured.out
    for name in ("gpus_over_time.png", "delay_cdf.png"):
        assert (tmp_path / "img" / name).read_bytes()[:4] == b"\x89PNG"


def test_plot_titles_are_not_clipped(tmp_path: Path, capsys):
    """Each plot's title fits its image: no dark pixel of it at the image's left or right edge."""
    import numpy as np
    from PIL import Image

    assert main([*SYNTHETIC, "--plot", str(tmp_path)]) == 0
    for name in ("gpus_over_time.png", "delay_cdf.png"):
        pixels = np.asarray(Image.open(tmp_path / name).convert("L"))
        title = pixels[: pixels.shape[0] // 8]  # the title's band
        edges = np.concatenate([title[:, :4], title[:, -4:]], axis=1)
        assert (edges < 200).sum() == 0, f"{name}: the title runs off the image"


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


def test_help_states_each_default_once(capsys):
    """`notebookos simulate --help`: every default as "(default: X)", once; a 0 default too."""
    from jupyter_notebookos.cli import main as notebookos

    with pytest.raises(SystemExit):
        notebookos(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # (argparse wraps lines)
    repeated = re.findall(r"\(([\w.]+)\) \(default: ([\w.]+)\)", text)
    assert not [pair for pair in repeated if pair[0] == pair[1] or f"{pair[0]}.0" == pair[1]], repeated
    assert "(default: [" not in text  # a list shown as Python writes it
    for option, default in (("--seed SEED", "0"), ("--warmup-hours", "24.0")):
        assert re.search(re.escape(option) + r" [^-]*\(default: " + re.escape(default) + r"\)", text), option
    # --hours depends on the workload: its help says each default once, in words.
    assert re.search(r"--hours HOURS [^-]*measured \(24\); flood: hours of cells \(1\)", text), "--hours"
    assert "(default: None)" not in text


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
