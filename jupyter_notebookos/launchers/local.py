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

**Kernels run as their own OS users** (``kernel_users``, on by default when the gateway runs as root): every
replica of a kernel runs under a uid of that kernel alone, allocated here and recorded beside its pid files. Its
home and, for a ``file://`` object store, its store directory are that uid's, mode 0700. So code in one kernel
cannot read another kernel's files, environment (its etcd password) or memory, nor the gateway's state dir. The
replica process takes the uid itself (``NOTEBOOKOS_KERNEL_UID``, :mod:`jupyter_notebookos.kernel.sandbox`) before
any user code runs: a warm process when it receives its assignment.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import psutil
from traitlets import Enum, Float, Int, Unicode, default

from jupyter_notebookos.launchers.base import (
    Launcher,
    LaunchError,
    ReplicaHandle,
    ReplicaPhase,
    ReplicaSpec,
    ReplicaStatus,
)
from jupyter_notebookos.launchers.hostnet import HostNetwork, HostNetworkError
from jupyter_notebookos.replication.protocol import (
    ENV_ETCD_ENDPOINTS,
    ENV_HOST,
    ENV_IP,
    ENV_KERNEL_ID,
    ENV_KERNEL_UID,
    ENV_OBJECT_STORE_URL,
    ENV_REPLICA_ID,
)

#: Environment variables that take effect when the interpreter starts, so a warm process must have them.
STARTUP_PREFIXES = ("PYTHON", "LD_", "OPENBLAS_", "OMP_", "MKL_", "MALLOC_", "GLIBC_TUNABLES")
WARM_FLAG = "--warm"


def startup_env(env: dict[str, str]) -> dict[str, str]:
    """The part of an environment that a process must have had from its start."""
    return {k: v for k, v in env.items() if k.startswith(STARTUP_PREFIXES) and k != "PYTHONUNBUFFERED"}


