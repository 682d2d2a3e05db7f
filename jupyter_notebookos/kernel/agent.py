"""The replica's side of etcd: its lease, its registration, the state log and its checkpoints.

Everything here runs on a dedicated thread with its own asyncio loop (:class:`CoordinationThread`), never on
the kernel's main loop: user code blocks that loop for as long as a cell runs (a training loop, minutes), and
the lease must be renewed meanwhile, or the replica would be declared dead in the middle of a cell.

The kernel's main thread calls the blocking methods of :class:`ReplicaAgent` at start-up, and hands it the
post-reply publication as a future; log records seen by the watch come back through a callback that the
kernel turns into work on its own loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from jupyter_notebookos.coordination import election
from jupyter_notebookos.coordination.client import Coordinator
from jupyter_notebookos.coordination.errors import (
    CoordinationError,
    EtcdFull,
    EtcdUnavailable,
    LeaseLost,
    PermissionDenied,
    QuorumLost,
)
from jupyter_notebookos.coordination.keys import KeyLayout
from jupyter_notebookos.coordination.kv import EventType
from jupyter_notebookos.coordination.lease import Lease
from jupyter_notebookos.coordination.txn import Compare, Op
from jupyter_notebookos.kernel.keepalive import LeaseKeeper
from jupyter_notebookos.kernel.settings import ReplicaSettings
from jupyter_notebookos.replication.protocol import (
    FIRST_SEQ,
    CheckpointPointer,
    LogRecord,
    ReplicaRegistration,
)

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: Most log records one checkpoint transaction deletes (etcd refuses transactions of more than 128 ops).
MAX_DELETES_PER_TXN = 100
#: Longest pause between two tries of a publication while etcd is unreachable (it keeps trying while the replica
#: lives: giving up would leave the cell's seq open and the namespace differing from the log).
PUBLISH_RETRY_MAX_S = 2.0
#: Least time between two puts of a follower's applied seq. The first report after a quiet spell goes out at
#: once; during a burst of cells the reports coalesce, so a follower writes to etcd a few times a second
#: instead of once per cell. Every applied put is an etcd write plus a watch event for the gateway, and on a
#: busy host those compete with the cell in flight for the same cores.
APPLIED_REPORT_INTERVAL = 0.1
#: Most records held back for one transaction.
MAX_HELD_RECORDS = 32
#: How long a replica whose lease etcd ended keeps trying to register again before it gives up and exits.
REJOIN_SECONDS = 60.0


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


class CoordinationThread:
    """A daemon thread running an asyncio loop for the etcd client."""

    def __init__(self, name: str = "notebookos-etcd") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self) -> None:
        """Start the thread (idempotent)."""
        if not self._thread.is_alive():
            self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        """Run ``coro`` on the loop; returns its future (safe from any thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, _T], timeout: float | None = None) -> _T:
        """Run ``coro`` on the loop and wait for its result (never call this from the loop itself)."""
        return self.submit(coro).result(timeout)


@dataclass(frozen=True)
class LogSnapshot:
    """The kernel's checkpoint pointer and the log records after it, read at one etcd revision."""

    checkpoint: CheckpointPointer | None
    records: list[LogRecord]
    revision: int


@dataclass(frozen=True)
class PublishOutcome:
    """What became of a publication: written, or refused (with the reason, in words)."""

    seq: int
    written: bool
    reason: str = ""


