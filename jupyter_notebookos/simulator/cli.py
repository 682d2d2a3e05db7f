"""`notebookos simulate`: replay a trace (or a synthetic workload) against the scheduler's policies.

`add_arguments` fills a parser (the `notebookos` console script wires it as the `simulate` subcommand) and
`run` executes it; `python -m jupyter_notebookos.simulator` runs it standalone.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from traitlets import TraitError

from jupyter_notebookos.scheduler import PrewarmSettings
from jupyter_notebookos.simulator.costs import CostModel
from jupyter_notebookos.simulator.culling import CULLING_MODELS, apply_idle_culling
from jupyter_notebookos.simulator.dearer import WITHOUT_READY_HOSTS, dearer_than_reservation, readiness_of, why_dearer
from jupyter_notebookos.simulator.metrics import PolicyMetrics, saved_vs_reservation
from jupyter_notebookos.simulator.prewarm import apply_prewarm
from jupyter_notebookos.simulator.report import result_document, write_json, write_table
from jupyter_notebookos.simulator.scenarios import FLOOD_GPUS_PER_HOST, FLOOD_HOSTS, SCENARIOS, flood
from jupyter_notebookos.simulator.sharingopts import (
    UsageError,
    add_sharing_arguments,
    pool_config,
    quota_config,
    sharing_model,
)
from jupyter_notebookos.simulator.simulation import Simulation, SimulationConfig
from jupyter_notebookos.simulator.synthetic import generate
from jupyter_notebookos.simulator.trace import TraceFormatError, read_workload
from jupyter_notebookos.simulator.users import assign_users
from jupyter_notebookos.simulator.windows import most_wasteful_window
from jupyter_notebookos.simulator.workload import Workload, clip_to_window

POLICY_NAMES = ("notebookos", "reservation", "batch")
MAX_WASTE = "max-waste"

# CLI option -> Scheduler traitlet, for the knobs passed straight through.
SCHEDULER_KNOBS = {
    "scaling_factor": "scaling_factor",
    "min_hosts": "min_hosts",
    "idle_host_buffer": "idle_host_buffer",
    "scale_in_delay_s": "scale_in_delay_s",
    "max_scale_in_per_round": "max_scale_in_per_round",
    "subscription_ratio_cap": "subscription_ratio_cap",
    "replicas_per_kernel": "replicas_per_kernel",
    "max_concurrent_migrations": "max_concurrent_migrations",
    "ready_host_buffer": "ready_host_buffer",
    "max_prepare_migrations_per_round": "max_prepare_migrations_per_round",
    "executor_fit": "executor_fit",
    "headroom_placement": "headroom_placement",
    "prepare_on_cell_start": "prepare_on_cell_start",
    "ready_host_probability": "ready_host_probability",
    "ready_host_lead_s": "ready_host_lead_s",
    "ready_host_min": "ready_host_min",
    "ready_host_max": "ready_host_max",
    "max_hosts": "max_hosts",
    "fair_share": "fair_share",
    "fair_share_half_life_s": "fair_share_half_life_s",
    "fair_share_max_wait_s": "fair_share_max_wait_s",
}


def _policies(text: str) -> list[str]:
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in POLICY_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown policy {', '.join(unknown) or '(none)'}; choose from {','.join(POLICY_NAMES)}"
        )
    return list(dict.fromkeys(names))


def _start_hour(text: str) -> float | str:
    if text == MAX_WASTE:
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected hours (a number) or {MAX_WASTE!r}, got {text!r}") from None
    if value < 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of `notebookos simulate` to `parser`."""
    source = parser.add_argument_group("workload")
    which = source.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--trace",
        metavar="PATH",
        help="job-list CSV (sensei_june_60sec.csv, tiresias.csv) or per-session JSON template",
    )
    which.add_argument(
        "--synthetic",
        action="store_true",
        help="a synthetic workload calibrated to the June trace's statistics",
    )
    which.add_argument(
        "--scenario",
        choices=SCENARIOS,
        help="flood: user alice floods a fixed cluster of 4 hosts x 2 GPUs with 2-GPU cells while user bob runs "
        "short 1-GPU cells (the sharing targets; see docs/evaluation.md)",
    )
    source.add_argument(
        "--flood-kernels",
        type=int,
        default=5,
        help="flood scenario: alice's 2-GPU kernels (0: bob alone, the idle cluster)",
    )
    source.add_argument(
        "--sessions",
        type=int,
        default=None,
        help="synthetic: sessions (default: the trace's task rate over --hours)",
    )
    source.add_argument(
        "--hours",
        type=float,
        default=None,
        help="synthetic: sessions arrive over this many hours, and they are what is measured (24); flood: hours of "
        "cells (1)",
    )
    source.add_argument("--seed", type=int, default=0, help="synthetic: random seed")
    source.add_argument(
        "--state-gb",
        type=float,
        default=None,
        help="every kernel holds this much state (GB) instead of its model's (the trace's model_name, the "
        "template's vram, the synthetic draw); restores read it",
    )
    source.add_argument(
        "--split-on-gpu-change",
        action="store_true",
        help="CSV: also start a new session where num_gpu changes (the trace README's reading)",
    )
    source.add_argument(
        "--culling",
        choices=CULLING_MODELS,
        default="production",
        help="production: the idle culler ends a kernel after --idle-timeout-min idle minutes and a later cell "
        "starts a new one; keep-alive: kernels live through every gap of a trace session (the old model, "
        "for sensitivity analysis)",
    )
    source.add_argument(
        "--idle-timeout-min",
        type=float,
        default=30.0,
        help="idle-culling timeout T: kernel life after a task (and before a session's first)",
    )
    source.add_argument(
        "--restart-lead-min",
        type=float,
        default=0.0,
        help="production culling: how long before a returning cell its new kernel is started (0: the "
        "cell starts it and waits)",
    )
    source.add_argument(
        "--lead-min",
        type=float,
        default=None,
        help="kernel life before a session's first task (default: the idle-culling timeout)",
    )

    prewarm = parser.add_argument_group("pre-warming (NotebookOS, production culling)")
    defaults_p = PrewarmSettings()
    prewarm.add_argument(
        "--prewarm-quantile",
        type=float,
        default=defaults_p.quantile,
        help="keep a culled kernel's standby replicas long enough for this share of the session's own "
        "earlier returns; 0: no pre-warming",
    )
    prewarm.add_argument(
        "--prewarm-max-hours",
        type=float,
        default=defaults_p.max_standby_s / 3600.0,
        help="longest standby window",
    )
    prewarm.add_argument(
        "--prewarm-min-history",
        type=int,
        default=defaults_p.min_history,
        help="earlier returns a session must show before its history is used",
    )
    prewarm.add_argument(
        "--prewarm-default-min",
        type=float,
        default=defaults_p.default_standby_s / 60.0,
        help="standby window of a session without enough history",
    )
    prewarm.add_argument(
        "--prewarm-margin",
        type=float,
        default=defaults_p.margin,
        help="the window is the history's quantile times this",
    )

    window = parser.add_argument_group("window")
    window.add_argument(
        "--window-hours",
        type=float,
        default=None,
        help="measure only this many hours (default: --hours with --synthetic, else the whole workload)",
    )
    window.add_argument(
        "--start-hour",
        type=_start_hour,
        default=0.0,
        help=f"window start, hours from the trace start, or {MAX_WASTE!r}: the window with the most reservation waste",
    )
    window.add_argument(
        "--warmup-hours",
        type=float,
        default=24.0,
        help="simulate this long before the window so the cluster is in its steady state",
    )

    policy = parser.add_argument_group("policies and cluster")
    policy.add_argument(
        "--policies",
        type=_policies,
        default=None,
        help="comma-separated: notebookos,reservation,batch (all three; the flood scenario: notebookos)",
    )
    defaults = CostModel()
    policy.add_argument("--gpus-per-host", type=int, default=None, help="GPUs per host (8; the flood scenario: 2)")
    policy.add_argument(
        "--container-start-s",
        type=float,
        default=defaults.container_start_s,
        help="start a replica container",
    )
    policy.add_argument(
        "--restore-s",
        type=float,
        default=defaults.restore_s,
        help="restore kernel state from the object store, fixed part; Batch pays a restore per cell, NotebookOS "
        "per migration and restarted kernel",
    )
    policy.add_argument(
        "--restore-gb-per-s",
        type=float,
        default=defaults.restore_gb_per_s,
        help="a restore also reads the kernel's state at this rate, GB/s",
    )
    policy.add_argument(
        "--migration-s",
        type=float,
        default=defaults.migration_s,
        help="migration time beyond container start and restore",
    )
    policy.add_argument(
        "--host-provision-s",
        type=float,
        default=defaults.host_provision_s,
        help="from requesting a host to it taking replicas",
    )
    policy.add_argument(
        "--host-release-s",
        type=float,
        default=defaults.host_release_s,
        help="a removed host is billed this much longer (stop, deprovision)",
    )
    policy.add_argument(
        "--cell-commit-s",
        type=float,
        default=defaults.cell_commit_s,
        help="NotebookOS per-cell executor election",
    )

    scaling = parser.add_argument_group("autoscaling (Scheduler traitlets; defaults are the scheduler's)")
    scaling.add_argument("--scaling-factor", type=float, help="target hosts = committed GPUs x this / G + buffer")
    scaling.add_argument("--idle-host-buffer", type=int, help="hosts' worth of idle GPUs kept spare")
    scaling.add_argument("--min-hosts", type=int, help="never fewer hosts")
    scaling.add_argument("--scale-in-delay-s", type=float, help="seconds over target before scaling in")
    scaling.add_argument("--max-scale-in-per-round", type=int, help="hosts drained per autoscaling round")
    scaling.add_argument("--subscription-ratio-cap", type=float, help="NotebookOS oversubscription cap")
    scaling.add_argument("--replicas-per-kernel", type=int, help="NotebookOS replicas per kernel")
    scaling.add_argument("--max-concurrent-migrations", type=int, help="cell-triggered migrations in flight")
    scaling.add_argument(
        "--ready-host-buffer", type=int, help="hosts kept able to bind the largest request (NotebookOS)"
    )
    scaling.add_argument(
        "--ready-host-probability",
        type=float,
        help="size the ready-host buffer from observed large-cell arrivals: cover one lead time's arrivals "
        "with this probability (0: the fixed --ready-host-buffer)",
    )
    scaling.add_argument(
        "--ready-host-lead-s", type=float, help="lead time of a new ready host (default: the scheduler's, 240)"
    )
    scaling.add_argument(
        "--ready-host-min", type=int, help="fewest ready hosts sized from arrivals (default: the scheduler's, 1)"
    )
    scaling.add_argument(
        "--ready-host-max", type=int, help="most ready hosts sized from arrivals (default: the scheduler's, 8)"
    )
    scaling.add_argument(
        "--max-prepare-migrations-per-round",
        type=int,
        help="ahead-of-time moves of idle kernels per autoscaling round (NotebookOS; 0: off)",
    )
    scaling.add_argument(
        "--executor-fit",
        choices=("sticky", "best-fit"),
        help="NotebookOS executor choice among replicas",
    )
    scaling.add_argument(
        "--max-hosts", type=int, help="autoscaling never goes above this many hosts (0: no bound; flood: 4)"
    )
    scaling.add_argument(
        "--headroom-placement",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="NotebookOS: one replica of a new kernel where its next cell can bind its GPUs now",
    )
    scaling.add_argument(
        "--prepare-on-cell-start",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="NotebookOS: ahead-of-time moves also right after a cell takes GPUs, not only once per round",
    )
    scaling.add_argument("--autoscale-interval-s", type=float, default=60.0, help="seconds between autoscaling rounds")
    scaling.add_argument(
        "--no-scale-out-on-wait",
        action="store_true",
        help="do not ask for a host when a queued cell is blocked and scaling out would help",
    )
    scaling.add_argument(
        "--initial-hosts",
        type=int,
        default=None,
        help="hosts up at the start (default: the scheduler's minimum)",
    )

    add_sharing_arguments(parser)

    output = parser.add_argument_group("output")
    output.add_argument("--json", action="store_true", help="print exactly one JSON object")
    output.add_argument(
        "--plot",
        metavar="DIR",
        default=None,
        help="write PNGs: provisioned vs busy GPUs over time, delay CDF",
    )
    output.add_argument("--plot-prefix", default="", help="prefix of the PNG file names")
    output.add_argument("--no-progress", action="store_true", help="no progress bar")


