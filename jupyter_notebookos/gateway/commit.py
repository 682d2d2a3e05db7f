"""The replica router's commit and fencing protocol in etcd.

Each cell's decision is committed in **one** etcd transaction: the cell record, the GPU-ledger entries bound
to the executor's lease and any deferred GPU releases (:mod:`jupyter_notebookos.gateway.ledger`), fenced on
the executor key's create revision, so a stale executor cannot act after a reassign. When an executor dies
before publishing the state of cells it replied to, their log sequence numbers are closed with ``lost``
records.
"""

from __future__ import annotations

import json

from jupyter_notebookos.coordination.election import fence, open_term
from jupyter_notebookos.coordination.errors import CoordinationError
from jupyter_notebookos.coordination.ridethrough import txn_once
from jupyter_notebookos.coordination.txn import Compare, Op
from jupyter_notebookos.gateway.cells import CHANGED_MEMORY, MALFORMED, CellGrant, PendingCell, _CellAborted
from jupyter_notebookos.gateway.routerstate import RouterState, log
from jupyter_notebookos.replication.protocol import LogRecord


class CellCommits(RouterState):
    """The router's part that writes decisions and lost records to etcd."""

    async def _commit(self, cell: PendingCell, grant: CellGrant) -> bool:
        """The one transaction of a cell: executor term (if it changes), cell record and GPU entries."""
        registration = self.replicas.registration(grant.replica_id)
        if registration is None:  # gone since the router checked: as if the transaction's compare failed
            return False
        keys, kid = self.keys, self.kernel_id
        seq = self.log_head + 1
        executor_key = keys.executor(kid)
        record = json.dumps(
            {
                "msg_id": cell.request.msg_id,
                "executor": grant.replica_id,
                "host": grant.host,
                "gpus": list(grant.devices),
                "attempt": cell.attempt,
                "seq": seq,
            }
        )
        gpu_keys = [keys.gpu(grant.host, d) for d in grant.devices]
        cell_key = keys.cell(kid, cell.request.msg_id)
        claim = self.ledger.claim(gpu_keys, writes=[cell_key])  # (a cell sent again re-writes its record)
        compares = [Compare.present(keys.replica(kid, grant.replica_id)), *claim.compares]
        ops = [Op.put(cell_key, record, lease=registration.lease)]
        ops += [
            Op.put(
                key,
                json.dumps(
                    {
                        "kernel_id": kid,
                        "replica_id": grant.replica_id,
                        "msg_id": cell.request.msg_id,
                    }
                ),
                lease=registration.lease,
            )
            for key in gpu_keys
        ]
        ops += claim.deletes  # earlier cells' entries, released since (see LedgerReleases)
        switching = self.executor != grant.replica_id or not self.fence
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
                compares.append(fence(executor_key, self.fence))
            # A leader election while this runs is settled, not reported (the record is unique to this attempt).
            result = await txn_once(self.coordinator, compares, ops, outcome_key=cell_key, outcome_value=record)
        except CoordinationError as err:
            self._error_reply(cell, "NotebookOSUnavailable", f"{err}")
            raise _CellAborted(str(err)) from err
        finally:
            self.ledger.settle(claim, result is not None and result.succeeded)
        self._executor_key_absent = False
        if not result.succeeded:
            log.warning(
                "kernel %s: decision for cell %s conflicted in etcd; choosing again",
                self.kernel_id,
                cell.request.msg_id,
            )
            if switching:
                self.executor, self.fence = None, 0
            return False
        if switching:
            self.executor, self.fence = grant.replica_id, result.revision
        cell.seq = seq
        self.last_executor = grant.replica_id
        cell.entries = {cell_key: result.revision}
        cell.entries.update((key, result.revision) for key in gpu_keys)
        self.log_head = seq
        return True

    async def _published_seq(self) -> int:
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

    async def _close_lost_seqs(self, replica_id: str, upto: int) -> None:
        """Write ``lost`` records for every seq up to ``upto`` a dead executor was given but did not publish.

        ``upto`` is the log head when it was found dead: seqs handed out since belong to another executor."""
        try:
            self._published_through(await self._published_seq())
        except CoordinationError as err:
            log.error("kernel %s: cannot read the state log: %s", self.kernel_id, err)
            return
        seqs = range(self.published_seq + 1, upto + 1)
        if not seqs:
            return
        log.warning(
            "kernel %s: replica %s died before publishing the state of log records %s; closing them",
            self.kernel_id,
            replica_id,
            ", ".join(map(str, seqs)),
        )
        try:
            if self.executor in (None, replica_id):  # (not a term opened since for another replica)
                # A stale executor must not publish after this: its fence (the executor key) goes first.
                await self.coordinator.delete(self.keys.executor(self.kernel_id))
            for seq in seqs:
                key = self.keys.log_record(self.kernel_id, seq)
                # The names the cell's reply said it changed: the next cell's output tells the user they are lost.
                names = self._changed.pop(seq, [])
                record = LogRecord(seq=seq, kind="lost", msg_id="", replica_id=replica_id, names=names)
                await self.coordinator.txn(compare=[Compare.absent(key)], success=[Op.put(key, record.to_json())])
            self._published_through(upto)
        except CoordinationError as err:
            log.error("kernel %s: could not close log records %s: %s", self.kernel_id, list(seqs), err)

    def _release_entries(self, cell: PendingCell) -> None:
        """``cell`` is over: its GPU entries go now, its cell record once its state record is published.

        The cell record carries the cell's seq. A gateway that re-attaches after a crash finds the seqs handed
        out from the log, the checkpoint and these records; had the record gone at the reply while the executor
        still uploaded the cell's state (a brokered store waits for the gateway to sign), the new gateway would
        give the next cell the same seq, the executor's record for it would be refused, and the state of a cell
        the user saw succeed would be lost. Kept, the new gateway adopts the cell and waits for its record.
        """
        cell_key = self.keys.cell(self.kernel_id, cell.request.msg_id)
        entries = dict(cell.entries)
        revision = entries.pop(cell_key, None)
        if entries:
            self.ledger.release(entries)
        if revision is None:
            return
        if cell.seq <= self.published_seq:
            self.ledger.release({cell_key: revision})
        else:
            self.unpublished[cell.seq] = (cell.request.msg_id, {cell_key: revision})

    def _published_through(self, seq: int) -> None:
        """Every record up to ``seq`` is in the log (or covered by the checkpoint, or closed as lost): the cell
        records kept for them go, and adopted cells up to ``seq`` are over."""
        if seq <= self.published_seq:
            return
        self.published_seq = seq
        for held in [s for s in self.unpublished if s <= seq]:
            self.ledger.release(self.unpublished.pop(held)[1])
        for cell in self.adopted_cells:
            if cell.seq <= seq and not cell.done.done():
                cell.done.set_result(None)

    def _remember_changed(self, seq: int, names: list[str]) -> None:
        """Keep what cell ``seq`` changed until its record is surely published (the last few cells)."""
        self._changed[seq] = names
        for old in [s for s in self._changed if s <= self.published_seq or s < seq - CHANGED_MEMORY]:
            del self._changed[old]
