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
  previous cell is intact. A cell is never re-run silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import zmq
import zmq.asyncio

from jupyter_notebookos.coordination.client import Coordinator
from jupyter_notebookos.coordination.errors import CoordinationError
from jupyter_notebookos.coordination.kv import EventType, WatchEvent
from jupyter_notebookos.coordination.ridethrough import txn_once
from jupyter_notebookos.coordination.txn import Compare, Op
from jupyter_notebookos.gateway.ledger import LedgerReleases
from jupyter_notebookos.gateway.waitnotice import WaitNotice
from jupyter_notebookos.gateway.wire import DELIM, MalformedMessage, Signer, WireMessage
from jupyter_notebookos.replication.protocol import (
    METADATA_KEY,
    CellDirective,
    LogRecord,
    ReplicaRegistration,
)

log = logging.getLogger(__name__)

#: What parsing a value from etcd raises when it is malformed (bad JSON or UTF-8, a wrong shape or type).
MALFORMED = (ValueError, TypeError, KeyError, AttributeError)

#: How many recent cells' changed names the router keeps in case their executor dies before publishing.
CHANGED_MEMORY = 64

# What a client may send on a kernel's control channel: interrupts, shutdown, the debugger, and kernel_info
# (read-only; jupyter_server's websocket handler sends it there to see that the kernel answers).
CONTROL_REQUESTS = frozenset({"interrupt_request", "shutdown_request", "debug_request", "kernel_info_request"})

#: How many request ids the router remembers for routing iopub (oldest forgotten first).
ROUTE_MEMORY = 4096
#: How often a cell adopted from a previous gateway checks whether its state record was published.
ADOPTED_POLL_S = 2.0
#: A cell that has no executor after this many seconds is announced busy by the router itself.
BUSY_AFTER_S = 0.02
#: A cell whose decision conflicts in etcd this many times in a row is answered with an error.
MAX_COMMIT_CONFLICTS = 40


class CellRejected(Exception):
    """The planner refuses a cell (e.g. it asks for more GPUs than any host has); the reason is for the user."""


@dataclass(frozen=True)
class CellRequest:
    """What the router asks the planner for one cell."""

    kernel_id: str
    cell_id: str
    gpus: int
    arrived: float  # time.monotonic() at arrival
    prefer: str | None = None  # a replica the client asked for (execute_request metadata.notebookos.replica)


@dataclass(frozen=True)
class CellGrant:
    """The planner's answer: run on ``replica_id`` at ``host`` with these GPU device ordinals."""

    replica_id: str
    host: str
    devices: tuple[int, ...]
    reason: str


class CellPlanner(Protocol):
    """The router's view of the scheduler (implemented by the gateway platform)."""

    async def acquire(self, request: CellRequest, changed: asyncio.Event) -> CellGrant:
        """Wait until the cell can run and return where; ``changed`` is set whenever replicas change."""

    def release(self, kernel_id: str, cell_id: str) -> None:
        """The cell finished (or failed): its GPUs are idle again."""

    def queue_position(self, kernel_id: str, cell_id: str) -> int | None:
        """The cell's 1-based place in the queue for GPUs; ``None`` when it is not queued (e.g. a migration)."""

    def note_resident(self, kernel_id: str, replica_id: str, host: str, devices: list[int]) -> None:
        """A replica's reply said its GPU state stays on ``devices`` of ``host`` (sticky release)."""


@dataclass(frozen=True)
class RouterSettings:
    """Timeouts and limits of one router."""

    launch_timeout: float = 60.0
    max_message_bytes: int = 256 << 20
    etcd_timeout: float = 5.0


