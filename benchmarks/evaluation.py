"""The evaluation in one command: NotebookOS, Reservation and Batch under both idle-culling models.

Runs `notebookos simulate` (as `python -m jupyter_notebookos.simulator`, two at a time) for

- the production culler (the default model) and the old keep-alive model (sensitivity row),
- the 17.5-hour window with the most reservation waste (each model's own) and the whole workload,

prints one table per scope with every policy and model, the p99 tail broken down by cause, and the issue's
targets checked for NotebookOS. `--frontier` adds a sweep of the NotebookOS scheduler's settings under the
production model (share of possible saving against cells within 1 s and p99), and says which target binds.

    python benchmarks/evaluation.py --trace PATH/sensei_june_60sec.csv [--frontier] [--out DIR]
    python benchmarks/evaluation.py --synthetic            # nothing downloaded: a generated day

The trace is the public `sensei_june_60sec.csv` of the NotebookOS-Dashboard repository (see the README);
`NOTEBOOKOS_TRACE` may name it instead of `--trace`. Without either, the synthetic workload is used.
Timing on a 2-core machine: the trace's window runs take seconds, each month run 30-60 s; the frontier
about 4 minutes more.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("notebookos", "reservation", "batch")
MODELS = ("production", "keep-alive")
WINDOW = ["--window-hours", "17.5", "--start-hour", "max-waste"]

# Targets of the issue, for NotebookOS (window and whole workload).
TARGET_SAVED_IN_WINDOW = 1187.0
TARGET_SHARE = 0.60
TARGET_IMMEDIATE = 0.98
TARGET_P99_S = 5.0

# Frontier: NotebookOS settings, cheapest first. Each is (label, extra options).
FRONTIER: list[tuple[str, list[str]]] = [
    (
        "lean: factor 1.0, no idle buffer, 1 ready host",
        ["--scaling-factor", "1.0", "--idle-host-buffer", "0", "--ready-host-buffer", "1"],
    ),
    (
        "factor 1.0, no idle buffer, 2 ready hosts",
        ["--scaling-factor", "1.0", "--idle-host-buffer", "0", "--ready-host-buffer", "2"],
    ),
    ("defaults, 2 ready hosts", ["--ready-host-buffer", "2"]),
    ("defaults (3 ready hosts)", []),
    ("defaults, no pre-warming", ["--prewarm-quantile", "0"]),
    (
        "defaults, pre-warming at most 24 h (4 h without history, margin 1.25)",
        ["--prewarm-max-hours", "24", "--prewarm-default-min", "240", "--prewarm-margin", "1.25"],
    ),
    (
        "defaults, no headroom placement, moves once per round",
        ["--no-headroom-placement", "--no-prepare-on-cell-start"],
    ),
    ("defaults, 4 ready hosts", ["--ready-host-buffer", "4"]),
    ("defaults, 6 ready hosts", ["--ready-host-buffer", "6"]),
    ("defaults, 8 ready hosts", ["--ready-host-buffer", "8"]),
    ("ready hosts from observed arrivals, p 0.95", ["--ready-host-probability", "0.95"]),
    ("ready hosts from observed arrivals, p 0.99", ["--ready-host-probability", "0.99"]),
]


# State sizes (production model, all three policies): what restores cost when kernels hold more or less, or the
# object store reads faster or slower, than the default model (the trace's model sizes at 0.2 GB/s).
STATE_SENSITIVITY: list[tuple[str, list[str]]] = [
    ("no state (a restore is its fixed 1 s)", ["--state-gb", "0"]),
    ("10 GB per kernel", ["--state-gb", "10"]),
    ("model sizes, store at 1 GB/s", ["--restore-gb-per-s", "1"]),
    ("model sizes, store at 0.05 GB/s", ["--restore-gb-per-s", "0.05"]),
]


def simulate(source: list[str], options: list[str]) -> dict[str, Any]:
    """One `notebookos simulate --json` run; its JSON document and wall time."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "jupyter_notebookos.simulator", *source, *options, "--json", "--no-progress"]
    began = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr.strip()}")
    document: dict[str, Any] = json.loads(done.stdout)
    document["wall_s"] = round(time.monotonic() - began, 1)
    return document


def share(document: dict[str, Any], policy: str) -> float | None:
    """(Reservation bill - policy bill) / (Reservation bill - busy GPU-hours)."""
    policies = document["policies"]
    if "reservation" not in policies or policy not in policies:
        return None
    reserved = policies["reservation"]["provisioned_gpu_hours"]
    possible = reserved - policies["reservation"]["busy_gpu_hours"]
    return (reserved - policies[policy]["provisioned_gpu_hours"]) / possible if possible > 0 else None


def _causes(causes: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(causes.items(), key=lambda kv: -kv[1])) or "-"


