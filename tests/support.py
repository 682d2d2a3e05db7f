"""Helpers shared by the whole suite: run `notebookos up`, free ports, find left-over processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil

from jupyter_notebookos.client import GatewayClient, GatewayError, KernelConnection
from jupyter_notebookos.coordination.client import Coordinator
from jupyter_notebookos.embedded.etcd import EtcdBinaryMissing, EtcdCluster, find_etcd_binary
from jupyter_notebookos.embedded.platform import RUNTIME_FILE
from jupyter_notebookos.embedded.runner import NOTEBOOKOS, PlatformProcess, free_port, processes_of

REPO = Path(__file__).resolve().parent.parent

Platform = PlatformProcess

__all__ = [
    "NOTEBOOKOS",
    "REPO",
    "Platform",
    "etcd_admin",
    "etcd_running",
    "free_port",
    "gpus_held_on",
    "jupyter_server",
    "kernel_of",
    "kill_the_gateway",
    "platform_running",
    "processes_of",
    "replace_a_follower",
    "run_on_replica",
    "start_etcd",
    "start_platform",
    "stop_platform",
    "wait_for",
]

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.1) -> T:
    """Poll ``predicate`` until it returns something truthy (returned), or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def start_platform(state_dir: Path, *args: str, timeout: float = 90.0, env: dict[str, str] | None = None) -> Platform:
    """Run `notebookos up --no-lab` with ``args`` (from the repository root; ``env`` added to this process's
    environment) and wait until it is up."""
    try:
        return PlatformProcess.start(state_dir, *args, timeout=timeout, cwd=REPO, env=env)
    except RuntimeError as err:
        raise AssertionError(str(err)) from None


def stop_platform(platform: Platform, timeout: float = 60.0) -> None:
    platform.stop(timeout)


@contextlib.contextmanager
def platform_running(state_dir: Path, *args: str) -> Iterator[Platform]:
    """A platform for a test module (``start_platform``'s arguments), stopped when the module is done."""
    started = start_platform(state_dir, *args)
    try:
        yield started
    finally:
        stop_platform(started)


def start_etcd(data_dir: Path, members: int = 1) -> EtcdCluster:
    """A real etcd cluster of ``members`` members (skips the test when no etcd binary is installed)."""
    import pytest

    try:
        find_etcd_binary()
    except EtcdBinaryMissing as err:
        pytest.skip(str(err))
    return EtcdCluster(data_dir, members).start()


@contextlib.contextmanager
def etcd_running(data_dir: Path, members: int = 1) -> Iterator[EtcdCluster]:
    """:func:`start_etcd` for the length of a fixture: the cluster stops when it is done."""
    cluster = start_etcd(data_dir, members)
    try:
        yield cluster
    finally:
        cluster.stop()


@contextlib.contextmanager
def gpus_held_on(client: GatewayClient, hosts: set[str], kernel_name: str, seconds: float) -> Iterator[None]:
    """Hold the GPU of each of ``hosts`` (one-GPU hosts) with a ``seconds``-long cell of another kernel.

    Starts kernels until every host has a replica of one of them, pins a sleeping cell to that replica, and
    waits until the scheduler counts every host's GPU as committed. On exit the kernels it started stop.
    """
    started: list[str] = []
    conns: list[KernelConnection] = []
    try:
        placements: dict[str, dict[str, str]] = {}  # kernel -> host -> replica id
        used: set[str] = set()
        for host in sorted(hosts):
            blocker = next((k for k, where in placements.items() if host in where and k not in used), None)
            while blocker is None:
                kernel_id = client.start_kernel(kernel_name)
                started.append(kernel_id)
                replicas = client.notebookos_kernel(kernel_id)["replicas"]
                placements[kernel_id] = {r["host"]: r["replica_id"] for r in replicas}
                blocker = kernel_id if host in placements[kernel_id] else None
            used.add(blocker)
            conns.append(client.connect(blocker))
            conns[-1].send(
                "shell",
                "execute_request",
                {"code": f"import time\ntime.sleep({seconds})", "silent": False},
                metadata={"notebookos": {"replica": placements[blocker][host]}},
            )

        def committed() -> set[str]:
            return {h["name"] for h in client.request("GET", "/api/notebookos/cluster")["hosts"] if h["gpus_committed"]}

        wait_for(lambda: hosts <= committed(), 30, f"kernels to hold the GPUs of {sorted(hosts)}", interval=0.1)
        yield
    finally:
        for conn in conns:
            conn.close()
        for kernel_id in started:
            with contextlib.suppress(GatewayError):
                client.shutdown_kernel(kernel_id)


def etcd_admin(platform: Platform, *writes: tuple[str, str], read: str | None = None, keep_leases: bool = False) -> Any:
    """Put ``writes`` (key below the prefix, raw value) as etcd's admin; return the values under ``read``.
    ``keep_leases``: a key that exists stays bound to its lease (as its owner's own write would leave it)."""
    endpoints = json.loads((platform.state_dir / RUNTIME_FILE).read_text())["etcd_endpoints"]

    async def run() -> Any:
        co = await Coordinator.connect(endpoints, credentials=platform.etcd_root())
        try:
            for key, value in writes:
                held = await co.get(f"/notebookos{key}") if keep_leases else None
                await co.put(f"/notebookos{key}", value, lease=held.lease if held is not None and held.lease else None)
            return {kv.key: kv.text for kv in await co.get_prefix(f"/notebookos{read}")} if read else None
        finally:
            await co.close()

    return asyncio.run(run())


