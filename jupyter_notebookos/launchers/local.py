"""``LocalLauncher``: the embedded mode's replicas, as processes on this machine tagged with a simulated host.

Each replica is ``python -m jupyter_notebookos.kernel`` started in its own session (``setsid``), so it
survives the gateway: a restarted gateway finds it again (:meth:`find_replicas`) and re-attaches. Its
output goes to ``<log_dir>/<kernel_id>/<replica_id>.log``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
from traitlets import Float, Unicode, default

from jupyter_notebookos.launchers.base import (
    Launcher,
    LaunchError,
    ReplicaHandle,
    ReplicaPhase,
    ReplicaSpec,
    ReplicaStatus,
)
from jupyter_notebookos.replication.protocol import ENV_HOST, ENV_KERNEL_ID, ENV_REPLICA_ID


class LocalLauncher(Launcher):
    """Starts replicas as detached local processes; the host is a label (simulated hosts)."""

    log_dir = Unicode(config=True, help="Directory for replica logs (one folder per kernel).")

    @default("log_dir")
    def _log_dir_default(self) -> str:
        return os.path.join(os.environ.get("NOTEBOOKOS_STATE_DIR", ".state"), "replicas")

    python = Unicode(config=True, help="The Python that runs replica kernels (default: the gateway's).")

    @default("python")
    def _python_default(self) -> str:
        return sys.executable

    stop_timeout = Float(
        5.0, config=True, help="Seconds between SIGTERM and SIGKILL when stopping a replica."
    )

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._children: dict[tuple[str, str], subprocess.Popen[bytes]] = {}

    def log_path(self, kernel_id: str, replica_id: str) -> Path:
        """Where a replica's output goes."""
        return Path(self.log_dir) / kernel_id / f"{replica_id}.log"

    async def start_replica(self, spec: ReplicaSpec) -> ReplicaHandle:
        log_path = self.log_path(spec.kernel_id, spec.replica_id)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(spec.env)
        env.update({ENV_KERNEL_ID: spec.kernel_id, ENV_REPLICA_ID: spec.replica_id, ENV_HOST: spec.host})
        env.setdefault("PYTHONUNBUFFERED", "1")
        command = [self.python, "-m", "jupyter_notebookos.kernel"]
        try:
            with open(log_path, "ab") as out:
                child = subprocess.Popen(
                    command,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    cwd=env.get("KERNEL_WORKING_DIR") or None,
                )
        except OSError as err:
            raise LaunchError(
                f"could not start replica {spec.replica_id} of kernel {spec.kernel_id}: {err}"
            ) from err
        self._children[(spec.kernel_id, spec.replica_id)] = child
        self.log.info(
            "replica %s of kernel %s started on %s (pid %d, log %s)",
            spec.replica_id,
            spec.kernel_id,
            spec.host,
            child.pid,
            log_path,
        )
        return ReplicaHandle(spec.kernel_id, spec.replica_id, spec.host, pid=child.pid)

    async def stop_replica(self, handle: ReplicaHandle, *, now: bool = False) -> None:
        if handle.pid is None:
            return
        child = self._children.pop((handle.kernel_id, handle.replica_id), None)
        try:
            process = psutil.Process(handle.pid)
            if not self._is_replica(process, handle.kernel_id, handle.replica_id):
                return  # the pid was reused by something else
            process.send_signal(signal.SIGKILL if now else signal.SIGTERM)
            try:
                process.wait(0 if now else self.stop_timeout)
            except psutil.TimeoutExpired:
                process.kill()
                process.wait(self.stop_timeout)
        except psutil.NoSuchProcess:
            pass
        except psutil.TimeoutExpired:
            self.log.warning(
                "replica %s of kernel %s (pid %d) did not exit",
                handle.replica_id,
                handle.kernel_id,
                handle.pid,
            )
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(0.1)

    async def status(self, handle: ReplicaHandle) -> ReplicaStatus:
        child = self._children.get((handle.kernel_id, handle.replica_id))
        if child is not None:
            code = child.poll()
            if code is None:
                return ReplicaStatus(ReplicaPhase.RUNNING)
            phase = ReplicaPhase.EXITED if code == 0 else ReplicaPhase.FAILED
            return ReplicaStatus(
                phase, f"exit code {code}; log: {self.log_path(handle.kernel_id, handle.replica_id)}"
            )
        if handle.pid is None:
            return ReplicaStatus(ReplicaPhase.UNKNOWN, "no pid")
        try:
            process = psutil.Process(handle.pid)
            if (
                self._is_replica(process, handle.kernel_id, handle.replica_id)
                and process.status() != "zombie"
            ):
                return ReplicaStatus(ReplicaPhase.RUNNING)
        except psutil.NoSuchProcess:
            pass
        return ReplicaStatus(ReplicaPhase.EXITED, "the process is gone")

    async def find_replicas(self, kernel_id: str) -> list[ReplicaHandle]:
        found = []
        for process in psutil.process_iter(["pid", "cmdline"]):
            cmdline = process.info.get("cmdline") or []
            if "jupyter_notebookos.kernel" not in cmdline:
                continue
            with contextlib.suppress(psutil.Error):
                env = process.environ()
                if env.get(ENV_KERNEL_ID) == kernel_id:
                    found.append(
                        ReplicaHandle(
                            kernel_id, env.get(ENV_REPLICA_ID, ""), env.get(ENV_HOST, ""), pid=process.pid
                        )
                    )
        return found

    @staticmethod
    def _is_replica(process: psutil.Process, kernel_id: str, replica_id: str) -> bool:
        try:
            env = process.environ()
        except psutil.Error:
            return False
        return env.get(ENV_KERNEL_ID) == kernel_id and env.get(ENV_REPLICA_ID) == replica_id