def _check(args: argparse.Namespace) -> None:
    checks = [
        (args.sessions is None or args.sessions >= 1, "--sessions must be >= 1"),
        (args.hours is None or args.hours > 0, "--hours must be > 0"),
        (args.flood_kernels >= 0, "--flood-kernels must be >= 0"),
        (args.groups >= 0, "--groups must be >= 0"),
        (args.restore_gb_per_s > 0, "--restore-gb-per-s must be > 0"),
        (args.state_gb is None or args.state_gb >= 0, "--state-gb must be >= 0"),
        (args.idle_timeout_min >= 0, "--idle-timeout-min must be >= 0"),
        (args.lead_min is None or args.lead_min >= 0, "--lead-min must be >= 0"),
        (args.restart_lead_min >= 0, "--restart-lead-min must be >= 0"),
        (0 <= args.prewarm_quantile <= 1, "--prewarm-quantile must be between 0 and 1"),
        (args.prewarm_max_hours >= 0, "--prewarm-max-hours must be >= 0"),
        (args.prewarm_min_history >= 0, "--prewarm-min-history must be >= 0"),
        (args.prewarm_default_min >= 0, "--prewarm-default-min must be >= 0"),
        (args.prewarm_margin >= 1, "--prewarm-margin must be >= 1"),
        (args.window_hours is None or args.window_hours > 0, "--window-hours must be > 0"),
        (args.warmup_hours >= 0, "--warmup-hours must be >= 0"),
        (args.gpus_per_host is None or args.gpus_per_host >= 1, "--gpus-per-host must be >= 1"),
        (args.autoscale_interval_s > 0, "--autoscale-interval-s must be > 0"),
        (
            not (args.start_hour == MAX_WASTE and args.window_hours is None),
            f"--start-hour {MAX_WASTE} needs --window-hours",
        ),
    ]
    for value in (
        "container_start_s",
        "restore_s",
        "migration_s",
        "host_provision_s",
        "host_release_s",
        "cell_commit_s",
    ):
        checks.append((getattr(args, value) >= 0, f"--{value.replace('_', '-')} must be >= 0"))
    for knob in (
        "min_hosts",
        "idle_host_buffer",
        "max_scale_in_per_round",
        "max_concurrent_migrations",
        "ready_host_buffer",
        "ready_host_min",
        "ready_host_max",
        "max_prepare_migrations_per_round",
        "initial_hosts",
        "max_hosts",
        "fair_share_half_life_s",
        "fair_share_max_wait_s",
    ):
        v = getattr(args, knob)
        checks.append((v is None or v >= 0, f"--{knob.replace('_', '-')} must be >= 0"))
    for knob in ("scaling_factor", "subscription_ratio_cap", "replicas_per_kernel", "ready_host_lead_s"):
        v = getattr(args, knob)
        checks.append((v is None or v > 0, f"--{knob.replace('_', '-')} must be > 0"))
    for ok, message in checks:
        if not ok:
            raise UsageError(message)