def unreachable_for_others(path: str | Path, *, read: bool = True) -> str | None:
    """The first directory on the way to ``path`` that users other than its owner cannot pass (no o+x), or
    the path itself when they cannot read it (``read``); None when any user can reach (and read) it."""
    real = Path(os.path.realpath(path))
    for parent in reversed(real.parents):
        with contextlib.suppress(OSError):
            if not parent.stat().st_mode & stat.S_IXOTH:
                return str(parent)
    if not read:
        return None
    try:
        mode = real.stat().st_mode
    except OSError:
        return str(real)
    return None if mode & stat.S_IROTH else str(real)


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

    kernel_users = Enum(
        ["auto", "on", "off"],
        "auto",
        config=True,
        help="Run each kernel's replicas as an OS user of that kernel alone (needs root). 'auto': when the "
        "gateway runs as root and the Python environment is readable by other users; 'on': always, or refuse "
        "to start kernels; 'off': replicas run as the gateway's user, and kernels are not isolated from each "
        "other or from the gateway's files.",
    )

    host_network = Enum(
        ["shared", "netns"],
        "shared",
        config=True,
        help="'shared': every simulated host's replicas use this machine's network (127.0.0.1). 'netns' (root): "
        "each host is a network namespace on a bridge of its own (launchers/hostnet.py), so a host can be cut "
        "off from etcd and the gateway (a network partition); etcd must listen on the bridge's address, as "
        "`notebookos up --host-network netns` arranges. Replicas then start cold (no warm pool).",
    )

    kernel_uid_base = Int(
        1_500_000_000,
        config=True,
        help="First uid (and gid) of the per-kernel OS users; each kernel takes one from this range.",
    )

    kernel_uid_count = Int(
        1_000_000, config=True, help="How many uids the per-kernel OS users may take from kernel_uid_base."
    )

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._isolation: str | None = None  # why kernels are not isolated ("" once checked and isolated)
        self._children: dict[tuple[str, str], subprocess.Popen[bytes]] = {}
        self._pool: list[tuple[dict[str, str], subprocess.Popen[bytes]]] = []

    def log_path(self, kernel_id: str, replica_id: str) -> Path:
        """Where a replica's output goes."""
        return Path(self.log_dir) / kernel_id / f"{replica_id}.log"

    def _pid_path(self, kernel_id: str, replica_id: str) -> Path:
        return Path(self.log_dir) / kernel_id / f"{replica_id}.pid"

    # -- per-kernel OS users ------------------------------------------------------------------------------

    def isolation(self) -> str:
        """ "" when kernels run as their own OS users; otherwise why not (for logs and the kernel view)."""
        if self._isolation is None:
            reason = ""
            if self.kernel_users == "off":
                reason = "kernel_users is off"
            elif os.geteuid() != 0:
                reason = "the gateway does not run as root"
            else:
                state_dir = Path(self.log_dir).resolve().parent
                blocked = unreachable_for_others(state_dir, read=False)
                if blocked is not None:
                    reason = f"{blocked} cannot be passed by other users (on the way to the state dir {state_dir})"
                else:
                    # Whether a replica can take a user here (and still read its Python): try it once.
                    probe = subprocess.run(
                        [self.python, "-m", "jupyter_notebookos.kernel.sandbox"],
                        capture_output=True,
                        text=True,
                        timeout=30,
                        env={"PATH": os.environ.get("PATH", ""), **startup_env(dict(os.environ))},
                    )
                    if probe.returncode != 0:
                        reason = f"a replica could not take an unprivileged user: {probe.stderr.strip()[-300:]}"
            if reason and self.kernel_users == "on":
                raise LaunchError(
                    f"kernel_users is 'on' but kernels cannot run as their own users: {reason}. Run the gateway "
                    "as root from a Python environment every user can read, or set LocalLauncher.kernel_users."
                )
            if reason:
                self.log.warning("kernels are NOT isolated from each other: %s", reason)
            self._isolation = reason
        return self._isolation

    def kernel_uid(self, kernel_id: str) -> int:
        """The uid of a kernel's replicas: recorded beside its pid files, else a free one chosen now."""
        recorded = self._recorded_uid(kernel_id)
        if recorded is not None:
            return recorded
        record = Path(self.log_dir) / kernel_id / "uid"
        taken = set()
        for other in Path(self.log_dir).glob("*/uid"):
            with contextlib.suppress(OSError, ValueError):
                taken.add(int(other.read_text()))
        start = int(hashlib.sha256(kernel_id.encode()).hexdigest(), 16) % self.kernel_uid_count
        for step in range(self.kernel_uid_count):
            uid = self.kernel_uid_base + (start + step) % self.kernel_uid_count
            if uid not in taken:
                break
        else:
            raise LaunchError(f"no free uid left for kernel {kernel_id} (LocalLauncher.kernel_uid_count)")
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(str(uid))
        return uid

    def _recorded_uid(self, kernel_id: str) -> int | None:
        """The uid recorded for the kernel (only where kernels run as their own users), else None."""
        with contextlib.suppress(OSError, ValueError):
            return int((Path(self.log_dir) / kernel_id / "uid").read_text())
        return None

    def kernel_home(self, kernel_id: str) -> Path:
        """The private home directory of a kernel's replicas (when they run as its own user)."""
        return Path(self.log_dir).resolve().parent / "kernels" / kernel_id

    def _prepare_kernel_dirs(self, kernel_id: str, uid: int, env: dict[str, str]) -> None:
        """The kernel's home and local object-store directory: owned by its uid, mode 0700, reachable."""
        dirs = [self.kernel_home(kernel_id)]
        store = urlparse(env.get(ENV_OBJECT_STORE_URL, ""))
        if store.scheme in ("", "file") and store.path:
            dirs.append(Path(store.path))
        state_dir = Path(self.log_dir).resolve().parent
        for directory in dirs:
            directory.mkdir(parents=True, exist_ok=True)
            os.chown(directory, uid, uid)
            directory.chmod(0o700)
            # Its parents inside the state dir must let the kernel's user pass (not list): o+x.
            for parent in directory.resolve().parents:
                if parent != state_dir and state_dir not in parent.parents:
                    break
                mode = parent.stat().st_mode
                if not mode & stat.S_IXOTH:
                    parent.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
            blocked = unreachable_for_others(directory, read=False)
            if blocked is not None:
                raise LaunchError(
                    f"kernel {kernel_id} runs as its own user but cannot reach its directory {directory}: {blocked} "
                    "has no search permission for other users. Put the object store under the state dir, or allow "
                    "search (chmod o+x) on that directory."
                )

    async def forget_kernel(self, kernel_id: str) -> None:
        """Remove what this launcher kept for a stopped kernel (its home, its uid record, its logs).

        A process still running as the kernel's own user (one that left the replica's process group and parent,
        as a daemon does) is killed first: its uid may be given to another kernel next. Runs in a worker thread:
        the home holds as many files as the kernel's user wrote there, and removing them on the gateway's event
        loop held up every other user's cells (0.7 s for 60,000 files)."""
        await asyncio.to_thread(self._forget_kernel, kernel_id)

    def _forget_kernel(self, kernel_id: str) -> None:
        import shutil

        uid = self._recorded_uid(kernel_id)
        if uid is not None and self.kernel_uid_base <= uid < self.kernel_uid_base + self.kernel_uid_count:
            for process in psutil.process_iter(["uids"]):
                with contextlib.suppress(psutil.Error):
                    if uid in (process.info["uids"] or ()):
                        self.log.warning(
                            "kernel %s: killing pid %d, still running as the kernel's user after it stopped",
                            kernel_id,
                            process.pid,
                        )
                        process.kill()
        shutil.rmtree(self.kernel_home(kernel_id), ignore_errors=True)
        shutil.rmtree(Path(self.log_dir) / kernel_id, ignore_errors=True)

    async def start_replica(self, spec: ReplicaSpec) -> ReplicaHandle:
        log_path = self.log_path(spec.kernel_id, spec.replica_id)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.parent.chmod(0o700)
        env = {k: str(v) for k, v in spec.env.items()}
        env.update({k: str(v) for k, v in spec.secret_env.items()})
        env.update({ENV_KERNEL_ID: spec.kernel_id, ENV_REPLICA_ID: spec.replica_id, ENV_HOST: spec.host})
        env.setdefault("PYTHONUNBUFFERED", "1")
        uid: int | None = None
        if not self.isolation():
            uid = self.kernel_uid(spec.kernel_id)
            self._prepare_kernel_dirs(spec.kernel_id, uid, env)
            home = str(self.kernel_home(spec.kernel_id))
            env.update(
                {
                    "HOME": home,
                    "USER": f"kernel-{uid}",
                    "MPLCONFIGDIR": f"{home}/.matplotlib",
                    ENV_KERNEL_UID: str(uid),
                }
            )
        cwd = env.get("KERNEL_WORKING_DIR") or None
        command = [self.python, "-m", "jupyter_notebookos.kernel"]
        if self.host_network == "netns":
            command = self._in_host_network(spec.host, env, command)
            child = None  # warm processes wait in this machine's network, not the host's
        else:
            child = self._assign_warm(env, log_path, cwd)
        try:
            if child is None:
                with open(log_path, "ab") as out:
                    child = subprocess.Popen(
                        command,
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
            if self.host_network != "netns":
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

    def _in_host_network(self, host: str, env: dict[str, str], command: list[str]) -> list[str]:
        """``command`` run in the host's network namespace; the replica binds on the host's address and reaches
        etcd on the bridge's instead of 127.0.0.1."""
        network = HostNetwork.for_state_dir(Path(self.log_dir).resolve().parent)
        try:
            env[ENV_IP] = network.ensure_host(host)
        except HostNetworkError as err:
            raise LaunchError(f"could not give host {host} its network namespace: {err}") from err
        endpoints = env.get(ENV_ETCD_ENDPOINTS, "").split(",")
        env[ENV_ETCD_ENDPOINTS] = ",".join(e.replace("127.0.0.1:", f"{network.bridge_ip}:") for e in endpoints if e)
        return network.command(host, command)

    def warm(self) -> None:
        """Start the pool now (the gateway calls this at start-up, so the first kernel finds it ready).

        Kernels get the gateway's own start-up variables (Enterprise Gateway passes them on), so the pool
        starts with those; a replica asked for with others is started cold and the pool follows it."""
        if self.host_network != "netns":
            self._refill(startup_env(dict(os.environ)))

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
        # Waiting for processes to exit, and scanning every process for a dead replica's group, takes up to
        # stop_timeout seconds: not on the gateway's event loop, which serves every other user's cells meanwhile.
        await asyncio.to_thread(self._stop_processes, handle, child, now)

    def _stop_processes(self, handle: ReplicaHandle, child: subprocess.Popen[bytes] | None, now: bool) -> None:
        """Stop replica ``handle``'s process and what its cells started (see :meth:`stop_replica`); blocks."""
        assert handle.pid is not None
        started: list[psutil.Process] = []
        try:
            process = psutil.Process(handle.pid)
            if not self._is_replica(process, handle.kernel_id, handle.replica_id):
                return  # the pid was reused by something else
            # What its cells started goes with it: a background job must not outlive its kernel (nor hold a GPU).
            started = _started_by(process)
            _signal([process, *started], signal.SIGKILL if now else signal.SIGTERM)
            try:
                process.wait(0 if now else self.stop_timeout)
            except psutil.TimeoutExpired:
                process.kill()
                process.wait(self.stop_timeout)
        except psutil.NoSuchProcess:
            # It died (a crash, SIGKILL): what its cells started may live on in its process group. While any
            # member lives, Linux gives nobody that group's id as a pid, so the group is still the replica's.
            if not psutil.pid_exists(handle.pid):
                started = _group_members(handle.pid)
                _signal(started, signal.SIGKILL if now else signal.SIGTERM)
        except psutil.TimeoutExpired:
            self.log.warning(
                "replica %s of kernel %s (pid %d) did not exit", handle.replica_id, handle.kernel_id, handle.pid
            )
        if started:
            _, alive = psutil.wait_procs(started, timeout=0 if now else 1)
            _signal(alive, signal.SIGKILL)
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
            log_path = self.log_path(handle.kernel_id, handle.replica_id)
            said = _last_line(log_path) if code != 0 else ""
            return ReplicaStatus(phase, f"exit code {code}{f': {said}' if said else ''}; log: {log_path}")
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


def _signal(processes: list[psutil.Process], sig: int) -> None:
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.send_signal(sig)


def _started_by(replica: psutil.Process) -> list[psutil.Process]:
    """What a replica's cells started: its descendants, and the rest of its process group (a replica leads its
    own session and group; a process whose parent exited stays in the group)."""
    found: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.Error):
        found.update((p.pid, p) for p in replica.children(recursive=True))
    found.update((p.pid, p) for p in _group_members(replica.pid) if p.pid != replica.pid and p.pid not in found)
    return list(found.values())


def _group_members(pgid: int) -> list[psutil.Process]:
    """The processes of process group ``pgid``."""
    members = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(process.pid) == pgid:
                members.append(process)
    return members


def _last_line(path: Path, limit: int = 4096) -> str:
    """The last non-empty line of a replica's log (its one-line reason when it failed), at most 300 characters."""
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - limit))
            tail = log.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
