"""The GPU ledger's deferred releases (``gateway/router/ledger.py``) against a real etcd."""

from __future__ import annotations

import asyncio

import pytest

from jupyter_notebookos.coordination import CoordinationError, Coordinator
from jupyter_notebookos.coordination.txn import Compare, Op
from jupyter_notebookos.embedded.etcd import EtcdCluster
from jupyter_notebookos.gateway.router.ledger import LedgerReleases

pytestmark = pytest.mark.asyncio


async def _take(co: Coordinator, ledger: LedgerReleases, gpu: str, cell: str, *, writes: tuple[str, ...] = ()) -> int:
    """A decision like the router's: take ``gpu`` and write ``cell`` in one transaction; returns its revision."""
    claim = ledger.claim([gpu], writes=[cell, *writes])
    result = await co.txn(
        compare=claim.compares, success=[Op.put(gpu, "held"), Op.put(cell, "record"), *claim.deletes], failure=[]
    )
    ledger.settle(claim, result.succeeded)
    assert result.succeeded
    return result.revision


async def _taken_and_released(co: Coordinator, ledger: LedgerReleases, gpu: str, cell: str) -> None:
    """A cell that took ``gpu`` and replied: its entries wait in ``ledger`` to be deleted."""
    revision = await _take(co, ledger, gpu, cell)
    ledger.release({gpu: revision, cell: revision})


async def test_a_release_rides_with_the_next_decision_which_may_retake_the_same_gpu(coordinator: Coordinator) -> None:
    keys = coordinator.keys
    gpu, first, second = keys.gpu("h1", 0), keys.cell("k1", "m1"), keys.cell("k1", "m2")
    ledger = LedgerReleases(coordinator, delay=60.0)  # no timer: only the next decision can carry it
    await _taken_and_released(coordinator, ledger, gpu, first)
    assert await coordinator.get(first) is not None  # deferred, not deleted yet

    # The same GPU again, while its release is pending: taken over, not refused as "held".
    await _take(coordinator, ledger, gpu, second)
    assert await coordinator.get(first) is None
    assert (await coordinator.get(second)) is not None and (await coordinator.get(gpu)) is not None
    assert ledger.pending == 0


async def test_a_release_no_decision_carries_is_written_after_the_delay(coordinator: Coordinator) -> None:
    keys = coordinator.keys
    gpu, cell = keys.gpu("h1", 1), keys.cell("k1", "m1")
    ledger = LedgerReleases(coordinator, delay=0.05)
    await _taken_and_released(coordinator, ledger, gpu, cell)
    for _ in range(100):
        if await coordinator.get(gpu) is None and await coordinator.get(cell) is None:
            break
        await asyncio.sleep(0.02)
    assert await coordinator.get(gpu) is None and await coordinator.get(cell) is None
    assert ledger.pending == 0


async def test_an_entry_someone_else_wrote_since_is_never_deleted(coordinator: Coordinator) -> None:
    keys = coordinator.keys
    gpu, cell = keys.gpu("h2", 0), keys.cell("k1", "m1")
    ledger = LedgerReleases(coordinator, delay=60.0)
    await _taken_and_released(coordinator, ledger, gpu, cell)
    await coordinator.put(gpu, "another gateway's entry")  # the key changed behind this gateway's back
    await ledger.flush()
    entry = await coordinator.get(gpu)
    assert entry is not None and entry.text == "another gateway's entry"
    assert await coordinator.get(cell) is None  # the rest of the batch still went


async def test_a_cell_sent_again_rewrites_its_record_instead_of_deleting_it(coordinator: Coordinator) -> None:
    keys = coordinator.keys
    gpu, cell = keys.gpu("h3", 0), keys.cell("k1", "m1")
    ledger = LedgerReleases(coordinator, delay=60.0)
    await _taken_and_released(coordinator, ledger, gpu, cell)  # its executor died before it began: released...
    await _take(coordinator, ledger, gpu, cell)  # ...and the same cell decided again (etcd refuses duplicates)
    assert (await coordinator.get(cell)) is not None and (await coordinator.get(gpu)) is not None


async def test_a_refused_decision_leaves_its_releases_pending(coordinator: Coordinator) -> None:
    keys = coordinator.keys
    gpu, cell, busy = keys.gpu("h4", 0), keys.cell("k1", "m1"), keys.gpu("h4", 1)
    ledger = LedgerReleases(coordinator, delay=60.0)
    await _taken_and_released(coordinator, ledger, gpu, cell)
    await coordinator.put(busy, "held by another kernel")
    claim = ledger.claim([busy])
    result = await coordinator.txn(compare=claim.compares, success=[Op.put(busy, "mine"), *claim.deletes])
    ledger.settle(claim, result.succeeded)
    assert not result.succeeded and ledger.pending == 2
    assert await coordinator.get(gpu) is not None  # the refused transaction deleted nothing
    await ledger.flush()
    assert await coordinator.get(gpu) is None and await coordinator.get(cell) is None
    assert (await coordinator.txn(compare=[Compare.present(busy)], success=[])).succeeded


async def test_a_decision_never_deletes_an_entry_someone_else_wrote_since(coordinator: Coordinator) -> None:
    keys = coordinator.keys
    gpu, cell, other = keys.gpu("h5", 0), keys.cell("k1", "m1"), keys.gpu("h5", 1)
    ledger = LedgerReleases(coordinator, delay=60.0)
    await _taken_and_released(coordinator, ledger, gpu, cell)
    await coordinator.put(gpu, "another gateway's entry")
    claim = ledger.claim([other], writes=[keys.cell("k2", "m1")])
    result = await coordinator.txn(compare=claim.compares, success=[Op.put(other, "mine"), *claim.deletes])
    ledger.settle(claim, result.succeeded)
    assert not result.succeeded  # it would have deleted the other gateway's entry
    await ledger.flush()  # what the router does before deciding again
    await _take(coordinator, ledger, other, keys.cell("k2", "m1"))
    entry = await coordinator.get(gpu)
    assert entry is not None and entry.text == "another gateway's entry"
    assert await coordinator.get(cell) is None


@pytest.mark.parametrize("fresh_etcd", [1], indirect=True, ids=["1-member"])
async def test_a_release_etcd_refuses_is_retried_until_it_goes_through(fresh_etcd: EtcdCluster, prefix: str) -> None:
    coordinator = await Coordinator.connect(fresh_etcd.endpoints, prefix=prefix, timeout=1.0)
    keys = coordinator.keys
    gpu, cell = keys.gpu("h1", 2), keys.cell("k1", "m1")
    ledger = LedgerReleases(coordinator, delay=0.05)
    revision = await _take(coordinator, ledger, gpu, cell)
    fresh_etcd.kill_member(0)
    ledger.release({gpu: revision, cell: revision})
    await asyncio.sleep(3)  # a few failed attempts (1 s each)
    assert ledger.pending == 2, "a failed release must stay pending, not be dropped"
    with pytest.raises(CoordinationError):
        await ledger.flush()
    assert ledger.pending == 2
    await asyncio.to_thread(fresh_etcd.start_member, 0)
    for _ in range(200):
        if ledger.pending == 0:
            break
        await asyncio.sleep(0.05)
    assert ledger.pending == 0
    assert await coordinator.get(gpu) is None and await coordinator.get(cell) is None
    await coordinator.close()
