"""``LogWriter``: this replica's writes to the kernel's state log in etcd, each fenced on the executor's term.

A cell's record goes out in one transaction fenced on the executor key's create revision
(``coordination/election.py``), with this replica's applied seq; records that change nothing are held back a moment
and go out together. A checkpoint's pointer goes in, and the records it covers go out, in one transaction fenced the
same way. The writer runs on the replica's coordination thread (``kernel/agent.py``) and asks the replica's etcd
presence (:class:`LeaseHolder`, the agent) only for what belongs to it: the lease held now, with which the applied
seq is put, and whether the replica is stopping.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from jupyter_notebookos.coordination import election
from jupyter_notebookos.coordination.client import Coordinator
from jupyter_notebookos.coordination.errors import EtcdFull, EtcdUnavailable, LeaseLost, QuorumLost
from jupyter_notebookos.coordination.keys import KeyLayout
from jupyter_notebookos.coordination.lease import Lease
from jupyter_notebookos.coordination.txn import Compare, Op
from jupyter_notebookos.kernel.loop import CoordinationThread
from jupyter_notebookos.kernel.settings import ReplicaSettings
from jupyter_notebookos.replication.protocol import (
    FIRST_SEQ,
    CheckpointPointer,
    LogRecord,
    ReplicaRegistration,
)

log = logging.getLogger(__name__)

#: Most log records one checkpoint transaction deletes (etcd refuses transactions of more than 128 ops).
MAX_DELETES_PER_TXN = 100
#: Longest pause between two tries of a publication while etcd is unreachable (it keeps trying while the replica
#: lives: giving up would leave the cell's seq open and the namespace differing from the log).
PUBLISH_RETRY_MAX_S = 2.0
#: Most records held back for one transaction.
MAX_HELD_RECORDS = 32


def parse_log_record(key: str, value: bytes | str) -> LogRecord | None:
    """The log record stored at ``key``; a malformed one (not JSON, wrong fields, another seq than its key's)
    becomes a ``malformed`` record for that seq, so followers and restores step over it and tell the user, instead
    of stopping or waiting for a seq that never comes. None when not even the key names a seq."""
    try:
        seq = int(KeyLayout.last_segment(key))
    except ValueError:
        log.error("ignoring %s in the state log: not a log record key", key)
        return None
    try:
        record = LogRecord.from_json(value)
        if not isinstance(record.seq, int) or record.seq != seq or record.kind not in ("delta", "lost"):
            raise ValueError(f"it names seq {record.seq!r} and kind {record.kind!r}")
        return record
    except (ValueError, TypeError) as exc:
        log.error("log record %d at %s is malformed (%s): its changes cannot be applied here", seq, key, exc)
        return LogRecord(seq=seq, kind="malformed", msg_id="", replica_id="")


async def read_log(
    coordinator: Coordinator, keys: KeyLayout, kernel_id: str
) -> tuple[CheckpointPointer | None, list[LogRecord], int]:
    """The kernel's checkpoint pointer and every record in its log, read in one transaction (one revision, which is
    returned too: a watch from the next one misses nothing)."""
    result = await coordinator.txn(
        compare=[],
        success=[Op.get(keys.checkpoint(kernel_id)), Op.get(keys.log_prefix(kernel_id), prefix=True)],
    )
    ckpt_items, log_items = result.results[0].items, result.results[1].items
    pointer = CheckpointPointer.from_json(ckpt_items[0].value) if ckpt_items else None
    records = [r for kv in log_items if (r := parse_log_record(kv.key, kv.value)) is not None]
    return pointer, records, result.revision


@dataclass(frozen=True)
class PublishOutcome:
    """What became of a publication: written, or refused (with the reason, in words)."""

    seq: int
    written: bool
    reason: str = ""


class LeaseHolder(Protocol):
    """What the log writer asks of the replica's etcd presence (:class:`~jupyter_notebookos.kernel.agent.ReplicaAgent`),
    on the coordination thread."""

    @property
    def lease(self) -> Lease | None:
        """The lease held now (another one once the replica registered again after etcd ended its lease)."""
        ...

    @property
    def stopping(self) -> bool:
        """Whether the replica stops: a publication no longer waits for etcd."""
        ...

    async def lease_other_than(self, lease: Lease | None) -> None:
        """Wait until the replica holds a lease other than ``lease`` (it registered again), or stops."""
        ...

    def applied_written(self, seq: int) -> None:
        """A publication put this replica's applied seq ``seq``, with the lease held then."""
        ...

    def applied_due(self, seq: int) -> None:
        """Put applied seq ``seq`` (again, if a put of it went with an ended lease) with the lease held now, in the
        background."""
        ...


