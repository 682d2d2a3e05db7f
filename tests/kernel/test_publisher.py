"""CellPublisher (with the LogFollower and IdleVerifier it works with) on its own: records in order, the next cell
waiting for the upload, a refused record undone, and a checkpoint after ``checkpoint_every`` records that a new
replica restores from (the process-level behaviour is in test_replica.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from parts_harness import THRESHOLD, LoopKernel, MemoryAgent, store_at, until

from jupyter_notebookos.kernel.checkpointer import Checkpointer
from jupyter_notebookos.kernel.follower import LogFollower
from jupyter_notebookos.kernel.knowncheckpoint import KnownCheckpoint
from jupyter_notebookos.kernel.lostchanges import LostChanges
from jupyter_notebookos.kernel.publisher import CellPublisher
from jupyter_notebookos.kernel.settings import ReplicaSettings
from jupyter_notebookos.kernel.statelog import StateLog
from jupyter_notebookos.kernel.verify import IdleVerifier
from jupyter_notebookos.replication.protocol import CellDirective
from jupyter_notebookos.replication.state import StateTracker


class Replica:
    """A replica's parts over its own namespace, wired as ReplicaKernel.attach wires them, without ipykernel."""

    def __init__(self, path: Path, agent: MemoryAgent, replica_id: str, *, checkpoint_every: int = 100) -> None:
        self.ns: dict[str, Any] = {"__name__": "__main__"}
        self.kernel = LoopKernel(self.ns)
        self.agent = agent
        settings = ReplicaSettings(
            kernel_id="k",
            replica_id=replica_id,
            host="h",
            etcd_endpoints=[],
            key="k",
            buffer_threshold=THRESHOLD,
            checkpoint_every=checkpoint_every,
        )
        self.tracker = StateTracker(self.ns, transform=lambda code: code, defer_min_bytes=THRESHOLD)
        statelog = StateLog(store_at(path), replica_id, lineage=self.tracker.lineage)
        self.lost = LostChanges()
        self.written: list[int] = []
        self.verifier = IdleVerifier(
            self.kernel,
            self.tracker,
            excluded=lambda: self.follower.reload_due,
            reading=lambda: self.publisher.uploading() or self.checkpoints.pickling(),
            ran_last_cell=lambda: self.follower.ran_last_cell(),
        )
        known = KnownCheckpoint()
        common: dict[str, Any] = {"statelog": statelog, "tracker": self.tracker}
        self.follower = LogFollower(
            self.kernel,
            agent=agent,
            **common,
            lost_changes=self.lost,
            checkpoint=known,
            verifier=self.verifier,
            quiesce=lambda: self.publisher.quiesce(),
        )
        self.publisher = CellPublisher(
            self.kernel,
            settings=settings,
            writer=agent,
            **common,
            lost_changes=self.lost,
            follower=self.follower,
            verifier=self.verifier,
            on_written=self._written,
        )
        self.checkpoints = Checkpointer(
            self.kernel,
            settings=settings,
            writer=agent,
            **common,
            checkpoint=known,
            follower=self.follower,
            publisher=self.publisher,
        )

    def _written(self, seq: int) -> None:
        self.written.append(seq)
        self.checkpoints.after_publication(seq)

    async def cell(self, code: str, seq: int) -> None:
        """Run ``code`` as directed cell ``seq``, as ReplicaKernel.execute_request does, and publish it."""
        await self.publisher.quiesce()
        assert await self.follower.catch_up(seq - 1)
        self.tracker.before_cell(code)
        exec(code, self.ns)
        self.publisher.publish(CellDirective(seq=seq, fence=7), f"cell-{seq}", self.tracker.after_cell())

    def close(self) -> None:
        self.verifier.stop()
        self.kernel.close()


@pytest_asyncio.fixture
async def executor(tmp_path: Path) -> AsyncIterator[Replica]:
    r = Replica(tmp_path, MemoryAgent(), "r0")
    yield r
    r.close()


@pytest.mark.asyncio
async def test_each_cell_publishes_one_record_and_the_next_cell_waits_for_the_upload(executor: Replica):
    executor.ns["np"] = np
    await executor.cell("big = np.ones(1 << 18)", 1)  # 2 MiB: out of band, uploaded 20 ms after the reply
    assert executor.follower.applied == 1  # its own record counts as applied at once
    # A cell aborted after an earlier error publishes its empty record at once, without waiting for anything.
    executor.publisher.publish(CellDirective(seq=2, fence=7), "aborted", None)
    assert executor.publisher.uploading()
    await executor.cell("pass", 3)  # waited for the upload (quiesce)
    assert not executor.publisher.uploading()
    await until(lambda: len(executor.written) == 3)
    assert sorted(executor.agent.published) == sorted(executor.written) == [1, 2, 3]  # (an empty one may go first)
    assert executor.agent.log[1].objects and executor.agent.log[1].names == ["big"]
    assert not executor.agent.log[2].names and not executor.agent.log[3].names


@pytest.mark.asyncio
async def test_a_refused_record_is_undone_from_the_log_and_the_next_cell_is_told(executor: Replica):
    await executor.cell("x = 1", 1)
    executor.agent.refuse.add(2)
    await executor.cell("x = 2\ny = [3]", 2)
    await until(lambda: executor.agent.published == [1, 2])
    await executor.kernel.dispatched()  # the reload, dispatched once the refusal came back
    assert executor.written == [1]
    assert executor.ns["x"] == 1 and "y" not in executor.ns and executor.follower.applied == 1
    notice = executor.lost.take_message(3, executor.ns)
    assert notice is not None and "refused" in notice and "x" in notice and "y" in notice


@pytest.mark.asyncio
async def test_the_executor_checkpoints_and_a_new_replica_restores_from_the_checkpoint(tmp_path: Path):
    agent = MemoryAgent()
    writer = Replica(tmp_path, agent, "r0", checkpoint_every=2)
    reader = Replica(tmp_path, agent, "r1")
    try:
        agent.followers_applied = 2
        await writer.cell("xs = [1, 2]\nalias = xs", 1)
        await writer.cell("n = 3", 2)
        await until(lambda: agent.checkpoint is not None)
        assert agent.checkpoint is not None and agent.checkpoint.seq == 2 and not agent.log
        await writer.cell("n = 4", 3)
        await until(lambda: 3 in agent.log)
        reader.follower.restore()
        assert reader.follower.applied == 3
        assert reader.ns["xs"] == [1, 2] and reader.ns["alias"] is reader.ns["xs"] and reader.ns["n"] == 4
    finally:
        writer.close()
        reader.close()


@pytest.mark.asyncio
async def test_a_checkpoint_waits_while_followers_are_behind(tmp_path: Path):
    agent = MemoryAgent()
    writer = Replica(tmp_path, agent, "r0", checkpoint_every=2)
    try:
        await writer.cell("a = 1", 1)
        await writer.cell("b = 2", 2)
        await until(lambda: writer.written == [1, 2])
        await writer.kernel.dispatched()
        assert agent.checkpoint is None and sorted(agent.log) == [1, 2]  # no follower applied them yet
    finally:
        writer.close()
