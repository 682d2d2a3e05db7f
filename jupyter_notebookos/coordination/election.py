"""Leadership with fencing, built on a lease and transactions.

One key per election (a kernel's executor: ``keys.executor(kernel_id)``). The leader is whoever
created the key; the key is bound to the leader's lease, so it vanishes when the leader dies. The
key's ``create_revision`` is the **fencing token**: every write the leader makes as leader goes
through :meth:`Election.fenced_txn`, which adds ``create_revision(key) == token`` to its compares. A
stale leader (its lease expired, or it was deposed and someone else now holds the key) therefore
cannot commit anything: its transaction fails with :class:`TransactionConflict`, even if the stale
leader has not noticed yet.

(etcd3aio's own Lock and Election do not renew their lease while held, hence this module.)

::

    lease = await coordinator.grant_lease(5)
    election = Election(coordinator, coordinator.keys.executor(kid), lease, value=replica_id)
    token = await election.campaign()
    await election.fenced_txn(success=[Op.put(coordinator.keys.cell(kid, msg_id), decision)])
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

from jupyter_notebookos.coordination.client import Coordinator
from jupyter_notebookos.coordination.errors import CoordinationError, TransactionConflict
from jupyter_notebookos.coordination.kv import EventType, Value, to_bytes
from jupyter_notebookos.coordination.lease import Lease
from jupyter_notebookos.coordination.txn import Compare, Op, TxnResult
from jupyter_notebookos.coordination.watch import Watch


@dataclass(frozen=True)
class Leader:
    """Who holds an election: the stored value, the fencing token and the holder's lease."""

    value: bytes
    token: int
    lease: int

    @property
    def text(self) -> str:
        return self.value.decode()


class Election:
    """Campaign for ``key`` with ``lease``; the winner's writes are fenced by its token."""

    def __init__(self, coordinator: Coordinator, key: str, lease: Lease, value: Value = b"") -> None:
        self.coordinator = coordinator
        self.key = key
        self.lease = lease
        self.value = to_bytes(value)
        #: The fencing token (create_revision of our key) while we lead, else None.
        self.token: int | None = None

    def __repr__(self) -> str:
        return f"<Election {self.key!r} token={self.token}>"

    async def try_campaign(self) -> int | None:
        """Become leader if nobody is; returns the fencing token, or None if someone else leads."""
        self.lease.check()
        result = await self._attempt()
        return self.token if result is None else None

    async def campaign(self, *, timeout: float | None = None) -> int:
        """Become leader, waiting for the current leader to go. Returns the fencing token.

        Raises:
            LeaseLost: our lease was lost while waiting.
            TimeoutError: ``timeout`` seconds passed without winning.
        """
        async with asyncio.timeout(timeout):
            while True:
                self.lease.check()
                revision = await self._attempt()
                if revision is None:
                    assert self.token is not None
                    return self.token
                await self._wait_for_vacancy(revision + 1)

    async def _attempt(self) -> int | None:
        """One create-if-absent. None when we lead; else the revision to watch from."""
        result = await self.coordinator.txn(
            compare=[Compare.absent(self.key)],
            success=[Op.put(self.key, self.value, lease=self.lease)],
            failure=[Op.get(self.key)],
        )
        if result.succeeded:
            self.token = result.revision  # a put's create_revision is the transaction's revision
            return None
        current = result.results[0].items[0] if result.results and result.results[0].items else None
        if current is not None and current.lease == self.lease.id:
            self.token = current.create_revision  # we already lead (e.g. a retried campaign)
            return None
        return result.revision

    async def _wait_for_vacancy(self, start_revision: int) -> None:
        lost = asyncio.ensure_future(self.lease.lost.wait())
        async with self.coordinator.watch_key(self.key, start_revision) as watch:
            vacated = asyncio.ensure_future(self._first_delete(watch))
            try:
                await asyncio.wait({lost, vacated}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (lost, vacated):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            if vacated.done() and not vacated.cancelled() and (error := vacated.exception()) is not None:
                raise error
        self.lease.check()

    @staticmethod
    async def _first_delete(watch: Watch) -> None:
        async for event in watch:
            if event.type is EventType.DELETE:
                return

    async def leader(self) -> Leader | None:
        """The current leader, or None."""
        current = await self.coordinator.get(self.key)
        if current is None:
            return None
        return Leader(current.value, current.create_revision, current.lease)

    async def is_leader(self) -> bool:
        """Whether etcd still has us as leader (same token)."""
        current = await self.leader()
        return self.token is not None and current is not None and current.token == self.token

    def fence(self) -> Compare:
        """The compare that holds only while we are still the leader that won with our token."""
        if self.token is None:
            raise CoordinationError(f"not the leader of {self.key}: campaign first")
        return Compare.create_revision(self.key, "==", self.token)

    async def fenced_txn(
        self,
        success: Sequence[Op],
        *,
        compare: Sequence[Compare] = (),
        failure: Sequence[Op] = (),
        timeout: float | None = None,
    ) -> TxnResult:
        """A transaction that commits only while we lead.

        Raises:
            TransactionConflict: we are no longer the leader (or another compare failed).
        """
        result = await self.coordinator.txn(
            compare=[self.fence(), *compare],
            success=success,
            failure=[Op.get(self.key), *failure],
            timeout=timeout,
        )
        if not result.succeeded:
            holder = result.results[0].items[0] if result.results[0].items else None
            if holder is None or holder.create_revision != self.token:
                now = f"now held with token {holder.create_revision}" if holder else "now vacant"
                raise TransactionConflict(
                    f"fenced write refused: {self.key} was won with token {self.token}, {now}: a stale "
                    "leader must not commit"
                )
            raise TransactionConflict(f"transaction refused: a compare did not hold (still leader of {self.key})")
        return result

    async def resign(self, *, timeout: float | None = None) -> bool:
        """Give up leadership (delete our key if it is still ours). Returns whether we still held it."""
        if self.token is None:
            return False
        token, self.token = self.token, None
        result = await self.coordinator.txn(
            compare=[Compare.create_revision(self.key, "==", token)],
            success=[Op.delete(self.key)],
            timeout=timeout,
        )
        return result.succeeded
