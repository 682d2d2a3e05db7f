"""etcd leader changes are invisible to transactions; a true quorum loss still fails fast and clearly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from typing import Any

import pytest

from jupyter_notebookos.coordination import Compare, Coordinator, Op, QuorumLost
from jupyter_notebookos.coordination.errors import LeaderChanged
from jupyter_notebookos.coordination.ridethrough import txn_once
from jupyter_notebookos.embedded.etcd import EtcdCluster

pytestmark = pytest.mark.timeout(120)


def _leader_index(cluster: EtcdCluster) -> int | None:
    for index, member in enumerate(cluster.members):
        with contextlib.suppress(Exception):
            if member.is_leader():
                return index
    return None


async def _decide_until(
    coordinator: Coordinator, writer: int, stop: asyncio.Event, done: list[tuple[str, str]]
) -> None:
    """Cell-decision-like transactions, back to back: each puts a unique record under a key of its own, fenced
    on that key's absence (as a cell record with its GPU entries). Every one must succeed, each exactly once."""
    i = 0
    while not stop.is_set():
        key = coordinator.keys.cell(f"k{writer}", f"msg-{i:05d}")
        record = json.dumps({"writer": writer, "i": i})
        result = await txn_once(
            coordinator,
            [Compare.absent(key)],
            [Op.put(key, record), Op.put(coordinator.keys.gpu(f"host-{writer}", 0), record)],
            outcome_key=key,
            outcome_value=record,
        )
        assert result.succeeded, f"{key}: the fence refused a transaction sent once"
        done.append((key, record))
        i += 1


@pytest.mark.asyncio
@pytest.mark.parametrize("fresh_etcd", [3], indirect=True, ids=["3-members"])
async def test_sigkill_of_the_leader_fails_no_transaction(fresh_etcd: EtcdCluster, prefix: str) -> None:
    coordinator = await Coordinator.connect(fresh_etcd.endpoints, prefix=prefix, timeout=5.0)
    stop, done = asyncio.Event(), []
    writers = [asyncio.ensure_future(_decide_until(coordinator, w, stop, done)) for w in range(4)]
    try:
        for _ in range(2):  # two elections in a row: the new leader is killed too
            await asyncio.sleep(0.7)
            leader = await asyncio.to_thread(_leader_index, fresh_etcd)
            assert leader is not None
            before = len(done)
            fresh_etcd.kill_member(leader)
            # One or two election timeouts (1 s each); on a loaded machine (CI: 2 cores, another test worker) up to
            # the transactions' own deadline (5 s), after which they would fail, and the check below says so.
            killed = time.monotonic()
            while len(done) <= before + 20 and time.monotonic() - killed < coordinator.timeout:
                await asyncio.sleep(0.1)
            assert len(done) > before + 20, "transactions did not continue on the surviving majority"
            assert not any(w.done() for w in writers), [w.exception() for w in writers if w.done()]
            await asyncio.to_thread(fresh_etcd.start_member, leader)
    finally:
        stop.set()
        results = await asyncio.gather(*writers, return_exceptions=True)
    assert not [r for r in results if isinstance(r, BaseException)], results
    stored = {kv.key: kv.text for kv in await coordinator.get_prefix(coordinator.keys.kernels_prefix())}
    assert dict(done) == stored  # every acknowledged decision is there, and nothing else
    await coordinator.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("fresh_etcd", [3], indirect=True, ids=["3-members"])
async def test_without_quorum_the_transaction_fails_within_5_seconds(fresh_etcd: EtcdCluster, prefix: str) -> None:
    coordinator = await Coordinator.connect(fresh_etcd.endpoints, prefix=prefix, timeout=4.0)
    key = coordinator.keys.cell("k", "m")
    fresh_etcd.kill_member(0)
    fresh_etcd.kill_member(1)
    began = time.monotonic()
    with pytest.raises(QuorumLost) as info:
        await txn_once(coordinator, [Compare.absent(key)], [Op.put(key, "x")], outcome_key=key, outcome_value="x")
    assert time.monotonic() - began < 5
    assert "lost quorum" in str(info.value) and "majority" in str(info.value)
    await coordinator.close()


@pytest.mark.asyncio
async def test_the_outcome_key_must_be_written_by_the_transaction(coordinator: Coordinator) -> None:
    key = coordinator.keys.cell("k", "m")
    with pytest.raises(ValueError, match="outcome"):
        await txn_once(coordinator, [], [Op.put(key, "a")], outcome_key=key, outcome_value="b")