def load_workload(args: argparse.Namespace) -> Workload:
    """The workload the options name, with the idle-culling model applied."""
    if args.scenario == "flood":
        workload = flood(hours=args.hours or 1.0, flood_kernels=args.flood_kernels, seed=args.seed)
    elif args.synthetic:
        workload = generate(sessions=args.sessions, hours=args.hours or 24.0, seed=args.seed, state_gb=args.state_gb)
    else:
        workload = read_workload(args.trace, split_on_gpu_change=args.split_on_gpu_change, state_gb=args.state_gb)
    workload = assign_users(workload, args.users, args.groups, args.gpu_type_mix, args.seed)
    lead = None if args.lead_min is None else args.lead_min * 60.0
    return apply_idle_culling(
        workload,
        args.idle_timeout_min * 60.0,
        lead,
        cull_gaps=args.culling == "production",
        restart_lead_s=args.restart_lead_min * 60.0,
    )


def _state_summary(workload: Workload, start_s: float, end_s: float, costs: CostModel) -> dict[str, float]:
    """The state sizes of the cells submitted in the window, and what restoring them costs."""
    sizes = np.asarray(
        [t.state_bytes for s in workload.sessions for t in s.tasks if start_s <= t.submit_s < end_s], dtype=float
    )
    if not sizes.size:
        return {}
    mean, p99 = float(sizes.mean()), float(np.percentile(sizes, 99))
    return {
        "mean_gb": round(mean / 1e9, 3),
        "p99_gb": round(p99 / 1e9, 3),
        "restore_mean_s": round(costs.restore_time_s(round(mean)), 2),
        "restore_p99_s": round(costs.restore_time_s(round(p99)), 2),
    }


