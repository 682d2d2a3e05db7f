"""Output of `notebookos simulate`: the one JSON object of `--json`, or a readable table."""

from __future__ import annotations

import json
from typing import Any, TextIO

from rich import box
from rich.console import Console
from rich.table import Table

from jupyter_notebookos.terminal import fitted_table, narrowest


def result_document(
    start_hour: float,
    hours: float,
    sessions: tuple[int, int],
    tasks: int,
    summaries: dict[str, dict[str, Any]],
    saved: dict[str, float],
    model: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `--json` object: window, model, per-policy figures and the saving against Reservation. ``sessions``: the
    window's (trace) sessions and kernels (more: the idle culler's model starts a kernel again for a session's cell
    after a long gap)."""
    return {
        "window": {
            "start_hour": round(start_hour, 4),
            "hours": round(hours, 4),
            "sessions": sessions[0],
            "kernels": sessions[1],
            "tasks": tasks,
        },
        "model": model or {},
        "policies": summaries,
        "saved_gpu_hours_vs_reservation": saved,
    }


def write_json(document: dict[str, Any], out: TextIO) -> None:
    """Print exactly one JSON object and a newline."""
    out.write(json.dumps(document, sort_keys=False) + "\n")


def _policies_as_rows(title: str, caption: str, policies: list[str], figures: list[tuple[str, list[str]]]) -> Table:
    """One row per policy, one column per figure (headers wrap at spaces, figures never)."""
    rows = [[name, *(values[index] for _, values in figures)] for index, name in enumerate(policies)]
    labels = [label for label, _ in figures]
    return fitted_table(["policy", *labels], rows, right=labels, title=title, caption=caption, box=box.SIMPLE_HEAD)


def _figures_as_rows(title: str, caption: str, policies: list[str], figures: list[tuple[str, list[str]]]) -> Table:
    """The same figures turned: one row per figure, one column per policy (for a narrow terminal)."""
    rows = [[label, *values] for label, values in figures]
    return fitted_table(["", *policies], rows, right=policies, title=title, caption=caption, box=box.SIMPLE_HEAD)


def write_table(
    document: dict[str, Any], console: Console, title: str = "", late: dict[str, dict[str, int]] | None = None
) -> None:
    """Print the run as a table: one row per policy; then, per policy, what cells over 1 s waited for."""
    window = document["window"]
    restarted = window["kernels"] - window["sessions"]
    kernels = f" ({window['kernels']} kernels: {restarted} started again after the idle culler)" if restarted else ""
    caption = (
        f"window: hour {window['start_hour']:g} + {window['hours']:g} h, {window['sessions']} sessions{kernels}, "
        f"{window['tasks']} tasks; delay = submission to start of execution"
    )
    saved = document["saved_gpu_hours_vs_reservation"]
    policies = document["policies"]
    figures: list[tuple[str, list[str]]] = [
        ("provisioned GPU-h", [f"{p['provisioned_gpu_hours']:,.0f}" for p in policies.values()]),
        ("busy GPU-h", [f"{p['busy_gpu_hours']:,.0f}" for p in policies.values()]),
        ("util.", [f"{100 * p['utilization']:.1f} %" for p in policies.values()]),
        ("saved vs resv.", [f"{saved[name]:,.0f}" if name in saved else "-" for name in policies]),
        ("delay p50 s", [f"{p['delay_s']['p50']:.2f}" for p in policies.values()]),
        ("p95 s", [f"{p['delay_s']['p95']:.2f}" for p in policies.values()]),
        ("p99 s", [f"{p['delay_s']['p99']:.1f}" for p in policies.values()]),
        ("max s", [f"{p['delay_s']['max']:.0f}" for p in policies.values()]),
        ("<= 1 s", [f"{100 * p['immediate_fraction']:.1f} %" for p in policies.values()]),
        ("migrations", [str(p["migrations"]) for p in policies.values()]),
        ("scale out/in", [f"{p['scale_outs']}/{p['scale_ins']}" for p in policies.values()]),
    ]
    table = _policies_as_rows(title or "notebookos simulate", caption, list(policies), figures)
    if narrowest(table) > console.width:
        table = _figures_as_rows(title or "notebookos simulate", caption, list(policies), figures)
    console.print(table)
    if document.get("why_notebookos_bills_more"):
        console.print(document["why_notebookos_bills_more"], highlight=False)
    for name, p in document["policies"].items():
        if p.get("users"):
            write_users(name, p["users"], p["jain_index"], console)
    for name, causes in (late or {}).items():
        if causes:
            ranked = sorted(causes.items(), key=lambda kv: -kv[1])
            text = ", ".join(f"{cause}: {count}" for cause, count in ranked)
            console.print(f"{name}: cells later than 1 s waited for {text}", highlight=False)
    for name, p in document["policies"].items():
        tail = p.get("p99_tail_by_cause") or {}
        if tail:
            text = ", ".join(f"{cause}: {count}" for cause, count in sorted(tail.items(), key=lambda kv: -kv[1]))
            console.print(f"{name}: the p99 tail (cells at or above p99, later than 1 s) is {text}", highlight=False)
    model = document.get("model") or {}
    state = model.get("state") or {}
    if state:
        console.print(
            f"kernel state of the window's cells: mean {state['mean_gb']:g} GB, p99 {state['p99_gb']:g} GB; a "
            f"restore takes {state['restore_mean_s']:g} s on average, {state['restore_p99_s']:g} s at p99",
            highlight=False,
        )
    if model.get("culling") == "production":
        prewarm = model.get("prewarm", {})
        console.print(
            f"kernels restarted after the idle culler: {model.get('kernel_restarts', 0)}; NotebookOS pre-warming "
            f"found {prewarm.get('warm_returns', 0)} returns warm, {prewarm.get('standby_expired', 0)} standby "
            "windows expired (whole workload)",
            highlight=False,
        )


#: Above this many users the table shows the users whose cells waited longest (p95) only.
USER_ROWS = 12


def write_users(policy: str, users: dict[str, Any], jain: float, console: Console) -> None:
    """Per-user delays of one policy, and Jain's fairness index over the users."""
    shown = sorted(users.items(), key=lambda item: (-item[1]["delay_s"]["p95"], item[0]))[:USER_ROWS]
    which = "" if len(users) <= USER_ROWS else f", the {USER_ROWS} with the longest p95 of {len(users)}"
    table = Table(title=f"{policy}: delay per user{which}; Jain's fairness index {jain:.3f}")
    for column in ("user", "cells", "GPU-h", "delay p50 s", "p95 s", "p99 s", "max s"):
        table.add_column(column, justify="left" if column == "user" else "right")
    for user, u in sorted(shown):
        d = u["delay_s"]
        table.add_row(
            user,
            str(u["cells"]),
            f"{u['gpu_hours']:,.1f}",
            f"{d['p50']:.3f}",
            f"{d['p95']:.2f}",
            f"{d['p99']:.2f}",
            f"{d['max']:.1f}",
        )
    console.print(table)
