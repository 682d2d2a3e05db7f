"""Key-value, transactions and watches against a real etcd (1 and 3 members)."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from jupyter_notebookos.coordination import (
    Compare,
    Coordinator,
    EtcdUnavailable,
    EventType,
    Op,
    TransactionConflict,
    WatchCompacted,
)

pytestmark = pytest.mark.timeout(30)


@pytest.mark.asyncio
async def test_put_get_prefix_delete(coordinator: Coordinator, prefix: str) -> None:
    keys = coordinator.keys
    assert await coordinator.get(keys.host("a")) is None
    rev_a = await coordinator.put(keys.host("a"), '{"gpus": 8}')
    rev_b = await coordinator.put(keys.host("b"), b"\x00raw")
    assert rev_b > rev_a

    a = await coordinator.get(keys.host("a"))
    assert a is not None
    assert a.json() == {"gpus": 8}
    assert (a.create_revision, a.mod_revision, a.version) == (rev_a, rev_a, 1)

    await coordinator.put(keys.host("a"), '{"gpus": 4}')
    a2 = await coordinator.get(keys.host("a"))
    assert a2 is not None and a2.version == 2 and a2.create_revision == rev_a and a2.mod_revision > rev_b

    hosts = await coordinator.get_prefix(keys.hosts_prefix())
    assert [kv.key for kv in hosts] == [f"{prefix}/hosts/a", f"{prefix}/hosts/b"]
    assert hosts.as_dict()[f"{prefix}/hosts/b"] == b"\x00raw"
    assert hosts.revision >= a2.mod_revision

    assert await coordinator.delete(keys.host("a")) is True
    assert await coordinator.delete(keys.host("a")) is False
    assert await coordinator.delete_prefix(keys.hosts_prefix()) == 1
    assert len(await coordinator.get_prefix(keys.hosts_prefix())) == 0


@pytest.mark.asyncio
async def test_log_records_come_back_in_sequence_order(coordinator: Coordinator) -> None:
    keys = coordinator.keys
    for seq in (10, 9, 2, 100, 1):
        await coordinator.put(keys.log_record("k1", seq), str(seq))
    log = await coordinator.get_prefix(keys.log_prefix("k1"))
    assert [keys.seq_of(kv.key) for kv in log] == [1, 2, 9, 10, 100]


@pytest.mark.asyncio
async def test_concurrent_create_if_absent_has_exactly_one_winner(coordinator: Coordinator) -> None:
    cell = coordinator.keys.cell("k1", "msg-1")

    async def decide(replica: str) -> bool:
        result = await coordinator.txn(
            compare=[Compare.absent(cell)],
            success=[Op.put(cell, replica), Op.put(coordinator.keys.gpu("h1", 0), replica)],
            failure=[Op.get(cell)],
        )
        return result.succeeded

    outcomes = await asyncio.gather(*(decide(f"r{i}") for i in range(8)))
    assert outcomes.count(True) == 1
    winner = f"r{outcomes.index(True)}"
    stored = await coordinator.get(cell)
    gpu = await coordinator.get(coordinator.keys.gpu("h1", 0))
    assert stored is not None and stored.text == winner
    assert gpu is not None and gpu.text == winner  # both puts of the winning txn, nothing of the losers


@pytest.mark.asyncio
async def test_compare_and_swap_on_mod_revision(coordinator: Coordinator) -> None:
    key = coordinator.keys.checkpoint("k1")
    await coordinator.put(key, "0")
    seen = await coordinator.get(key)
    assert seen is not None

    async def increment() -> bool:
        result = await coordinator.txn(
            compare=[Compare.mod_revision(key, "==", seen.mod_revision)],
            success=[Op.put(key, str(int(seen.text) + 1))],
        )
        return result.succeeded

    outcomes = await asyncio.gather(increment(), increment())
    assert sorted(outcomes) == [False, True]
    final = await coordinator.get(key)
    assert final is not None and final.text == "1"

    with pytest.raises(TransactionConflict):
        await coordinator.txn([Compare.value(key, "==", "0")], [Op.put(key, "x")], raise_on_failure=True)
    failed = await coordinator.txn([Compare.version(key, ">", 5)], [Op.delete(key)], [Op.get(key)])
    assert not failed and failed.results[0].items[0].text == "1"


@pytest.mark.asyncio
async def test_watch_sees_every_event_in_order(coordinator: Coordinator) -> None:
    keys = coordinator.keys
    async with coordinator.watch_prefix(keys.kernel_prefix("k1")) as watch:
        start = await watch.ready()
        expected = []
        for i in range(30):
            await coordinator.put(keys.applied("k1", "r0"), str(i))
            expected.append((EventType.PUT, str(i)))
            if i % 10 == 9:
                await coordinator.delete(keys.applied("k1", "r0"))
                expected.append((EventType.DELETE, ""))
        await coordinator.put(keys.kernel("k1"), "session record: outside the watched prefix")
        got = [await asyncio.wait_for(anext(watch), 5) for _ in expected]
    assert [(e.type, e.text) for e in got] == expected
    revisions = [e.mod_revision for e in got]
    assert revisions == sorted(revisions) and len(set(revisions)) == len(revisions)
    assert revisions[0] == start


@pytest.mark.asyncio
async def test_watch_from_revision_replays_history_and_compaction_is_reported(coordinator: Coordinator) -> None:
    key = coordinator.keys.host("h")
    first = await coordinator.put(key, "1")
    await coordinator.put(key, "2")
    async with coordinator.watch_prefix(key, start_revision=first) as watch:
        assert [(await anext(watch)).text for _ in range(2)] == ["1", "2"]

    last = await coordinator.put(key, "3")
    await coordinator.compact(last)
    with pytest.raises(WatchCompacted, match="compacted"):
        async with coordinator.watch_prefix(key, start_revision=first) as watch:
            await asyncio.wait_for(anext(watch), 5)


@pytest.mark.asyncio
async def test_connect_to_nothing_fails_fast_with_a_clear_error() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{sock.getsockname()[1]}"
    began = time.monotonic()
    with pytest.raises(EtcdUnavailable, match="Check that etcd is running") as info:
        await Coordinator.connect([endpoint], timeout=1.0)
    assert time.monotonic() - began < 3
    assert endpoint in str(info.value)
