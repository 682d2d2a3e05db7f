"""The sharing options of `notebookos simulate`: users, quotas, fair share, GPU types and host pools.

`add_sharing_arguments` adds them to the command's parser; `quota_config` and `pool_config` turn them into the
scheduler's `quotas` and `pools` knobs (their config form); `sharing_model` is what the `--json` output records of
them (nothing when none is given, so the output without them is what it always was).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jupyter_notebookos.scheduler import HostPool, Quotas, canonical, parse_device_types, parse_pools
from jupyter_notebookos.simulator.users import parse_type_mix, parse_users


class UsageError(ValueError):
    """A bad option value; the message says which and what is allowed."""


def _checked(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An option's parser whose ``ValueError`` argparse shows as its message."""

    def check(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return check


def add_sharing_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the users, quotas, fair-share, type and pool options to `parser`."""
    sharing = parser.add_argument_group("users, quotas, fair share (Scheduler traitlets)")
    sharing.add_argument(
        "--users",
        type=_checked(parse_users),
        default=None,
        help="who owns the sessions: 'sessions' (each trace session is a user) or N users the sessions are dealt "
        "to in turn (default: nobody; quotas and fair share then do nothing)",
    )
    sharing.add_argument("--groups", type=int, default=0, help="with --users: user k is in group{k mod G} (0: none)")
    sharing.add_argument(
        "--quotas",
        metavar="FILE",
        help="quotas in their config form, JSON: {default, users, groups} (see scheduler/quotas.py)",
    )
    sharing.add_argument("--quota-gpus", type=float, help="everyone's GPUs at once (the default quota)")
    sharing.add_argument("--quota-kernels", type=float, help="everyone's kernels at once")
    sharing.add_argument("--quota-gpu-hours-day", type=float, help="everyone's GPU-hours per day")
    sharing.add_argument("--quota-gpu-hours-week", type=float, help="everyone's GPU-hours per week")
    sharing.add_argument(
        "--fair-share",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="order waiting cells of different users by decayed GPU-seconds per weight (on)",
    )
    sharing.add_argument("--fair-share-half-life-s", type=float, help="half-life of fair share's usage (3600)")
    sharing.add_argument("--fair-share-max-wait-s", type=float, help="fair share's bound on waiting (600; 0: none)")

    types = parser.add_argument_group("GPU types and host pools")
    types.add_argument(
        "--pool",
        action="append",
        default=[],
        metavar="DEVICES[:MIN[:MAX]]",
        help="a host pool autoscaling adds hosts of, named after its first type: e.g. a100*8:1:20, h100*8, "
        "mig-1g.10gb*7 (repeat for more pools; cheapest first). Replaces --gpus-per-host's untyped hosts",
    )
    types.add_argument(
        "--gpu-type-mix",
        type=_checked(parse_type_mix),
        default=None,
        metavar="TYPE=WEIGHT,...",
        help="each session asks for one GPU type, drawn with these weights (seeded by --seed)",
    )


def quota_config(args: argparse.Namespace) -> dict[str, Any]:
    """The quotas the options name: ``--quotas FILE``, with the ``--quota-*`` flags as its default for everyone."""
    config: dict[str, Any] = {}
    if args.quotas:
        try:
            config = json.loads(Path(args.quotas).read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise UsageError(f"--quotas {args.quotas}: {error}") from None
        if not isinstance(config, dict):
            raise UsageError(f"--quotas {args.quotas}: expected a JSON object with default, users and groups")
    flags = {
        "gpus": args.quota_gpus,
        "kernels": args.quota_kernels,
        "gpu_hours_per_day": args.quota_gpu_hours_day,
        "gpu_hours_per_week": args.quota_gpu_hours_week,
    }
    given = {name: value for name, value in flags.items() if value is not None}
    if given:
        config = {**config, "default": {**config.get("default", {}), **given}}
    Quotas.from_config(config)  # a bad entry is a usage error, named
    return config


def pool_config(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The host pools of the ``--pool DEVICES[:MIN[:MAX]]`` options, in their config form."""
    pools = []
    for text in args.pool:
        devices, *bounds = text.split(":")
        try:
            types = parse_device_types(devices)
        except ValueError as error:
            raise UsageError(f"--pool {text}: {error}") from None
        if not all(b.isdigit() for b in bounds):
            raise UsageError(f"--pool {text}: MIN and MAX must be whole numbers; expected DEVICES[:MIN[:MAX]]")
        numbers = [int(b) for b in bounds]
        if not types or len(numbers) > 2:
            raise UsageError(f"--pool {text}: expected DEVICES[:MIN[:MAX]], e.g. a100*8:1:20")
        uniform = len(set(types)) == 1
        pool = HostPool(
            canonical(types[0]),
            len(types),
            types[0] if uniform else "",
            None if uniform else types,
            *numbers,
        )
        pools.append(pool.to_config())
    parse_pools(pools)
    return pools


def sharing_model(args: argparse.Namespace, quotas: dict[str, Any], pools: list[dict[str, Any]]) -> dict[str, Any]:
    """What the `--json` output's `model.sharing` records (empty when no sharing option is given)."""
    if args.users is None and not quotas and not pools and not args.gpu_type_mix:
        return {}
    return {
        "users": args.users,
        "groups": args.groups,
        "quotas": quotas,
        "pools": pools,
        "gpu_type_mix": args.gpu_type_mix or {},
    }
