"""``LogFollower``: where this replica stands in the kernel's state log, and applying what the others publish.

It restores the namespace from the checkpoint and the log at start, applies the records other replicas publish
strictly in ``seq`` order, on the kernel's own loop and through the same queue as shell requests (so never while a
cell runs), lets a directed cell wait until every record before it is applied (:meth:`LogFollower.catch_up`), and
reloads the namespace from the log when this replica's own record was refused (:meth:`LogFollower.reload_if_due`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from jupyter_notebookos.kernel.agent import ReplicaAgent
from jupyter_notebookos.kernel.knowncheckpoint import KnownCheckpoint
from jupyter_notebookos.kernel.loop import KernelLoop
from jupyter_notebookos.kernel.lostchanges import LostChanges
from jupyter_notebookos.kernel.statelog import StateLog
from jupyter_notebookos.kernel.verify import IdleVerifier
from jupyter_notebookos.replication.protocol import FIRST_SEQ, LogRecord
from jupyter_notebookos.replication.serialization import UnreplicatedValue
from jupyter_notebookos.replication.state import StateTracker
from jupyter_notebookos.waiting import wait_event

log = logging.getLogger(__name__)

#: How long a directed cell waits for this replica to apply the records before it.
CATCH_UP_TIMEOUT = 30.0


class LogFollower:
    """This replica's place in the state log: :attr:`applied`, the last record whose state it holds.

    ``quiesce`` waits until the namespace may change (the last upload done; see CellPublisher.quiesce): records are
    applied only then. ``verifier`` is stopped before the namespace changes and asked for a baseline after.
    """

    def __init__(
        self,
        kernel: KernelLoop,
        *,
        agent: ReplicaAgent,
        statelog: StateLog,
        tracker: StateTracker,
        lost_changes: LostChanges,
        checkpoint: KnownCheckpoint,
        verifier: IdleVerifier,
        quiesce: Callable[[], Awaitable[None]],
    ) -> None:
        self._kernel = kernel
        self._agent = agent
        self._statelog = statelog
        self._tracker = tracker
        self._lost_changes = lost_changes
        self._checkpoint = checkpoint
        self._verifier = verifier
        self._quiesce = quiesce
        self._applied = FIRST_SEQ - 1
        self._own_seq = FIRST_SEQ - 1  # the last record this replica published as the executor
        self._records: dict[int, LogRecord] = {}  # arrived, not yet applied (waiting for the ones before)
        self._record_arrived = asyncio.Event()
        self._reload_due = False

    @property
    def applied(self) -> int:
        """The last log record whose state this replica holds (applied here, or published by it)."""
        return self._applied

    def ran_last_cell(self) -> bool:
        """Whether the last record this replica holds is its own (it ran the last cell)."""
        return self._applied == self._own_seq

    def own_record(self, seq: int, names: Iterable[str]) -> None:
        """This replica publishes record ``seq`` (its own cell, which changed ``names``). The namespace already holds
        the cell's effects, so the record counts as applied here at once (the publication transaction reports it to
        etcd)."""
        self._applied = max(self._applied, seq)
        self._own_seq = seq
        self._checkpoint.note_touched(seq, names)

    # -- restore ---------------------------------------------------------------------------------------

    def restore(self) -> int:
        """Load the checkpoint and the log records after it into the namespace; returns the etcd revision
        the log was read at (watch from the next one)."""
        snapshot = self._agent.read_snapshot()
        self._checkpoint.forget()
        if snapshot.checkpoint is not None:
            self._checkpoint.checkpointed(snapshot.checkpoint.seq)
            checkpoint = self._statelog.read_checkpoint(snapshot.checkpoint)
            for record in checkpoint.records:
                self._tracker.apply(record, self._statelog.store)
            self._applied = snapshot.checkpoint.seq
            self._checkpoint.learned(checkpoint.seq, checkpoint.parts or None)
        for rec in sorted(snapshot.records, key=lambda r: r.seq):
            if rec.seq == self._applied + 1:
                self._apply_one(rec)
            elif rec.seq > self._applied + 1:
                self._records[rec.seq] = rec  # a gap: wait for the router to close it
        self._tracker.reset()
        log.info(
            "restored %d names up to log seq %d (checkpoint %s, %d records)",
            len(self._tracker.user_names()),
            self._applied,
            snapshot.checkpoint.seq if snapshot.checkpoint else "none",
            len(snapshot.records),
        )
        return snapshot.revision

    # -- following the log -----------------------------------------------------------------------------

    def on_record(self, record: LogRecord) -> None:
        """A log record arrived (called on the coordination thread)."""
        if record.seq <= self._applied:
            # Our own record coming back (or one a restore covered): _queue_record would drop it, so do not
            # wake the kernel's loop for it. A stale read of ``applied`` only means a wasted wake-up.
            return
        loop = self._kernel.io_loop
        assert loop is not None
        loop.add_callback(self._queue_record, record)

    def _queue_record(self, record: LogRecord) -> None:
        if record.seq <= self._applied:
            return  # our own record, or one a restore already covered
        self._records[record.seq] = record
        self._record_arrived.set()
        self._kernel.schedule_dispatch(self._apply_ready)

    async def _apply_ready(self) -> None:
        """Apply every record that is next in line (a dispatch: runs between shell requests)."""
        await self._quiesce()
        self._apply_pending()

    def _apply_pending(self) -> None:
        applied = self._applied
        while (record := self._records.pop(self._applied + 1, None)) is not None:
            self._apply_one(record)
        for seq in [s for s in self._records if s <= self._applied]:
            del self._records[seq]
        if self._applied > applied:
            self._verifier.prepare_baseline()

    def _apply_one(self, record: LogRecord) -> None:
        started = time.perf_counter()
        namespace = self._kernel.namespace
        if record.kind == "lost" and record.unserializable:
            # Its executor kept these but could not upload them: a marker here, never a stale value.
            reason = f"log record {record.seq}: its executor could not upload these names to the object store"
            for name in record.unserializable:
                namespace[name] = UnreplicatedValue(name, reason)
            self._tracker.refresh(list(record.unserializable))
            self._lost_changes.add(record.seq, list(record.unserializable), "the object store refused them")
        elif record.kind == "lost":
            self._lost_changes.add(record.seq, [*record.names, *record.deleted], "its replica stopped first")
        elif record.kind == "malformed":
            self._lost_changes.add_unreadable(record.seq)
        else:
            self._lost_changes.forget_before(record.seq)
        changed = None if record.kind == "malformed" else [*record.names, *record.deleted, *record.unserializable]
        self._checkpoint.note_touched(record.seq, changed)
        if record.kind == "delta":
            try:
                state = self._statelog.load(record)
                if state is not None:
                    self._tracker.apply(state, self._statelog.store)
            except Exception as exc:
                # The names exist on the executor; here they explain why they cannot be used.
                reason = f"applying log record {record.seq} failed: {type(exc).__name__}: {exc}"
                log.error("%s (names %s)", reason, ", ".join(record.names))
                for name in record.deleted:
                    namespace.pop(name, None)
                for name in [*record.names, *record.unserializable]:
                    namespace[name] = UnreplicatedValue(name, reason)
                self._tracker.refresh([*record.names, *record.deleted])
        self._applied = record.seq
        self._agent.report_applied(record.seq)
        log.debug(
            "applied record %d (%s) in %.1f ms",
            record.seq,
            record.kind,
            (time.perf_counter() - started) * 1e3,
        )

    async def catch_up(self, target: int) -> bool:
        """Apply records until ``target`` is applied; False if they do not arrive within CATCH_UP_TIMEOUT."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CATCH_UP_TIMEOUT
        while True:
            # A baseline taken or a verification begun while this waited reads the namespace: it stops first.
            self._verifier.stop()
            self._apply_pending()
            if self._applied >= target:
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            self._record_arrived.clear()
            await wait_event(self._record_arrived, min(remaining, 1.0))

    # -- reloading after a refused publication -----------------------------------------------------------

    @property
    def reload_due(self) -> bool:
        """Whether the namespace is to be reloaded from the log (see :meth:`reload_later`)."""
        return self._reload_due

    def reload_later(self) -> None:
        """This replica's own record was refused (or its publication failed): its namespace now differs from the
        log. The next :meth:`reload_if_due` reloads it; nothing else reads it meanwhile."""
        self._reload_due = True

    def reload_if_due(self) -> None:
        """Reload the namespace from the checkpoint and the log, if a refused publication asked for it."""
        if not self._reload_due:
            return
        self._reload_due = False
        namespace = self._kernel.namespace
        for name in self._tracker.user_names():
            namespace.pop(name, None)
        self._applied = FIRST_SEQ - 1
        self._tracker.reset()
        self._tracker.lineage.clear()  # the memory the other replicas' patches were for is gone
        self.restore()
        self._apply_pending()
        self._agent.report_applied(self._applied)
        self._verifier.prepare_baseline()
