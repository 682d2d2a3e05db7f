"""The ``notebookos`` console script: ``up``, ``down``, ``status``, ``migrate`` and ``simulate``.

This module is the command line (options, help, dispatch); :mod:`jupyter_notebookos.commands` does what the
commands that talk to a running gateway do.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from jupyter_notebookos import __version__
from jupyter_notebookos.commands import ENV_GATEWAY_TOKEN, ENV_GATEWAY_URL, CommandError
from jupyter_notebookos.terminal import DefaultsHelpFormatter


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


def _positive_float(text: str) -> float:
    value = _non_negative_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {value:g}")
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


def _gateway_arguments(parser: argparse.ArgumentParser) -> None:
    """--url, --token and --state-dir: which gateway to ask, as jupyter_server's GatewayClient finds it."""
    env_url = os.environ.get(ENV_GATEWAY_URL)
    parser.add_argument(
        "--url",
        help=f"gateway URL (default: ${ENV_GATEWAY_URL}"
        + (f" = {env_url}" if env_url else " (unset here)")
        + ", else the gateway that `notebookos up` in --state-dir started)",
    )
    parser.add_argument(
        "--token",
        help=f"gateway auth token (default: ${ENV_GATEWAY_TOKEN} or $NOTEBOOKOS_TOKEN, else the token of the "
        "`notebookos up` in --state-dir when --url is its gateway)",
    )
    parser.add_argument("--state-dir", type=Path, default=Path(".state"), help="state dir of `notebookos up`")


def _etcd_duration(text: str) -> str:
    """A duration as etcd's --auto-compaction-retention takes it: a number and s, m or h (e.g. 10m)."""
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?[smh]", text) or float(text[:-1]) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 90s, 10m or 1h")
    return text


