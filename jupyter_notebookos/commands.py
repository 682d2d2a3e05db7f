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
from rich.text import Text

from jupyter_notebookos.statusview import cluster_view, kernel_view

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


#: Columns of what ``status`` prints to a pipe or file: ids whole, lines never wrapped by a guessed terminal width.
PIPE_WIDTH = 200

#: A view of a body the gateway answered, for a terminal of this many columns (None: no limit).
View = Callable[[dict[str, Any], "int | None"], RenderableType]


def cmd_status(args: argparse.Namespace) -> int:
    """``notebookos status [KERNEL] [--watch] [--json]``."""
    gateway = Gateway.from_args(args)
    fetch: Callable[[], dict[str, Any]] = gateway.cluster
    render: View = cluster_view
    if args.kernel:
        kernel_id = gateway.kernel(args.kernel)["kernel_id"]  # resolves a prefix once, and fails early
        fetch, render = (lambda: gateway.kernel(kernel_id)), (lambda body, width: kernel_view(body))
    body = fetch()
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=PIPE_WIDTH)
    if not args.watch:
        if args.json:
            print(json.dumps(body, indent=2))
        else:
            console.print(render(body, console.width if console.is_terminal else None))
        return 0
    return watch(console, fetch, render, body, args.interval)


def watch(
    console: Console,
    fetch: Callable[[], dict[str, Any]],
    render: View,
    first: dict[str, Any],
    interval: float,
) -> int:
    """Redraw ``render(fetch())`` every ``interval`` seconds until Ctrl-C or SIGTERM (exit 0). A failed fetch is
    shown above the last good view and retried: a gateway restarting does not end the watch. On a terminal the view
    is redrawn in place; to a pipe or file each redraw is printed after the last, as soon as it is drawn."""
    body, problem = first, ""

    def screen() -> RenderableType:
        stamp = Text(f"every {interval:g} s, {time.strftime('%H:%M:%S')}; Ctrl-C to stop", style="dim")
        header = Text(problem, style="bold red") if problem else stamp
        return Group(header, render(body, console.width if console.is_terminal else None))

    def next_view() -> None:
        nonlocal body, problem
        time.sleep(interval)
        try:
            body, problem = fetch(), ""
        except CommandError as err:
            problem = f"{err} (retrying every {interval:g} s)"

    signal.signal(signal.SIGTERM, _interrupt)  # stopped by a service manager or `kill`: as Ctrl-C
    try:
        if not console.is_terminal:
            while True:
                console.print(screen())
                console.file.flush()
                next_view()
        with Live(screen(), console=console, auto_refresh=False, screen=False) as live:
            while True:
                next_view()
                live.update(screen(), refresh=True)
    except KeyboardInterrupt:
        return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


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
    "cmd_down",
    "cmd_migrate",
    "cmd_status",
    "runtime_of",
]
