"""The ``notebookos`` console script: ``up``, ``status`` and ``simulate``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from jupyter_notebookos import __version__


def _positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value:g}")
    return value


def _gateway_option(text: str) -> str:
    name, sep, _ = text.partition("=")
    if not sep or "." not in name or not name.replace(".", "").replace("_", "").isalnum():
        raise argparse.ArgumentTypeError(f"{text!r} is not Class.trait=VALUE (e.g. Scheduler.min_hosts=2)")
    return text


def _users(text: str) -> list[str]:
    from jupyter_notebookos.embedded.hub import HubSetupError, parse_users

    try:
        return parse_users(text)
    except HubSetupError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _port(text: str) -> int:
    value = _int(text)
    if not 0 <= value < 65536:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (0 picks a free one)")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="notebookos", description="NotebookOS: GPU-efficient replicated notebook kernels."
    )
    parser.add_argument("--version", action="version", version=f"notebookos {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{up,status,simulate}")
    sub.required = True

    up = sub.add_parser("up", help="run the embedded platform (etcd, gateway, JupyterLab) in the foreground")
    up.add_argument("--hosts", type=_positive_int, default=4, help="simulated hosts (default 4)")
    up.add_argument(
        "--gpus-per-host",
        type=_non_negative_int,
        default=8,
        help="simulated GPUs per host (default 8; real GPUs found by NVML are used instead)",
    )
    up.add_argument("--port", type=_port, default=8888, help="gateway port on 127.0.0.1 (default 8888)")
    lab = up.add_mutually_exclusive_group()
    lab.add_argument("--lab-port", type=_port, default=8889, help="JupyterLab port (default 8889)")
    lab.add_argument("--no-lab", action="store_true", help="do not start JupyterLab")
    up.add_argument("--etcd-members", type=int, choices=(1, 3), default=1, help="etcd cluster size (1 or 3)")
    up.add_argument(
        "--host-network",
        choices=("shared", "netns"),
        default="shared",
        help="netns (root): each simulated host is a network namespace, so it can be partitioned "
        "(python -m jupyter_notebookos.launchers.hostnet partition STATE_DIR HOST) (default shared)",
    )
    up.add_argument("--state-dir", type=Path, default=Path(".state"), help="local state (default ./.state)")
    up.add_argument("--notebook-dir", type=Path, default=Path.cwd(), help="JupyterLab's root directory")
    up.add_argument(
        "--gateway-option",
        action="append",
        default=[],
        metavar="Class.trait=VALUE",
        type=_gateway_option,
        help="pass a configuration option to the gateway, e.g. Scheduler.scale_in_delay_s=30 (repeatable)",
    )
    up.add_argument(
        "--autoscale", action="store_true", help="add and remove simulated hosts with the load (autoscaler)"
    )
    up.add_argument(
        "--provisioning-delay",
        type=_non_negative_float,
        default=30.0,
        help="seconds a new simulated host takes to be ready (default 30, like a cloud VM)",
    )

    hub = up.add_argument_group("JupyterHub (--hub)")
    hub.add_argument(
        "--hub",
        action="store_true",
        help="run a JupyterHub (with its proxy) instead of one JupyterLab: each user logs in with a generated "
        "password and gets a JupyterLab that reaches the gateway with the user's own Hub token",
    )
    hub.add_argument("--hub-port", type=_port, default=8000, help="the Hub's port on 127.0.0.1 (default 8000)")
    hub.add_argument(
        "--users",
        type=_users,
        default=["alice", "bob"],
        metavar="NAME,NAME",
        help="the Hub's users, comma-separated (default alice,bob)",
    )
    hub.add_argument(
        "--cull-idle-servers",
        type=_non_negative_float,
        default=0.0,
        metavar="SECONDS",
        help="stop users' servers idle this long (jupyterhub-idle-culler; default 0: never)",
    )

    status = sub.add_parser("status", help="hosts, GPUs and kernels of a running platform")
    status.add_argument("--url", help="gateway URL (default: the one `notebookos up` in --state-dir started)")
    status.add_argument("--token", help="gateway auth token (default: $NOTEBOOKOS_TOKEN or the state dir's)")
    status.add_argument("--state-dir", type=Path, default=Path(".state"), help="state dir of `notebookos up`")
    status.add_argument("--json", action="store_true", help="print the cluster as JSON")

    simulate = sub.add_parser("simulate", help="trace-driven simulation of NotebookOS and its baselines")
    try:
        from jupyter_notebookos.simulator.cli import add_arguments
    except ImportError:  # pragma: no cover - while the simulator is being written
        pass
    else:
        add_arguments(simulate)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    args = build_parser().parse_args(argv)
    if args.command == "up":
        return cmd_up(args)
    if args.command == "status":
        return cmd_status(args)
    from jupyter_notebookos.simulator.cli import run

    return run(args)


def cmd_up(args: argparse.Namespace) -> int:
    """``notebookos up``."""
    from jupyter_notebookos.embedded.platform import EmbeddedPlatform, PlatformError, UpOptions

    options = UpOptions(
        hosts=args.hosts,
        gpus_per_host=args.gpus_per_host,
        port=args.port,
        lab_port=args.lab_port,
        lab=not args.no_lab,
        etcd_members=args.etcd_members,
        state_dir=args.state_dir,
        notebook_dir=args.notebook_dir,
        autoscale=args.autoscale,
        host_network=args.host_network,
        provisioning_delay=args.provisioning_delay,
        gateway_options=list(args.gateway_option),
        hub=args.hub,
        hub_port=args.hub_port,
        users=list(args.users),
        cull_idle_servers=args.cull_idle_servers,
    )
    try:
        return EmbeddedPlatform(options).run()
    except PlatformError as err:
        print(f"notebookos up: {err}", file=sys.stderr)
        return 1


def _runtime(state_dir: Path) -> dict[str, Any]:
    from jupyter_notebookos.embedded.platform import RUNTIME_FILE

    try:
        return dict(json.loads((state_dir / RUNTIME_FILE).read_text()))
    except (OSError, ValueError):
        return {}


def cmd_status(args: argparse.Namespace) -> int:
    """``notebookos status``."""
    runtime = _runtime(args.state_dir)
    url = (args.url or runtime.get("gateway_url") or "").rstrip("/")
    if not url:
        print(
            f"notebookos status: no running `notebookos up` in {args.state_dir.resolve()}; give --url",
            file=sys.stderr,
        )
        return 1
    token = args.token or os.environ.get("NOTEBOOKOS_TOKEN") or runtime.get("token")
    request = urllib.request.Request(f"{url}/api/notebookos/cluster")
    if token:
        request.add_header("Authorization", f"token {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            cluster = json.loads(response.read())
    except urllib.error.HTTPError as err:
        hint = " (wrong or missing --token)" if err.code in (401, 403) else ""
        print(f"notebookos status: {url} answered HTTP {err.code}{hint}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        print(f"notebookos status: cannot reach the gateway at {url}: {reason}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(cluster, indent=2))
    else:
        print_cluster(cluster, Console(highlight=False))
    return 0


def print_cluster(cluster: dict[str, Any], console: Console) -> None:
    """The cluster as readable tables: hosts, then kernels, then the queue."""
    hosts = Table(title="Hosts")
    for column in ("host", "GPUs", "committed", "pending", "idle", "replicas", "kind"):
        hosts.add_column(column, justify="left" if column in ("host", "kind") else "right")
    for h in cluster.get("hosts", []):
        hosts.add_row(
            str(h["name"]),
            str(h["gpus"]),
            str(h["gpus_committed"]),
            str(h["gpus_pending"]),
            str(h["gpus"] - h["gpus_committed"]),
            str(h["replicas"]),
            "simulated" if h.get("simulated") else "real GPUs",
        )
    console.print(hosts)
    console.print(f"Subscription ratio: {cluster.get('subscription_ratio', 0):.2f}")
    kernels = cluster.get("kernels", [])
    if kernels:
        table = Table(title="Kernels")
        for column in ("kernel", "replicas", "executor", "GPUs/cell", "state", "cells"):
            table.add_column(column)
        for k in kernels:
            table.add_row(
                str(k.get("kernel_id") or "(another user's)"),  # users see others' kernels without ids
                ", ".join(_replica_text(r) for r in k.get("replicas", [])),
                str(k.get("executor") or "-"),
                str(k.get("gpus", "")),
                _kernel_state(k),
                str(k.get("cells", "")),
            )
        console.print(table)
    else:
        console.print("No NotebookOS kernels.")
    queue = cluster.get("queue", [])
    if queue:
        waiting = Table(title=f"Queued cells ({len(queue)}, waiting for GPUs)")
        for column in ("#", "kernel", "cell", "GPUs", "waiting"):
            waiting.add_column(column, justify="right" if column in ("#", "GPUs", "waiting") else "left")
        for position, q in enumerate(queue, start=1):
            waiting.add_row(
                str(q.get("position", position)),
                str(q.get("kernel_id") or "(another user's)"),
                str(q.get("cell_id") or "-"),
                str(q.get("gpus", "")),
                f"{float(q.get('waiting_ms', 0.0)) / 1000.0:.1f} s",
            )
        console.print(waiting)
    else:
        console.print("Queued cells: none")
    migrations = cluster.get("migrations", [])
    if migrations:
        moving = Table(title=f"Migrations in progress ({len(migrations)})")
        for column in ("#", "kernel", "replica", "from", "to", "why", "for"):
            moving.add_column(column)
        for m in migrations:
            moving.add_row(
                f"m{m.get('migration_id')}",
                str(m.get("kernel_id") or "(another user's)"),
                f"r{m.get('replica_id')}",
                str(m.get("source")),
                str(m.get("target")),
                str(m.get("trigger")),
                f"{m.get('seconds', 0):.1f} s",
            )
        console.print(moving)
    scaling = cluster.get("scaling") or {}
    if scaling.get("enabled"):
        draining = ", ".join(scaling.get("draining", [])) or "none"
        console.print(f"Autoscaling: {scaling.get('provisioning', 0)} host(s) provisioning, draining: {draining}")
        for event in scaling.get("recent", [])[-3:]:
            console.print(f"  {event.get('decision')}")


def _replica_text(replica: Any) -> str:
    """``0@host-1`` for a ready replica, ``0@host-1 (starting)`` otherwise."""
    if not isinstance(replica, dict):
        return str(replica)
    text = f"{replica['replica_id']}@{replica.get('host')}" if "replica_id" in replica else str(replica.get("host"))
    state = replica.get("state", "ready")
    return text if state == "ready" else f"{text} ({state})"


def _kernel_state(kernel: dict[str, Any]) -> str:
    """What a kernel is doing: running a cell, waiting for GPUs, or idle."""
    if kernel.get("state"):
        return str(kernel["state"])
    return "running" if kernel.get("running") else "idle"


if __name__ == "__main__":
    sys.exit(main())