@dataclass
class PendingCell:
    """An ``execute_request`` waiting for, or running on, an executor."""

    request: WireMessage
    arrived: float
    attempt: int = 1
    seq: int = 0
    grant: CellGrant | None = None
    started: float = 0.0
    prefer: str | None = None
    waiter: asyncio.Future[CellGrant] | None = None  # the planner's answer, while the cell waits for it
    interrupted: bool = False
    began_executing: bool = False  # the executor said "busy" for it: from then on it is never re-sent
    retry: bool = False
    entries: dict[str, int] = field(default_factory=dict)  # its etcd cell record and GPU entries -> revision
    done: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class ReplicaLink:
    """The router's sockets to one registered replica."""

    def __init__(self, ctx: zmq.asyncio.Context, registration: ReplicaRegistration, identity: bytes) -> None:
        self.registration = registration
        self.replica_id = registration.replica_id
        self.host = registration.host
        base = f"{registration.transport}://{registration.ip}:"
        self.shell = ctx.socket(zmq.DEALER)
        self.stdin = ctx.socket(zmq.DEALER)
        self.control = ctx.socket(zmq.DEALER)
        # The replica answers stdin requests to the identities of the shell request, so the router's
        # shell and stdin sockets to a replica carry the same identity.
        for sock in (self.shell, self.stdin, self.control):
            sock.setsockopt(zmq.IDENTITY, identity)
            sock.setsockopt(zmq.LINGER, 0)
        self.iopub = ctx.socket(zmq.SUB)
        self.iopub.setsockopt(zmq.SUBSCRIBE, b"")
        self.iopub.setsockopt(zmq.LINGER, 0)
        self.shell.connect(base + str(registration.shell_port))
        self.stdin.connect(base + str(registration.stdin_port))
        self.control.connect(base + str(registration.control_port))
        self.iopub.connect(base + str(registration.iopub_port))
        self.tasks: list[asyncio.Task[None]] = []

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        for sock in (self.shell, self.stdin, self.control, self.iopub):
            sock.close(0)


