"""Fixtures for the replica kernel tests: a real etcd, real replica processes, real Jupyter clients.

Every test gets its own etcd key prefix, kernel id and object store, so tests share one etcd (started once
per session) without seeing each other. Replica processes run in their own session and are killed (the
whole process group) when the test ends, whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from support import etcd_running

from jupyter_notebookos.coordination.client import Coordinator
from jupyter_notebookos.coordination.keys import KeyLayout
from jupyter_notebookos.embedded.etcd import EtcdCluster
from jupyter_notebookos.kernel.loop import CoordinationThread
from jupyter_notebookos.replication import protocol as p

_T = TypeVar("_T")
REPO = Path(__file__).resolve().parents[2]


class Etcd:
    """Synchronous test access to etcd (a Coordinator on its own loop thread)."""

    def __init__(self, endpoints: list[str], prefix: str):
        self.thread = CoordinationThread("test-etcd")
        self.thread.start()
        self.keys = KeyLayout(prefix)
        self.co: Coordinator = self.run(Coordinator.connect(endpoints, prefix=prefix))

    def run(self, coro: Coroutine[Any, Any, _T], timeout: float = 10) -> _T:
        return self.thread.run(coro, timeout)

    def get(self, key: str) -> Any:
        return self.run(self.co.get(key))

    def close(self) -> None:
        self.run(self.co.close())
        self.thread.loop.call_soon_threadsafe(self.thread.loop.stop)


@dataclass
class Cell:
    """What one execute_request produced."""

    reply: dict[str, Any]
    stdout: str = ""
    stderr: str = ""
    outputs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def status(self) -> str:
        return str(self.reply["content"]["status"])

    @property
    def meta(self) -> dict[str, Any]:
        return dict(self.reply["metadata"].get(p.METADATA_KEY, {}))


@dataclass
class Replica:
    """A replica process under test."""

    rid: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    env: dict[str, str]
    registration: p.ReplicaRegistration | None = None
    client: BlockingKernelClient | None = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def connect(self) -> BlockingKernelClient:
        reg = self.registration
        assert reg is not None
        client = BlockingKernelClient()
        # jupyter_client 6 ignores key= in the constructor; load_connection_info sets the session's key.
        client.load_connection_info(
            {
                "ip": reg.ip,
                "transport": reg.transport,
                "shell_port": reg.shell_port,
                "iopub_port": reg.iopub_port,
                "stdin_port": reg.stdin_port,
                "control_port": reg.control_port,
                "hb_port": reg.hb_port,
                "key": self.env[p.ENV_KEY],
                "signature_scheme": "hmac-sha256",
            }
        )
        client.start_channels()
        client.wait_for_ready(timeout=10)
        self.client = client
        return client

    def control(self, msg_type: str, content: dict[str, Any], timeout: float = 10) -> dict[str, Any]:
        """Send a request on the control channel; returns its reply."""
        client = self.client or self.connect()
        msg = client.session.msg(msg_type, content)
        client.control_channel.send(msg)
        deadline = time.monotonic() + timeout
        while True:
            reply = client.get_control_msg(timeout=max(deadline - time.monotonic(), 0.01))
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return reply

    def execute(
        self, code: str, directive: p.CellDirective | None = None, timeout: float = 20, *, msg_id: str | None = None
    ) -> Cell:
        """Run ``code`` (with ``directive`` in the metadata, if given; as request ``msg_id``, if given) and collect
        its outputs."""
        client = self.client or self.connect()
        content = {
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        }
        metadata = {p.METADATA_KEY: directive.to_dict()} if directive else {}
        msg = client.session.msg("execute_request", content, metadata=metadata)
        if msg_id is not None:
            msg["header"]["msg_id"] = msg["msg_id"] = msg_id
        client.shell_channel.send(msg)
        msg_id = msg["header"]["msg_id"]
        cell = Cell(reply={})
        deadline = time.monotonic() + timeout
        idle = False
        while not (idle and cell.reply):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"cell did not finish in {timeout} s:\n{code}\n--- replica log:\n{self.log()}")
            if not cell.reply:
                try:
                    reply = client.get_shell_msg(timeout=min(remaining, 0.05))
                    if reply["parent_header"].get("msg_id") == msg_id:
                        cell.reply = reply
                except Exception:
                    pass
            try:
                out = client.get_iopub_msg(timeout=0.05 if not cell.reply else min(remaining, 1))
            except Exception:
                continue
            if out["parent_header"].get("msg_id") != msg_id:
                continue
            kind = out["msg_type"]
            if kind == "status" and out["content"]["execution_state"] == "idle":
                idle = True
            elif kind == "stream":
                if out["content"]["name"] == "stdout":
                    cell.stdout += out["content"]["text"]
                else:
                    cell.stderr += out["content"]["text"]
            elif kind in ("display_data", "execute_result", "error"):
                cell.outputs.append(out)
        return cell

    def kill(self) -> None:
        if self.client is not None:
            self.client.stop_channels()
            self.client = None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def orphans_left(self, within: float = 3.0) -> bool:
        """Whether any process of this replica's session (group) is still alive ``within`` seconds after it was
        killed (its lease keeper, a child of the replica, is reaped by init, which may take a moment)."""
        deadline = time.monotonic() + within
        while True:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return False
            if time.monotonic() > deadline:
                return True
            time.sleep(0.05)


@pytest.fixture(scope="session")
def etcd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    with etcd_running(tmp_path_factory.mktemp("etcd")) as cluster:
        yield cluster


class ReplicaFactory:
    """Starts replicas of one kernel (ids r0, r1, ...) and talks to the kernel's etcd keys."""

    def __init__(self, endpoints: list[str], tmp_path: Path):
        self.endpoints = endpoints
        self.kernel_id = "k-" + uuid.uuid4().hex[:8]
        self.prefix = "/test-" + uuid.uuid4().hex[:8]
        self.tmp_path = tmp_path
        self.key = uuid.uuid4().hex
        self.replicas: list[Replica] = []
        self.etcd = Etcd(endpoints, self.prefix)
        self.keys = self.etcd.keys

    def env(self, rid: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTEBOOKOS_", "JPY_"))}
        env.update(
            {
                p.ENV_KERNEL_ID: self.kernel_id,
                p.ENV_REPLICA_ID: rid,
                p.ENV_HOST: f"host-{rid}",
                p.ENV_ETCD_ENDPOINTS: ",".join(self.endpoints),
                p.ENV_ETCD_PREFIX: self.prefix,
                p.ENV_OBJECT_STORE_URL: f"file://{self.tmp_path}/objects",
                p.ENV_KEY: self.key,
                p.ENV_LEASE_TTL: "2",
                p.ENV_GPU_DEVICES: json.dumps(
                    [{"index": i, "uuid": f"GPU-sim-{i}", "simulated": True} for i in range(2)]
                ),
                "PYTHONPATH": str(REPO),
            }
        )
        env.update(extra or {})
        return env

    def spawn(self, rid: str, extra: dict[str, str] | None = None) -> Replica:
        env = self.env(rid, extra)
        log_path = self.tmp_path / f"{rid}.log"
        with open(log_path, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "jupyter_notebookos.kernel"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.tmp_path,
            )
        replica = Replica(rid, proc, log_path, env)
        self.replicas.append(replica)
        return replica

    def start(self, rid: str, extra: dict[str, str] | None = None, timeout: float = 15) -> Replica:
        """Start replica ``rid`` (environment overrides in ``extra``) and wait for its registration."""
        replica = self.spawn(rid, extra)
        replica.registration = self.wait_registered(replica, timeout)
        return replica

    def wait_registered(self, replica: Replica, timeout: float = 15) -> p.ReplicaRegistration:
        deadline = time.monotonic() + timeout
        key = self.keys.replica(self.kernel_id, replica.rid)
        while time.monotonic() < deadline:
            kv = self.etcd.get(key)
            if kv is not None:
                return p.ReplicaRegistration.from_json(kv.value)
            if replica.proc.poll() is not None:
                raise AssertionError(f"replica {replica.rid} exited with {replica.proc.returncode}:\n{replica.log()}")
            time.sleep(0.05)
        raise AssertionError(f"replica {replica.rid} did not register in {timeout} s:\n{replica.log()}")

    def elect(self, rid: str) -> int:
        """Make ``rid`` the executor (a fresh executor key); returns the fence (its create_revision)."""
        key = self.keys.executor(self.kernel_id)
        self.etcd.run(self.etcd.co.delete(key))
        self.etcd.run(self.etcd.co.put(key, rid))
        kv = self.etcd.get(key)
        return int(kv.create_revision)

    def record(self, seq: int) -> p.LogRecord | None:
        kv = self.etcd.get(self.keys.log_record(self.kernel_id, seq))
        return p.LogRecord.from_json(kv.value) if kv is not None else None

    def applied(self, rid: str) -> int | None:
        kv = self.etcd.get(self.keys.applied(self.kernel_id, rid))
        return int(kv.text) if kv is not None else None

    def wait_applied(self, rid: str, seq: int, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (self.applied(rid) or 0) >= seq:
                return
            time.sleep(0.02)
        raise AssertionError(f"replica {rid} did not apply seq {seq} in {timeout} s (applied {self.applied(rid)})")

    def wait_record(self, seq: int, timeout: float = 10) -> p.LogRecord:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rec = self.record(seq)
            if rec is not None:
                return rec
            time.sleep(0.02)
        raise AssertionError(f"log record {seq} did not appear in {timeout} s")

    def close(self) -> None:
        """Kill every replica's process group; fail if anything of theirs survives."""
        for replica in self.replicas:
            replica.kill()
        with contextlib.suppress(Exception):
            self.etcd.close()
        left = [r.rid for r in self.replicas if r.orphans_left()]
        assert not left, f"processes of replicas {left} outlived the test"


@pytest.fixture
def replicas(etcd_cluster: EtcdCluster, tmp_path: Path) -> Iterator[ReplicaFactory]:
    factory = ReplicaFactory(etcd_cluster.endpoints, tmp_path)
    try:
        yield factory
    finally:
        factory.close()


__all__ = ["Cell", "Replica", "ReplicaFactory"]
