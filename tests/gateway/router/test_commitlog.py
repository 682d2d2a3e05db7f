"""CommitLog against a real etcd: a cell's one transaction, the executor term and its fence, a commit whose answer
is lost, a decision undone, records closed for a dead executor, and cell records kept until their state is in
the log."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest
from etcd_replicas import KERNEL, register

from jupyter_notebookos.coordination import Coordinator
from jupyter_notebookos.coordination.errors import EtcdUnavailable
from jupyter_notebookos.coordination.txn import Compare, Op, TxnResult
from jupyter_notebookos.gateway.router.cells import CellGrant
from jupyter_notebookos.gateway.router.commitlog import CommitLog
from jupyter_notebookos.gateway.router.ledger import LedgerReleases
from jupyter_notebookos.gateway.router.tasks import RouterTasks
from jupyter_notebookos.replication.protocol import LogRecord, ReplicaRegistration


class FaultyCoordinator:
    """The real coordinator, but the answers of the next ``lose_answers`` transactions are lost after etcd applied
    them (a leader that died after committing), or the next ``refuse`` transactions never reach etcd."""

    def __init__(self, real: Coordinator) -> None:
        self.real = real
        self.lose_answers = 0
        self.refuse = 0
        self.txns = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    async def txn(self, compare: Sequence[Compare], success: Sequence[Op], **kwargs: Any) -> TxnResult:
        self.txns += 1
        if self.refuse:
            self.refuse -= 1
            raise EtcdUnavailable(self.real.endpoints, "no answer (injected)")
        result = await self.real.txn(compare, success, **kwargs)
        if self.lose_answers:
            self.lose_answers -= 1
            raise EtcdUnavailable(self.real.endpoints, "the answer was lost; the outcome of this request is unknown")
        return result


def make_log(coordinator: Any, published: list[int] | None = None) -> CommitLog:
    seen = published if published is not None else []
    return CommitLog(
        kernel_id=KERNEL,
        coordinator=coordinator,
        ledger=LedgerReleases(coordinator),
        tasks=RouterTasks(KERNEL),
        on_published=seen.append,
    )


async def ran(commit: CommitLog, msg_id: str, cell_grant: CellGrant, registration: ReplicaRegistration) -> int:
    """Commit a cell and end it as the queue does when it replies (its GPUs released); returns its seq."""
    committed = await commit.commit(msg_id, 1, cell_grant, registration)
    assert committed is not None
    commit.release_entries(msg_id, committed.seq, committed.entries)
    return committed.seq


def grant(replica_id: str, devices: tuple[int, ...] = (0,), host: str = "host-0") -> CellGrant:
    return CellGrant(replica_id, host, devices, "test")


@pytest.mark.asyncio
async def test_a_cell_commits_its_record_gpus_and_executor_term_in_one_transaction(coordinator: Coordinator) -> None:
    registration = await register(coordinator, "0")
    commit = make_log(coordinator)
    commit.cleared()
    keys = coordinator.keys

    first = await commit.commit("m1", 1, grant("0", (0, 1)), registration)

    assert first is not None and first.seq == 1 and commit.log_head == 1
    record = await coordinator.get(keys.cell(KERNEL, "m1"))
    assert record is not None and json.loads(record.value) == {
        "msg_id": "m1",
        "executor": "0",
        "host": "host-0",
        "gpus": [0, 1],
        "attempt": 1,
        "seq": 1,
    }
    executor = await coordinator.get(keys.executor(KERNEL))
    assert executor is not None and executor.value == b"0"
    # One transaction wrote them all: the record, both GPU entries and the term share its revision.
    revisions = {record.mod_revision, executor.create_revision}
    for device in (0, 1):
        entry = await coordinator.get(keys.gpu("host-0", device))
        assert entry is not None and json.loads(entry.value)["msg_id"] == "m1"
        revisions.add(entry.mod_revision)
    assert len(revisions) == 1
    assert commit.executor == "0" and commit.fence == executor.create_revision and commit.last_executor == "0"
    assert first.entries == {
        keys.cell(KERNEL, "m1"): record.mod_revision,
        **dict.fromkeys((keys.gpu("host-0", 0), keys.gpu("host-0", 1)), record.mod_revision),
    }


@pytest.mark.asyncio
async def test_the_same_executor_keeps_its_term_and_a_new_one_opens_a_new_fence(coordinator: Coordinator) -> None:
    zero, one = await register(coordinator, "0"), await register(coordinator, "1")
    commit = make_log(coordinator)
    commit.cleared()

    assert await ran(commit, "m1", grant("0"), zero) == 1
    fence = commit.fence
    assert await ran(commit, "m2", grant("0"), zero) == 2
    assert commit.fence == fence and commit.log_head == 2  # sticky: the term goes on

    assert await ran(commit, "m3", grant("1", host="host-1"), one) == 3
    executor = await coordinator.get(coordinator.keys.executor(KERNEL))
    assert executor is not None and executor.value == b"1"
    assert commit.executor == "1" and commit.fence == executor.create_revision > fence and commit.log_head == 3


@pytest.mark.asyncio
async def test_a_term_opened_behind_the_routers_back_fences_its_decisions_out(coordinator: Coordinator) -> None:
    zero = await register(coordinator, "0")
    commit = make_log(coordinator)
    commit.cleared()
    assert await ran(commit, "m1", grant("0"), zero) == 1
    stale = commit.fence
    # Another term was opened meanwhile (the executor key deleted and put again: a new create revision).
    key = coordinator.keys.executor(KERNEL)
    await coordinator.delete(key)
    await coordinator.put(key, "0", lease=zero.lease)

    assert await commit.commit("m2", 1, grant("0"), zero) is None
    assert commit.log_head == 1
    assert await coordinator.get(coordinator.keys.cell(KERNEL, "m2")) is None  # nothing of the refused decision

    # The router hears that the term ended (its replica's registration went, or the key's deletion): the next
    # decision opens a term of its own.
    commit.end_term("0")
    again = await commit.commit("m2", 2, grant("0"), zero)
    assert again is not None and again.seq == 2 and commit.executor == "0" and commit.fence > stale


@pytest.mark.asyncio
async def test_a_decision_for_a_replica_not_registered_in_etcd_conflicts(coordinator: Coordinator) -> None:
    zero = await register(coordinator, "0")
    await coordinator.delete(coordinator.keys.replica(KERNEL, "0"))  # its lease ended under the router
    commit = make_log(coordinator)
    commit.cleared()

    assert await commit.commit("m1", 1, grant("0"), zero) is None
    assert commit.log_head == 0 and commit.executor is None
    assert await coordinator.get(coordinator.keys.gpu("host-0", 0)) is None


@pytest.mark.asyncio
async def test_a_commit_whose_answer_is_lost_is_applied_once_and_known(coordinator: Coordinator) -> None:
    zero = await register(coordinator, "0")
    faulty = FaultyCoordinator(coordinator)
    commit = make_log(faulty)
    commit.cleared()
    faulty.lose_answers = 1

    committed = await commit.commit("m1", 1, grant("0"), zero)

    assert committed is not None and committed.seq == 1 and commit.log_head == 1
    record = await coordinator.get(coordinator.keys.cell(KERNEL, "m1"))
    assert record is not None and committed.entries[coordinator.keys.cell(KERNEL, "m1")] == record.mod_revision
    assert faulty.txns == 1  # settled by reading the record back, not sent again
    assert commit.executor == "0" and commit.fence == record.mod_revision


@pytest.mark.asyncio
async def test_a_commit_etcd_never_answers_raises_and_hands_out_no_seq(coordinator: Coordinator) -> None:
    zero = await register(coordinator, "0")
    faulty = FaultyCoordinator(coordinator)
    faulty.real = await Coordinator.connect(coordinator.endpoints, timeout=0.5, prefix=coordinator.keys.prefix)
    commit = make_log(faulty)
    commit.cleared()
    faulty.refuse = 10**6
    try:
        with pytest.raises(EtcdUnavailable):
            await commit.commit("m1", 1, grant("0"), zero)
    finally:
        await faulty.real.close()
    assert commit.log_head == 0 and commit.executor is None and commit.fence == 0


@pytest.mark.asyncio
async def test_rollback_gives_the_seq_back_and_ends_the_term(coordinator: Coordinator) -> None:
    zero = await register(coordinator, "0")
    commit = make_log(coordinator)
    commit.cleared()
    assert await ran(commit, "m1", grant("0"), zero) == 1
    mark = commit.mark()
    assert await ran(commit, "m2", grant("0"), zero) == 2

    commit.rollback(mark)  # m2 was never sent: its replica went away meanwhile

    assert commit.log_head == 1 and commit.last_executor == "0"
    assert commit.executor is None and commit.fence == 0
    retried = await commit.commit("m2", 2, grant("0"), zero)
    assert retried is not None and retried.seq == 2


@pytest.mark.asyncio
async def test_a_cell_record_stays_until_its_state_record_is_published(coordinator: Coordinator) -> None:
    zero = await register(coordinator, "0")
    published: list[int] = []
    commit = make_log(coordinator, published)
    commit.cleared()
    committed = await commit.commit("m1", 1, grant("0"), zero)
    assert committed is not None
    keys = coordinator.keys

    commit.release_entries("m1", committed.seq, committed.entries)  # the cell replied; its record is not in the log
    await commit.flush_releases()
    assert await coordinator.get(keys.gpu("host-0", 0)) is None  # its GPU is free at once
    assert await coordinator.get(keys.cell(KERNEL, "m1")) is not None  # its record holds its seq
    assert commit.unpublished_cells() == ["m1"]

    commit.published_through(1)  # the executor published the record (the watch says so)
    await commit.flush_releases()
    assert await coordinator.get(keys.cell(KERNEL, "m1")) is None
    assert commit.unpublished_cells() == [] and published == [1] and commit.published_seq == 1
    commit.published_through(1)
    assert published == [1]  # told once per seq


@pytest.mark.asyncio
async def test_a_dead_executors_unpublished_seqs_are_closed_as_lost(coordinator: Coordinator) -> None:
    zero = await register(coordinator, "0")
    published: list[int] = []
    commit = make_log(coordinator, published)
    commit.cleared()
    keys = coordinator.keys
    for msg_id in ("m1", "m2"):
        await ran(commit, msg_id, grant("0"), zero)
    await coordinator.put(
        keys.log_record(KERNEL, 1), LogRecord(seq=1, kind="delta", msg_id="m1", replica_id="0").to_json()
    )
    commit.remember_changed(2, ["x", "y"])  # what m2's reply said it changed

    commit.executor_lost("0")
    for _ in range(100):
        if commit.published_seq == 2:
            break
        await asyncio.sleep(0.02)

    assert commit.published_seq == 2 and published[-1] == 2
    lost = await coordinator.get(keys.log_record(KERNEL, 2))
    assert lost is not None
    record = LogRecord.from_json(lost.value)
    assert record.kind == "lost" and record.names == ["x", "y"] and record.replica_id == "0"
    assert await coordinator.get(keys.executor(KERNEL)) is None  # a stale executor cannot publish after this
    assert (await coordinator.get(keys.log_record(KERNEL, 1))) is not None  # a published record is left as it is
