"""``LocalLauncher``: the embedded mode's replicas, as processes on this machine tagged with a simulated host.

Each replica is ``python -m jupyter_notebookos.kernel`` started in its own session (``setsid``), so it
survives the gateway: a restarted gateway finds it again (:meth:`find_replicas`) and re-attaches. Its
output goes to ``<log_dir>/<kernel_id>/<replica_id>.log``; ``<replica_id>.pid`` beside it records which
process it is (pid and start time, so a reused pid is never mistaken for it).

A few *warm* replica processes wait with the expensive imports done (``warm_replicas``): a kernel start, a
replacement or a migration hands one its assignment (environment, log file) on its stdin instead of
starting an interpreter, which halves a replica's start-up time. A warm process is used only when the
variables that matter at interpreter start-up (``PYTHON*``, ``LD_*``, thread-pool sizes) are the ones the
replica would have been started with.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
from traitlets import Float, Int, Unicode, default

from jupyter_notebookos.launchers.base import (
    Launcher,
    LaunchError,
    ReplicaHandle,
    ReplicaPhase,
    ReplicaSpec,
    ReplicaStatus,
)
from jupyter_notebookos.replication.protocol import ENV_HOST, ENV_KERNEL_ID, ENV_REPLICA_ID

#: Environment variables that take effect when the interpreter starts, so a warm process must have them.
STARTUP_PREFIXES = ("PYTHON", "LD_", "OPENBLAS_", "OMP_", "MKL_")
WARM_FLAG = "--warm"


def startup_env(env: dict[str, str]) -> dict[str, str]:
    """The part of an environment that a process must have had from its start."""
    return {k: v for k, v in env.items() if k.startswith(STARTUP_PREFIXES) and k != "PYTHONUNBUFFERED"}


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

    stop_timeout = Float(5.0, config=True, help="Seconds between SIGTERM and SIGKILL when stopping a replica.")

    warm_replicas = Int(
        3,
        config=True,
        help="Replica processes kept started with their imports done, so kernels, replacements and migrations "
        "start faster (each costs about 100 MB of memory while it waits). 0 disables the pool.",
    )

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._children: dict[tuple[str, str], subprocess.Popen[bytes]] = {}
        self._pool: list[tuple[dict[str, str], subprocess.Popen[bytes]]] = []

    def log_path(self, kernel_id: str, replica_id: str) -> Path:
        """Where a replica's output goes."""
        return Path(self.log_dir) / kernel_id / f"{replica_id}.log"

    def _pid_path(self, kernel_id: str, replica_id: str) -> Path:
        return Path(self.log_dir) / kernel_id / f"{replica_id}.pid"

    async def start_replica(self, spec: ReplicaSpec) -> ReplicaHandle:
        log_path = self.log_path(spec.kernel_id, spec.replica_id)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {k: str(v) for k, v in spec.env.items()}
        env.update({ENV_KERNEL_ID: spec.kernel_id, ENV_REPLICA_ID: spec.replica_id, ENV_HOST: spec.host})
        env.setdefault("PYTHONUNBUFFERED", "1")
        cwd = env.get("KERNEL_WORKING_DIR") or None
        child = self._assign_warm(env, log_path, cwd)
        try:
            if child is None:
                with open(log_path, "ab") as out:
                    child = subprocess.Popen(
                        [self.python, "-m", "jupyter_notebookos.kernel"],
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                        cwd=cwd,
                    )
        except OSError as err:
            raise LaunchError(f"could not start replica {spec.replica_id} of kernel {spec.kernel_id}: {err}") from err
        finally:
            self._refill(startup_env(env))
        self._children[(spec.kernel_id, spec.replica_id)] = child
        self._pid_path(spec.kernel_id, spec.replica_id).write_text(
            json.dumps(
                {
                    "pid": child.pid,
                    "created": psutil.Process(child.pid).create_time(),
                    "host": spec.host,
                }
            )
        )
        self.log.info(
            "replica %s of kernel %s started on %s (pid %d, log %s)",
            spec.replica_id,
            spec.kernel_id,
            spec.host,
            child.pid,
            log_path,
        )
        return ReplicaHandle(spec.kernel_id, spec.replica_id, spec.host, pid=child.pid)

    # -- the warm pool -------------------------------------------------------------------------------------

    def _assign_warm(self, env: dict[str, str], log_path: Path, cwd: str | None) -> subprocess.Popen[bytes] | None:
        """Hand a waiting warm process this replica's assignment; None when none fits."""
        wanted = startup_env(env)
        while self._pool:
            startup, process = self._pool.pop(0)
            if process.poll() is not None or startup != wanted or process.stdin is None:
                self._discard(process)
                continue
            assignment = json.dumps({"env": env, "log": str(log_path), "cwd": cwd}) + "\n"
            try:
                process.stdin.write(assignment.encode())
                process.stdin.close()
            except OSError:
                self._discard(process)
                continue
            return process
        return None

    def _refill(self, startup: dict[str, str]) -> None:
        """Keep ``warm_replicas`` processes waiting, started like the replicas now being asked for."""
        self._pool = [(s, p) for s, p in self._pool if p.poll() is None or self._discard(p)]
        while len(self._pool) < self.warm_replicas:
            env = {
                "PATH": os.environ.get("PATH", ""),
                **startup,
                "PYTHONUNBUFFERED": "1",
                "NOTEBOOKOS_STATE_DIR": str(Path(self.log_dir).resolve().parent),
            }
            pool_log = Path(self.log_dir) / "warm-pool.log"
            pool_log.parent.mkdir(parents=True, exist_ok=True)
            try:
                with open(pool_log, "ab") as out:
                    process = subprocess.Popen(
                        [self.python, "-m", "jupyter_notebookos.kernel", WARM_FLAG],
                        env=env,
                        stdin=subprocess.PIPE,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
            except OSError as err:
                self.log.warning("could not start a warm replica process: %s", err)
                return
            self._pool.append((startup, process))

    @staticmethod
    def _discard(process: subprocess.Popen[bytes]) -> bool:
        with contextlib.suppress(OSError):
            if process.stdin is not None:
                process.stdin.close()  # a warm process exits when its stdin closes
        with contextlib.suppress(OSError):
            process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(1)
        return False

    def warm(self) -> None:
        """Start the pool now (the gateway calls this at start-up, so the first kernel finds it ready).

        Kernels get the gateway's own start-up variables (Enterprise Gateway passes them on), so the pool
        starts with those; a replica asked for with others is started cold and the pool follows it."""
        self._refill(startup_env(dict(os.environ)))

    async def stop(self) -> None:
        """Let the warm processes go (replicas themselves are stopped one by one by the platform)."""
        for _, process in self._pool:
            self._discard(process)
        self._pool.clear()

    # -- replicas ------------------------------------------------------------------------------------------

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
                "replica %s of kernel %s (pid %d) did not exit", handle.replica_id, handle.kernel_id, handle.pid
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
            return ReplicaStatus(phase, f"exit code {code}; log: {self.log_path(handle.kernel_id, handle.replica_id)}")
        if handle.pid is None:
            return ReplicaStatus(ReplicaPhase.UNKNOWN, "no pid")
        try:
            process = psutil.Process(handle.pid)
            if self._is_replica(process, handle.kernel_id, handle.replica_id) and process.status() != "zombie":
                return ReplicaStatus(ReplicaPhase.RUNNING)
        except psutil.NoSuchProcess:
            pass
        return ReplicaStatus(ReplicaPhase.EXITED, "the process is gone")

    async def find_replicas(self, kernel_id: str) -> list[ReplicaHandle]:
        found = []
        for pid_file in sorted((Path(self.log_dir) / kernel_id).glob("*.pid")):
            replica_id = pid_file.stem
            with contextlib.suppress(OSError, ValueError, KeyError, psutil.Error):
                record = json.loads(pid_file.read_text())
                process = psutil.Process(int(record["pid"]))
                if self._is_replica(process, kernel_id, replica_id) and process.status() != "zombie":
                    found.append(ReplicaHandle(kernel_id, replica_id, str(record.get("host", "")), pid=process.pid))
        return found

    def _is_replica(self, process: psutil.Process, kernel_id: str, replica_id: str) -> bool:
        """Whether ``process`` is that replica: the pid file names it, and it started when recorded."""
        try:
            record = json.loads(self._pid_path(kernel_id, replica_id).read_text())
            return int(record["pid"]) == process.pid and abs(float(record["created"]) - process.create_time()) < 0.01
        except (OSError, ValueError, KeyError, psutil.Error):
            return False