def table(runs: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown rows: one per model and policy."""
    lines = [
        "| model | policy | provisioned GPU-h | busy GPU-h | saved vs Reservation | share of possible saving "
        "| <= 1 s | p99 s | max s | migrations | hosts added / removed | restores | p99 tail by cause |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for model, document in runs.items():
        saved = document["saved_gpu_hours_vs_reservation"]
        for policy, p in document["policies"].items():
            s = share(document, policy)
            lines.append(
                f"| {model} | {policy} | {p['provisioned_gpu_hours']:,.0f} | {p['busy_gpu_hours']:,.0f} "
                f"| {saved.get(policy, 0):,.0f} | {'' if s is None or policy == 'reservation' else f'{100 * s:.1f} %'} "
                f"| {100 * p['immediate_fraction']:.1f} % | {p['delay_s']['p99']:.1f} | {p['delay_s']['max']:.0f} "
                f"| {p['migrations']:,} | {p['scale_outs']:,} / {p['scale_ins']:,} | {p['restores']:,} "
                f"| {_causes(p['p99_tail_by_cause'])} |"
            )
    return lines


def targets(document: dict[str, Any], window: bool) -> list[tuple[str, bool, str]]:
    """The issue's targets for NotebookOS in one run: (target, met, measured)."""
    nbos = document["policies"]["notebookos"]
    s = share(document, "notebookos")
    saved = document["saved_gpu_hours_vs_reservation"].get("notebookos", 0.0)
    checks = []
    if window:
        checks.append(
            (f"saves >= {TARGET_SAVED_IN_WINDOW:,.0f} GPU-h", saved >= TARGET_SAVED_IN_WINDOW, f"{saved:,.0f}")
        )
    checks += [
        (f"share >= {100 * TARGET_SHARE:.0f} %", s is not None and s >= TARGET_SHARE, f"{100 * (s or 0):.1f} %"),
        (
            f"<= 1 s for >= {100 * TARGET_IMMEDIATE:.0f} %",
            nbos["immediate_fraction"] >= TARGET_IMMEDIATE,
            f"{100 * nbos['immediate_fraction']:.1f} %",
        ),
        (f"p99 <= {TARGET_P99_S:g} s", nbos["delay_s"]["p99"] <= TARGET_P99_S, f"{nbos['delay_s']['p99']:.1f} s"),
    ]
    if "batch" in document["policies"]:
        batch = document["policies"]["batch"]["provisioned_gpu_hours"]
        checks.append(
            (
                "bills less than Batch",
                nbos["provisioned_gpu_hours"] < batch,
                f"{nbos['provisioned_gpu_hours']:,.0f} vs {batch:,.0f}",
            )
        )
    return checks


def frontier_rows(label: str, documents: list[tuple[str, dict[str, Any]]], reference: dict[str, Any]) -> list[str]:
    """Markdown rows of the frontier: NotebookOS runs measured against one run's Reservation and Batch."""
    reserved = reference["policies"]["reservation"]["provisioned_gpu_hours"]
    busy = reference["policies"]["reservation"]["busy_gpu_hours"]
    batch = reference["policies"]["batch"]["provisioned_gpu_hours"]
    rows = []
    for name, document in documents:
        p = document["policies"]["notebookos"]
        bill = p["provisioned_gpu_hours"]
        s = (reserved - bill) / (reserved - busy)
        rows.append(
            f"| {label} | {name} | {bill:,.0f} | {reserved - bill:,.0f} | {100 * s:.1f} % "
            f"| {100 * p['immediate_fraction']:.1f} % | {p['delay_s']['p99']:.1f} | {'yes' if bill < batch else 'no'} "
            f"| {_causes(p['late_by_cause'])} |"
        )
    return rows


def state_rows(label: str, documents: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Markdown rows of the state-size sensitivity: NotebookOS and Batch, each run against its own Reservation."""
    rows = []
    for name, document in documents:
        policies = document["policies"]
        nbos, batch = policies["notebookos"], policies["batch"]
        s = share(document, "notebookos")
        state = document["model"].get("state") or {}
        rows.append(
            f"| {label} | {name} | {state.get('restore_mean_s', 0):g} | {nbos['provisioned_gpu_hours']:,.0f} "
            f"| {100 * (s or 0):.1f} % | {100 * nbos['immediate_fraction']:.1f} % | {nbos['delay_s']['p99']:.1f} "
            f"| {nbos['restored_gb']:,.0f} | {batch['provisioned_gpu_hours']:,.0f} | {batch['delay_s']['p50']:.1f} "
            f"| {'yes' if nbos['provisioned_gpu_hours'] < batch['provisioned_gpu_hours'] else 'no'} |"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the evaluation; print Markdown tables; optionally write every JSON document to --out."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--trace", metavar="PATH", default=os.environ.get("NOTEBOOKOS_TRACE"))
    which.add_argument("--synthetic", action="store_true", help="a generated workload (24 h), no trace needed")
    parser.add_argument("--frontier", action="store_true", help="also sweep NotebookOS's scheduler settings")
    parser.add_argument("--no-month", action="store_true", help="the window only (quick)")
    parser.add_argument("--out", metavar="DIR", help="write each run's JSON document here")
    args = parser.parse_args(argv)
    if args.trace and not Path(args.trace).is_file():
        parser.error(
            f"--trace {args.trace}: no such file (the NotebookOS-Dashboard repository's "
            "driver-backend/scripts/tiresias_generator/sensei_june_60sec.csv)"
        )
    source = ["--trace", args.trace] if args.trace and not args.synthetic else ["--synthetic", "--hours", "24"]
    window = WINDOW if source[0] != "--synthetic" else ["--window-hours", "6", "--start-hour", "max-waste"]
    scopes = {"window": window} if args.no_month else {"window": window, "whole workload": []}

    jobs = {(scope, model): ["--culling", model, *opts] for scope, opts in scopes.items() for model in MODELS}
    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {key: pool.submit(simulate, source, opts) for key, opts in jobs.items()}
        results = {key: f.result() for key, f in futures.items()}
        sweep: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        if args.frontier:
            for scope, opts in scopes.items():
                runs = [
                    (name, pool.submit(simulate, source, [*opts, "--policies", "notebookos", *extra]))
                    for name, extra in FRONTIER
                ]
                sweep[scope] = [(name, f.result()) for name, f in runs]
        sizes: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        if args.frontier:
            for scope, opts in scopes.items():
                runs = [(name, pool.submit(simulate, source, [*opts, *extra])) for name, extra in STATE_SENSITIVITY]
                sizes[scope] = [("model sizes at 0.2 GB/s (default)", results[(scope, "production")])]
                sizes[scope] += [(name, f.result()) for name, f in runs]

    print(f"# Evaluation ({' '.join(source)}), {time.monotonic() - began:.0f} s wall\n")
    for scope in scopes:
        runs = {model: results[(scope, model)] for model in MODELS}
        first = runs["production"]["window"]
        print(
            f"## {scope}: hour {first['start_hour']:g} + {first['hours']:g} h (production model), "
            f"{first['sessions']} sessions, {first['kernels']} kernels, {first['tasks']} cells"
        )
        keep = runs["keep-alive"]["window"]
        print(
            f"(keep-alive model: hour {keep['start_hour']:g}, {keep['sessions']} sessions; run times "
            f"{runs['production']['wall_s']} s and {runs['keep-alive']['wall_s']} s)\n"
        )
        print("\n".join(table(runs)))
        restarts = runs["production"]["model"]
        print(
            f"\nProduction model: {restarts['kernel_restarts']:,} kernels restarted after the culler in this "
            f"scope; NotebookOS pre-warming found {restarts['prewarm']['warm_returns']:,} returns warm and let "
            f"{restarts['prewarm']['standby_expired']:,} standby windows expire (whole workload).\n"
        )
        for model, document in runs.items():
            checks = targets(document, scope == "window")
            text = "; ".join(f"{name}: {measured} {'ok' if met else 'MISSED'}" for name, met, measured in checks)
            print(f"- NotebookOS targets, {model}: {text}")
        print()
    if sweep:
        print("## Frontier (production model): NotebookOS settings against the default run's Reservation and Batch\n")
        print(
            "| scope | settings | NotebookOS GPU-h | saved | share of possible saving | <= 1 s | p99 s "
            "| below Batch | late cells by cause |"
        )
        print("|---|---|---:|---:|---:|---:|---:|---|---|")
        for scope, documents in sweep.items():
            print("\n".join(frontier_rows(scope, documents, results[(scope, "production")])))
    if sizes:
        print("\n## State sizes (production model): restores of more or less state, from a faster or slower store\n")
        print(
            "| scope | state / store | mean restore s | NotebookOS GPU-h | share of possible saving | <= 1 s | p99 s "
            "| GB restored | Batch GPU-h | Batch p50 s | NotebookOS below Batch |"
        )
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for scope, documents in sizes.items():
            print("\n".join(state_rows(scope, documents)))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for (scope, model), document in results.items():
            (out / f"{scope.replace(' ', '-')}-{model}.json").write_text(json.dumps(document, indent=1) + "\n")
        for scope, documents in sweep.items():
            frontier = [{"settings": name, **doc} for name, doc in documents]
            (out / f"frontier-{scope.replace(' ', '-')}.json").write_text(json.dumps(frontier, indent=1) + "\n")
        for scope, documents in sizes.items():
            rows = [{"settings": name, **doc} for name, doc in documents]
            (out / f"state-sizes-{scope.replace(' ', '-')}.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
