"""The kernel's place in the state log and its executor term, kept in etcd by one object: :class:`CommitLog`.

Each cell's decision is committed in **one** etcd transaction: the cell record, the GPU-ledger entries bound
to the executor's lease and any deferred GPU releases (:mod:`jupyter_notebookos.gateway.router.ledger`), fenced on
the executor key's create revision, so a stale executor cannot act after a reassign. When an executor dies
before publishing the state of cells it replied to, their log sequence numbers are closed with ``lost``
records.

:class:`CommitLog` is the only writer of the log head (the last seq handed to a cell), the published seq, the
executor, the last executor and the fence. The cell queue commits through it and hands it each finished cell's
entries; the replica-set watch tells it what etcd says of the log; the router ends executor terms through it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from jupyter_notebookos.coordination.client import Coordinator
from jupyter_notebookos.coordination.election import fence, open_term
from jupyter_notebookos.coordination.errors import CoordinationError
from jupyter_notebookos.coordination.ridethrough import txn_once
from jupyter_notebookos.coordination.txn import Compare, Op
from jupyter_notebookos.gateway.router.cells import CHANGED_MEMORY, MALFORMED, CellGrant
from jupyter_notebookos.gateway.router.ledger import LedgerReleases
from jupyter_notebookos.gateway.router.tasks import RouterTasks
from jupyter_notebookos.replication.protocol import LogRecord, ReplicaRegistration

log = logging.getLogger("jupyter_notebookos.gateway.router")


@dataclass(frozen=True)
class Committed:
    """A cell's decision as etcd holds it: its log seq, and its etcd entries (cell record, GPUs) -> revision."""

    seq: int
    entries: dict[str, int]


@dataclass(frozen=True)
class LogMark:
    """The log head and last executor before a decision (:meth:`CommitLog.rollback` goes back to it)."""

    log_head: int
    last_executor: str | None


