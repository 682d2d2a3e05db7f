"""Fixtures for state replication: a real IPython shell as executor, a replica in a separate process."""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

from jupyter_notebookos.kernel.statelog import StateLog, serialize_delta
from jupyter_notebookos.replication.objectstore import ObjectStore
from jupyter_notebookos.replication.protocol import FIRST_SEQ
from jupyter_notebookos.replication.records import StateRecord
from jupyter_notebookos.replication.state import StateDelta, StateTracker

REPO = Path(__file__).resolve().parents[2]


def published(statelog: StateLog, delta: StateDelta, threshold: int) -> StateRecord:
    """The record a replica kernel publishes for ``delta``, as its followers read it: pickled as after the reply
    (serialize_delta), uploaded (StateLog.finish: with the statelog's lineage, write-tracked buffers the followers
    hold go as the chunks that changed) and read back from the log record (StateLog.load)."""
    pending = serialize_delta(delta, threshold)
    record = statelog.load(statelog.finish(pending, FIRST_SEQ, "cell"))
    return pending.record if record is None else record  # (a record that changes nothing carries no payload)


class Executor:
    """A real IPython shell whose cells are tracked and encoded like the replica kernel will do it."""

    def __init__(
        self, shell: InteractiveShell, store: ObjectStore, threshold: int = 1024 * 1024, *, write_tracking: bool = True
    ):
        self.shell = shell
        self.ns = shell.user_ns
        self.store = store
        self.threshold = threshold
        self.tracker = StateTracker(
            shell.user_ns,
            hidden=shell.user_ns_hidden,
            transform=shell.transform_cell,
            defer_min_bytes=threshold,
            write_tracking=write_tracking,
        )
        self.statelog = StateLog(store, "executor", lineage=self.tracker.lineage)
        self.records: list[bytes] = []
        self.deltas: list[StateDelta] = []
        self.encoded: list[StateRecord] = []

    def run(self, code: str) -> StateDelta:
        self.tracker.before_cell(code)
        result = self.shell.run_cell(code, silent=True)
        delta = self.tracker.after_cell()
        if not result.success:
            raise AssertionError(f"cell failed: {code!r}: {result.error_in_exec or result.error_before_exec}")
        record = published(self.statelog, delta, self.threshold)
        self.deltas.append(delta)
        self.encoded.append(record)
        self.records.append(record.to_bytes())
        return delta


class Replica:
    """A follower namespace in its own Python process (no shared memory with the executor)."""

    def __init__(self, store_url: str):
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("follower_process.py")), store_url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )

    def call(self, command: str, arg: Any = None) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        data = pickle.dumps((command, arg))
        self.proc.stdin.write(struct.pack(">I", len(data)) + data)
        self.proc.stdin.flush()
        head = self.proc.stdout.read(4)
        if len(head) < 4:
            raise AssertionError(f"replica process died (exit {self.proc.wait()})")
        status, result = pickle.loads(self.proc.stdout.read(struct.unpack(">I", head)[0]))
        if status != "ok":
            raise AssertionError(f"replica failed on {command}: {result}")
        return result

    def apply(self, record: bytes) -> list[str]:
        return self.call("apply", record)

    def eval(self, expr: str) -> Any:
        return self.call("eval", expr)

    def describe(self) -> dict[str, Any]:
        return self.call("describe")

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def shell() -> Iterator[InteractiveShell]:
    """The process's IPython shell with an empty user namespace."""
    sh = InteractiveShell.instance()
    sh.reset(new_session=False)
    yield sh
    sh.reset(new_session=False)


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return (tmp_path / "objects").as_uri()


@pytest.fixture
def store(store_url: str) -> ObjectStore:
    return ObjectStore(store_url)


@pytest.fixture
def executor(shell: InteractiveShell, store: ObjectStore) -> Executor:
    return Executor(shell, store)


@pytest.fixture
def replica(store_url: str) -> Iterator[Replica]:
    r = Replica(store_url)
    yield r
    r.close()