class LogWriter:
    """Publishes this replica's records and commits its checkpoints, fenced (see the module's docstring).

    Built by the replica's agent once it reached etcd, which hands it to the parts that write the log
    (:class:`~jupyter_notebookos.kernel.publisher.CellPublisher`,
    :class:`~jupyter_notebookos.kernel.checkpointer.Checkpointer`); its coroutines run on :attr:`thread`.
    """

    def __init__(
        self,
        thread: CoordinationThread,
        coordinator: Coordinator,
        keys: KeyLayout,
        settings: ReplicaSettings,
        holder: LeaseHolder,
    ) -> None:
        self._thread = thread
        self._coordinator = coordinator
        self._keys = keys
        self._settings = settings
        self._kid = settings.kernel_id
        self._rid = settings.replica_id
        self._holder = holder
        self._publish_lock = asyncio.Lock()
        self._held: list[tuple[LogRecord, int, asyncio.Future[PublishOutcome]]] = []  # (record, fence, written)
        self._hold_timer: asyncio.TimerHandle | None = None
        self._flushes: list[asyncio.Task[None]] = []  # flushes of held records under way

    @property
    def thread(self) -> CoordinationThread:
        """The coordination thread, whose loop runs this writer's coroutines."""
        return self._thread

    async def publish(self, record: LogRecord, fence: int, *, hold: bool = False) -> PublishOutcome:
        """Write ``record`` in one transaction fenced on the executor key's create_revision.

        The same transaction puts this replica's applied seq (the executor applied its own record). Retried
        while etcd is unreachable; the compare on the record's absence makes a retry safe.

        ``hold``: the record changes nothing (a cell that bound no name). It waits up to
        ``settings.hold_empty_records_ms`` (``NOTEBOOKOS_HOLD_EMPTY_RECORDS_MS``, default 100; 0: not held) and
        goes out with the next record or with the others held meanwhile, in one transaction: a burst of such
        cells costs etcd (and every follower's watch) one write, not one per cell. Losing a held record loses
        no state: if this replica dies first, the router closes its seq as ``lost``, which followers apply the
        same way (nothing changes).
        """
        async with self._publish_lock:  # records go out in the order their cells ran
            if self._held and self._held[0][1] != fence:
                await self._write_held()  # a new executor term: the older records go on their own
            written: asyncio.Future[PublishOutcome] = asyncio.get_running_loop().create_future()
            self._held.append((record, fence, written))
            if not hold or len(self._held) >= MAX_HELD_RECORDS or not self._settings.hold_empty_records_ms:
                await self._write_held()
            elif self._hold_timer is None:
                delay = self._settings.hold_empty_records_ms / 1000
                self._hold_timer = asyncio.get_running_loop().call_later(delay, self._held_due)
        return await written

    async def flush_held(self) -> None:
        """Write the records held back now (before a checkpoint, or at shutdown)."""
        async with self._publish_lock:
            await self._write_held()

    def _held_due(self) -> None:
        self._hold_timer = None
        task = asyncio.get_running_loop().create_task(self.flush_held(), name="held records")
        self._flushes.append(task)
        task.add_done_callback(self._flushes.remove)

    async def _write_held(self) -> None:
        """Write every held record in one transaction and resolve their futures (under the publish lock)."""
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        held, self._held = self._held, []
        if not held:
            return
        try:
            outcomes = await self._publish([r for r, _, _ in held], held[0][1])
        except Exception as exc:  # LeaseLost: each publisher hears of it
            for _, _, written in held:
                if not written.done():
                    written.set_exception(exc)
            return
        for (_, _, written), outcome in zip(held, outcomes, strict=True):
            if not written.done():
                written.set_result(outcome)

    async def _publish(self, records: list[LogRecord], fence: int) -> list[PublishOutcome]:
        co = self._coordinator
        log_keys = [self._keys.log_record(self._kid, r.seq) for r in records]
        executor_key = self._keys.executor(self._kid)
        last = records[-1].seq
        pause = 0.2
        term = [election.fence(executor_key, fence)]
        term_ended = False  # whether the executor term ended with our lease (and `term` says so)
        while True:
            lease = self._holder.lease
            try:
                result = await co.txn(
                    compare=[*term, *map(Compare.absent, log_keys)],
                    success=[
                        *(Op.put(k, r.to_json()) for k, r in zip(log_keys, records, strict=True)),
                        Op.put(self._keys.applied(self._kid, self._rid), str(last), lease=lease),
                    ],
                    failure=[Op.get(executor_key), *map(Op.get, log_keys)],
                )
            except (EtcdUnavailable, QuorumLost, EtcdFull, LeaseLost) as exc:
                # etcd unreachable, restarting, out of quorum or full, or our lease ended in a long outage (the
                # watchdog registers again with a new one): the record goes out when etcd is back, fenced as before.
                if self._holder.stopping:
                    return [PublishOutcome(r.seq, False, f"etcd unavailable: {exc}") for r in records]
                log.warning("publishing records %d..%d: %s; retrying", records[0].seq, last, exc)
                await asyncio.sleep(pause)
                pause = min(pause * 2, PUBLISH_RETRY_MAX_S)
                if isinstance(exc, LeaseLost):
                    await self._holder.lease_other_than(lease)
                continue
            if result.succeeded or any(r.items for r in result.results[1:]):
                break  # written; or someone wrote a record (an earlier attempt of ours, or the router: lost)
            renewed = self._term_renewed_for_us(executor_key, result.results[0].items, term)
            if renewed is not None:
                # Our lease ended with the term (an etcd outage outlived it) and the router, seeing the same
                # process register again, opened the next cell's term for it before these records went out: they
                # are this replica's own and still the log's next ones, so they go out in that term. (Refusing
                # them made the replica reload its state without this cell: its changes were lost.)
                log.info(
                    "records %d..%d: the router opened a new executor term for this replica (fence %d); "
                    "publishing them in it",
                    records[0].seq,
                    last,
                    renewed,
                )
                term, term_ended = [election.fence(executor_key, renewed)], False
                continue
            if result.results[0].items:
                break  # refused for good: a term of another replica (or process) is in force
            if term_ended:
                # No term is in force and no one wrote the records, but this replica is not registered: its lease
                # ended and the watchdog is registering it again (or ends the replica, if etcd does not let it).
                # Giving up here lost the cell's state whenever etcd revoked the lease before this try.
                if self._holder.stopping:
                    break
                await asyncio.sleep(pause)
                pause = min(pause * 2, PUBLISH_RETRY_MAX_S)
                continue
            # The executor key is gone and none of the records is written: the term ended with our lease (an etcd
            # outage outlived it), not with a new executor (the router opens a term for another replica only once
            # that one applied these records from the log, and closes them as lost before replacing us; a term it
            # opens for this process is taken above). The records go out while no term is in force, no one wrote
            # them, and this replica is still registered.
            log.info(
                "records %d..%d: the executor term ended with this replica's lease; publishing them",
                records[0].seq,
                last,
            )
            term = [Compare.absent(executor_key), Compare.present(self._keys.replica(self._kid, self._rid))]
            term_ended = True
        if result.succeeded:
            self._holder.applied_written(last)
            return [PublishOutcome(r.seq, True) for r in records]
        executor_items = result.results[0].items
        outcomes = [
            self._refusal(r, executor_key, executor_items, fence, i.items)
            for r, i in zip(records, result.results[1:], strict=True)
        ]
        ours = [o.seq for o in outcomes if o.written]
        if ours:
            # An earlier attempt of ours was applied after its answer was lost (etcd, paused, resumed with the
            # requests it had queued), and the applied seq it put may have gone with the lease it was bound to (an
            # outage that outlived the lease; the registration put again since says the seq reported before). The
            # reporter puts it again with the lease held now: else the router, which learns from that key that this
            # replica holds the cell's state, waits for it to catch up with its own cell.
            self._holder.applied_due(max(ours))
        if len(records) > 1:
            # Something in the batch did not hold: each record not written yet goes on its own (and says why).
            return [
                o if o.written else (await self._publish([r], fence))[0] for r, o in zip(records, outcomes, strict=True)
            ]
        return outcomes

    def _term_renewed_for_us(self, executor_key: str, executor_items: list[Any], term: list[Compare]) -> int | None:
        """The fence of the executor term in force, if the router opened it for this very process (the key names
        this replica and is bound to its current lease, which no other process holds) and ``term`` is not it."""
        if not executor_items or self._holder.lease is None:
            return None
        current = executor_items[0]
        if current.text != self._rid or current.lease != self._holder.lease.id:
            return None
        if election.fence(executor_key, current.create_revision) in term:
            return None  # that term already failed this write: something else refused it
        return int(current.create_revision)

    @staticmethod
    def _refusal(
        record: LogRecord, executor_key: str, executor_items: list[Any], fence: int, log_items: list[Any]
    ) -> PublishOutcome:
        """Why ``record`` was not written by a refused publication (or that an earlier attempt wrote it)."""
        if log_items:
            existing = parse_log_record(log_items[0].key, log_items[0].value) or LogRecord(
                seq=record.seq, kind="malformed", msg_id="", replica_id=""
            )
            if existing.msg_id == record.msg_id and existing.replica_id == record.replica_id:
                return PublishOutcome(record.seq, True)  # our own earlier attempt got through
            return PublishOutcome(
                record.seq,
                False,
                f"log record {record.seq} already exists (cell {existing.msg_id} by replica {existing.replica_id})",
            )
        return PublishOutcome(record.seq, False, election.term_refusal(executor_key, executor_items, fence))

    async def checkpoint_due(self, head_seq: int, every: int) -> tuple[list[int] | None, CheckpointPointer | None]:
        """The log seqs a checkpoint at ``head_seq`` may delete, when that is at least ``every`` records (else
        None), and the pointer of the kernel's checkpoint now (None without one).

        Records up to the lowest seq every registered replica has applied may go.
        """
        co = self._coordinator
        result = await co.txn(
            compare=[],
            success=[
                Op.get(self._keys.log_prefix(self._kid), prefix=True),
                Op.get(self._keys.replicas_prefix(self._kid), prefix=True),
                Op.get(self._keys.applied_prefix(self._kid), prefix=True),
                Op.get(self._keys.checkpoint(self._kid)),
            ],
        )
        log_items, replica_items, applied_items, checkpoint_items = (r.items for r in result.results)
        current = CheckpointPointer.from_json(checkpoint_items[0].value) if checkpoint_items else None
        applied = {KeyLayout.last_segment(kv.key): int(kv.text) for kv in applied_items}
        floor = head_seq
        for kv in replica_items:
            rid = KeyLayout.last_segment(kv.key)
            try:
                registered = ReplicaRegistration.from_json(kv.value).applied_seq
            except (ValueError, TypeError):
                registered = FIRST_SEQ - 1
            floor = min(floor, max(applied.get(rid, registered), registered))
        deletable = [s for s in (KeyLayout.seq_of(kv.key) for kv in log_items) if s <= floor]
        return (deletable[:MAX_DELETES_PER_TXN] if len(deletable) >= every else None), current

    async def commit_checkpoint(self, pointer: CheckpointPointer, delete: list[int], fence: int) -> bool:
        """Point the kernel's checkpoint key at ``pointer`` and delete records ``delete``, in one txn.

        Fenced like a publication; refused if a newer checkpoint is already in place, or if the record the
        checkpoint covers is not in the log (its publication is still under way, or was refused).
        """
        co = self._coordinator
        key = self._keys.checkpoint(self._kid)
        current = await co.get(key)
        if current is not None and CheckpointPointer.from_json(current.value).seq >= pointer.seq:
            return False
        result = await co.txn(
            compare=[
                election.fence(self._keys.executor(self._kid), fence),
                Compare.mod_revision(key, "==", current.mod_revision if current is not None else 0),
                Compare.present(self._keys.log_record(self._kid, pointer.seq)),
            ],
            success=[Op.put(key, pointer.to_json())] + [Op.delete(self._keys.log_record(self._kid, s)) for s in delete],
        )
        return result.succeeded

    async def referenced_objects(self) -> tuple[int | None, set[str]]:
        """The seq of the kernel's checkpoint (None without one) and the object-store keys that the checkpoint
        and every record still in the log name: what garbage collection must keep (coordination thread).

        Every record still in the log, not only those after the checkpoint: a follower may not have applied
        the ones the checkpoint covers yet (they are deleted only once every replica has)."""
        pointer, records, _ = await read_log(self._coordinator, self._keys, self._kid)
        keys = {pointer.ref, *pointer.objects} if pointer is not None else set()
        for record in records:
            keys.update(record.objects)
        return (pointer.seq if pointer is not None else None), keys

    def stop(self) -> None:
        """Cancel the flushes of held records under way (the replica stops; coordination thread)."""
        for task in self._flushes:
            task.cancel()