class CommitLog:
    """The kernel's log head, published seq and executor term (see the module docstring).

    ``on_published(seq)`` is told each time the published seq moves up to ``seq``: the cells adopted from a
    previous gateway are over once their state records are in the log."""

    def __init__(
        self,
        *,
        kernel_id: str,
        coordinator: Coordinator,
        ledger: LedgerReleases,
        tasks: RouterTasks,
        on_published: Callable[[int], None],
    ) -> None:
        self.kernel_id = kernel_id
        self.coordinator = coordinator
        self.keys = coordinator.keys
        self.ledger = ledger
        self._tasks = tasks
        self._on_published = on_published
        self._log_head = 0  # the last seq handed to a cell
        self._published_seq = 0  # the highest seq whose record is in the log (or covered by a checkpoint)
        self._executor: str | None = None
        self._last_executor: str | None = None  # the executor of seq log_head: it holds any records not published
        self._fence = 0  # create_revision of the executor key for the current executor
        self._executor_key_absent = False  # known absent in etcd: a new term need not delete it first
        # Cells that replied but whose state record is not published yet: seq -> (msg_id, its cell record ->
        # revision). The cell record stays in etcd until then (see release_entries).
        self._unpublished: dict[int, tuple[str, dict[str, int]]] = {}
        self._changed: dict[int, list[str]] = {}  # log seq -> names its cell's reply said it changed
        self._closing: set[str] = set()  # replicas whose unpublished seqs are being closed as lost

    # -- reading ------------------------------------------------------------------------------------

    @property
    def log_head(self) -> int:
        """The last seq handed to a cell."""
        return self._log_head

    @property
    def published_seq(self) -> int:
        """The highest seq whose state record is in the log, covered by the checkpoint, or closed as lost."""
        return self._published_seq

    @property
    def executor(self) -> str | None:
        """The replica of the executor term in force (None: the next cell opens a new term)."""
        return self._executor

    @property
    def last_executor(self) -> str | None:
        """The replica given seq :attr:`log_head`: it holds any records not published yet."""
        return self._last_executor

    @property
    def fence(self) -> int:
        """The create revision of the executor key of the term in force (0: none)."""
        return self._fence

    def unpublished_cells(self) -> list[str]:
        """The msg_ids of cells that replied but whose state record is not published yet."""
        return [msg_id for msg_id, _ in self._unpublished.values()]

    # -- the executor term and the log head -----------------------------------------------------------

    def cleared(self) -> None:
        """The kernel's keys were deleted (a fresh kernel): no executor key to delete before the first term."""
        self._executor_key_absent = True

    def resume_term(self, executor: str, fence_revision: int) -> None:
        """Re-attaching: the executor term etcd holds (later changes are this router's, made in memory first)."""
        self._executor, self._fence = executor, fence_revision
        self._last_executor = executor

    def end_term(self, replica_id: str | None = None) -> None:
        """The executor term ends (its replica ``replica_id`` is gone or retiring; None: whichever replica):
        the next cell opens a new one."""
        if replica_id is None or self._executor == replica_id:
            self._executor, self._fence = None, 0

    def note_handed(self, seq: int) -> None:
        """Seq ``seq`` was handed to a cell by a previous gateway (a cell adopted at re-attach)."""
        self._log_head = max(self._log_head, seq)

    def note_log(self, seq: int) -> None:
        """etcd holds the record of ``seq`` in the log, or a checkpoint covering it."""
        self._log_head = max(self._log_head, seq)
        self.published_through(seq)

    def mark(self) -> LogMark:
        """Where the log stands before a decision (see :meth:`rollback`)."""
        return LogMark(self._log_head, self._last_executor)

    def rollback(self, mark: LogMark) -> None:
        """Undo a committed decision that was never sent (its replica went away meanwhile): the seq was given to no
        one. A new executor term follows, as after any executor loss."""
        self._log_head, self._last_executor = mark.log_head, mark.last_executor
        self._executor, self._fence = None, 0

    def give_up(self, seq: int) -> None:
        """The cell of ``seq``, decided by a previous gateway, never reached its executor: the seq is free again
        when it is the last one handed out."""
        if self._log_head == seq:
            self._log_head = seq - 1

    # -- committing a cell --------------------------------------------------------------------------

    async def commit(
        self, msg_id: str, attempt: int, grant: CellGrant, registration: ReplicaRegistration
    ) -> Committed | None:
        """The one transaction of a cell: executor term (if it changes), cell record and GPU entries.

        Returns what etcd holds, or None when the decision conflicted (another term, a GPU entry held by something
        else). Raises CoordinationError when etcd cannot answer (the cell did not run)."""
        keys, kid = self.keys, self.kernel_id
        seq = self._log_head + 1
        executor_key = keys.executor(kid)
        record = json.dumps(
            {
                "msg_id": msg_id,
                "executor": grant.replica_id,
                "host": grant.host,
                "gpus": list(grant.devices),
                "attempt": attempt,
                "seq": seq,
            }
        )
        gpu_keys = [keys.gpu(grant.host, d) for d in grant.devices]
        cell_key = keys.cell(kid, msg_id)
        claim = self.ledger.claim(gpu_keys, writes=[cell_key])  # (a cell sent again re-writes its record)
        compares = [Compare.present(keys.replica(kid, grant.replica_id)), *claim.compares]
        ops = [Op.put(cell_key, record, lease=registration.lease)]
        ops += [
            Op.put(
                key,
                json.dumps({"kernel_id": kid, "replica_id": grant.replica_id, "msg_id": msg_id}),
                lease=registration.lease,
            )
            for key in gpu_keys
        ]
        ops += claim.deletes  # earlier cells' entries, released since (see LedgerReleases)
        switching = self._executor != grant.replica_id or not self._fence
        result = None
        try:
            if switching:
                # A new executor term: the old executor key goes first, so the new one gets a fresh
                # create_revision (the fence a stale executor's log write will fail on).
                if not self._executor_key_absent:
                    await self.coordinator.delete(executor_key)
                vacant, claim_term = open_term(executor_key, grant.replica_id, registration.lease)
                compares.append(vacant)
                ops.append(claim_term)
            else:
                compares.append(fence(executor_key, self._fence))
            # A leader election while this runs is settled, not reported (the record is unique to this attempt).
            result = await txn_once(self.coordinator, compares, ops, outcome_key=cell_key, outcome_value=record)
        finally:
            self.ledger.settle(claim, result is not None and result.succeeded)
        self._executor_key_absent = False
        if not result.succeeded:
            log.warning("kernel %s: decision for cell %s conflicted in etcd; choosing again", kid, msg_id)
            if switching:
                self._executor, self._fence = None, 0
            return None
        if switching:
            self._executor, self._fence = grant.replica_id, result.revision
        self._last_executor = grant.replica_id
        self._log_head = seq
        entries = {cell_key: result.revision}
        entries.update((key, result.revision) for key in gpu_keys)
        return Committed(seq, entries)

    # -- a cell's entries after its decision ------------------------------------------------------------

    def release(self, entries: dict[str, int]) -> None:
        """Delete these ledger entries and cell records (deferred, see LedgerReleases)."""
        if entries:
            self.ledger.release(dict(entries))

    async def flush_releases(self) -> None:
        """Send the deferred releases now (one of them may be in the way of a decision)."""
        await self.ledger.flush()

    def release_entries(self, msg_id: str, seq: int, entries: dict[str, int]) -> None:
        """The cell ``msg_id`` (given ``seq``) is over: its GPU entries go now, its cell record once its state
        record is published.

        The cell record carries the cell's seq. A gateway that re-attaches after a crash finds the seqs handed
        out from the log, the checkpoint and these records; had the record gone at the reply while the executor
        still uploaded the cell's state (a brokered store waits for the gateway to sign), the new gateway would
        give the next cell the same seq, the executor's record for it would be refused, and the state of a cell
        the user saw succeed would be lost. Kept, the new gateway adopts the cell and waits for its record.
        """
        cell_key = self.keys.cell(self.kernel_id, msg_id)
        gpus = dict(entries)
        revision = gpus.pop(cell_key, None)
        if gpus:
            self.ledger.release(gpus)
        if revision is None:
            return
        if seq <= self._published_seq:
            self.ledger.release({cell_key: revision})
        else:
            self._unpublished[seq] = (msg_id, {cell_key: revision})

    # -- the log as etcd has it ---------------------------------------------------------------------------

    def published_through(self, seq: int) -> None:
        """Every record up to ``seq`` is in the log (or covered by the checkpoint, or closed as lost): the cell
        records kept for them go, and ``on_published`` hears of it."""
        if seq <= self._published_seq:
            return
        self._published_seq = seq
        for held in [s for s in self._unpublished if s <= seq]:
            self.ledger.release(self._unpublished.pop(held)[1])
        self._on_published(seq)

    async def read_published(self) -> int:
        """The highest seq whose record is in the log or covered by the checkpoint (read from etcd)."""
        keys, kid = self.keys, self.kernel_id
        records = await self.coordinator.get_prefix(keys.log_prefix(kid), keys_only=True)
        checkpoint = await self.coordinator.get(keys.checkpoint(kid))
        covered = 0
        if checkpoint is not None:
            try:
                covered = int(json.loads(checkpoint.value).get("seq", 0))
            except MALFORMED as err:
                log.error("kernel %s: ignoring a malformed checkpoint pointer: %r", self.kernel_id, err)
        return max([covered, *(keys.seq_of(kv.key) for kv in records)])

    def remember_changed(self, seq: int, names: list[str]) -> None:
        """Keep what cell ``seq`` changed until its record is surely published (the last few cells)."""
        self._changed[seq] = names
        for old in [s for s in self._changed if s <= self._published_seq or s < seq - CHANGED_MEMORY]:
            del self._changed[old]

    def executor_lost(self, replica_id: str) -> None:
        """Replica ``replica_id`` is gone for good. If it was given the last cells but did not publish their
        records, those cells' state changes are lost: their seqs are closed so the other replicas do not wait."""
        if (
            self._last_executor == replica_id
            and self._published_seq < self._log_head
            and replica_id not in self._closing
        ):
            # (published_seq is refreshed from etcd there: the router does not watch the log.)
            self._closing.add(replica_id)
            closing = self._tasks.spawn(self._close_lost_seqs(replica_id, self._log_head))
            closing.add_done_callback(lambda _: self._closing.discard(replica_id))

    async def _close_lost_seqs(self, replica_id: str, upto: int) -> None:
        """Write ``lost`` records for every seq up to ``upto`` a dead executor was given but did not publish.

        ``upto`` is the log head when it was found dead: seqs handed out since belong to another executor."""
        try:
            self.published_through(await self.read_published())
        except CoordinationError as err:
            log.error("kernel %s: cannot read the state log: %s", self.kernel_id, err)
            return
        seqs = range(self._published_seq + 1, upto + 1)
        if not seqs:
            return
        log.warning(
            "kernel %s: replica %s died before publishing the state of log records %s; closing them",
            self.kernel_id,
            replica_id,
            ", ".join(map(str, seqs)),
        )
        try:
            if self._executor in (None, replica_id):  # (not a term opened since for another replica)
                # A stale executor must not publish after this: its fence (the executor key) goes first.
                await self.coordinator.delete(self.keys.executor(self.kernel_id))
            for seq in seqs:
                key = self.keys.log_record(self.kernel_id, seq)
                # The names the cell's reply said it changed: the next cell's output tells the user they are lost.
                names = self._changed.pop(seq, [])
                record = LogRecord(seq=seq, kind="lost", msg_id="", replica_id=replica_id, names=names)
                await self.coordinator.txn(compare=[Compare.absent(key)], success=[Op.put(key, record.to_json())])
            self.published_through(upto)
        except CoordinationError as err:
            log.error("kernel %s: could not close log records %s: %s", self.kernel_id, list(seqs), err)
