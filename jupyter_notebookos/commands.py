"""What ``notebookos status``, ``migrate`` and ``down`` do: talk to a running gateway, or stop `notebookos up`.

The gateway is found as jupyter_server's ``GatewayClient`` finds it, so one environment serves both: ``--url``,
else ``$JUPYTER_GATEWAY_URL``, else the gateway that `notebookos up` in ``--state-dir`` started; the token is
``--token``, else ``$JUPYTER_GATEWAY_AUTH_TOKEN`` (or ``$NOTEBOOKOS_TOKEN``), else that `notebookos up`'s own
token (only when talking to that same gateway: it is its admin token). Every problem a user can cause (a
gateway that does not answer, a wrong token, an unknown kernel) ends as one line and exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

ENV_GATEWAY_URL = "JUPYTER_GATEWAY_URL"  # jupyter_server's GatewayClient reads the same variables
ENV_GATEWAY_TOKEN = "JUPYTER_GATEWAY_AUTH_TOKEN"
ENV_NOTEBOOKOS_TOKEN = "NOTEBOOKOS_TOKEN"

#: Seconds to wait for a migration's answer: the new replica must start and catch up (a pod may pull an image).
MIGRATION_TIMEOUT_S = 900.0


class CommandError(Exception):
    """A problem the user can fix; its message is the one line the command prints."""


def runtime_of(state_dir: Path) -> dict[str, Any]:
    """The runtime file of the `notebookos up` running in ``state_dir`` ({} when there is none)."""
    from jupyter_notebookos.embedded.platform import RUNTIME_FILE

    try:
        return dict(json.loads((state_dir / RUNTIME_FILE).read_text()))
    except (OSError, ValueError):
        return {}


@dataclass
class Gateway:
    """A gateway's REST API, with the token to send."""

    url: str
    token: str | None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Gateway:
        """The gateway and token named by the options, the environment, or the state dir (in that order)."""
        runtime = runtime_of(args.state_dir)
        url = (args.url or os.environ.get(ENV_GATEWAY_URL) or runtime.get("gateway_url") or "").rstrip("/")
        if not url:
            raise CommandError(
                f"no running `notebookos up` in {args.state_dir.resolve()}; give --url or set ${ENV_GATEWAY_URL}"
            )
        if not url.startswith(("http://", "https://")):
            raise CommandError(f"{url!r} is not a gateway URL; give one like http://127.0.0.1:8888")
        token = args.token or os.environ.get(ENV_GATEWAY_TOKEN) or os.environ.get(ENV_NOTEBOOKOS_TOKEN)
        if not token and url == str(runtime.get("gateway_url", "")).rstrip("/"):
            token = runtime.get("token")  # that platform's admin token goes to that platform only
        return cls(url, token or None)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
        """The JSON answer to ``method path``; raises CommandError with the gateway's reason."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"token {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as err:
            raise CommandError(self._refusal(err)) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", None) or err
            if isinstance(reason, TimeoutError):
                raise CommandError(f"{self.url} did not answer {method} {path} within {timeout:g} s") from None
            raise CommandError(f"cannot reach the gateway at {self.url}: {reason}") from None
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            raise CommandError(f"{self.url}{path} did not answer JSON: is {self.url} a NotebookOS gateway?") from None

    def _refusal(self, err: urllib.error.HTTPError) -> str:
        try:
            message = str(json.loads(err.read()).get("message") or "")
        except (ValueError, AttributeError, OSError):
            message = ""
        text = f"{self.url} answered HTTP {err.code}" + (f": {message}" if message else "")
        if err.code == 401:
            where = "--token" if self.token else f"--token or ${ENV_GATEWAY_TOKEN}"
            return f"{text} (wrong or missing token: give {where})"
        return text

    def cluster(self) -> dict[str, Any]:
        """``GET /api/notebookos/cluster``."""
        return dict(self.request("GET", "/api/notebookos/cluster"))

    def kernel(self, kernel_id: str) -> dict[str, Any]:
        """``GET /api/notebookos/kernels/{id}``; a unique prefix of a kernel id the requester sees works too."""
        try:
            return dict(self.request("GET", f"/api/notebookos/kernels/{urllib.parse.quote(kernel_id, safe='')}"))
        except CommandError as err:
            if "HTTP 404" not in str(err):
                raise
        return dict(self.request("GET", f"/api/notebookos/kernels/{self.resolve(kernel_id)}"))

    def resolve(self, kernel_id: str) -> str:
        """The full id of the one kernel whose id starts with ``kernel_id``."""
        ids = [str(k["kernel_id"]) for k in self.cluster().get("kernels", []) if k.get("kernel_id")]
        matches = [k for k in ids if k.startswith(kernel_id)] if kernel_id else []
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise CommandError(f"{kernel_id!r} names {len(matches)} kernels ({', '.join(matches)}); give more of it")
        known = ", ".join(ids) or "none"
        raise CommandError(f"no NotebookOS kernel {kernel_id!r} on {self.url} (kernels you may see: {known})")


# -- status -------------------------------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    """``notebookos status [KERNEL] [--watch] [--json]``."""
    gateway = Gateway.from_args(args)
    fetch: Callable[[], dict[str, Any]] = gateway.cluster
    render: Callable[[dict[str, Any]], RenderableType] = cluster_view
    if args.kernel:
        kernel_id = gateway.kernel(args.kernel)["kernel_id"]  # resolves a prefix once, and fails early
        fetch, render = (lambda: gateway.kernel(kernel_id)), kernel_view
    body = fetch()
    console = Console(highlight=False)
    if not args.watch:
        if args.json:
            print(json.dumps(body, indent=2))
        else:
            console.print(render(body))
        return 0
    return watch(console, fetch, render, body, args.interval)


def watch(
    console: Console,
    fetch: Callable[[], dict[str, Any]],
    render: Callable[[dict[str, Any]], RenderableType],
    first: dict[str, Any],
    interval: float,
) -> int:
    """Redraw ``render(fetch())`` every ``interval`` seconds until Ctrl-C (exit 0). A failed fetch is shown
    above the last good view and retried: a gateway restarting does not end the watch."""
    body, problem = first, ""

    def screen() -> RenderableType:
        stamp = Text(f"every {interval:g} s, {time.strftime('%H:%M:%S')}; Ctrl-C to stop", style="dim")
        header = Text(problem, style="bold red") if problem else stamp
        return Group(header, render(body))

    try:
        with Live(screen(), console=console, auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(interval)
                try:
                    body, problem = fetch(), ""
                except CommandError as err:
                    problem = f"{err} (retrying every {interval:g} s)"
                live.update(screen(), refresh=True)
    except KeyboardInterrupt:
        return 0


def cluster_view(cluster: dict[str, Any]) -> RenderableType:
    """The cluster as tables: hosts, then kernels, the queue, migrations and scaling."""
    parts: list[RenderableType] = []
    hosts = Table(title="Hosts")
    for column in ("host", "GPUs", "committed", "pending", "idle", "replicas", "kind"):
        hosts.add_column(column, justify="left" if column in ("host", "kind") else "right")
    for h in cluster.get("hosts", []):
        kind = "simulated" if h.get("simulated") else "real GPUs"
        if h.get("draining"):
            kind += ", draining"
        hosts.add_row(
            str(h["name"]),
            str(h["gpus"]),
            str(h["gpus_committed"]),
            str(h["gpus_pending"]),
            str(h["gpus"] - h["gpus_committed"]),
            str(h["replicas"]),
            kind,
        )
    parts.append(hosts)
    totals = cluster.get("totals") or {}
    ratio = f"{totals['subscription_ratio']:.2f}, " if "subscription_ratio" in totals else ""
    parts.append(Text(f"Subscription ratio: {ratio}admission limit {cluster.get('subscription_ratio', 0):.2f}"))
    kernels = cluster.get("kernels", [])
    if kernels:
        table = Table(title="Kernels")
        table.add_column("kernel", no_wrap=True, min_width=36)  # whole ids: they are what one copies
        for column in ("owner", "replicas", "executor", "GPUs/cell", "state", "cells"):
            table.add_column(column)
        for k in kernels:
            table.add_row(
                str(k.get("kernel_id") or "(another user's)"),  # users see others' kernels without ids
                str(k.get("owner") or ("-" if k.get("kernel_id") else "")),
                ", ".join(replica_text(r) for r in k.get("replicas", [])),
                str(k.get("executor") or "-"),
                str(k.get("gpus", "")),
                kernel_state(k),
                str(k.get("cells", "")),
            )
        parts.append(table)
    else:
        parts.append(Text("No NotebookOS kernels."))
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
        parts.append(waiting)
    else:
        parts.append(Text("Queued cells: none"))
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
        parts.append(moving)
    scaling = cluster.get("scaling") or {}
    if scaling.get("enabled"):
        draining = ", ".join(scaling.get("draining", [])) or "none"
        parts.append(Text(f"Autoscaling: {scaling.get('provisioning', 0)} host(s) provisioning, draining: {draining}"))
        parts.extend(Text(f"  {event.get('decision')}") for event in scaling.get("recent", [])[-3:])
    return Group(*parts)


def kernel_view(kernel: dict[str, Any]) -> RenderableType:
    """One kernel: its replicas (host, state, up to date), executor, cells and GPU-seconds."""
    replicas = kernel.get("replicas", [])
    head = max((int(r.get("applied_seq", -1)) for r in replicas), default=-1)
    table = Table(title=f"Kernel {kernel['kernel_id']} ({kernel.get('kernel_name')})")
    for column in ("replica", "host", "state", "applied", "up to date", "executor", "memory"):
        table.add_column(column, justify="right" if column in ("applied", "memory") else "left")
    for r in replicas:
        memory = r.get("memory_bytes")
        table.add_row(
            str(r.get("replica_id")),
            str(r.get("host")),
            str(r.get("state")),
            str(r.get("applied_seq")),
            "yes" if r.get("state") == "ready" and int(r.get("applied_seq", -1)) >= head else "no",
            "yes" if r.get("replica_id") == kernel.get("executor") else "",
            f"{memory / 2**20:.0f} MiB" if isinstance(memory, int) else "-",
        )
    used = float(kernel.get("gpu_seconds_used") or 0.0)
    held = float(kernel.get("gpu_seconds_held_if_reserved") or 0.0)
    share = f" ({100.0 * used / held:.1f} %)" if held > 0 else ""
    lines = [
        f"Owner: {kernel.get('owner') or 'the admin'}",
        f"State: {kernel_state(kernel)}; executor: {kernel.get('executor') or '-'}",
        f"GPUs per cell: {kernel.get('gpus')}",
        f"Cells: {kernel.get('cells')} run, {kernel.get('queued', 0)} queued",
        f"GPU-seconds: {used:.1f} used; a reservation would have held {held:.1f}{share}",
    ]
    return Group(table, *(Text(line) for line in lines))


def replica_text(replica: Any) -> str:
    """``0@host-1`` for a ready replica, ``0@host-1 (starting)`` otherwise."""
    if not isinstance(replica, dict):
        return str(replica)
    text = f"{replica['replica_id']}@{replica.get('host')}" if "replica_id" in replica else str(replica.get("host"))
    state = replica.get("state", "ready")
    return text if state == "ready" else f"{text} ({state})"


def kernel_state(kernel: dict[str, Any]) -> str:
    """What a kernel is doing: running a cell, waiting for GPUs, or idle."""
    if kernel.get("state"):
        return str(kernel["state"])
    return "running" if kernel.get("running") else "idle"


# -- migrate ------------------------------------------------------------------------------------------------


def cmd_migrate(args: argparse.Namespace) -> int:
    """``notebookos migrate KERNEL REPLICA [--host H]``: move one replica now, wait until it serves again."""
    gateway = Gateway.from_args(args)
    kernel_id = gateway.kernel(args.kernel)["kernel_id"]
    body = {"host": args.host} if args.host else {}
    path = f"/api/notebookos/kernels/{kernel_id}/replicas/{urllib.parse.quote(args.replica, safe='')}/migrate"
    moved = gateway.request("POST", path, body, timeout=MIGRATION_TIMEOUT_S)
    print(
        f"replica {moved['previous_replica_id']} of kernel {kernel_id} moved from {moved['from']} to {moved['to']} "
        f"in {moved['seconds']:.1f} s; it is replica {moved['replica_id']} now"
    )
    return 0


# -- down ---------------------------------------------------------------------------------------------------


def cmd_down(args: argparse.Namespace) -> int:
    """``notebookos down``: stop the `notebookos up` of ``--state-dir`` (SIGTERM; it stops all it started)."""
    state_dir = args.state_dir.resolve()
    runtime = runtime_of(state_dir)
    pid = runtime.get("pid")
    if not isinstance(pid, int):
        raise CommandError(f"no running `notebookos up` in {state_dir} (no runtime.json there)")
    try:
        process = psutil.Process(pid)
        cmdline = process.cmdline()
    except psutil.NoSuchProcess:
        raise CommandError(
            f"`notebookos up` in {state_dir} is not running (process {pid} is gone; its runtime.json is stale)"
        ) from None
    except psutil.AccessDenied:
        raise CommandError(f"process {pid} of `notebookos up` in {state_dir} belongs to another user") from None
    if "up" not in cmdline or not any("notebookos" in part for part in cmdline):
        raise CommandError(f"process {pid} named in {state_dir}/runtime.json is not `notebookos up`; not stopping it")
    began = time.monotonic()
    with contextlib.suppress(psutil.NoSuchProcess):  # gone already: nothing to wait for
        process.send_signal(signal.SIGTERM)
    while _running(process):
        if time.monotonic() - began > args.timeout:
            raise CommandError(
                f"`notebookos up` (pid {pid}) did not stop within {args.timeout:g} s; see {state_dir}/gateway.log"
            )
        time.sleep(0.1)
    print(f"stopped `notebookos up` (pid {pid}, state dir {state_dir}) in {time.monotonic() - began:.1f} s")
    return 0


def _running(process: psutil.Process) -> bool:
    """Whether ``process`` still runs (an exited one its parent has not reaped yet does not)."""
    try:
        return bool(process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


__all__ = [
    "ENV_GATEWAY_TOKEN",
    "ENV_GATEWAY_URL",
    "CommandError",
    "Gateway",
    "cluster_view",
    "cmd_down",
    "cmd_migrate",
    "cmd_status",
    "kernel_view",
    "runtime_of",
]
