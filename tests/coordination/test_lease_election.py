"""Leases (expiry, keepalive) and fenced elections against a real etcd (1 and 3 members)."""

from __future__ import annotations

import asyncio
import time

import pytest

from jupyter_notebookos.coordination import Coordinator, Election, LeaseLost, Op, TransactionConflict

pytestmark = pytest.mark.timeout(30)


async def _wait_until_absent(coordinator: Coordinator, key: str, limit: float) -> float:
    began = time.monotonic()
    while await coordinator.get(key) is not None:
        assert time.monotonic() - began < limit, f"{key} still present after {limit} s"
        await asyncio.sleep(0.1)
    return time.monotonic() - began


@pytest.mark.asyncio
async def test_expired_lease_removes_its_keys(coordinator: Coordinator) -> None:
    keys = coordinator.keys
    lost: list[int] = []
    lease = await coordinator.grant_lease(1, keepalive=False, on_lost=lambda lease: lost.append(lease.id))
    await coordinator.put(keys.replica("k1", "r0"), '{"pid": 1}', lease=lease)
    await coordinator.put(keys.gpu("h1", 0), "k1/r0", lease=lease)
    await coordinator.put(keys.host("h1"), "not bound to the lease")

    gone_after = await _wait_until_absent(coordinator, keys.replica("k1", "r0"), limit=6)
    assert gone_after > 0.5  # it lived for its TTL, it was not deleted at once
    assert await coordinator.get(keys.gpu("h1", 0)) is None
    assert await coordinator.get(keys.host("h1")) is not None
    with pytest.raises(LeaseLost):
        await lease.refresh()
    assert lease.lost.is_set() and lost == [lease.id]


@pytest.mark.asyncio
async def test_keepalive_keeps_a_lease_alive_well_past_its_ttl(coordinator: Coordinator) -> None:
    key = coordinator.keys.replica("k1", "r1")
    lease = await coordinator.grant_lease(1)  # etcd rounds this up to its minimum (2 s here)
    await coordinator.put(key, "alive", lease=lease)
    await asyncio.sleep(2 * lease.ttl)  # two full TTLs: only renewals can explain it
    assert await coordinator.get(key) is not None
    assert lease.alive and await lease.time_to_live() > 0

    await lease.revoke()
    assert await coordinator.get(key) is None
    assert lease.lost.is_set()
    with pytest.raises(LeaseLost):
        lease.check()


@pytest.mark.asyncio
async def test_campaign_waits_for_the_leader_to_go(coordinator: Coordinator) -> None:
    key = coordinator.keys.executor("k1")
    lease_a = await coordinator.grant_lease(5)
    lease_b = await coordinator.grant_lease(5)
    a = Election(coordinator, key, lease_a, value="r0")
    b = Election(coordinator, key, lease_b, value="r1")

    token_a = await a.campaign(timeout=5)
    assert await b.try_campaign() is None
    waiting = asyncio.ensure_future(b.campaign(timeout=10))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    leader = await b.leader()
    assert leader is not None and (leader.text, leader.token, leader.lease) == ("r0", token_a, lease_a.id)

    assert await a.resign() is True
    token_b = await asyncio.wait_for(waiting, 5)
    assert token_b > token_a
    assert await b.is_leader() and not await a.is_leader()
    await lease_a.revoke()
    await lease_b.revoke()


@pytest.mark.asyncio
async def test_stale_leader_cannot_commit_after_its_lease_expired(coordinator: Coordinator) -> None:
    keys = coordinator.keys
    key = keys.executor("k1")
    lease_a = await coordinator.grant_lease(1)
    a = Election(coordinator, key, lease_a, value="r0")
    await a.campaign(timeout=5)
    await a.fenced_txn([Op.put(keys.cell("k1", "m1"), "r0")])

    # r0 freezes (no more renewals): its lease expires and r1 takes over.
    await lease_a.stop_keepalive()
    lease_b = await coordinator.grant_lease(5)
    b = Election(coordinator, key, lease_b, value="r1")
    await b.campaign(timeout=10)

    with pytest.raises(TransactionConflict, match="stale leader"):
        await a.fenced_txn([Op.put(keys.cell("k1", "m2"), "r0")])
    assert await coordinator.get(keys.cell("k1", "m2")) is None
    await b.fenced_txn([Op.put(keys.cell("k1", "m2"), "r1")])
    cell = await coordinator.get(keys.cell("k1", "m2"))
    assert cell is not None and cell.text == "r1"
    await lease_b.revoke()


@pytest.mark.asyncio
async def test_deposed_leader_is_fenced_even_if_its_lease_lives(coordinator: Coordinator) -> None:
    """The router reassigns the executor (deletes the key); the old executor still has a live lease."""
    keys = coordinator.keys
    key = keys.executor("k2")
    lease_a = await coordinator.grant_lease(5)
    lease_b = await coordinator.grant_lease(5)
    a = Election(coordinator, key, lease_a, value="r0")
    b = Election(coordinator, key, lease_b, value="r1")
    await a.campaign(timeout=5)
    await coordinator.delete(key)
    await b.campaign(timeout=5)
    with pytest.raises(TransactionConflict):
        await a.fenced_txn([Op.put(keys.gpu("h1", 0), "r0")], timeout=2)
    assert await coordinator.get(keys.gpu("h1", 0)) is None
    assert await a.resign() is False  # must not delete r1's key
    assert await b.is_leader()
    await lease_a.revoke()
    await lease_b.revoke()