@contextlib.contextmanager
def jupyter_server(gateway_url: str, gateway_token: str, root_dir: Path) -> Iterator[GatewayClient]:
    """A Jupyter server from ``.venv-lab`` with ``--gateway-url``, as JupyterLab and JupyterHub's single-user
    servers run it (the gateway token in its environment, never on its command line); yields a client of it."""
    import pytest

    lab_python = REPO / ".venv-lab" / "bin" / "python"
    if not lab_python.exists():
        pytest.skip(".venv-lab is missing (run the bootstrap)")
    port, token = free_port(), secrets.token_hex(16)
    server = subprocess.Popen(
        [
            str(lab_python),
            "-m",
            "jupyter_server",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--gateway-url={gateway_url}",
            f"--ServerApp.root_dir={root_dir}",
            "--allow-root",
        ],
        env=dict(os.environ, JUPYTER_TOKEN=token, JUPYTER_GATEWAY_AUTH_TOKEN=gateway_token),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        client = GatewayClient(f"http://127.0.0.1:{port}", token)
        wait_for(lambda: _answers(client), 60, "the Jupyter server to answer")
        yield client
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(20)


def _answers(client: GatewayClient) -> bool:
    try:
        client.request("GET", "/api/status", timeout=2)
    except Exception:
        return False
    return True


@contextlib.contextmanager
def kernel_of(client: GatewayClient, name: str = "python3-notebookos") -> Iterator[tuple[GatewayClient, str]]:
    """A kernel started through the gateway for one test, shut down afterwards (if the test did not)."""
    kernel_id = client.start_kernel(name)
    try:
        yield client, kernel_id
    finally:
        with contextlib.suppress(GatewayError):
            client.shutdown_kernel(kernel_id)


def replace_a_follower(client: GatewayClient, kernel_id: str) -> str:
    """SIGKILL a follower of the kernel and wait for its replacement; returns the new replica's id."""
    # No executor is named while the last one registers again (etcd ended its lease): then any replica could be it.
    info = wait_for(
        lambda: (i := client.notebookos_kernel(kernel_id))["executor"] is not None and i, 30, "an executor to be named"
    )
    follower = next(r for r in info["replicas"] if r["replica_id"] != info["executor"])
    before = {r["replica_id"] for r in info["replicas"]}
    os.kill(follower["pid"], signal.SIGKILL)

    def replaced() -> str | None:
        ready = [r for r in client.notebookos_kernel(kernel_id)["replicas"] if r["state"] == "ready"]
        new = {r["replica_id"] for r in ready} - before
        return next(iter(new)) if len(ready) == 3 and new else None

    return wait_for(replaced, 90, f"a replacement replica of kernel {kernel_id}")


def run_on_replica(conn: KernelConnection, replica: str, code: str, timeout: float = 60) -> dict[str, Any]:
    """Run ``code`` on one replica of the kernel (the cell is pinned to it); returns the reply, which must be
    ``ok`` and come from that replica."""
    msg_id = conn.send(
        "shell", "execute_request", {"code": code, "silent": False}, metadata={"notebookos": {"replica": replica}}
    )
    reply = conn.reply(msg_id, timeout)
    assert reply["content"]["status"] == "ok", reply["content"]
    assert reply["metadata"]["notebookos"]["replica"] == replica, reply["metadata"]
    return dict(reply)


def hold_uploads_until(go: Path) -> str:
    """Code for a cell that makes its replica hold each later upload of buffers until the file ``go`` exists (or
    for 120 s): the replica replies, then waits to store the cell's state. A user's code may do anything to its
    own replica; this is what a slow object store looks like from the gateway."""
    return (
        "import os as _os, time as _time\n"
        "from jupyter_notebookos.kernel.statelog import StateLog as _StateLog\n"
        "_finish = _StateLog.finish\n"
        "def _held(self, pending, *args):\n"
        "    deadline = _time.monotonic() + 120\n"
        f"    while pending.views and not _os.path.exists({str(go)!r}) and _time.monotonic() < deadline:\n"
        "        _time.sleep(0.05)\n"
        "    return _finish(self, pending, *args)\n"
        "_StateLog.finish = _held\n"
    )


def etcd_member(endpoint: str) -> psutil.Process | None:
    """The etcd member process serving client ``endpoint`` (``host:port`` or its URL), or None (one that was killed
    and is not started again yet)."""
    url = endpoint if endpoint.startswith("http") else f"http://{endpoint}"
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if cmdline and cmdline[0].endswith("etcd") and f"--listen-client-urls={url}" in "=".join(cmdline):
            return proc
    return None


def kill_the_gateway(platform: Platform, client: GatewayClient, kernel_id: str) -> None:
    """SIGKILL the platform's gateway and wait until its successor (``notebookos up`` starts one) lists the
    kernel again for ``client``."""
    import requests

    gateway = next(p for p in platform.descendants() if "jupyter_notebookos.gateway" in " ".join(p.cmdline()))
    gateway.kill()
    gateway.wait(10)

    def relisted() -> bool:
        with contextlib.suppress(GatewayError, requests.RequestException):
            return kernel_id in {k["id"] for k in client.request("GET", "/api/kernels", timeout=5)}
        return False

    wait_for(relisted, 60, "the restarted gateway to list the kernel")
