"""Run `notebookos up --no-lab` as a child process: for benchmarks, tests and scripts that need a platform.

``PlatformProcess.start(state_dir, "--hosts", "4")`` returns once the gateway answers (its runtime file is
written); ``stop()`` sends SIGTERM (the platform stops everything it started) and kills whatever is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from jupyter_notebookos.client import GatewayClient
from jupyter_notebookos.coordination.client import EtcdCredentials
from jupyter_notebookos.embedded.platform import RUNTIME_FILE
from jupyter_notebookos.embedded.ports import free_port

NOTEBOOKOS = [sys.executable, "-m", "jupyter_notebookos.cli"]
#: How many ports `PlatformProcess.start` tries for the gateway (see there).
PORT_ATTEMPTS = 3


def processes_of(state_dir: Path) -> list[psutil.Process]:
    """Every process whose command line or environment names ``state_dir`` (etcd, gateway, replicas)."""
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


@dataclass
class PlatformProcess:
    """A running `notebookos up --no-lab`."""

    process: subprocess.Popen[bytes]
    state_dir: Path
    url: str
    token: str
    log: Path

    @classmethod
    def start(
        cls,
        state_dir: Path,
        *args: str,
        timeout: float = 90.0,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> PlatformProcess:
        """Start the platform with ``args`` (and ``env`` on top of this process's environment) and wait until it
        is up (or raise with the end of its output).

        The gateway's port is picked here, free at that moment; another program may bind it in the second or two
        before `notebookos up` checks it (tests in parallel workers pick from the same range). ``up`` then refuses
        it before starting anything, and the platform is started again on another port, up to
        :data:`PORT_ATTEMPTS` times."""
        state_dir = state_dir.resolve()
        state_dir.parent.mkdir(parents=True, exist_ok=True)
        log = state_dir.parent / f"{state_dir.name}-up.log"
        runtime = state_dir / RUNTIME_FILE
        deadline = time.monotonic() + timeout
        for attempt in range(1, PORT_ATTEMPTS + 1):
            port = free_port()
            with open(log, "wb") as out:
                process = subprocess.Popen(
                    [*NOTEBOOKOS, "up", "--no-lab", "--state-dir", str(state_dir), "--port", str(port), *args],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=cwd,
                    env=None if env is None else {**os.environ, **env},
                )
            while not runtime.exists():
                if process.poll() is not None:
                    said = log.read_text()
                    if attempt < PORT_ATTEMPTS and f"port {port} (port) is already in use" in said:
                        break  # taken since it was picked: nothing started, try another
                    raise RuntimeError(f"notebookos up exited with {process.returncode}:\n{said}")
                if time.monotonic() > deadline:
                    process.kill()
                    raise RuntimeError(f"notebookos up did not come up in {timeout} s:\n{log.read_text()}")
                time.sleep(0.1)
            else:
                info = json.loads(runtime.read_text())
                return cls(process, state_dir, info["gateway_url"], info["token"], log)
        raise AssertionError("unreachable: the last attempt returns or raises")

    @property
    def client(self) -> GatewayClient:
        return GatewayClient(self.url, self.token)

    def etcd_root(self) -> EtcdCredentials:
        """etcd's admin identity of this platform (for tests and tools that read etcd directly)."""
        return EtcdCredentials("root", (self.state_dir / "etcd-root-password").read_text().strip())

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM (everything it started stops), then kill anything of its state dir still alive."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        for proc in processes_of(self.state_dir):
            proc.kill()
