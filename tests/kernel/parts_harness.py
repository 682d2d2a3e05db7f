"""The parts of a replica kernel without ipykernel and etcd: the kernel's loop and dispatch queue, the etcd side of a
replica in memory, and an executor whose cells are published the way the replica kernel publishes them."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tornado.ioloop import IOLoop

from jupyter_notebookos.kernel.agent import LogSnapshot
from jupyter_notebookos.kernel.logwriter import PublishOutcome
from jupyter_notebookos.kernel.loop import CoordinationThread
from jupyter_notebookos.kernel.statelog import StateLog, serialize_delta
from jupyter_notebookos.replication.objectstore import ObjectStore
from jupyter_notebookos.replication.protocol import CheckpointPointer, LogRecord
from jupyter_notebookos.replication.state import StateTracker

THRESHOLD = 1 << 20


class LoopKernel:
    """The kernel as its parts see it (KernelLoop), on the running test's loop: dispatches run one at a time and in
    order, as ipykernel runs them."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.io_loop = IOLoop.current()
        self.namespace = namespace
        self._queue: asyncio.Queue[tuple[Callable[..., Any], tuple[Any, ...]]] = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._dispatch())

    async def _dispatch(self) -> None:
        while True:
            dispatch, args = await self._queue.get()
            try:
                result = dispatch(*args)
                if inspect.isawaitable(result):
                    await result
            finally:
                self._queue.task_done()

    def schedule_dispatch(self, dispatch: Callable[..., Any], *args: Any) -> None:
        self._queue.put_nowait((dispatch, args))

    def requests_waiting(self) -> bool:
        return not self._queue.empty()

    async def dispatched(self) -> None:
        """Wait until the callbacks handed to the loop so far ran, and every dispatch they queued."""
        await asyncio.sleep(0.01)
        await self._queue.join()

    def close(self) -> None:
        self._task.cancel()


class MemoryAgent:
    """A replica's etcd side in memory, as its agent (for the follower) and its log writer (for the publisher and the
    checkpointer): the log (records written unless their seq is in :attr:`refuse`), the checkpoint pointer, and the
    applied seqs reported. Other replicas have applied up to :attr:`followers_applied`."""

    def __init__(self) -> None:
        self.thread = CoordinationThread("test-agent")
        self.thread.start()
        self.log: dict[int, LogRecord] = {}
        self.published: list[int] = []
        self.refuse: set[int] = set()
        self.checkpoint: CheckpointPointer | None = None
        self.reported: list[int] = []
        self.followers_applied = 0

    def read_snapshot(self) -> LogSnapshot:
        return LogSnapshot(self.checkpoint, [self.log[seq] for seq in sorted(self.log)], revision=1)

    def report_applied(self, seq: int) -> None:
        self.reported.append(seq)

    async def publish(self, record: LogRecord, fence: int, *, hold: bool = False) -> PublishOutcome:
        self.published.append(record.seq)
        if record.seq in self.refuse:
            return PublishOutcome(record.seq, False, "the test refused it")
        self.log[record.seq] = record
        return PublishOutcome(record.seq, True)

    async def flush_held(self) -> None:
        pass

    async def checkpoint_due(self, head_seq: int, every: int) -> tuple[list[int] | None, CheckpointPointer | None]:
        if self.followers_applied < head_seq:
            return None, self.checkpoint
        return [seq for seq in self.log if seq <= head_seq], self.checkpoint

    async def commit_checkpoint(self, pointer: CheckpointPointer, delete: list[int], fence: int) -> bool:
        self.checkpoint = pointer
        for seq in delete:
            self.log.pop(seq, None)
        return True

    async def referenced_objects(self) -> tuple[int | None, set[str]]:
        assert self.checkpoint is not None
        objects = {key for record in self.log.values() for key in record.objects}
        return self.checkpoint.seq, objects | set(self.checkpoint.objects)


class Executor:
    """A namespace whose cells are captured and published as a replica kernel publishes them (serialize_delta after
    the reply, then StateLog.finish), without ipykernel: the records another replica's follower applies."""

    def __init__(self, store: ObjectStore) -> None:
        self.ns: dict[str, Any] = {"__name__": "__main__"}
        self.tracker = StateTracker(self.ns, transform=lambda code: code, defer_min_bytes=THRESHOLD)
        self.statelog = StateLog(store, "executor", lineage=self.tracker.lineage)
        self.seq = 0

    def run(self, code: str) -> LogRecord:
        """Run ``code`` as the next directed cell; its log record."""
        self.tracker.before_cell(code)
        exec(code, self.ns)
        delta = self.tracker.after_cell()
        self.tracker.settle()
        self.seq += 1
        return self.statelog.finish(serialize_delta(delta, THRESHOLD), self.seq, f"cell-{self.seq}")


def store_at(path: Path) -> ObjectStore:
    return ObjectStore((path / "objects").as_uri())


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait (on the loop) until ``condition()`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true in time"
        await asyncio.sleep(0.01)