def prewarm_settings(args: argparse.Namespace) -> PrewarmSettings:
    """The pre-warming knobs the options name."""
    return PrewarmSettings(
        quantile=args.prewarm_quantile,
        max_standby_s=args.prewarm_max_hours * 3600.0,
        min_history=args.prewarm_min_history,
        default_standby_s=args.prewarm_default_min * 60.0,
        margin=args.prewarm_margin,
    )


def run(args: argparse.Namespace) -> int:
    """Run `notebookos simulate`; returns the exit status (2: bad input, with a one-line message)."""
    err = Console(stderr=True)
    try:
        return _run(args, err)
    except (UsageError, TraceFormatError, TraitError, ValueError, OSError) as error:
        err.print(f"notebookos simulate: error: {error}", markup=False, highlight=False, emoji=False, soft_wrap=True)
        return 2


def _scenario_defaults(args: argparse.Namespace) -> None:
    """Fill what the options left to their defaults: the flood scenario's fixed cluster, or the usual ones."""
    if args.scenario == "flood":
        for knob, value in (
            ("gpus_per_host", FLOOD_GPUS_PER_HOST),
            ("min_hosts", FLOOD_HOSTS),
            ("max_hosts", FLOOD_HOSTS),
            ("initial_hosts", FLOOD_HOSTS),
            ("policies", ["notebookos"]),
        ):
            if getattr(args, knob) is None:
                setattr(args, knob, value)
    if args.gpus_per_host is None:
        args.gpus_per_host = CostModel().gpus_per_host
    if args.policies is None:
        args.policies = list(POLICY_NAMES)


