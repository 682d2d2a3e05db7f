"""The replica router: one per NotebookOS kernel, the one place that sees every request of that kernel.

To Enterprise Gateway (and so to every client, every tab) the router *is* the kernel: it binds the five
Jupyter sockets at the connection info EG chose. Behind it run the kernel's replicas (see
:mod:`jupyter_notebookos.replication.protocol` for the router <-> replica contract):

- ``execute_request``: queued per kernel (FIFO). For the cell at the head, the planner (the scheduler)
  chooses the executor among the replicas that applied every earlier state record and the GPU devices;
  the router commits that decision in **one** etcd transaction (cell record + GPU-ledger entries bound to
  the executor's lease, fenced on the executor key), forwards the request to the executor only, and on
  ``execute_reply`` adds ``metadata.notebookos`` and releases the GPUs (in the scheduler at once; in etcd
  with the next decision, see :mod:`jupyter_notebookos.gateway.ledger`).
- Other shell and control requests go to the current executor (or the most up-to-date replica);
  ``shutdown_request`` goes to all replicas; stdin replies go to the replica that asked.
- iopub: a replica's messages reach clients only when their parent request was routed to that replica,
  so every output arrives exactly once.
- Heartbeats are answered while a quorum of replicas is registered.
- A replica whose registration vanishes (lease expired or revoked, process gone) is replaced on another
  host; if it was running a cell, the client gets an error reply for that cell saying the state of the
  previous cell is intact. A cell is never re-run silently. A live replica whose lease etcd ended (an outage
  longer than the lease) keeps its connections to the router through the rejoin grace: its cell finishes, and
  the error comes only if it does not register again.

:class:`ReplicaRouter` is assembled from parts, one job each: the ZMQ relay (:mod:`.relay`), the etcd view of
the replica set (:mod:`.replicaset`), the commit and fencing protocol (:mod:`.commit`); the cell types are in
:mod:`.cells`. This module holds the router's lifecycle and the cell lifecycle (queue, attempts, interrupts).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio

from jupyter_notebookos.coordination.client import Coordinator
from jupyter_notebookos.coordination.errors import CoordinationError
from jupyter_notebookos.coordination.kv import EventType, WatchEvent
from jupyter_notebookos.gateway.cells import (
    ADOPTED_POLL_S,
    BUSY_AFTER_S,
    MALFORMED,
    MAX_COMMIT_CONFLICTS,
    TAKEN_ASK_S,
    CellGrant,
    CellPlanner,
    CellRejected,
    CellRequest,
    PendingCell,
    RouterSettings,
    _CellAborted,
)
from jupyter_notebookos.gateway.commit import CellCommits
from jupyter_notebookos.gateway.ledger import LedgerReleases
from jupyter_notebookos.gateway.relay import (
    ClientSocket,
    LocalClient,
    ReplicaLink,
    RouterRelay,
    forget_local_clients,
    local_clients_of,
)
from jupyter_notebookos.gateway.replicas import KernelReplicas, process_of
from jupyter_notebookos.gateway.replicaset import ReplicaSetView
from jupyter_notebookos.gateway.routerstate import log
from jupyter_notebookos.gateway.waitnotice import WaitNotice
from jupyter_notebookos.gateway.wire import DELIM, Signer, WireMessage
from jupyter_notebookos.replication.protocol import METADATA_KEY, CellDirective, ReplicaRegistration

#: Requests whose "idle" a replica still owes that the router keeps, per replica (the latest; see _say_owed_idle).
IDLES_OWED_KEPT = 16


class ReplicaRouter(RouterRelay, ReplicaSetView, CellCommits):
    """Presents one Jupyter kernel to EG and its clients, backed by replicas on distinct hosts."""

    def __init__(
        self,
        *,
        kernel_id: str,
        ip: str,
        ports: dict[str, int],
        key: bytes,
        signature_scheme: str,
        gpus: int,
        coordinator: Coordinator,
        planner: CellPlanner,
        ledger: LedgerReleases,
        settings: RouterSettings | None = None,
        on_replica_lost: Callable[[ReplicaRouter, ReplicaRegistration, str], None] | None = None,
    ) -> None:
        self.kernel_id = kernel_id
        self.ip = ip
        self.ports = ports
        self.gpus = gpus
        self.coordinator = coordinator
        self.keys = coordinator.keys
        self.planner = planner
        self.ledger = ledger
        self.settings = settings or RouterSettings()
        self.signer = Signer(key, signature_scheme)
        self.on_replica_lost = on_replica_lost
        self.ctx = zmq.asyncio.Context.instance()
        self.identity = f"notebookos-router-{kernel_id}".encode()

        self.links: dict[str, ReplicaLink] = {}
        self._held: dict[str, tuple[ReplicaLink, str]] = {}
        # The kernel's replicas: the one record of them, shared with the platform (its KernelRecord).
        self.replicas = KernelReplicas(kernel_id, on_change=self._replica_changed)
        self.log_head = 0  # the last seq handed to a cell
        self.published_seq = 0  # the highest seq whose record is in the log (or covered by a checkpoint)
        self.executor: str | None = None
        self.last_executor: str | None = None  # the executor of seq log_head: it holds any records not published
        self.fence = 0  # create_revision of the executor key for the current executor
        self._executor_key_absent = False  # known absent in etcd: a new term need not delete it first
        self.running: PendingCell | None = None
        self.waiting: PendingCell | None = None  # the cell at the head, waiting for GPUs (or a migration)
        self.committing: PendingCell | None = None  # the cell whose decision is being committed in etcd
        self.cells_run = 0
        self._zmq_shell_last = OrderedDict()
        self.client_messages = {"zmq": 0, "direct": 0}
        self.gpu_seconds = 0.0
        self.started_at = time.time()
        self.changed = asyncio.Event()
        self.stopped = asyncio.Event()
        self.shutting_down = False
        self.exit_code: int | None = None

        self._queue: asyncio.Queue[PendingCell] = asyncio.Queue()
        self.adopted_cells: list[PendingCell] = []  # running when a previous gateway died
        self._changed: dict[int, list[str]] = {}  # log seq -> names its cell's reply said it changed
        self.unpublished: dict[int, tuple[str, dict[str, int]]] = {}
        self._closing: set[str] = set()  # replicas whose unpublished seqs are being closed as lost
        self._idle_owed = {}

        self._routes: OrderedDict[str, str] = OrderedDict()  # request msg_id -> replica id
        self._answers = {}
        self._stdin_owner: str | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._sockets: dict[str, ClientSocket] = {}
        self.local_clients: weakref.WeakSet[LocalClient] = local_clients_of(kernel_id)
        self._watches: list[Any] = []

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self, *, fresh: bool = True) -> None:
        """Start watching etcd and serving clients. ``fresh`` clears what a previous kernel left in etcd."""
        if fresh:
            await self.coordinator.delete_prefix(self.keys.kernel_prefix(self.kernel_id))
            self._executor_key_absent = True
        snapshot = await self.coordinator.get_prefix(self.keys.kernel_prefix(self.kernel_id))
        running: list[tuple[int, str, dict[str, Any], int]] = []
        for kv in snapshot:
            event = WatchEvent(EventType.PUT, kv.key, kv.value, kv.mod_revision, kv.create_revision)
            if not self._apply_checked(event):
                continue
            section = kv.key[len(self.keys.kernel_prefix(self.kernel_id)) :].partition("/")[0]
            if section == "executor":
                # Re-attaching: the executor term in force (later changes are our own, made in memory first).
                self.executor, self.fence = kv.value.decode(errors="replace"), kv.create_revision
                self.last_executor = self.executor
            elif section == "cells":
                try:
                    record = json.loads(kv.value)
                    running.append((int(record.get("seq", 0)), kv.key, record, kv.mod_revision))
                except MALFORMED as err:
                    log.error("kernel %s: ignoring a malformed cell record at %s: %r", self.kernel_id, kv.key, err)
        # In seq order: all but the last had replied, and their state records are awaited in turn.
        running.sort(key=lambda cell: cell[0])
        for i, (_, key, record, revision) in enumerate(running):
            try:
                self._adopt_running_cell(record, revision, replied=i < len(running) - 1)
            except MALFORMED as err:
                log.error("kernel %s: ignoring a malformed cell record at %s: %r", self.kernel_id, key, err)
        # Only what the router must react to: registrations and applied sequences. The log itself (large
        # values, one per cell) is read on demand, when an executor dies.
        for prefix in (self.keys.replicas_prefix(self.kernel_id), self.keys.applied_prefix(self.kernel_id)):
            watch = self.coordinator.watch_prefix(prefix, start_revision=snapshot.revision + 1)
            self._watches.append(watch)
            self._spawn(self._watch_loop(watch))
        self._spawn(self._client_loop("shell", self._on_client_shell))
        self._spawn(self._client_loop("control", self._on_client_control))
        self._spawn(self._client_loop("stdin", self._on_client_stdin))
        self._spawn(self._heartbeat_loop())
        self._spawn(self._dispatch_loop())

    def _adopt_running_cell(self, record: dict[str, Any], revision: int, *, replied: bool = False) -> None:
        """A cell that was running when the previous gateway died: release its GPUs when it replies, and its
        cell record once its state record is published (the next cell waits for that).

        A cell whose state record is already in the log had finished (only its entries were not deleted
        yet): its entries are deleted instead. ``replied``: a later cell has a record, so this one replied;
        its GPU entries go now. ``revision`` wrote the cell record and its GPU entries (deletes are
        conditional on it: an entry taken since by another cell stays)."""
        cell_key = self.keys.cell(self.kernel_id, record["msg_id"])
        gpus = {self.keys.gpu(str(record["host"]), d): revision for d in record.get("gpus", ())}
        if int(record.get("seq", 0)) <= self.published_seq:
            self.ledger.release({cell_key: revision, **gpus})
            self.planner.release(self.kernel_id, record["msg_id"])
            return
        devices = tuple(record.get("gpus", ()))
        if replied:
            self.ledger.release(gpus)
            gpus, devices = {}, ()
        header = json.dumps({"msg_id": record["msg_id"], "msg_type": "execute_request"}).encode()
        request = WireMessage([], b"", header, b"{}", b"{}", b"{}")
        cell = PendingCell(request, time.monotonic(), attempt=int(record.get("attempt", 1)))
        cell.seq = int(record.get("seq", 0))
        cell.grant = CellGrant(str(record["executor"]), str(record["host"]), devices, "adopted")
        cell.started = time.monotonic()
        cell.began_executing = True
        cell.entries = {cell_key: revision, **gpus}
        self.log_head = max(self.log_head, cell.seq)
        self.adopted_cells.append(cell)
        self._queue.put_nowait(cell)

    def poll(self) -> int | None:
        """``None`` while the kernel lives (EG's process-proxy convention), else an exit code."""
        return self.exit_code

    async def interrupt(self) -> None:
        """Interrupt the running cell (a message on the executor's control channel), or the waiting one."""
        if self._interrupt_unsent():
            return
        running = self.running
        held = self._held.get(running.grant.replica_id) if running is not None and running.grant else None
        target = self._target_replica()
        if held is None and target is None:
            return
        link = held[0] if held is not None else self.links[str(target)]
        msg = self.signer.make("interrupt_request", {}, self._synthetic_parent("interrupt_request"), idents=[])
        await link.control.send_multipart(msg.frames())

    async def evict(self, replica_id: str, timeout: float = 60.0) -> dict[str, Any]:
        """Ask a replica to move the GPU state it keeps between cells to host memory; returns its answer."""
        return await self._ask(replica_id, "notebookos_evict_request", {}, timeout)

    async def _ask(self, replica_id: str, msg_type: str, content: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send a replica a request of the router's own on its control channel; returns the answer's content
        (status "error" when it is not connected or does not answer within ``timeout`` seconds)."""
        link = self.links.get(replica_id)
        if link is None:
            return {"status": "error", "evalue": f"replica {replica_id} is not connected"}
        parent = self._synthetic_parent(msg_type)
        msg = self.signer.make(msg_type, content, parent, idents=[])
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._answers[msg.msg_id] = answer  # the replica answers with this request as the parent
        try:
            await link.control.send_multipart(msg.frames())
            return await asyncio.wait_for(answer, timeout)
        except TimeoutError:
            return {"status": "error", "evalue": f"no answer within {timeout:.0f} s"}
        finally:
            self._answers.pop(msg.msg_id, None)

    async def close(self) -> None:
        """Stop every loop, close every socket. Replicas are stopped by the caller (it owns the launcher)."""
        self.shutting_down = True
        if self.exit_code is None:
            self.exit_code = 0
        for watch in self._watches:
            await watch.aclose()
        for task in self._tasks:
            task.cancel()
        for link in [*self.links.values(), *(held for held, _ in self._held.values())]:
            link.close()
        self.links.clear()
        self._held.clear()
        for sock in self._sockets.values():
            sock.close(0)
        self._sockets.clear()
        forget_local_clients(self.kernel_id)  # (connections still open keep it for the kernel's next router)
        self.stopped.set()

    def _replica_gone(self, rid: str, why: str) -> None:
        registration, retiring = self.replicas.gone(rid, why)
        link = self.links.pop(rid, None)
        cell = self._cell_running_on(rid)
        if link is not None and registration is not None and cell and not retiring and not self.shutting_down:
            # etcd ended its lease; the process may live on (an etcd outage longer than the lease), running the
            # cell. Its connections need no etcd: the cell's output and reply still come, and the platform says
            # whether it registers again within the rejoin grace (then the link serves on) or is lost.
            self._held[rid] = (link, why)
        elif link is not None:
            link.close()
            self._say_owed_idle(rid)
        if registration is None:
            return
        if self.executor == rid:
            self.executor, self.fence = None, 0
        if self.shutting_down:
            if not self.replicas.registered_count():
                self.exit_code = 0
            return
        if retiring:
            log.info("kernel %s: replica %s on %s retired", self.kernel_id, rid, registration.host)
        else:
            log.warning("kernel %s: replica %s on %s is gone: %s", self.kernel_id, rid, registration.host, why)
            # The scheduler hears of it before the running cell is failed or retried, so it is not picked again.
            if self.on_replica_lost is not None:
                self.on_replica_lost(self, registration, why)
        cell = self._cell_running_on(rid)  # (again: the platform may have given it up at once)
        if cell is not None and rid not in self._held:
            self._fail_running_cell(cell, registration, why)
        elif cell is not None:
            log.warning(
                "kernel %s: replica %s still runs cell %s; its reply is awaited while it may register again",
                self.kernel_id,
                rid,
                cell.request.msg_id,
            )
        elif retiring or self.on_replica_lost is None:
            self.replica_lost(rid)
        # Else the platform calls replica_lost() once the replica is lost for good: a live process whose lease
        # etcd ended in an outage registers again and publishes its records itself.

    def _rejoined(self, registration: ReplicaRegistration) -> ReplicaLink | None:
        """The held link of ``registration``'s replica, if the same process registered again (its connections
        never dropped); a held link of another process under that id is closed, and its cell failed."""
        held = self._held.pop(registration.replica_id, None)
        if held is None:
            return None
        link, why = held
        before = link.registration
        if process_of(before) == process_of(registration):
            link.registration = registration
            return link
        link.close()
        self._fail_held_cell(before, why)
        return None

    def replica_lost(self, rid: str) -> None:
        """Replica ``rid`` is gone for good. If it replied to the last cells but did not publish their records,
        those cells' state changes are lost: close their sequence numbers so the other replicas do not wait.
        A cell it still ran fails now."""
        held = self._held.pop(rid, None)
        if held is not None:
            link, why = held
            link.close()
            self._fail_held_cell(link.registration, why)
        self._say_owed_idle(rid)
        if self.last_executor == rid and self.published_seq < self.log_head and rid not in self._closing:
            # (published_seq is refreshed from etcd there: the router does not watch the log.)
            self._closing.add(rid)
            closing = self._spawn(self._close_lost_seqs(rid, self.log_head))
            closing.add_done_callback(lambda _: self._closing.discard(rid))

    def _say_owed_idle(self, rid: str) -> None:
        """Replica ``rid``'s connections are closed. For each cell it replied to whose "idle" has not come (it died
        in between, or its lease ended then), say "idle" for it: clients wait for both. A cell it still runs is
        answered by _fail_running_cell, idle included, or sent again."""
        owed = self._idle_owed.pop(rid, [])
        iopub = self._sockets.get("iopub")
        running = self._cell_running_on(rid)
        owed = [request for request in owed if running is None or request.msg_id != running.request.msg_id]
        if not owed or iopub is None or self.shutting_down:
            return
        log.warning(
            "kernel %s: replica %s is gone before the idle of %d cell(s) it replied to; saying it for them",
            self.kernel_id,
            rid,
            len(owed),
        )
        self._spawn(self._send_all(iopub, [self._status(request, "idle").frames() for request in owed]))

    def _fail_held_cell(self, registration: ReplicaRegistration, why: str) -> None:
        cell = self._cell_running_on(registration.replica_id)
        if cell is not None:
            self._fail_running_cell(cell, registration, why)

    def _cell_running_on(self, rid: str) -> PendingCell | None:
        """The running cell, if replica ``rid`` runs it and it has not been answered."""
        cell = self.running
        if cell is not None and cell.grant is not None and cell.grant.replica_id == rid and not cell.done.done():
            return cell
        return None

    # -- cells --------------------------------------------------------------------------------------

    async def _dispatch_loop(self) -> None:
        while True:
            cell = await self._queue.get()
            try:
                await self._run_cell(cell)
            except asyncio.CancelledError:
                raise
            except _CellAborted:
                self.planner.release(self.kernel_id, cell.request.msg_id)
            except Exception as err:
                log.exception("kernel %s: cell %s failed in the router", self.kernel_id, cell.request.msg_id)
                if not cell.done.done():
                    self._error_reply(cell, "NotebookOSError", f"NotebookOS could not run this cell: {err}")

    async def _run_cell(self, cell: PendingCell) -> None:
        if cell in self.adopted_cells:
            await self._await_adopted(cell)
            return
        while True:
            await self._attempt_cell(cell)
            if not cell.retry:
                return
            # The executor died before it began the cell: nothing ran, so sending it again is safe.
            log.warning(
                "kernel %s: cell %s never began on its executor; attempt %d",
                self.kernel_id,
                cell.request.msg_id,
                cell.attempt + 1,
            )
            cell.attempt += 1
            cell.retry, cell.grant, cell.started = False, None, 0.0
            cell.done = asyncio.get_running_loop().create_future()

    async def _await_adopted(self, cell: PendingCell) -> None:
        assert cell.grant is not None
        self.running = cell
        self._remember_route(cell.request.msg_id, cell.grant.replica_id)
        try:
            if cell.seq == self.log_head and await self._never_taken(cell):
                return
            # Its reply may never come (it finished while no gateway listened): its published state record
            # says it is over as well (the watch's applied reports end the wait, see _published_through; etcd is
            # asked now and then too).
            while not cell.done.done():
                await asyncio.wait({cell.done}, timeout=ADOPTED_POLL_S)  # not wait_for: it may swallow a cancel
                if not cell.done.done():
                    with contextlib.suppress(CoordinationError):
                        if await self._published_seq() >= cell.seq:
                            break
        finally:
            self.adopted_cells.remove(cell)
            self.running = None
            self.planner.release(self.kernel_id, cell.request.msg_id)
            self._release_entries(cell)

    async def _never_taken(self, cell: PendingCell) -> bool:
        """Whether the adopted ``cell`` (the last one decided) never reached its executor: the previous gateway
        died between committing the decision and sending it. Then it is given up (the replica refuses it, should
        it still come), and its GPUs, its record and its place in the log go to the next cell; waiting for it
        would hold every later cell of the kernel for ever. The client that sent it lost its connection with that
        gateway; nothing ran. The executor not answering: False (its record, or its loss, ends the wait)."""
        assert cell.grant is not None
        replica_id = cell.grant.replica_id
        if await self.wait_registered({replica_id}, TAKEN_ASK_S):
            return False
        answer = await self._ask(replica_id, "notebookos_cell_request", {"msg_id": cell.request.msg_id}, TAKEN_ASK_S)
        if answer.get("status") != "ok" or answer.get("taken") is not False:
            return False
        log.warning(
            "kernel %s: cell %s (record %d), decided by the previous gateway, never reached replica %s: given up",
            self.kernel_id,
            cell.request.msg_id,
            cell.seq,
            replica_id,
        )
        self.ledger.release(dict(cell.entries))
        cell.entries = {}
        if self.log_head == cell.seq:
            self.log_head = cell.seq - 1
        return True

    async def _attempt_cell(self, cell: PendingCell) -> None:
        msg_id = cell.request.msg_id
        request = CellRequest(self.kernel_id, msg_id, self.gpus, cell.arrived, cell.prefer)
        conflicts = 0
        notice: WaitNotice | None = None  # what the client sees while the cell waits (not on the fast path)
        while True:
            self.waiting = cell
            try:
                placed = self.planner.place(request)
                if isinstance(placed, CellGrant):  # (no await since: nothing can have interrupted it)
                    grant = placed
                else:
                    cell.waiter = asyncio.ensure_future(placed)
                    done, _ = await asyncio.wait({cell.waiter}, timeout=BUSY_AFTER_S)
                    if not done:
                        # It waits for GPUs (or a migration): clients see the kernel busy meanwhile. A cell that
                        # gets its executor at once needs no extra message: the replica says busy itself.
                        busy = self._status(cell.request, "busy")
                        await self._sockets["iopub"].send_multipart(busy.frames())
                        notice = WaitNotice(
                            signer=self.signer,
                            iopub=self._sockets["iopub"],
                            request=cell.request,
                            gpus=self.gpus,
                            arrived=cell.arrived,
                            position=lambda: self.planner.queue_position(self.kernel_id, msg_id),
                        )
                    grant = await cell.waiter
            except CellRejected as err:
                self._error_reply(cell, "NotebookOSCellRejected", str(err))
                return
            except asyncio.CancelledError:
                if not cell.interrupted:
                    raise
                self.planner.release(self.kernel_id, msg_id)  # also takes it out of the scheduler's queue
                self._error_reply(
                    cell, "KeyboardInterrupt", "interrupted while it waited for GPUs; the cell did not run"
                )
                return
            finally:
                self.waiting, cell.waiter = None, None
                if notice is not None:  # cleared before the request reaches its executor
                    notice.clear()
                    notice = None
            if not self.replicas.is_registered(grant.replica_id):
                self.planner.release(self.kernel_id, msg_id)
                await asyncio.sleep(0.05)
                continue  # the replica went away while we waited
            prior = (self.log_head, self.last_executor)
            self.committing = cell
            try:
                committed = await self._commit(cell, grant)
            finally:
                self.committing = None
            if committed and grant.replica_id not in self.links:
                # Its replica went away while the decision was committed (its lease ended: etcd was out, or it
                # died), and nothing was sent to it: undo the decision (the seq was given to no one) and choose
                # again. A new executor term follows, as after any executor loss.
                log.warning(
                    "kernel %s: replica %s went away while cell %s was committed; choosing again",
                    self.kernel_id,
                    grant.replica_id,
                    msg_id,
                )
                self.log_head, self.last_executor = prior
                self.executor, self.fence = None, 0
                if cell.entries:
                    self.ledger.release(dict(cell.entries))
                    cell.entries = {}
                self.planner.release(self.kernel_id, msg_id)
                await asyncio.sleep(0.05)
                continue
            if committed:
                break
            self.planner.release(self.kernel_id, msg_id)
            if cell.interrupted:  # while its decision conflicted: it goes no further
                self._error_reply(cell, "KeyboardInterrupt", "interrupted before it reached a replica; it did not run")
                return
            with contextlib.suppress(CoordinationError):
                await self.ledger.flush()  # a deferred release that was in the way goes first
            conflicts += 1
            if conflicts >= MAX_COMMIT_CONFLICTS:
                self._error_reply(
                    cell,
                    "NotebookOSConflict",
                    f"the decision for this cell conflicted in etcd {conflicts} times (GPU ledger or executor key "
                    "held by something else); the cell did not run. Run it again; if this repeats, check "
                    "/api/notebookos/cluster and the gateway log.",
                )
                return
            await asyncio.sleep(0.05)

        link = self.links[grant.replica_id]
        cell.grant = grant
        cell.started = time.monotonic()
        self.running = cell
        directive = CellDirective(
            seq=cell.seq, fence=self.fence, gpus=list(grant.devices), attempt=cell.attempt, interrupted=cell.interrupted
        )
        metadata = cell.request.metadata()
        metadata[METADATA_KEY] = directive.to_dict()
        forwarded = self.signer.with_metadata(cell.request, metadata)
        self._remember_route(msg_id, grant.replica_id)
        owed = self._idle_owed.setdefault(grant.replica_id, [])
        owed.append(cell.request)
        del owed[:-IDLES_OWED_KEPT]
        await link.shell.send_multipart(forwarded.frames())
        try:
            await cell.done
        finally:
            self.running = None
            self.planner.release(self.kernel_id, msg_id)
            self.gpu_seconds += (time.monotonic() - cell.started) * len(grant.devices)
            self._release_entries(cell)

    def _fail_running_cell(self, cell: PendingCell, registration: ReplicaRegistration, why: str) -> None:
        self.replica_lost(registration.replica_id)
        if not cell.began_executing:
            cell.retry = True
            cell.done.set_result(None)
            return
        message = (
            f"The replica running this cell ({registration.replica_id} on {registration.host}) stopped: {why}. "
            "This cell was not re-run. The kernel's state as of the previous cell is intact on the other "
            "replicas, and the kernel is back to full strength by itself; run the cell again when ready."
        )
        self._error_reply(cell, "ReplicaLost", message)

    def summary(self) -> dict[str, Any]:
        """The router's state for ``GET /api/notebookos/kernels/{id}``."""
        return {
            "executor": self.executor,
            "cells": self.cells_run,
            "log_head": self.log_head,
            "queued": self._queue.qsize(),
            "running": self.running.request.msg_id if self.running else None,
            "gpu_seconds_used": round(self.gpu_seconds, 3),
            "client_shell_messages": dict(self.client_messages),
            "messages_to_clients_in_process": sum(sock.delivered for sock in self._sockets.values()),
        }


__all__ = [
    "DELIM",
    "CellGrant",
    "CellPlanner",
    "CellRejected",
    "CellRequest",
    "ReplicaRouter",
    "RouterSettings",
]