class ReplicaRouter:
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
        self.registrations: dict[str, ReplicaRegistration] = {}
        self.expected: set[str] = set()  # replicas started and not yet gone
        self.retiring: set[str] = set()  # replicas being retired on purpose (migration): not a loss
        self.failed: dict[str, str] = {}  # replicas whose process ended before they registered, and why
        self.state_seq: dict[str, int] = {}  # highest log seq each replica has the state of
        self.log_head = 0  # the last seq handed to a cell
        self.published_seq = 0  # the highest seq whose record is in the log (or covered by a checkpoint)
        self.executor: str | None = None
        self.fence = 0  # create_revision of the executor key for the current executor
        self._executor_key_absent = False  # known absent in etcd: a new term need not delete it first
        self.running: PendingCell | None = None
        self.waiting: PendingCell | None = None  # the cell at the head, waiting for GPUs (or a migration)
        self.cells_run = 0
        self.gpu_seconds = 0.0
        self.started_at = time.time()
        self.changed = asyncio.Event()
        self.stopped = asyncio.Event()
        self.shutting_down = False
        self.exit_code: int | None = None

        self._queue: asyncio.Queue[PendingCell] = asyncio.Queue()
        self.adopted_cells: list[PendingCell] = []  # running when a previous gateway died
        self._changed: dict[int, list[str]] = {}  # log seq -> names its cell's reply said it changed

        self._routes: OrderedDict[str, str] = OrderedDict()  # request msg_id -> replica id
        self._evictions: dict[str, asyncio.Future[dict[str, Any]]] = {}  # evict request msg_id -> its answer
        self._stdin_owner: str | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._sockets: dict[str, zmq.asyncio.Socket] = {}
        self._watches: list[Any] = []

    # -- lifecycle ----------------------------------------------------------------------------------

    async def bind(self) -> None:
        """Bind the client-facing sockets at the kernel's connection info."""
        kinds = {
            "shell": zmq.ROUTER,
            "control": zmq.ROUTER,
            "stdin": zmq.ROUTER,
            "iopub": zmq.PUB,
            "hb": zmq.REP,
        }
        for name, kind in kinds.items():
            sock = self.ctx.socket(kind)
            sock.setsockopt(zmq.LINGER, 0)
            if name != "hb":
                sock.setsockopt(zmq.MAXMSGSIZE, self.settings.max_message_bytes)
            if kind == zmq.ROUTER:
                sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
            sock.bind(f"tcp://{self.ip}:{self.ports[name]}")
            self._sockets[name] = sock

    async def start(self, *, fresh: bool = True) -> None:
        """Start watching etcd and serving clients. ``fresh`` clears what a previous kernel left in etcd."""
        if fresh:
            await self.coordinator.delete_prefix(self.keys.kernel_prefix(self.kernel_id))
            self._executor_key_absent = True
        snapshot = await self.coordinator.get_prefix(self.keys.kernel_prefix(self.kernel_id))
        running: list[tuple[str, bytes, int]] = []
        for kv in snapshot:
            event = WatchEvent(EventType.PUT, kv.key, kv.value, kv.mod_revision, kv.create_revision)
            if not self._apply_checked(event):
                continue
            section = kv.key[len(self.keys.kernel_prefix(self.kernel_id)) :].partition("/")[0]
            if section == "executor":
                # Re-attaching: the executor term in force (later changes are our own, made in memory first).
                self.executor, self.fence = kv.value.decode(errors="replace"), kv.create_revision
            elif section == "cells":
                running.append((kv.key, kv.value, kv.mod_revision))
        for key, value, revision in running:
            try:
                self._adopt_running_cell(json.loads(value), revision)
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

    def _adopt_running_cell(self, record: dict[str, Any], revision: int) -> None:
        """A cell that was running when the previous gateway died: release its GPUs when it replies.

        A cell whose state record is already in the log had finished (only its GPU entries were not deleted
        yet): its entries are deleted instead. ``revision`` wrote the cell record and its GPU entries."""
        entries = {self.keys.cell(self.kernel_id, record["msg_id"]): revision}
        entries.update({self.keys.gpu(str(record["host"]), d): revision for d in record.get("gpus", ())})
        if int(record.get("seq", 0)) <= self.published_seq:
            self.ledger.release(entries)
            self.planner.release(self.kernel_id, record["msg_id"])
            return
        header = json.dumps({"msg_id": record["msg_id"], "msg_type": "execute_request"}).encode()
        request = WireMessage([], b"", header, b"{}", b"{}", b"{}")
        cell = PendingCell(request, time.monotonic(), attempt=int(record.get("attempt", 1)))
        cell.seq = int(record.get("seq", 0))
        cell.grant = CellGrant(str(record["executor"]), str(record["host"]), tuple(record.get("gpus", ())), "adopted")
        cell.started = time.monotonic()
        cell.began_executing = True
        cell.entries = entries
        self.log_head = max(self.log_head, cell.seq)
        self.adopted_cells.append(cell)
        self._queue.put_nowait(cell)

    def expect(self, replica_id: str) -> None:
        """A replica was started for this kernel: count it until it registers or is declared gone."""
        self.expected.add(replica_id)

    def retire(self, replica_id: str) -> None:
        """This replica is being stopped on purpose (its replacement holds the state): its end is no loss."""
        self.retiring.add(replica_id)
        self.expected.discard(replica_id)
        if self.executor == replica_id:
            self.executor, self.fence = None, 0  # the next cell opens a new executor term
        self.changed.set()

    def launch_failed(self, replica_id: str, reason: str) -> None:
        """A started replica's process ended before it registered."""
        self.failed[replica_id] = reason
        self.expected.discard(replica_id)
        self.changed.set()

    async def wait_caught_up(self, replica_id: str, timeout: float) -> bool:
        """Wait until ``replica_id`` holds the state of every cell so far (False on timeout or if it died)."""
        deadline = time.monotonic() + timeout
        while self.state_seq.get(replica_id, -1) < self.log_head:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or replica_id not in self.registrations:
                return False
            self.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(remaining, 1.0))
        return replica_id in self.registrations

    async def wait_registered(self, replica_ids: set[str], timeout: float) -> set[str]:
        """Wait until these replicas registered; return those that did not within ``timeout`` (or died)."""
        deadline = time.monotonic() + timeout
        while not replica_ids <= set(self.registrations) | set(self.failed):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)
        return replica_ids - set(self.registrations)

    @property
    def quorum(self) -> bool:
        """Whether a majority of the kernel's replicas is registered."""
        size = max(len(self.expected), 1)
        return len(self.registrations) * 2 > size

    def poll(self) -> int | None:
        """``None`` while the kernel lives (EG's process-proxy convention), else an exit code."""
        return self.exit_code

    async def interrupt(self) -> None:
        """Interrupt the running cell (a message on the executor's control channel), or the waiting one."""
        waiting = self.waiting
        if self.running is None and waiting is not None:
            waiting.interrupted = True
            if waiting.waiter is not None:
                waiting.waiter.cancel()
            return
        target = self._target_replica()
        if target is None:
            return
        msg = self.signer.make("interrupt_request", {}, self._synthetic_parent("interrupt_request"), idents=[])
        await self.links[target].control.send_multipart(msg.frames())

    async def evict(self, replica_id: str, timeout: float = 60.0) -> dict[str, Any]:
        """Ask a replica to move the GPU state it keeps between cells to host memory; returns its answer."""
        link = self.links.get(replica_id)
        if link is None:
            return {"status": "error", "evalue": f"replica {replica_id} is not connected"}
        parent = self._synthetic_parent("notebookos_evict_request")
        msg = self.signer.make("notebookos_evict_request", {}, parent, idents=[])
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._evictions[msg.msg_id] = answer  # the replica answers with this request as the parent
        try:
            await link.control.send_multipart(msg.frames())
            return await asyncio.wait_for(answer, timeout)
        except TimeoutError:
            return {"status": "error", "evalue": f"no answer within {timeout:.0f} s"}
        finally:
            self._evictions.pop(msg.msg_id, None)

    async def close(self) -> None:
        """Stop every loop, close every socket. Replicas are stopped by the caller (it owns the launcher)."""
        self.shutting_down = True
        if self.exit_code is None:
            self.exit_code = 0
        for watch in self._watches:
            await watch.aclose()
        for task in self._tasks:
            task.cancel()
        for link in self.links.values():
            link.close()
        self.links.clear()
        for sock in self._sockets.values():
            sock.close(0)
        self._sockets.clear()
        self.stopped.set()

    # -- etcd ---------------------------------------------------------------------------------------

    async def _watch_loop(self, watch: Any) -> None:
        try:
            async for event in watch:
                self._apply_checked(event)
        except asyncio.CancelledError:
            raise
        except CoordinationError as err:
            log.error("kernel %s: watch on etcd ended: %s", self.kernel_id, err)

    def _apply_checked(self, event: WatchEvent) -> bool:
        """Apply ``event``; a malformed value is logged and skipped (it must not end the watch). Returns
        whether it applied."""
        try:
            self._apply_event(event)
        except MALFORMED as err:
            log.error("kernel %s: ignoring a malformed value at %s in etcd: %r", self.kernel_id, event.key, err)
            return False
        return True

    def _apply_event(self, event: WatchEvent) -> None:
        rel = event.key[len(self.keys.kernel_prefix(self.kernel_id)) :]
        section, _, name = rel.partition("/")
        if section == "replicas" and name:
            if event.type is EventType.PUT:
                self._replica_registered(ReplicaRegistration.from_json(event.value))
            else:
                self._replica_gone(name, "its etcd lease ended (process exited or unreachable)")
        elif section == "applied" and name and event.type is EventType.PUT:
            seq = int(event.value)
            if seq > self.state_seq.get(name, -1):
                self.state_seq[name] = seq
        elif section == "log" and name and event.type is EventType.PUT:
            seq = self.keys.seq_of(event.key)
            self.log_head = max(self.log_head, seq)
            self.published_seq = max(self.published_seq, seq)
        elif section == "checkpoint" and event.type is EventType.PUT:
            seq = int(json.loads(event.value).get("seq", 0))
            self.log_head = max(self.log_head, seq)
            self.published_seq = max(self.published_seq, seq)
        elif section == "executor" and event.type is EventType.DELETE and self.executor is not None:
            self.executor, self.fence = None, 0
        self.changed.set()

    def _replica_registered(self, registration: ReplicaRegistration) -> None:
        rid = registration.replica_id
        old = self.links.pop(rid, None)
        if old is not None:
            old.close()
        link = ReplicaLink(self.ctx, registration, self.identity)
        self.links[rid] = link
        self.registrations[rid] = registration
        self.expected.add(rid)
        self.state_seq[rid] = max(self.state_seq.get(rid, -1), registration.applied_seq)
        link.tasks.append(self._spawn(self._replica_loop(link, link.shell, self._on_replica_shell)))
        link.tasks.append(self._spawn(self._replica_loop(link, link.control, self._on_replica_control)))
        link.tasks.append(self._spawn(self._replica_loop(link, link.stdin, self._on_replica_stdin)))
        link.tasks.append(self._spawn(self._replica_loop(link, link.iopub, self._on_replica_iopub)))
        log.info(
            "kernel %s: replica %s ready on %s (state seq %d)",
            self.kernel_id,
            rid,
            registration.host,
            registration.applied_seq,
        )

    def _replica_gone(self, rid: str, why: str) -> None:
        registration = self.registrations.pop(rid, None)
        link = self.links.pop(rid, None)
        if link is not None:
            link.close()
        self.state_seq.pop(rid, None)
        self.expected.discard(rid)
        if registration is None:
            return
        was_executor = self.executor == rid
        if was_executor:
            self.executor, self.fence = None, 0
        if self.shutting_down:
            if not self.registrations:
                self.exit_code = 0
            return
        if rid in self.retiring:
            self.retiring.discard(rid)
            log.info("kernel %s: replica %s on %s retired", self.kernel_id, rid, registration.host)
        else:
            log.warning("kernel %s: replica %s on %s is gone: %s", self.kernel_id, rid, registration.host, why)
            # The scheduler hears of it before the running cell is failed or retried, so it is not picked again.
            if self.on_replica_lost is not None:
                self.on_replica_lost(self, registration, why)
        cell = self.running
        if cell is not None and cell.grant is not None and cell.grant.replica_id == rid and not cell.done.done():
            self._fail_running_cell(cell, registration, why)
        elif was_executor and self.published_seq < self.log_head:
            # (published_seq is refreshed from etcd there: the router does not watch the log.)
            # It replied to its last cells but died before publishing their records: those cells' state
            # changes are lost; close their sequence numbers so the other replicas do not wait for them.
            self._spawn(self._close_lost_seqs(rid))

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
            # Its reply may never come (it finished while no gateway listened): its published state record
            # says it is over as well.
            while not cell.done.done():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(cell.done), ADOPTED_POLL_S)
                if not cell.done.done():
                    with contextlib.suppress(CoordinationError):
                        if await self._published_seq() >= cell.seq:
                            break
        finally:
            self.adopted_cells.remove(cell)
            self.running = None
            self.planner.release(self.kernel_id, cell.request.msg_id)
            self.ledger.release(cell.entries)

    async def _attempt_cell(self, cell: PendingCell) -> None:
        msg_id = cell.request.msg_id
        request = CellRequest(self.kernel_id, msg_id, self.gpus, cell.arrived, cell.prefer)
        conflicts = 0
        notice: WaitNotice | None = None  # what the client sees while the cell waits (not on the fast path)
        while True:
            self.waiting = cell
            cell.waiter = asyncio.ensure_future(self.planner.acquire(request, self.changed))
            try:
                done, _ = await asyncio.wait({cell.waiter}, timeout=BUSY_AFTER_S)
                if not done:
                    # It waits for GPUs (or a migration): clients see the kernel busy meanwhile. A cell that
                    # gets its executor at once needs no extra message: the replica says busy itself.
                    busy = self.signer.make(
                        "status", {"execution_state": "busy"}, cell.request, idents=[b"kernel.status"]
                    )
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
            if grant.replica_id not in self.registrations:
                self.planner.release(self.kernel_id, msg_id)
                await asyncio.sleep(0.05)
                continue  # the replica went away while we waited
            if await self._commit(cell, grant):
                break
            self.planner.release(self.kernel_id, msg_id)
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
        directive = CellDirective(seq=cell.seq, fence=self.fence, gpus=list(grant.devices), attempt=cell.attempt)
        metadata = cell.request.metadata()
        metadata[METADATA_KEY] = directive.to_dict()
        forwarded = self.signer.with_metadata(cell.request, metadata)
        self._remember_route(msg_id, grant.replica_id)
        await link.shell.send_multipart(forwarded.frames())
        try:
            await cell.done
        finally:
            self.running = None
            self.planner.release(self.kernel_id, msg_id)
            self.gpu_seconds += (time.monotonic() - cell.started) * len(grant.devices)
            self.ledger.release(cell.entries)

    async def _commit(self, cell: PendingCell, grant: CellGrant) -> bool:
        """The one transaction of a cell: executor term (if it changes), cell record and GPU entries."""
        registration = self.registrations[grant.replica_id]
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
                compares.append(Compare.absent(executor_key))
                ops.append(Op.put(executor_key, grant.replica_id, lease=registration.lease))
            else:
                compares.append(Compare.create_revision(executor_key, "==", self.fence))
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
        cell.entries = {cell_key: result.revision}
        cell.entries.update((key, result.revision) for key in gpu_keys)
        self.log_head = seq
        return True

    def _fail_running_cell(self, cell: PendingCell, registration: ReplicaRegistration, why: str) -> None:
        self._spawn(self._close_lost_seqs(registration.replica_id))
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

    async def _close_lost_seqs(self, replica_id: str) -> None:
        """Write ``lost`` records for every seq a dead executor was given but did not publish."""
        try:
            self.published_seq = max(self.published_seq, await self._published_seq())
        except CoordinationError as err:
            log.error("kernel %s: cannot read the state log: %s", self.kernel_id, err)
            return
        seqs = range(self.published_seq + 1, self.log_head + 1)
        if not seqs:
            return
        log.warning(
            "kernel %s: replica %s died before publishing the state of log records %s; closing them",
            self.kernel_id,
            replica_id,
            ", ".join(map(str, seqs)),
        )
        try:
            # A stale executor must not publish after this: its fence (the executor key) goes first.
            await self.coordinator.delete(self.keys.executor(self.kernel_id))
            for seq in seqs:
                key = self.keys.log_record(self.kernel_id, seq)
                # The names the cell's reply said it changed: the next cell's output tells the user they are lost.
                names = self._changed.pop(seq, [])
                record = LogRecord(seq=seq, kind="lost", msg_id="", replica_id=replica_id, names=names)
                await self.coordinator.txn(compare=[Compare.absent(key)], success=[Op.put(key, record.to_json())])
        except CoordinationError as err:
            log.error("kernel %s: could not close log records %s: %s", self.kernel_id, list(seqs), err)

    def _remember_changed(self, seq: int, names: list[str]) -> None:
        """Keep what cell ``seq`` changed until its record is surely published (the last few cells)."""
        self._changed[seq] = names
        for old in [s for s in self._changed if s <= self.published_seq or s < seq - CHANGED_MEMORY]:
            del self._changed[old]

    def _error_reply(self, cell: PendingCell, ename: str, evalue: str) -> None:
        """Answer ``cell`` with an error (reply on shell, error and idle on iopub)."""
        grant = cell.grant
        metadata = {
            "status": "error",
            METADATA_KEY: {
                "replica": grant.replica_id if grant else None,
                "host": grant.host if grant else None,
                "gpus": list(grant.devices) if grant else [],
                "queued_ms": self._queued_ms(cell),
                "attempt": cell.attempt,
            },
        }
        content = {
            "status": "error",
            "ename": ename,
            "evalue": evalue,
            "traceback": [f"{ename}: {evalue}"],
            "execution_count": None,
        }
        iopub = self._sockets.get("iopub")
        shell = self._sockets.get("shell")
        if iopub is not None:
            error = self.signer.make(
                "error",
                {k: content[k] for k in ("ename", "evalue", "traceback")},
                cell.request,
                idents=[b"kernel.error"],
            )
            idle = self.signer.make("status", {"execution_state": "idle"}, cell.request, idents=[b"kernel.status"])
            self._spawn(self._send_all(iopub, [error.frames(), idle.frames()]))
        if shell is not None:
            reply = self.signer.make("execute_reply", content, cell.request, metadata=metadata)
            self._spawn(self._send_all(shell, [reply.frames()]))
        if not cell.done.done():
            cell.done.set_result(None)

    async def answer_running_cell(self, why: str) -> None:
        """Answer the running cell with an error if its executor has not (the kernel is stopped under it, e.g.
        by a restart), and wait until the answer is sent: every execute_request gets its reply."""
        cell = self.running
        if cell is None or cell.done.done():
            return
        before = set(self._tasks)
        self._error_reply(cell, "KernelStopped", why)
        sends = [t for t in self._tasks if t not in before]
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*sends), 2)

    @staticmethod
    async def _send_all(sock: zmq.asyncio.Socket, messages: list[list[bytes]]) -> None:
        for frames in messages:
            await sock.send_multipart(frames)

    def _queued_ms(self, cell: PendingCell) -> float:
        end = cell.started or time.monotonic()
        return round((end - cell.arrived) * 1000.0, 3)

    # -- client side --------------------------------------------------------------------------------

    async def _client_loop(self, name: str, handler: Callable[[WireMessage], Awaitable[None]]) -> None:
        sock = self._sockets[name]
        while True:
            frames = await sock.recv_multipart(copy=True)
            try:
                msg = WireMessage.parse(frames)
                _ = msg.header  # parse now, so a bad header is refused here
            except MalformedMessage as err:
                log.warning("kernel %s: dropped a malformed %s message: %s", self.kernel_id, name, err)
                continue
            try:
                await handler(msg)
            except MalformedMessage as err:
                log.warning("kernel %s: dropped a %s message: %s", self.kernel_id, name, err)
            except zmq.ZMQError as err:
                log.warning("kernel %s: could not forward a %s message: %s", self.kernel_id, name, err)

    async def _on_client_shell(self, msg: WireMessage) -> None:
        if msg.msg_type == "execute_request":
            self.signer.verify(msg)  # we re-sign it, so we must vouch for it
            msg.content()  # and it must be readable
            asked = msg.metadata().get(METADATA_KEY)
            prefer = str(asked["replica"]) if isinstance(asked, dict) and asked.get("replica") is not None else None
            await self._queue.put(PendingCell(msg, time.monotonic(), prefer=prefer))
            return
        target = self._target_replica()
        if target is None:
            log.warning("kernel %s: no replica to take %s", self.kernel_id, msg.msg_type)
            return
        self._remember_route(msg.msg_id, target)
        await self.links[target].shell.send_multipart(msg.frames())

    async def _on_client_control(self, msg: WireMessage) -> None:
        if msg.msg_type not in CONTROL_REQUESTS:
            # Cells reach a replica only through the queue, the scheduler and a committed decision: one sent on
            # the control channel would run on some replica with no GPUs, no record and no state delta.
            log.warning(
                "kernel %s: dropped %s that arrived on the control channel (there it takes only %s)",
                self.kernel_id,
                msg.msg_type,
                ", ".join(sorted(CONTROL_REQUESTS)),
            )
            return
        if msg.msg_type == "shutdown_request":
            self.shutting_down = True
            for rid, link in list(self.links.items()):
                self._remember_route(msg.msg_id, rid)
                await link.control.send_multipart(msg.frames())
            if not self.links:
                self.exit_code = 0
            return
        waiting = self.waiting
        if msg.msg_type == "interrupt_request" and self.running is None and waiting is not None:
            # The cell has not reached a replica yet: interrupting it means taking it out of the queue.
            waiting.interrupted = True
            if waiting.waiter is not None:
                waiting.waiter.cancel()
            reply = self.signer.make("interrupt_reply", {"status": "ok"}, msg)
            await self._sockets["control"].send_multipart(reply.frames())
            return
        target = self._target_replica(prefer_running=True)
        if target is None:
            return
        self._remember_route(msg.msg_id, target)
        await self.links[target].control.send_multipart(msg.frames())

    async def _on_client_stdin(self, msg: WireMessage) -> None:
        target = self._stdin_owner or self._target_replica(prefer_running=True)
        if target is not None and target in self.links:
            await self.links[target].stdin.send_multipart(msg.frames())

    async def _heartbeat_loop(self) -> None:
        sock = self._sockets["hb"]
        while True:
            frames = await sock.recv_multipart()
            while not self.quorum and not self.shutting_down:
                # No answer while a majority of replicas is missing: the client sees the kernel as dead.
                self.changed.clear()
                await self.changed.wait()
            await sock.send_multipart(frames)

    def _target_replica(self, *, prefer_running: bool = False) -> str | None:
        """Where a non-execute request goes: the running cell's replica, the executor, or the freshest."""
        if prefer_running and self.running is not None and self.running.grant is not None:
            rid = self.running.grant.replica_id
            if rid in self.links:
                return rid
        if self.executor in self.links:
            return self.executor
        if not self.links:
            return None
        return max(self.links, key=lambda r: (self.state_seq.get(r, -1), r))

    def _remember_route(self, msg_id: str, replica_id: str) -> None:
        self._routes[msg_id] = replica_id
        self._routes.move_to_end(msg_id)
        while len(self._routes) > ROUTE_MEMORY:
            self._routes.popitem(last=False)

    # -- replica side -------------------------------------------------------------------------------

    async def _replica_loop(
        self,
        link: ReplicaLink,
        sock: zmq.asyncio.Socket,
        handler: Callable[[ReplicaLink, WireMessage, list[bytes]], Awaitable[None]],
    ) -> None:
        while True:
            frames = await sock.recv_multipart(copy=True)
            try:
                msg = WireMessage.parse(frames)
                await handler(link, msg, frames)
            except MalformedMessage as err:
                log.warning("kernel %s: replica %s sent a malformed message: %s", self.kernel_id, link.replica_id, err)
            except zmq.ZMQError as err:
                log.warning("kernel %s: could not relay from replica %s: %s", self.kernel_id, link.replica_id, err)

    async def _on_replica_shell(self, link: ReplicaLink, msg: WireMessage, frames: list[bytes]) -> None:
        cell = self.running
        if (
            msg.msg_type == "execute_reply"
            and cell is not None
            and msg.parent_msg_id == cell.request.msg_id
            and cell.grant is not None
            and cell.grant.replica_id == link.replica_id
        ):
            metadata = msg.metadata()
            ours = dict(metadata.get(METADATA_KEY) or {})
            ours.setdefault("replica", link.replica_id)
            ours.setdefault("host", link.host)
            ours.setdefault("gpus", list(cell.grant.devices))
            ours.update(queued_ms=self._queued_ms(cell), attempt=cell.attempt)
            metadata[METADATA_KEY] = ours
            if isinstance(ours.get("changed"), list):
                self._remember_changed(cell.seq, [str(n) for n in ours["changed"]])
            resident = ours.get("resident")
            if isinstance(resident, list):
                self.planner.note_resident(self.kernel_id, link.replica_id, link.host, [int(d) for d in resident])
            msg = self.signer.with_metadata(msg, metadata)
            await self._sockets["shell"].send_multipart(msg.frames())
            # The executor has the state of this cell in memory already.
            self.state_seq[link.replica_id] = max(self.state_seq.get(link.replica_id, -1), cell.seq)
            self.cells_run += 1
            if not cell.done.done():
                cell.done.set_result(None)
            return
        if self._routes.get(msg.parent_msg_id) == link.replica_id:
            await self._sockets["shell"].send_multipart(frames)

    async def _on_replica_control(self, link: ReplicaLink, msg: WireMessage, frames: list[bytes]) -> None:
        if not msg.idents:
            # A reply to the router's own request: an eviction's answer, or an interrupt's (from a signal).
            answer = self._evictions.get(msg.parent_msg_id)
            if answer is not None and not answer.done():
                answer.set_result(msg.content())
            return
        if msg.msg_type == "shutdown_reply":
            # Every replica answers; clients get one reply.
            if self._routes.pop(msg.parent_msg_id, None) is None:
                return
        elif self._routes.get(msg.parent_msg_id) != link.replica_id:
            return
        await self._sockets["control"].send_multipart(frames)

    async def _on_replica_stdin(self, link: ReplicaLink, msg: WireMessage, frames: list[bytes]) -> None:
        self._stdin_owner = link.replica_id
        await self._sockets["stdin"].send_multipart(frames)

    async def _on_replica_iopub(self, link: ReplicaLink, msg: WireMessage, frames: list[bytes]) -> None:
        parent = msg.parent_msg_id
        if parent:
            if self._routes.get(parent) != link.replica_id:
                return
            cell = self.running
            if cell is not None and parent == cell.request.msg_id:
                cell.began_executing = True
        elif link.replica_id != self._target_replica():
            return  # unparented output (e.g. a background thread): from the executor only
        await self._sockets["iopub"].send_multipart(frames)

    # -- helpers ------------------------------------------------------------------------------------

    def _spawn(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.append(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        with contextlib.suppress(ValueError):
            self._tasks.remove(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("kernel %s: router task failed: %r", self.kernel_id, task.exception())

    def _synthetic_parent(self, msg_type: str) -> WireMessage:
        header = json.dumps(
            {
                "msg_id": f"router-{time.monotonic_ns()}",
                "msg_type": msg_type,
                "session": self.signer.session.session,
                "username": "notebookos",
                "version": "5.3",
            }
        ).encode()
        return WireMessage([], b"", header, b"{}", b"{}", b"{}")

    def summary(self) -> dict[str, Any]:
        """The router's state for ``GET /api/notebookos/kernels/{id}``."""
        return {
            "executor": self.executor,
            "cells": self.cells_run,
            "log_head": self.log_head,
            "queued": self._queue.qsize(),
            "running": self.running.request.msg_id if self.running else None,
            "gpu_seconds_used": round(self.gpu_seconds, 3),
        }


class _CellAborted(Exception):
    """The cell could not be committed and was answered with an error already."""


__all__ = [
    "DELIM",
    "CellGrant",
    "CellPlanner",
    "CellRejected",
    "CellRequest",
    "ReplicaRouter",
    "RouterSettings",
]
