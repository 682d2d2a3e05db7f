"""Leases (expiry, keepalive) and fenced executor terms against a real etcd (1 and 3 members)."""

from __future__ import annotations

import asyncio
import time

import pytest

from jupyter_notebookos.coordination import Coordinator, Lease, LeaseLost, Op
from jupyter_notebookos.coordination.election import fence, open_term, term_refusal

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


async def _open_term(coordinator: Coordinator, key: str, holder: str, lease: Lease) -> int:
    """Open an executor term as the router does; returns its fencing token."""
    vacant, claim = open_term(key, holder, lease)
    result = await coordinator.txn([vacant], [claim])
    assert result.succeeded, f"{key} is held"
    return result.revision


async def _fenced_put(coordinator: Coordinator, term_key: str, token: int, key: str, value: str) -> str | None:
    """Put ``key`` fenced on the term; None when it went through, else why it was refused."""
    result = await coordinator.txn([fence(term_key, token)], [Op.put(key, value)], [Op.get(term_key)])
    return None if result.succeeded else term_refusal(term_key, result.results[0].items, token)


@pytest.mark.asyncio
async def test_a_second_term_cannot_open_while_one_is_in_force(coordinator: Coordinator) -> None:
    key = coordinator.keys.executor("k1")
    lease_a = await coordinator.grant_lease(5)
    lease_b = await coordinator.grant_lease(5)
    token_a = await _open_term(coordinator, key, "r0", lease_a)
    vacant, claim = open_term(key, "r1", lease_b)
    assert not (await coordinator.txn([vacant], [claim])).succeeded
    held = await coordinator.get(key)
    assert held is not None and (held.text, held.create_revision, held.lease) == ("r0", token_a, lease_a.id)
    await lease_a.revoke()
    assert await _open_term(coordinator, key, "r1", lease_b) > token_a
    await lease_b.revoke()


@pytest.mark.asyncio
async def test_stale_executor_cannot_commit_after_its_lease_expired(coordinator: Coordinator) -> None:
    keys = coordinator.keys
    key = keys.executor("k1")
    lease_a = await coordinator.grant_lease(1)
    token_a = await _open_term(coordinator, key, "r0", lease_a)
    assert await _fenced_put(coordinator, key, token_a, keys.cell("k1", "m1"), "r0") is None

    # r0 freezes (no more renewals): its lease expires, the term with it, and r1 gets the next one.
    await lease_a.stop_keepalive()
    await _wait_until_absent(coordinator, key, 10)
    lease_b = await coordinator.grant_lease(5)
    token_b = await _open_term(coordinator, key, "r1", lease_b)

    refusal = await _fenced_put(coordinator, key, token_a, keys.cell("k1", "m2"), "r0")
    assert refusal is not None and "no longer the executor" in refusal
    assert await coordinator.get(keys.cell("k1", "m2")) is None
    assert await _fenced_put(coordinator, key, token_b, keys.cell("k1", "m2"), "r1") is None
    cell = await coordinator.get(keys.cell("k1", "m2"))
    assert cell is not None and cell.text == "r1"
    await lease_b.revoke()


@pytest.mark.asyncio
async def test_deposed_executor_is_fenced_even_if_its_lease_lives(coordinator: Coordinator) -> None:
    """The router reassigns the executor (deletes the key); the old executor still has a live lease."""
    keys = coordinator.keys
    key = keys.executor("k2")
    lease_a = await coordinator.grant_lease(5)
    lease_b = await coordinator.grant_lease(5)
    token_a = await _open_term(coordinator, key, "r0", lease_a)
    await coordinator.delete(key)
    assert await _fenced_put(coordinator, key, token_a, keys.gpu("h1", 0), "r0") == (
        f"no executor is elected ({key} is absent)"
    )
    await _open_term(coordinator, key, "r1", lease_b)
    assert await _fenced_put(coordinator, key, token_a, keys.gpu("h1", 0), "r0") is not None
    assert await coordinator.get(keys.gpu("h1", 0)) is None
    await lease_a.revoke()
    await lease_b.revoke()
