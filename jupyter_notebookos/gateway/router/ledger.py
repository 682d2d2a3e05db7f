"""Group commit of the GPU ledger's releases in etcd, shared by every router of one gateway.

A cell's decision puts its cell record and GPU entries in etcd (one transaction, see the router). When
the cell replies, the scheduler frees its GPUs in memory at once; deleting the etcd entries is deferred:
they ride along with the next decision any router of this gateway commits, or go in a transaction of their
own after :data:`RELEASE_DELAY_S`. Cells that follow each other closely thus cost one etcd transaction
each instead of two, and the next cell's decision no longer waits behind the previous cell's release.

A deferred entry never blocks a decision: a decision that takes a GPU whose release is still pending
compares the entry's revision (absent, or still the entry this gateway wrote) instead of its absence, and
overwrites it. Deletes are conditional on the same revision, so an entry written by anyone else is never
removed. Every entry is bound to its executor's lease, so nothing outlives a crashed gateway for longer
than that lease, and a re-attaching gateway deletes the entries of cells that had finished. A release etcd refuses
stays pending and is retried, backing off while etcd is away; :mod:`jupyter_notebookos.gateway.upkeep.reconcile` deletes
whatever is left over by anything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from jupyter_notebookos.coordination.client import Coordinator
from jupyter_notebookos.coordination.errors import CoordinationError
from jupyter_notebookos.coordination.txn import Compare, Op

log = logging.getLogger(__name__)

#: How long a released cell's entries may stay in etcd when no other decision comes to carry them.
RELEASE_DELAY_S = 0.1
#: Most deletes folded into one transaction (etcd refuses transactions of more than 128 operations).
MAX_DELETES_PER_TXN = 64
#: Longest wait between two attempts to release entries while etcd refuses (doubling from ``delay``).
MAX_RETRY_DELAY_S = 5.0


@dataclass(frozen=True)
class Claim:
    """What a decision's transaction adds for the ledger: compares for its GPU entries, pending deletes."""

    compares: list[Compare]
    deletes: list[Op]
    taken: dict[str, int]  # the pending releases it carries: key -> revision of the entry


class LedgerReleases:
    """Deferred deletes of GPU-ledger entries and cell records (see the module docstring)."""

    def __init__(self, coordinator: Coordinator, delay: float = RELEASE_DELAY_S) -> None:
        self.coordinator = coordinator
        self.delay = delay
        self._pending: dict[str, int] = {}  # key -> the revision that wrote it
        self._flushing: dict[str, int] = {}  # taken by a flush in flight
        self._timer: asyncio.TimerHandle | None = None
        self._flush_task: asyncio.Task[None] | None = None
        self._retry_delay = 0.0  # seconds before the next background flush after a failed one (0: none failed)

    @property
    def pending(self) -> int:
        """How many entries wait to be deleted."""
        return len(self._pending) + len(self._flushing)

    def release(self, entries: Mapping[str, int]) -> None:
        """Delete these entries (key -> revision of the write that created them) soon."""
        self._pending.update(entries)
        self._schedule()

    def claim(self, keys: Sequence[str], *, writes: Collection[str] = ()) -> Claim:
        """For a decision about to take ``keys`` (GPU entries): its compares and the deletes to carry.

        A key whose release is pending may be absent or still hold the entry this gateway wrote; any other
        key must be absent. Nothing the transaction writes (``keys`` and ``writes``, e.g. the cell record of
        a cell sent again) is deleted by it. Call :meth:`settle` with the outcome of the transaction.
        """
        own = {**self._flushing, **self._pending}
        compares = [Compare.mod_revision(k, "<", own[k] + 1) if k in own else Compare.absent(k) for k in keys]
        taken: dict[str, int] = {}
        for key in list(self._pending)[:MAX_DELETES_PER_TXN]:
            taken[key] = self._pending.pop(key)
        if not self._pending and self._timer is not None:
            self._timer.cancel()
            self._timer = None
        claimed = {*keys, *writes}
        carried = [k for k in taken if k not in claimed]
        # Each carried delete is conditional like a flush's: a decision that finds one of them changed is
        # refused as a whole; the caller then flushes (which spares the changed entry) and decides again.
        compares += [Compare.mod_revision(k, "<", taken[k] + 1) for k in carried]
        return Claim(compares, [Op.delete(k) for k in carried], taken)

    def settle(self, claim: Claim, committed: bool) -> None:
        """The transaction of ``claim`` ended: if it did not commit, its deletes are pending again."""
        if committed:
            return
        for key, revision in claim.taken.items():
            self._pending.setdefault(key, revision)
        self._schedule()

    def holds(self, key: str) -> bool:
        """Whether ``key``'s release is pending here (the reconciler leaves it to this class)."""
        return key in self._pending or key in self._flushing

    async def flush(self) -> None:
        """Delete every pending entry now (also waits for a flush in flight).

        Raises:
            CoordinationError: etcd refused; the entries stay pending and are retried in the background.
        """
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._flush_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._flush_task)
        try:
            while self._pending:
                await self._flush_batch()
        except CoordinationError:
            self._schedule()  # the background retries take over
            raise

    def _schedule(self) -> None:
        if self._timer is None and self._pending:
            self._timer = asyncio.get_running_loop().call_later(self._retry_delay or self.delay, self._start_flush)

    def _start_flush(self) -> None:
        self._timer = None
        if self._flush_task is None or self._flush_task.done():
            self._flush_task = asyncio.ensure_future(self._flush_some())
            self._flush_task.add_done_callback(lambda _: self._schedule())
        else:
            self._schedule()

    async def _flush_some(self) -> None:
        """A background flush: a failure is logged and retried later, backing off while etcd is away."""
        try:
            await self._flush_batch()
        except CoordinationError as err:
            self._retry_delay = min(max(2 * self._retry_delay, self.delay), MAX_RETRY_DELAY_S)
            log.warning(
                "releasing GPU-ledger entries in etcd failed (%d pending, retrying in %.1f s): %s",
                len(self._pending),
                self._retry_delay,
                err,
            )
        else:
            self._retry_delay = 0.0

    async def _flush_batch(self) -> None:
        batch: dict[str, int] = {}
        for key in list(self._pending)[:MAX_DELETES_PER_TXN]:
            batch[key] = self._pending.pop(key)
        if not batch:
            return
        self._flushing = batch
        try:
            await self._delete_unchanged(batch)
        except CoordinationError:
            for key, revision in batch.items():  # pending again: a failed release is retried, never dropped
                self._pending.setdefault(key, revision)
            raise
        finally:
            self._flushing = {}

    async def _delete_unchanged(self, entries: dict[str, int]) -> None:
        """Delete the entries that still hold the revision this gateway wrote (one transaction if all do)."""

        def unchanged(key: str) -> Compare:
            return Compare.mod_revision(key, "<", entries[key] + 1)

        result = await self.coordinator.txn(
            compare=[unchanged(k) for k in entries], success=[Op.delete(k) for k in entries], failure=[]
        )
        if result.succeeded:
            return
        for key in entries:  # some entry was taken over meanwhile: spare it, delete the others
            await self.coordinator.txn(compare=[unchanged(key)], success=[Op.delete(key)], failure=[])


__all__ = ["RELEASE_DELAY_S", "Claim", "LedgerReleases"]