class ReplicaAgent:
    """One replica's etcd presence. Create, :meth:`connect`, then use; all blocking calls are thread-safe.

    ``on_fatal(message)`` is called (on the coordination thread) when the replica must stop at once: etcd
    ended its lease and it could not register again, or its log watch failed; the cluster replaces it. An
    etcd outage alone never ends it (see :meth:`_watchdog`).
    """

    def __init__(self, settings: ReplicaSettings, on_fatal: Callable[[str], None]) -> None:
        self.settings = settings
        self.keys = KeyLayout(settings.etcd_prefix)
        self.kid = settings.kernel_id
        self.rid = settings.replica_id
        self.thread = CoordinationThread()
        self.coordinator: Coordinator | None = None
        self.lease: Lease | None = None
        self._keeper: LeaseKeeper | None = None  # renews the lease while a cell holds the GIL
        self._on_fatal = on_fatal
        self._stopping = False
        self._applied_target = FIRST_SEQ - 1
        self._applied_reported = FIRST_SEQ - 1
        self._applied_wakeup: asyncio.Event | None = None
        self._publish_lock: asyncio.Lock | None = None
        self._held: list[tuple[LogRecord, int, asyncio.Future[PublishOutcome]]] = []  # (record, fence, written)
        self._hold_timer: asyncio.TimerHandle | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self.registration: ReplicaRegistration | None = None

    # -- start-up (blocking, from the main thread) ----------------------------------------------------

    def connect(self, timeout: float = 5.0, within: float = 20.0) -> None:
        """Connect to etcd and take a lease, kept alive and watched from now on.

        ``timeout`` bounds each etcd call from now on; reaching etcd at start may take up to ``within`` seconds
        of attempts, so that a replica started during an etcd election, or on a host whose network is still
        settling, waits it out instead of failing the kernel's start.

        Raises:
            EtcdUnavailable, QuorumLost: etcd cannot be reached or cannot grant a lease within ``within`` s.
        """
        self.thread.start()
        self.thread.run(self._connect(timeout, within), within + timeout + 5)

    async def _connect(self, timeout: float, within: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            try:
                self.coordinator = await Coordinator.connect(
                    self.settings.etcd_endpoints,
                    prefix=self.settings.etcd_prefix,
                    timeout=timeout,
                    tls=self.settings.etcd_tls,
                    credentials=self.settings.etcd_credentials,
                )
                self.lease = await self.coordinator.grant_lease(self.settings.lease_ttl)
                break
            except (EtcdUnavailable, QuorumLost) as err:
                if self.coordinator is not None:
                    await self.coordinator.close()
                    self.coordinator = None
                if loop.time() + 1.0 >= deadline:
                    raise
                log.warning("etcd not reachable yet (%s); trying again", err)
                await asyncio.sleep(1.0)
        self._applied_wakeup = asyncio.Event()
        self._publish_lock = asyncio.Lock()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._watchdog(), name="lease watchdog"))
        self._tasks.append(loop.create_task(self._report_applied_loop(), name="applied reporter"))

    def keep_lease_from_helper(self) -> None:
        """Have a lease keeper (:mod:`.keepalive`) renew the lease too, from now on (idempotent; a keeper that
        exited is started again).

        Called by the main thread when the replica first runs a cell, not at its start: a kernel's start pays
        nothing for it, and replicas that only follow the log do not hold the GIL for seconds. It starts here, not
        on the coordination thread, which could not run while the cell holds the GIL; the helper dies with the
        main thread, that is with the process."""
        lease = self.lease
        if lease is None or self._stopping:
            return
        if self._keeper is not None:
            if self._keeper.alive():
                return
            log.warning("the lease keeper exited (killed?); starting it again")
            self._keeper.stop()  # (reaps it)
        self._keeper = LeaseKeeper.start(lease.id)
        now = self.lease
        if self._keeper is not None and now is not None and now is not lease:
            self._keeper.follow(now.id)  # registered again meanwhile (_rejoin saw no keeper yet)

    def read_snapshot(self) -> LogSnapshot:
        """The checkpoint pointer and every log record after it, in one consistent read."""
        return self.thread.run(self._read_snapshot(), 30)

    async def _read_snapshot(self) -> LogSnapshot:
        co = self._co()
        result = await co.txn(
            compare=[],
            success=[
                Op.get(self.keys.checkpoint(self.kid)),
                Op.get(self.keys.log_prefix(self.kid), prefix=True),
            ],
        )
        ckpt_items, log_items = result.results[0].items, result.results[1].items
        pointer = CheckpointPointer.from_json(ckpt_items[0].value) if ckpt_items else None
        after = pointer.seq if pointer is not None else FIRST_SEQ - 1
        records = [r for kv in log_items if (r := parse_log_record(kv.key, kv.value)) is not None]
        return LogSnapshot(pointer, [r for r in records if r.seq > after], result.revision)

    async def referenced_objects(self) -> tuple[int | None, set[str]]:
        """The seq of the kernel's checkpoint (None without one) and the object-store keys that the checkpoint
        and every record still in the log name: what garbage collection must keep (coordination thread).

        Every record still in the log, not only those after the checkpoint: a follower may not have applied
        the ones the checkpoint covers yet (they are deleted only once every replica has)."""
        result = await self._co().txn(
            compare=[],
            success=[
                Op.get(self.keys.checkpoint(self.kid)),
                Op.get(self.keys.log_prefix(self.kid), prefix=True),
            ],
        )
        ckpt_items, log_items = result.results[0].items, result.results[1].items
        pointer = CheckpointPointer.from_json(ckpt_items[0].value) if ckpt_items else None
        keys = {pointer.ref, *pointer.objects} if pointer is not None else set()
        for kv in log_items:
            record = parse_log_record(kv.key, kv.value)
            keys.update(record.objects if record is not None else ())
        return (pointer.seq if pointer is not None else None), keys

    def register(self, registration: ReplicaRegistration) -> None:
        """Put the registration (bound to the lease): from now on the router may use this replica."""
        self.thread.run(self._register(registration), 30)

    async def _register(self, registration: ReplicaRegistration) -> None:
        co = self._co()
        await co.txn(
            compare=[],
            success=[
                Op.put(self.keys.replica(self.kid, self.rid), registration.to_json(), lease=self.lease),
                Op.put(self.keys.applied(self.kid, self.rid), str(registration.applied_seq), lease=self.lease),
            ],
        )
        self.registration = registration  # what _rejoin puts again after an etcd outage
        self._applied_reported = max(self._applied_reported, registration.applied_seq)

    def follow(self, start_revision: int, on_record: Callable[[LogRecord], None]) -> None:
        """Deliver every log record put from ``start_revision`` on to ``on_record`` (coordination thread)."""
        self.thread.run(self._follow(start_revision, on_record), 30)

    async def _follow(self, start_revision: int, on_record: Callable[[LogRecord], None]) -> None:
        watch = self._co().watch_prefix(self.keys.log_prefix(self.kid), start_revision=start_revision)
        await watch.ready(timeout=10)

        async def pump() -> None:
            try:
                async for event in watch:
                    if event.type is EventType.PUT:
                        record = parse_log_record(event.key, event.value)
                        if record is not None:
                            on_record(record)
            except CoordinationError as exc:
                if not self._stopping:
                    self._fatal(f"lost the watch on the state log ({exc}); this replica cannot stay in step")

        self._tasks.append(asyncio.get_running_loop().create_task(pump(), name="log watch"))

    # -- the cell protocol -----------------------------------------------------------------------------

    def report_applied(self, seq: int) -> None:
        """Note that every record up to ``seq`` is applied; the put happens in the background, coalesced."""
        self.thread.loop.call_soon_threadsafe(self._set_applied_target, seq)

    def _set_applied_target(self, seq: int) -> None:
        self._applied_target = max(self._applied_target, seq)
        if self._applied_wakeup is not None:
            self._applied_wakeup.set()

    async def _report_applied_loop(self) -> None:
        assert self._applied_wakeup is not None
        loop = asyncio.get_running_loop()
        last_put = -APPLIED_REPORT_INTERVAL
        while True:
            await self._applied_wakeup.wait()
            self._applied_wakeup.clear()
            while self._applied_target > self._applied_reported and not self._stopping:
                pause = last_put + APPLIED_REPORT_INTERVAL - loop.time()
                if pause > 0:
                    await asyncio.sleep(pause)  # records applied meanwhile ride along in this put
                target = self._applied_target
                if target <= self._applied_reported:
                    break  # a publication of ours reported it meanwhile
                try:
                    # A transaction, not a plain put: etcd refuses a plain put bound to a lease that also holds
                    # keys this kernel's etcd user may not write (the router's GPU-ledger entries).
                    await self._co().txn(
                        [], [Op.put(self.keys.applied(self.kid, self.rid), str(target), lease=self.lease)]
                    )
                    self._applied_reported = max(self._applied_reported, target)
                except CoordinationError as exc:
                    log.warning("could not report applied seq %d (will retry): %s", target, exc)
                    await asyncio.sleep(0.2)
                last_put = loop.time()

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
        assert self._publish_lock is not None
        async with self._publish_lock:  # records go out in the order their cells ran
            if self._held and self._held[0][1] != fence:
                await self._write_held()  # a new executor term: the older records go on their own
            written: asyncio.Future[PublishOutcome] = asyncio.get_running_loop().create_future()
            self._held.append((record, fence, written))
            if not hold or len(self._held) >= MAX_HELD_RECORDS or not self.settings.hold_empty_records_ms:
                await self._write_held()
            elif self._hold_timer is None:
                delay = self.settings.hold_empty_records_ms / 1000
                self._hold_timer = asyncio.get_running_loop().call_later(delay, self._held_due)
        return await written

    async def flush_held(self) -> None:
        """Write the records held back now (before a checkpoint, or at shutdown)."""
        assert self._publish_lock is not None
        async with self._publish_lock:
            await self._write_held()

    def _held_due(self) -> None:
        self._hold_timer = None
        task = asyncio.get_running_loop().create_task(self.flush_held(), name="held records")
        self._tasks.append(task)
        task.add_done_callback(self._tasks.remove)

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
        co = self._co()
        log_keys = [self.keys.log_record(self.kid, r.seq) for r in records]
        executor_key = self.keys.executor(self.kid)
        last = records[-1].seq
        pause = 0.2
        term = [election.fence(executor_key, fence)]
        term_ended = False  # whether the executor term ended with our lease (and `term` says so)
        while True:
            lease = self.lease
            try:
                result = await co.txn(
                    compare=[*term, *map(Compare.absent, log_keys)],
                    success=[
                        *(Op.put(k, r.to_json()) for k, r in zip(log_keys, records, strict=True)),
                        Op.put(self.keys.applied(self.kid, self.rid), str(last), lease=lease),
                    ],
                    failure=[Op.get(executor_key), *map(Op.get, log_keys)],
                )
            except (EtcdUnavailable, QuorumLost, EtcdFull, LeaseLost) as exc:
                # etcd unreachable, restarting, out of quorum or full, or our lease ended in a long outage (the
                # watchdog registers again with a new one): the record goes out when etcd is back, fenced as before.
                if self._stopping:
                    return [PublishOutcome(r.seq, False, f"etcd unavailable: {exc}") for r in records]
                log.warning("publishing records %d..%d: %s; retrying", records[0].seq, last, exc)
                await asyncio.sleep(pause)
                pause = min(pause * 2, PUBLISH_RETRY_MAX_S)
                if isinstance(exc, LeaseLost):
                    await self._lease_other_than(lease)
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
                if self._stopping:
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
            term = [Compare.absent(executor_key), Compare.present(self.keys.replica(self.kid, self.rid))]
            term_ended = True
        if result.succeeded:
            self._applied_reported = max(self._applied_reported, last)
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
            self._set_applied_target(max(ours))
        if len(records) > 1:
            # Something in the batch did not hold: each record not written yet goes on its own (and says why).
            return [
                o if o.written else (await self._publish([r], fence))[0] for r, o in zip(records, outcomes, strict=True)
            ]
        return outcomes

    def _term_renewed_for_us(self, executor_key: str, executor_items: list[Any], term: list[Compare]) -> int | None:
        """The fence of the executor term in force, if the router opened it for this very process (the key names
        this replica and is bound to its current lease, which no other process holds) and ``term`` is not it."""
        if not executor_items or self.lease is None:
            return None
        current = executor_items[0]
        if current.text != self.rid or current.lease != self.lease.id:
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
        co = self._co()
        result = await co.txn(
            compare=[],
            success=[
                Op.get(self.keys.log_prefix(self.kid), prefix=True),
                Op.get(self.keys.replicas_prefix(self.kid), prefix=True),
                Op.get(self.keys.applied_prefix(self.kid), prefix=True),
                Op.get(self.keys.checkpoint(self.kid)),
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
        co = self._co()
        key = self.keys.checkpoint(self.kid)
        current = await co.get(key)
        if current is not None and CheckpointPointer.from_json(current.value).seq >= pointer.seq:
            return False
        result = await co.txn(
            compare=[
                election.fence(self.keys.executor(self.kid), fence),
                Compare.mod_revision(key, "==", current.mod_revision if current is not None else 0),
                Compare.present(self.keys.log_record(self.kid, pointer.seq)),
            ],
            success=[Op.put(key, pointer.to_json())] + [Op.delete(self.keys.log_record(self.kid, s)) for s in delete],
        )
        return result.succeeded

    # -- the end ---------------------------------------------------------------------------------------

    def revoke(self, timeout: float = 2.0) -> None:
        """Revoke the lease (registration, applied and GPU keys vanish at once) and stop."""
        self._stopping = True
        if self._keeper is not None:
            self._keeper.stop()  # before the revoke: nothing renews the lease any more
        try:
            self.thread.run(self._revoke(timeout), timeout + 1)
        except Exception as exc:
            log.warning("could not revoke lease cleanly (its keys expire with its TTL): %s", exc)

    async def _revoke(self, timeout: float) -> None:
        for task in self._tasks:
            task.cancel()
        try:
            if self.lease is not None:
                await self.lease.revoke(timeout=timeout)
        except PermissionDenied:
            # The router's GPU-ledger entries of a cell are still bound to our lease, and this kernel's etcd user
            # may not delete them: the lease (and they) end with its TTL instead.
            log.info("lease held GPU-ledger entries; it expires with its TTL")
        finally:
            if self.coordinator is not None:
                await self.coordinator.close()

    # -- internals -------------------------------------------------------------------------------------

    def _co(self) -> Coordinator:
        if self.coordinator is None:
            raise RuntimeError("ReplicaAgent.connect() was not called")
        return self.coordinator

    async def _watchdog(self) -> None:
        """Keep the replica through etcd outages; rejoin when etcd says the lease is gone (see :meth:`_rejoin`).

        An unconfirmed lease is not a dead replica: etcd may be stopped, restarting or out of quorum, and then
        nobody can take this replica's place either (fencing keeps it from writing meanwhile). Only etcd's own
        word that the lease is gone counts, and even then the process keeps its memory and registers again.
        """
        loop = asyncio.get_running_loop()
        unconfirmed_since: float | None = None
        while not self._stopping:
            await asyncio.sleep(0.2)
            lease = self.lease
            if self._stopping or lease is None:
                return
            if lease.lost.is_set():
                if not await self._rejoin(lease):
                    return
                unconfirmed_since = None
                continue
            if loop.time() > lease.confirmed_until and unconfirmed_since is None:
                unconfirmed_since = loop.time()
                log.warning(
                    "etcd has not confirmed lease %x for longer than its %d s TTL (etcd unreachable at %s); this "
                    "replica keeps its state and serves again when etcd is back",
                    lease.id,
                    lease.ttl,
                    ", ".join(self.settings.etcd_endpoints),
                )
            elif loop.time() <= lease.confirmed_until and unconfirmed_since is not None:
                log.info("etcd confirmed lease %x again after %.1f s", lease.id, loop.time() - unconfirmed_since)
                unconfirmed_since = None

    async def _lease_other_than(self, lease: Lease | None) -> None:
        """Wait until the watchdog holds a lease other than ``lease`` (it rejoined), or the replica stops."""
        while self.lease is lease and not self._stopping:
            await asyncio.sleep(0.2)

    async def _rejoin(self, old: Lease) -> bool:
        """etcd ended our lease (an outage outlived it): take a new one and register again with the same state.

        The gateway waits a while for a replica whose lease ended while its process lives, and replaces it only
        if it does not come back; a replaced replica's process is stopped by the gateway. Returns False (after
        ending the replica) when etcd does not let it register again within :data:`REJOIN_SECONDS`.
        """
        co = self._co()
        log.warning("etcd lease %x is gone (%s): registering again with this replica's state", old.id, old.lost_reason)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REJOIN_SECONDS
        while not self._stopping:
            try:
                lease = await co.grant_lease(self.settings.lease_ttl)
                try:
                    await self._put_registration(lease)
                except BaseException:
                    with contextlib.suppress(CoordinationError):
                        await lease.revoke()
                    raise
            except CoordinationError as exc:
                if loop.time() > deadline:
                    self._fatal(
                        f"etcd lease {old.id:x} is gone ({old.lost_reason}) and registering again failed: {exc}"
                    )
                    return False
                log.warning("registering again failed (will retry): %s", exc)
                await asyncio.sleep(0.5)
                continue
            self.lease = lease
            if self._keeper is not None:
                self._keeper.follow(lease.id)
            log.info("registered again with lease %x at applied seq %d", lease.id, self._applied_reported)
            return True
        return False

    async def _put_registration(self, lease: Lease) -> None:
        """Put this replica's registration and applied seq, bound to ``lease``, unless the key is taken."""
        assert self.registration is not None
        self.registration = dataclasses.replace(
            self.registration, lease=lease.id, applied_seq=max(self._applied_reported, FIRST_SEQ - 1)
        )
        await self._co().txn(
            compare=[Compare.absent(self.keys.replica(self.kid, self.rid))],
            success=[
                Op.put(self.keys.replica(self.kid, self.rid), self.registration.to_json(), lease=lease),
                Op.put(self.keys.applied(self.kid, self.rid), str(self.registration.applied_seq), lease=lease),
            ],
            raise_on_failure=True,
        )

    def _fatal(self, reason: str) -> None:
        if self._stopping:
            return
        self._stopping = True
        self._on_fatal(
            f"NotebookOS replica {self.rid} of kernel {self.kid} stops: {reason}. It counts as dead; the "
            "gateway replaces it from the other replicas' state."
        )