def _run(args: argparse.Namespace, err: Console) -> int:
    _check(args)
    _scenario_defaults(args)
    costs = CostModel(
        gpus_per_host=args.gpus_per_host,
        container_start_s=args.container_start_s,
        restore_s=args.restore_s,
        restore_gb_per_s=args.restore_gb_per_s,
        migration_s=args.migration_s,
        host_provision_s=args.host_provision_s,
        host_release_s=args.host_release_s,
        cell_commit_s=args.cell_commit_s,
    )
    options: dict[str, Any] = {
        trait: getattr(args, opt) for opt, trait in SCHEDULER_KNOBS.items() if getattr(args, opt) is not None
    }
    quotas, pools = quota_config(args), pool_config(args)
    if quotas:
        options["quotas"] = quotas
    if pools:
        options["pools"] = pools
    workload = load_workload(args)
    if not workload.sessions:
        raise UsageError("the workload has no sessions")
    # NotebookOS's own workload: the same sessions plus the standby replicas its pre-warming keeps
    prewarmed, warm_returns, standby_expired = apply_prewarm(workload, prewarm_settings(args))
    origin = 0.0  # hours are counted from the trace's time 0
    span_start, span_end = workload.span_s
    # A synthetic workload's sessions arrive over --hours: that is the window measured, unless one is given (their
    # last cells can run days longer; counting that tail measured a near-empty cluster, not the workload asked for).
    window_hours = (args.hours or 24.0) if args.synthetic and args.window_hours is None else args.window_hours
    if window_hours is None:
        start_s, end_s = -math.inf, math.inf
        start_hour = max(0.0, span_start) / 3600.0
        hours = (span_end - max(0.0, span_start)) / 3600.0
        simulated = workload
        simulated_prewarmed = prewarmed
    else:
        if args.start_hour == MAX_WASTE:
            start_s = most_wasteful_window(workload, window_hours).start_s
        else:
            start_s = origin + float(args.start_hour) * 3600.0
        end_s = start_s + window_hours * 3600.0
        if start_s >= span_end:
            raise UsageError(f"--start-hour is past the end of the workload ({span_end / 3600.0:.1f} h)")
        start_hour, hours = start_s / 3600.0, window_hours
        simulated = clip_to_window(workload, start_s, end_s, args.warmup_hours * 3600.0)
        simulated_prewarmed = clip_to_window(prewarmed, start_s, end_s, args.warmup_hours * 3600.0)
    kernels = [s for s in simulated.sessions if s.end_s > start_s and s.start_s < end_s]
    tasks_in_window = sum(1 for s in simulated.sessions for t in s.tasks if start_s <= t.submit_s < end_s)

    runs: dict[str, PolicyMetrics] = {}
    show = not args.no_progress and err.is_terminal
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=err,
        disable=not show,
        transient=True,
    ) as bar:
        lo, hi = simulated.span_s
        if math.isfinite(end_s):
            hi = min(hi, end_s)

        def simulate(policy: str, scheduler_options: dict[str, Any], what: str) -> Simulation:
            task = bar.add_task(what, total=max(1.0, hi - lo))

            def progress(now: float) -> None:
                bar.update(task, completed=min(max(0.0, now - lo), hi - lo))

            config = SimulationConfig(
                policy=policy,
                costs=costs,
                scheduler_options=scheduler_options,
                autoscale_interval_s=args.autoscale_interval_s,
                initial_hosts=args.initial_hosts,
                scale_out_on_wait=not args.no_scale_out_on_wait,
                measure_start_s=start_s,
                measure_end_s=end_s,
            )
            simulation = Simulation(simulated_prewarmed if policy == "notebookos" else simulated, config, progress)
            simulation.run()
            return simulation

        simulations = {policy: simulate(policy, options, f"simulating {policy}") for policy in args.policies}
        runs = {policy: simulation.metrics for policy, simulation in simulations.items()}
        summaries = {name: m.summary() for name, m in runs.items()}
        why = None
        if dearer_than_reservation(summaries) and readiness_of(simulations["notebookos"]).buffer_kept:
            # Measured, not guessed: the same run without the ready-host buffer.
            lean = simulate(
                "notebookos", {**options, **WITHOUT_READY_HOSTS}, "simulating notebookos without ready hosts"
            )
            why = why_dearer(summaries, lean.metrics.summary(), readiness_of(simulations["notebookos"]), hours)
    model = {
        "culling": args.culling,
        "idle_timeout_min": args.idle_timeout_min,
        "restart_lead_min": args.restart_lead_min,
        "kernel_restarts": sum(
            1 for s in workload.sessions if s.resumed and s.tasks and start_s <= s.tasks[0].submit_s < end_s
        ),
        "state": _state_summary(workload, start_s, end_s, costs),
        "prewarm": {
            "quantile": args.prewarm_quantile,
            "max_hours": args.prewarm_max_hours,
            "warm_returns": warm_returns,
            "standby_expired": standby_expired,
        },
    }
    sessions_in_window = len({s.trace_session_id for s in kernels})
    sharing = sharing_model(args, quotas, pools)
    if sharing:
        model["sharing"] = sharing
    document = result_document(
        start_hour, hours, (sessions_in_window, len(kernels)), tasks_in_window, summaries,
        saved_vs_reservation(summaries), model,
    )  # fmt: skip
    if why is not None:
        document["why_notebookos_bills_more"] = why
    title = (
        f"{workload.name}, hour {start_hour:g} + {hours:.1f} h, {args.culling} culling {args.idle_timeout_min:g} min"
    )
    if args.plot:
        from jupyter_notebookos.simulator.plots import write_plots

        for path in write_plots(runs, args.plot, title, args.plot_prefix):
            err.print(f"wrote {path}", highlight=False)
    if args.json:
        write_json(document, sys.stdout)
    else:
        out = Console()
        late = {name: m.late_causes for name, m in runs.items()}
        write_table(document, out if out.is_terminal else Console(width=160), title=title, late=late)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point (`python -m jupyter_notebookos.simulator`)."""
    from jupyter_notebookos.terminal import DefaultsHelpFormatter

    parser = argparse.ArgumentParser(
        prog="notebookos simulate", description=__doc__.splitlines()[0], formatter_class=DefaultsHelpFormatter
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
