"""etcd member failures: watches resume, acknowledged writes survive, quorum loss fails fast."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from jupyter_notebookos.coordination import (
    CoordinationError,
    Coordinator,
    EtcdUnavailable,
    QuorumLost,
    WatchEvent,
)
from jupyter_notebookos.embedded.etcd import EtcdCluster

pytestmark = pytest.mark.timeout(60)


async def _write_until(
    coordinator: Coordinator, stop: asyncio.Event, acked: list[int], *, timeout: float = 2.0
) -> None:
    """Put /seq/{i} for i = 0, 1, ... until ``stop``; record each i whose put returned."""
    i = 0
    while not stop.is_set():
        with contextlib.suppress(CoordinationError):  # not acknowledged: the test does not count it
            await coordinator.put(coordinator.keys.host(f"seq-{i:06d}"), str(i), timeout=timeout)
            acked.append(i)
        i += 1
        await asyncio.sleep(0.005)


def _leader_index(cluster: EtcdCluster) -> int:
    for index, member in enumerate(cluster.members):
        if member.is_leader():
            return index
    return 0


@pytest.mark.asyncio
async def test_watch_resumes_after_member_restarts_without_loss_or_duplicates(
    fresh_etcd: EtcdCluster, prefix: str
) -> None:
    writer = await Coordinator.connect(fresh_etcd.endpoints, prefix=prefix)
    watcher = await Coordinator.connect(fresh_etcd.endpoints, prefix=prefix)
    watch = watcher.watch_prefix(watcher.keys.hosts_prefix())
    first_revision = await watch.ready()
    seen: list[WatchEvent] = []

    async def consume() -> None:
        async for event in watch:
            seen.append(event)

    consumer = asyncio.ensure_future(consume())
    stop, acked = asyncio.Event(), []
    writing = asyncio.ensure_future(_write_until(writer, stop, acked))
    # Restart every member in turn, so the one serving the watch stream is certainly among them.
    for index in range(fresh_etcd.size):
        await asyncio.sleep(0.3)
        await asyncio.to_thread(fresh_etcd.restart_member, index)
    await asyncio.sleep(0.3)
    stop.set()
    await writing
    final_revision = await writer.put(writer.keys.host("zz-end"), "end")
    deadline = time.monotonic() + 10
    while (not seen or seen[-1].mod_revision < final_revision) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await watch.aclose()
    consumer.cancel()

    # The oracle: a watch opened now on the healthy cluster, replaying the same history.
    async with writer.watch_prefix(writer.keys.hosts_prefix(), start_revision=first_revision) as replay:
        reference = []
        while not reference or reference[-1].mod_revision < final_revision:
            reference.append(await asyncio.wait_for(anext(replay), 5))

    assert len(acked) > 20
    assert seen == reference  # same events, same order: nothing lost, nothing repeated
    seen_values = {int(e.text) for e in seen if e.key != writer.keys.host("zz-end")}
    assert set(acked) <= seen_values
    await writer.close()
    await watcher.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("fresh_etcd", [3], indirect=True, ids=["3-members"])
async def test_sigkill_of_one_member_loses_no_acknowledged_write(fresh_etcd: EtcdCluster, prefix: str) -> None:
    coordinator = await Coordinator.connect(fresh_etcd.endpoints, prefix=prefix)
    stop, acked = asyncio.Event(), []
    writing = asyncio.ensure_future(_write_until(coordinator, stop, acked, timeout=3.0))
    await asyncio.sleep(0.5)
    fresh_etcd.kill_member(_leader_index(fresh_etcd))  # the worst case: the leader dies
    acked_at_kill = len(acked)
    await asyncio.sleep(3.5)  # a new leader is elected within 1-2 election timeouts (1 s each)
    stop.set()
    await writing

    assert len(acked) > acked_at_kill + 10, "writes did not continue on the surviving majority"
    stored = await coordinator.get_prefix(coordinator.keys.hosts_prefix())
    values = {int(kv.text) for kv in stored}
    assert set(acked) <= values
    await coordinator.close()


@pytest.mark.asyncio
async def test_without_quorum_calls_fail_fast_and_work_resumes(fresh_etcd: EtcdCluster, prefix: str) -> None:
    coordinator = await Coordinator.connect(fresh_etcd.endpoints, prefix=prefix, timeout=1.5)
    keys = coordinator.keys
    lease = await coordinator.grant_lease(5)
    await coordinator.put(keys.replica("k1", "r0"), "registered", lease=lease)
    await coordinator.put(keys.kernel("k1"), "session")

    # 3 members: kill two (a majority). 1 member: kill it (etcd is simply down).
    down = [i for i in range(fresh_etcd.size)][: max(1, fresh_etcd.size - 1)]
    for index in down:
        fresh_etcd.kill_member(index)
    expected = QuorumLost if fresh_etcd.size == 3 else EtcdUnavailable
    for call in (
        lambda: coordinator.put(keys.kernel("k1"), "changed"),
        lambda: coordinator.get(keys.kernel("k1")),
        lambda: coordinator.txn([], []),
    ):
        began = time.monotonic()
        with pytest.raises((QuorumLost, EtcdUnavailable)) as info:
            await call()
        assert time.monotonic() - began < 5, "a call hung instead of failing fast"
    assert isinstance(info.value, expected), repr(info.value)
    if expected is QuorumLost:
        assert "majority" in str(info.value) and "No data is lost" in str(info.value)

    for index in down:
        fresh_etcd.start_member(index, wait=False)
    await asyncio.to_thread(fresh_etcd.wait_healthy, 30)
    deadline = time.monotonic() + 10
    while True:
        try:
            await coordinator.put(keys.kernel("k1"), "after")
            break
        except CoordinationError:
            assert time.monotonic() < deadline, "work did not resume after the members returned"
            await asyncio.sleep(0.2)
    session = await coordinator.get(keys.kernel("k1"))
    assert session is not None and session.text == "after"
    # The outage did not cost the replica its registration: leases are not expired without a leader.
    assert await coordinator.get(keys.replica("k1", "r0")) is not None
    assert lease.alive
    await coordinator.close()