def build_parser(*, simulate_options: bool = True) -> argparse.ArgumentParser:
    """The argument parser of every subcommand. ``simulate_options=False`` leaves out ``simulate``'s options,
    whose module loads the simulator (numpy, the scheduler): a second or more that `status` need not wait."""
    parser = argparse.ArgumentParser(
        prog="notebookos",
        description="NotebookOS: GPU-efficient replicated notebook kernels.",
        formatter_class=DefaultsHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"notebookos {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{up,down,status,migrate,simulate}")
    sub.required = True

    up = sub.add_parser(
        "up",
        help="run the embedded platform (etcd, gateway, JupyterLab) in the foreground",
        formatter_class=DefaultsHelpFormatter,
    )
    up.add_argument("--hosts", type=_positive_int, default=4, help="simulated hosts")
    up.add_argument(
        "--gpus-per-host",
        type=_non_negative_int,
        default=8,
        help="simulated GPUs per host (real GPUs found by NVML are used instead)",
    )
    up.add_argument("--port", type=_port, default=8888, help="gateway port on 127.0.0.1")
    lab = up.add_mutually_exclusive_group()
    lab.add_argument("--lab-port", type=_port, default=8889, help="JupyterLab port")
    lab.add_argument("--no-lab", action="store_true", help="do not start JupyterLab")
    up.add_argument("--etcd-members", type=int, choices=(1, 3), default=1, help="etcd cluster size (1 or 3)")
    up.add_argument(
        "--etcd-history",
        type=_etcd_duration,
        default="10m",
        help="how long etcd keeps its history of changes before compacting it (e.g. 10m, 1h; watches resume "
        "only within it)",
    )
    up.add_argument(
        "--host-network",
        choices=("shared", "netns"),
        default="shared",
        help="netns (root): each simulated host is a network namespace, so it can be partitioned "
        "(python -m jupyter_notebookos.launchers.hostnet partition STATE_DIR HOST)",
    )
    up.add_argument("--state-dir", type=Path, default=Path(".state"), help="local state: etcd's data, tokens, logs")
    up.add_argument(
        "--notebook-dir",
        type=Path,
        help="JupyterLab's root directory, created if missing (default: ~/notebooks, outside the source tree)",
    )
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
        help="seconds a new simulated host takes to be ready (like a cloud VM)",
    )

    hub = up.add_argument_group("JupyterHub (--hub)")
    hub.add_argument(
        "--hub",
        action="store_true",
        help="run a JupyterHub (with its proxy) instead of one JupyterLab: each user logs in with a generated "
        "password and gets a JupyterLab that reaches the gateway with the user's own Hub token",
    )
    hub.add_argument("--hub-port", type=_port, default=8000, help="the Hub's port on 127.0.0.1")
    hub.add_argument(
        "--users",
        type=_users,
        default=["alice", "bob"],
        metavar="NAME,NAME",
        help="the Hub's users, comma-separated (default: alice,bob)",
    )
    hub.add_argument(
        "--cull-idle-servers",
        type=_non_negative_float,
        default=0.0,
        metavar="SECONDS",
        help="stop users' servers idle this long (jupyterhub-idle-culler; 0: never)",
    )

    down = sub.add_parser(
        "down",
        help="stop the `notebookos up` running in --state-dir (and all it started)",
        formatter_class=DefaultsHelpFormatter,
    )
    down.add_argument("--state-dir", type=Path, default=Path(".state"), help="state dir of `notebookos up`")
    down.add_argument(
        "--timeout", type=_non_negative_float, default=120.0, help="seconds to wait for everything to stop"
    )

    status = sub.add_parser(
        "status",
        help="hosts, GPUs and kernels of a running platform, or one kernel's replicas",
        formatter_class=DefaultsHelpFormatter,
    )
    status.add_argument(
        "kernel", nargs="?", metavar="KERNEL", help="show this kernel (its id, or a unique start of it)"
    )
    _gateway_arguments(status)
    status.add_argument("--json", action="store_true", help="print the API's JSON (not with --watch)")
    status.add_argument("--watch", action="store_true", help="redraw every --interval seconds until Ctrl-C")
    status.add_argument("--interval", type=_positive_float, default=2.0, help="seconds between redraws (--watch)")

    migrate = sub.add_parser(
        "migrate",
        help="move one replica of a kernel to another host now (waits until it serves again)",
        formatter_class=DefaultsHelpFormatter,
    )
    migrate.add_argument("kernel", metavar="KERNEL", help="the kernel (its id, or a unique start of it)")
    migrate.add_argument("replica", metavar="REPLICA", help="the replica's id (see `notebookos status KERNEL`)")
    migrate.add_argument("--host", help="the target host (default: the scheduler picks one)")
    _gateway_arguments(migrate)

    simulate = sub.add_parser(
        "simulate",
        help="trace-driven simulation of NotebookOS and its baselines",
        formatter_class=DefaultsHelpFormatter,
    )
    if simulate_options:
        from jupyter_notebookos.simulator.cli import add_arguments

        add_arguments(simulate)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(simulate_options="simulate" in words)
    args = parser.parse_args(words)
    if args.command == "up":
        return cmd_up(args)
    if args.command in ("down", "status", "migrate"):
        from jupyter_notebookos import commands

        if args.command == "status" and args.watch and args.json:
            parser.error("status: --json and --watch do not go together")  # exits 2, as for any bad option
        run = {"down": commands.cmd_down, "status": commands.cmd_status, "migrate": commands.cmd_migrate}
        try:
            return run[args.command](args)
        except CommandError as err:
            print(f"notebookos {args.command}: {err}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:  # Ctrl-C while waiting for the gateway: no traceback
            print(f"notebookos {args.command}: interrupted", file=sys.stderr)
            return 130
    from jupyter_notebookos.simulator.cli import run as simulate

    return simulate(args)


def cmd_up(args: argparse.Namespace) -> int:
    """``notebookos up``."""
    from jupyter_notebookos.embedded.platform import NOTEBOOK_DIR, EmbeddedPlatform, PlatformError, UpOptions

    options = UpOptions(
        hosts=args.hosts,
        gpus_per_host=args.gpus_per_host,
        port=args.port,
        lab_port=args.lab_port,
        lab=not args.no_lab,
        etcd_members=args.etcd_members,
        etcd_history=args.etcd_history,
        state_dir=args.state_dir,
        notebook_dir=args.notebook_dir or NOTEBOOK_DIR,
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


if __name__ == "__main__":
    sys.exit(main())
