"""Helpers shared by the whole suite: run `notebookos up`, free ports, find left-over processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from jupyter_notebookos.client import GatewayClient

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKOS = [sys.executable, "-m", "jupyter_notebookos.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Platform:
    """A `notebookos up` running in a subprocess."""

    process: subprocess.Popen[bytes]
    state_dir: Path
    url: str
    token: str
    log: Path

    @property
    def client(self) -> GatewayClient:
        return GatewayClient(self.url, self.token)

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []


def processes_of(state_dir: Path) -> list[psutil.Process]:
    """Every process whose command line or environment mentions ``state_dir`` (etcd, gateway, replicas)."""
    found = []
    marker = str(state_dir)
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid == os.getpid():
                continue
            cmdline = " ".join(proc.info.get("cmdline") or [])
            if marker in cmdline or proc.environ().get("NOTEBOOKOS_STATE_DIR") == marker:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def start_platform(state_dir: Path, *args: str, timeout: float = 90.0) -> Platform:
    """Run `notebookos up --no-lab` with ``args`` and wait until it wrote its runtime file."""
    port = free_port()
    log = state_dir.parent / f"{state_dir.name}-up.log"
    out = open(log, "wb")  # noqa: SIM115 - the child writes to it
    process = subprocess.Popen(
        [*NOTEBOOKOS, "up", "--no-lab", "--state-dir", str(state_dir), "--port", str(port), *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )
    out.close()
    runtime = state_dir / "runtime.json"
    deadline = time.monotonic() + timeout
    while not runtime.exists():
        if process.poll() is not None:
            raise AssertionError(f"notebookos up exited with {process.returncode}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"notebookos up did not come up in {timeout} s:\n{log.read_text()}")
        time.sleep(0.1)
    info = json.loads(runtime.read_text())
    return Platform(process, state_dir, info["gateway_url"], info["token"], log)


def stop_platform(platform: Platform, timeout: float = 60.0) -> None:
    if platform.process.poll() is None:
        platform.process.send_signal(signal.SIGTERM)
        try:
            platform.process.wait(timeout)
        except subprocess.TimeoutExpired:
            platform.process.kill()
            platform.process.wait(10)
    for proc in processes_of(platform.state_dir):
        proc.kill()
