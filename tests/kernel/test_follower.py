"""LogFollower on its own: records applied in order, a cell waiting for the records before it, lost records, a reload
after a refused record, a restore (the process-level behaviour is in test_replica.py)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from parts_harness import Executor, LoopKernel, MemoryAgent, store_at, until

from jupyter_notebookos.kernel import follower as follower_module
from jupyter_notebookos.kernel.follower import LogFollower
from jupyter_notebookos.kernel.knowncheckpoint import KnownCheckpoint
from jupyter_notebookos.kernel.lostchanges import LostChanges
from jupyter_notebookos.kernel.statelog import StateLog
from jupyter_notebookos.kernel.verify import IdleVerifier
from jupyter_notebookos.replication.protocol import LogRecord
from jupyter_notebookos.replication.serialization import UnreplicatedValue
from jupyter_notebookos.replication.state import StateTracker


class Replica:
    """A follower over its own namespace, fed by ``agent`` (its log) and the object store at ``path``."""

    def __init__(self, path: Path, agent: MemoryAgent) -> None:
        self.ns: dict[str, Any] = {"__name__": "__main__"}
        self.kernel = LoopKernel(self.ns)
        self.agent = agent
        self.tracker = StateTracker(self.ns, transform=lambda code: code)
        self.lost = LostChanges()
        self.quiesced = 0
        verifier = IdleVerifier(
            self.kernel, self.tracker, excluded=lambda: False, reading=lambda: False, ran_last_cell=lambda: False
        )
        self.follower = LogFollower(
            self.kernel,
            agent=agent,  # type: ignore[arg-type]
            statelog=StateLog(store_at(path), "r1", lineage=self.tracker.lineage),
            tracker=self.tracker,
            lost_changes=self.lost,
            checkpoint=KnownCheckpoint(),
            verifier=verifier,
            quiesce=self._quiesce,
        )

    async def _quiesce(self) -> None:
        self.quiesced += 1

    def arrive(self, record: LogRecord) -> None:
        """The record arrives as it does from etcd: on another thread."""
        thread = threading.Thread(target=self.follower.on_record, args=(record,))
        thread.start()
        thread.join()


@pytest_asyncio.fixture
async def replica(tmp_path: Path) -> AsyncIterator[Replica]:
    r = Replica(tmp_path, MemoryAgent())
    yield r
    r.kernel.close()


@pytest.mark.asyncio
async def test_records_that_arrive_out_of_order_are_applied_in_order_once_the_gap_closes(tmp_path: Path, replica):
    executor = Executor(store_at(tmp_path))
    first = executor.run("xs = [1]")
    second = executor.run("xs.append(2)\nys = xs")
    replica.arrive(second)
    await replica.kernel.dispatched()
    assert replica.follower.applied == 0 and "xs" not in replica.ns  # waits for record 1
    replica.arrive(first)
    await replica.kernel.dispatched()
    assert replica.follower.applied == 2 and replica.agent.reported == [1, 2]
    assert replica.ns["xs"] == [1, 2] and replica.ns["ys"] is replica.ns["xs"]
    assert replica.quiesced >= 1  # applied only once the namespace may change
    replica.arrive(first)  # (again: etcd's watch may repeat one)
    await replica.kernel.dispatched()
    assert replica.agent.reported == [1, 2]


@pytest.mark.asyncio
async def test_a_cell_waits_for_the_records_before_it_and_gives_up_after_the_catch_up_timeout(
    tmp_path: Path, replica, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(follower_module, "CATCH_UP_TIMEOUT", 0.3)
    executor = Executor(store_at(tmp_path))
    record = executor.run("x = 1")
    assert not await replica.follower.catch_up(1)  # never came: the cell answers that the replica is behind
    replica.kernel.io_loop.call_later(0.05, replica.arrive, record)
    assert await replica.follower.catch_up(1)
    assert replica.ns["x"] == 1


@pytest.mark.asyncio
async def test_a_lost_record_marks_its_names_and_the_next_cell_is_told(replica):
    replica.arrive(LogRecord(1, "lost", "m1", "r0", unserializable=["model"]))
    replica.arrive(LogRecord(2, "lost", "m2", "r0", names=["x"]))
    await replica.kernel.dispatched()
    assert isinstance(replica.ns["model"], UnreplicatedValue)
    with pytest.raises(AttributeError, match="was not replicated"):
        replica.ns["model"].eval()
    notice = replica.lost.take_message(3, replica.ns)
    assert notice is not None and "model" in notice and "x" in notice
    assert replica.follower.applied == 2


@pytest.mark.asyncio
async def test_a_refused_record_of_this_replica_is_undone_by_the_reload_from_the_log(tmp_path: Path, replica):
    executor = Executor(store_at(tmp_path))
    replica.agent.log[1] = executor.run("x = 1")
    replica.arrive(replica.agent.log[1])
    await replica.kernel.dispatched()
    replica.ns["x"], replica.ns["y"] = 2, 3  # this replica's own cell 2, whose record etcd then refused
    replica.follower.own_record(2, ["x", "y"])
    assert replica.follower.applied == 2 and replica.follower.ran_last_cell()
    replica.follower.reload_if_due()
    assert replica.ns["x"] == 2  # nothing asked for a reload yet
    replica.follower.reload_later()
    assert replica.follower.reload_due
    replica.follower.reload_if_due()
    assert not replica.follower.reload_due
    assert replica.ns["x"] == 1 and "y" not in replica.ns and replica.follower.applied == 1
    assert replica.agent.reported[-1] == 1


@pytest.mark.asyncio
async def test_a_replica_restores_the_log_and_waits_for_a_gap_in_it(tmp_path: Path, replica):
    executor = Executor(store_at(tmp_path))
    replica.agent.log = {1: executor.run("x = [1]"), 2: executor.run("x.append(2)")}
    executor.run("skipped = 1")  # record 3 is not in the log yet
    replica.agent.log[4] = executor.run("z = x")
    assert replica.follower.restore() == 1
    assert replica.ns["x"] == [1, 2] and "z" not in replica.ns and replica.follower.applied == 2
    replica.arrive(LogRecord(3, "delta", "m3", "r0"))  # (a cell that changed nothing)
    await until(lambda: replica.follower.applied == 4)
    assert replica.ns["z"] is replica.ns["x"]
