"""The replica's presence in etcd: its lease, its registration and applied seq, the watch on the state log, and
registering again when etcd ended its lease.

Everything here runs on a dedicated thread with its own asyncio loop (:class:`~.loop.CoordinationThread`), never on
the kernel's main loop: user code blocks that loop for as long as a cell runs (a training loop, minutes), and
the lease must be renewed meanwhile, or the replica would be declared dead in the middle of a cell.

The kernel's main thread calls the blocking methods of :class:`ReplicaAgent` at start-up; log records seen by the
watch come back through a callback that the kernel turns into work on its own loop. The writes to the log (each
cell's record, checkpoints) are the :class:`~.logwriter.LogWriter`'s, which the agent builds once it reached etcd
and hands out (:attr:`ReplicaAgent.log_writer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jupyter_notebookos.coordination.client import Coordinator
from jupyter_notebookos.coordination.errors import (
    CoordinationError,
    EtcdUnavailable,
    PermissionDenied,
    QuorumLost,
)
from jupyter_notebookos.coordination.keys import KeyLayout
from jupyter_notebookos.coordination.kv import EventType
from jupyter_notebookos.coordination.lease import Lease
from jupyter_notebookos.coordination.txn import Compare, Op
from jupyter_notebookos.kernel.keepalive import LeaseKeeper
from jupyter_notebookos.kernel.logwriter import LogWriter, parse_log_record, read_log
from jupyter_notebookos.kernel.loop import CoordinationThread
from jupyter_notebookos.kernel.settings import ReplicaSettings
from jupyter_notebookos.replication.protocol import (
    FIRST_SEQ,
    CheckpointPointer,
    LogRecord,
    ReplicaRegistration,
)

log = logging.getLogger(__name__)

#: Least time between two puts of a follower's applied seq. The first report after a quiet spell goes out at
#: once; during a burst of cells the reports coalesce, so a follower writes to etcd a few times a second
#: instead of once per cell. Every applied put is an etcd write plus a watch event for the gateway, and on a
#: busy host those compete with the cell in flight for the same cores.
APPLIED_REPORT_INTERVAL = 0.1
#: How long a replica whose lease etcd ended keeps trying to register again before it gives up and exits.
REJOIN_SECONDS = 60.0


@dataclass(frozen=True)
class LogSnapshot:
    """The kernel's checkpoint pointer and the log records after it, read at one etcd revision."""

    checkpoint: CheckpointPointer | None
    records: list[LogRecord]
    revision: int


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
        self._log_writer: LogWriter | None = None  # built once etcd is reached
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
        self._log_writer = LogWriter(self.thread, self._co(), self.keys, self.settings, self)
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
        pointer, records, revision = await read_log(self._co(), self.keys, self.kid)
        after = pointer.seq if pointer is not None else FIRST_SEQ - 1
        return LogSnapshot(pointer, [r for r in records if r.seq > after], revision)

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

    @property
    def log_writer(self) -> LogWriter:
        """The writer of this replica's records and checkpoints (built once :meth:`connect` reached etcd)."""
        if self._log_writer is None:
            raise RuntimeError("ReplicaAgent.connect() was not called")
        return self._log_writer

    # -- the applied seq -------------------------------------------------------------------------------

    def report_applied(self, seq: int) -> None:
        """Note that every record up to ``seq`` is applied; the put happens in the background, coalesced."""
        self.thread.loop.call_soon_threadsafe(self.applied_due, seq)

    def applied_due(self, seq: int) -> None:
        """Put applied seq ``seq`` with the lease held now, in the background, coalesced (coordination thread)."""
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

    def applied_written(self, seq: int) -> None:
        """A publication put applied seq ``seq``, with the lease held then (coordination thread)."""
        self._applied_reported = max(self._applied_reported, seq)

    # -- the lease, as the log writer sees it ----------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """Whether the replica stops (revoked, or ended by :meth:`_fatal`)."""
        return self._stopping

    async def lease_other_than(self, lease: Lease | None) -> None:
        """Wait until the watchdog holds a lease other than ``lease`` (it rejoined), or the replica stops."""
        while self.lease is lease and not self._stopping:
            await asyncio.sleep(0.2)

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
        if self._log_writer is not None:
            self._log_writer.stop()
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