@pytest.mark.asyncio
@pytest.mark.parametrize("fresh_etcd", [3], indirect=True, ids=["3-members"])
async def test_a_call_that_outlasts_an_election_says_so_instead_of_lost_quorum(
    fresh_etcd: EtcdCluster, prefix: str
) -> None:
    """A plain transaction sent to a leader that stops answering times out; by then the other two elected a new
    leader, so the error says the leader changed (still a QuorumLost to callers), not that a majority is gone."""
    coordinator = await Coordinator.connect(fresh_etcd.endpoints, prefix=prefix, timeout=3.0)
    await coordinator.put(coordinator.keys.cell("k", "warm"), "x")
    leader = await asyncio.to_thread(_leader_index, fresh_etcd)
    assert leader is not None
    stopped = fresh_etcd.members[leader].process
    assert stopped is not None
    stopped.send_signal(signal.SIGSTOP)  # it hangs, as a partitioned or overloaded machine would
    try:
        # Round-robin over three members: some of these land on the stopped leader and wait out their deadline.
        results = await asyncio.gather(
            *(coordinator.txn([], [Op.put(coordinator.keys.cell("k", f"m{i}"), "x")]) for i in range(6)),
            return_exceptions=True,
        )
    finally:
        stopped.send_signal(signal.SIGCONT)
    failures = [r for r in results if isinstance(r, BaseException)]
    assert failures, "no transaction reached the stopped leader"
    for failure in failures:
        assert isinstance(failure, LeaderChanged), repr(failure)
        assert isinstance(failure, QuorumLost) and "changed its leader" in str(failure)
        assert "lost quorum" not in str(failure) and "outcome of this txn is unknown" in str(failure)
    await coordinator.close()


class _AppliedLate:
    """The real etcd client, except that the first transaction's call ends with its outcome unknown, and etcd
    applies that attempt only after ``txn_once`` has read the outcome key: Raft may commit an attempt late (CI, with
    every member paused for a second, then resumed)."""

    def __init__(self, real: Coordinator, *, applied: bool = True) -> None:
        self.real, self.timeout, self.applied = real, real.timeout, applied
        self.late: tuple[list[Compare], list[Op]] | None = None
        self.reads = 0

    async def txn(self, compare: list[Compare], success: list[Op], **kwargs: Any) -> Any:
        if self.late is None:
            self.late = (compare, success)
            raise LeaderChanged(["etcd"], "txn: no answer in time; the outcome of this txn is unknown")
        return await self.real.txn(compare, success, **kwargs)

    async def get(self, key: str, **kwargs: Any) -> Any:
        found = await self.real.get(key, **kwargs)
        self.reads += 1
        if self.reads == 1 and self.late is not None and self.applied:
            await self.real.txn(*self.late)  # the first attempt lands just after the read that missed it
        return found


@pytest.mark.asyncio
async def test_an_attempt_applied_after_the_read_that_missed_it_is_still_a_success(coordinator: Coordinator) -> None:
    """The attempt sent again fails its compare (the late one wrote the key), and that is no conflict: the key holds
    this transaction's own value. Reported as a conflict, a cell's decision was committed with its GPU entries while
    the router chose again, and every later cell of the kernel conflicted on those entries."""
    key, gpu = coordinator.keys.cell("k", "m"), coordinator.keys.gpu("host-0", 0)
    record = json.dumps({"msg_id": "m", "attempt": 0})
    late = _AppliedLate(coordinator)
    result = await txn_once(
        late,  # type: ignore[arg-type]
        [Compare.absent(key), Compare.absent(gpu)],
        [Op.put(key, record), Op.put(gpu, record)],
        outcome_key=key,
        outcome_value=record,
    )
    stored = await coordinator.get(key)
    assert stored is not None and stored.text == record
    assert result.succeeded and result.revision == stored.mod_revision, result
    # Someone else's value at the key (the first attempt was not applied after all) is still a conflict.
    other = coordinator.keys.cell("k", "n")
    await coordinator.put(other, "someone else's")
    refused = await txn_once(
        _AppliedLate(coordinator, applied=False),  # type: ignore[arg-type]
        [Compare.absent(other)],
        [Op.put(other, record)],
        outcome_key=other,
        outcome_value=record,
    )
    assert not refused.succeeded
