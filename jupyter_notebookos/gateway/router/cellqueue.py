"""A kernel's cells, from arrival to reply: :class:`CellQueue`.

``execute_request``\\ s are queued per kernel (FIFO). For the cell at the head, the planner (the scheduler) chooses
the executor among the replicas that applied every earlier state record and the GPU devices; the
:class:`~jupyter_notebookos.gateway.router.commitlog.CommitLog` commits that decision in **one** etcd transaction;
the request goes to the executor only, through the relay; on ``execute_reply`` the queue adds
``metadata.notebookos`` and releases the GPUs (in the scheduler at once; in etcd with the next decision).

The queue owns the cells: the one queued, waiting for GPUs, being committed or running, and the cells adopted from a
previous gateway. It answers a cell itself when no replica will: an error (a rejected or lost cell), "aborted"
behind a failed cell, an interrupt of a cell not sent yet. A cell whose executor died before it began is sent
again; one that began is never re-run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from jupyter_notebookos.coordination.errors import CoordinationError
from jupyter_notebookos.coordination.keys import KeyLayout
from jupyter_notebookos.gateway.router.cells import (
    ADOPTED_POLL_S,
    BUSY_AFTER_S,
    MAX_COMMIT_CONFLICTS,
    TAKEN_ASK_S,
    CellAborted,
    CellGrant,
    CellPlanner,
    CellRejected,
    CellRequest,
    PendingCell,
)
from jupyter_notebookos.gateway.router.commitlog import CommitLog
from jupyter_notebookos.gateway.router.replicas import KernelReplicas
from jupyter_notebookos.gateway.router.sockets import ClientSocket, ReplicaLink
from jupyter_notebookos.gateway.router.tasks import log
from jupyter_notebookos.gateway.router.waitnotice import WaitNotice
from jupyter_notebookos.gateway.router.wire import MalformedMessage, Signer, WireMessage
from jupyter_notebookos.replication.protocol import METADATA_KEY, CellDirective, ReplicaRegistration, stops_on_error


def _stops_on_error(request: WireMessage) -> bool:
    """:func:`~jupyter_notebookos.replication.protocol.stops_on_error` for a request whose content may not parse
    (then: it does, as ipykernel's default)."""
    try:
        return stops_on_error(request.content())
    except MalformedMessage:
        return True


def _reply_status(reply: WireMessage) -> object:
    try:
        return reply.content().get("status")
    except MalformedMessage:
        return None


class CellRelay(Protocol):
    """What the queue needs of the relay (:class:`~jupyter_notebookos.gateway.router.relay.Relay`): to reach the
    kernel's clients and the cell's executor."""

    def is_connected(self, replica_id: str) -> bool:
        """Whether replica ``replica_id`` is registered and reachable."""

    def status(self, request: WireMessage, state: str) -> WireMessage:
        """An iopub ``status`` message for ``request``."""

    def send(self, channel: str, frames: list[bytes]) -> Awaitable[Any]:
        """Send to the clients on ``channel``, in order with what follows."""

    def send_soon(self, channel: str, messages: list[list[bytes]]) -> asyncio.Task[None] | None:
        """Send to the clients on ``channel`` in the background (None: the channel is closed)."""

    def client_socket(self, channel: str) -> ClientSocket | None:
        """The clients' socket of ``channel`` (for the waiting notice)."""

    def send_cell(self, replica_id: str, request: WireMessage, frames: list[bytes]) -> Awaitable[Any]:
        """Send a cell to its executor."""

    def remember_route(self, msg_id: str, replica_id: str) -> None:
        """Output and replies for ``msg_id`` come from ``replica_id``."""

    async def ask(self, replica_id: str, msg_type: str, content: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Ask a replica something of the router's own."""


class CellQueue:
    """The kernel's cells and what happens to each (see the module docstring).

    ``wait_registered(replica_ids, timeout)`` waits for replicas to register and returns those that did not."""

    def __init__(
        self,
        *,
        kernel_id: str,
        gpus: int,
        signer: Signer,
        keys: KeyLayout,
        planner: CellPlanner,
        commit: CommitLog,
        relay: CellRelay,
        replicas: KernelReplicas,
        wait_registered: Callable[[set[str], float], Awaitable[set[str]]],
    ) -> None:
        self.kernel_id = kernel_id
        self.gpus = gpus
        self.signer = signer
        self.keys = keys
        self.planner = planner
        self._commit = commit
        self._relay = relay
        self._replicas = replicas
        self._wait_registered = wait_registered
        self._queue: asyncio.Queue[PendingCell] = asyncio.Queue()
        self._running: PendingCell | None = None
        self._waiting: PendingCell | None = None  # the cell at the head, waiting for GPUs (or a migration)
        self._committing: PendingCell | None = None  # the cell whose decision is being committed in etcd
        self._adopted: list[PendingCell] = []  # running when a previous gateway died
        self._cells_run = 0
        self._gpu_seconds = 0.0
        self._last_cell_ended: float | None = None  # time.monotonic() of the last cell's end: the kernel's idle time

    # -- reading ------------------------------------------------------------------------------------

    def running_on(self, replica_id: str) -> PendingCell | None:
        """The running cell, if replica ``replica_id`` runs it and it has not been answered."""
        cell = self._running
        if cell is not None and cell.grant is not None and cell.grant.replica_id == replica_id and not cell.done.done():
            return cell
        return None

    def running_replica(self) -> str | None:
        """The replica the running cell was sent to (None: no cell runs)."""
        cell = self._running
        return cell.grant.replica_id if cell is not None and cell.grant is not None else None

    def live_cells(self) -> list[str]:
        """The msg_ids of the cells that hold GPUs or may: running, waiting for GPUs, adopted."""
        return [cell.request.msg_id for cell in (self._running, self._waiting, *self._adopted) if cell is not None]

    def summary(self) -> dict[str, Any]:
        """The queue's part of the router's summary."""
        now = time.monotonic()
        running = self._running
        busy = running is not None or self._waiting is not None or self._queue.qsize() > 0
        held = len(running.grant.devices) if running is not None and running.grant is not None else 0
        return {
            "cells": self._cells_run,
            "queued": self._queue.qsize(),
            "running": running.request.msg_id if running else None,
            "gpu_seconds_used": round(self._gpu_seconds, 3),
            # The running cell's GPU-seconds so far (they join gpu_seconds_used when it ends).
            "gpu_seconds_running": round((now - running.started) * held, 3) if running and running.started else 0.0,
            # Seconds since the last cell ended (None: no cell ended yet, or one runs or waits now).
            "idle_seconds": None if busy or self._last_cell_ended is None else round(now - self._last_cell_ended, 3),
        }

    # -- arrivals -----------------------------------------------------------------------------------

    async def submit(self, msg: WireMessage) -> None:
        """A client's ``execute_request``: queued behind the kernel's earlier cells."""
        self.signer.verify(msg)  # we re-sign it, so we must vouch for it
        msg.content()  # and it must be readable
        asked = msg.metadata().get(METADATA_KEY)
        prefer = str(asked["replica"]) if isinstance(asked, dict) and asked.get("replica") is not None else None
        await self._queue.put(PendingCell(msg, time.monotonic(), prefer=prefer))

    def adopt(self, record: dict[str, Any], revision: int, *, replied: bool = False) -> None:
        """A cell that was running when the previous gateway died: release its GPUs when it replies, and its
        cell record once its state record is published (the next cell waits for that).

        A cell whose state record is already in the log had finished (only its entries were not deleted
        yet): its entries are deleted instead. ``replied``: a later cell has a record, so this one replied;
        its GPU entries go now. ``revision`` wrote the cell record and its GPU entries (deletes are
        conditional on it: an entry taken since by another cell stays). Raises what a malformed record raises
        (:data:`~jupyter_notebookos.gateway.router.cells.MALFORMED`)."""
        cell_key = self.keys.cell(self.kernel_id, record["msg_id"])
        gpus = {self.keys.gpu(str(record["host"]), d): revision for d in record.get("gpus", ())}
        if int(record.get("seq", 0)) <= self._commit.published_seq:
            self._commit.release({cell_key: revision, **gpus})
            self.planner.release(self.kernel_id, record["msg_id"])
            return
        devices = tuple(record.get("gpus", ()))
        if replied:
            self._commit.release(gpus)
            gpus, devices = {}, ()
        header = json.dumps({"msg_id": record["msg_id"], "msg_type": "execute_request"}).encode()
        request = WireMessage([], b"", header, b"{}", b"{}", b"{}")
        cell = PendingCell(request, time.monotonic(), attempt=int(record.get("attempt", 1)))
        cell.seq = int(record.get("seq", 0))
        cell.grant = CellGrant(str(record["executor"]), str(record["host"]), devices, "adopted")
        cell.started = time.monotonic()
        cell.began_executing = True
        cell.entries = {cell_key: revision, **gpus}
        self._commit.note_handed(cell.seq)
        self._adopted.append(cell)
        self._queue.put_nowait(cell)

    def published_through(self, seq: int) -> None:
        """Every state record up to ``seq`` is in the log: adopted cells up to ``seq`` are over."""
        for cell in self._adopted:
            if cell.seq <= seq and not cell.done.done():
                cell.done.set_result(None)

    # -- running cells ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Run the queued cells, one at a time, until the router closes."""
        while True:
            cell = await self._queue.get()
            try:
                await self._run_cell(cell)
            except asyncio.CancelledError:
                raise
            except CellAborted:
                self.planner.release(self.kernel_id, cell.request.msg_id)
            except Exception as err:
                log.exception("kernel %s: cell %s failed in the router", self.kernel_id, cell.request.msg_id)
                if not cell.done.done():
                    self.error_reply(cell, "NotebookOSError", f"NotebookOS could not run this cell: {err}")

    async def _run_cell(self, cell: PendingCell) -> None:
        if cell in self._adopted:
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
        self._running = cell
        self._relay.remember_route(cell.request.msg_id, cell.grant.replica_id)
        try:
            if cell.seq == self._commit.log_head and await self._never_taken(cell):
                return
            # Its reply may never come (it finished while no gateway listened): its published state record
            # says it is over as well (the watch's applied reports end the wait, see published_through; etcd is
            # asked now and then too).
            while not cell.done.done():
                await asyncio.wait({cell.done}, timeout=ADOPTED_POLL_S)  # not wait_for: it may swallow a cancel
                if not cell.done.done():
                    with contextlib.suppress(CoordinationError):
                        if await self._commit.read_published() >= cell.seq:
                            break
        finally:
            self._adopted.remove(cell)
            self._running = None
            self.planner.release(self.kernel_id, cell.request.msg_id)
            self._commit.release_entries(cell.request.msg_id, cell.seq, cell.entries)

    async def _never_taken(self, cell: PendingCell) -> bool:
        """Whether the adopted ``cell`` (the last one decided) never reached its executor: the previous gateway
        died between committing the decision and sending it. Then it is given up (the replica refuses it, should
        it still come), and its GPUs, its record and its place in the log go to the next cell; waiting for it
        would hold every later cell of the kernel for ever. The client that sent it lost its connection with that
        gateway; nothing ran. The executor not answering: False (its record, or its loss, ends the wait)."""
        assert cell.grant is not None
        replica_id = cell.grant.replica_id
        if await self._wait_registered({replica_id}, TAKEN_ASK_S):
            return False
        answer = await self._relay.ask(
            replica_id, "notebookos_cell_request", {"msg_id": cell.request.msg_id}, TAKEN_ASK_S
        )
        if answer.get("status") != "ok" or answer.get("taken") is not False:
            return False
        log.warning(
            "kernel %s: cell %s (record %d), decided by the previous gateway, never reached replica %s: given up",
            self.kernel_id,
            cell.request.msg_id,
            cell.seq,
            replica_id,
        )
        self._commit.release(cell.entries)
        cell.entries = {}
        self._commit.give_up(cell.seq)
        return True

    async def _wait_for_grant(self, cell: PendingCell, request: CellRequest) -> CellGrant | None:
        """Ask the planner where ``cell`` runs, waiting for GPUs (or a migration) as long as it takes; None when the
        cell was answered instead (rejected, or interrupted while it waited)."""
        msg_id = cell.request.msg_id
        notice: WaitNotice | None = None  # what the client sees while the cell waits (not on the fast path)
        self._waiting = cell
        try:
            placed = self.planner.place(request)
            if isinstance(placed, CellGrant):  # (no await since: nothing can have interrupted it)
                return placed
            cell.waiter = asyncio.ensure_future(placed)
            done, _ = await asyncio.wait({cell.waiter}, timeout=BUSY_AFTER_S)
            if not done:
                # It waits for GPUs (or a migration): clients see the kernel busy meanwhile. A cell that gets its
                # executor at once needs no extra message: the replica says busy itself.
                await self._relay.send("iopub", self._relay.status(cell.request, "busy").frames())
                iopub = self._relay.client_socket("iopub")
                assert iopub is not None
                notice = WaitNotice(
                    signer=self.signer,
                    iopub=iopub,
                    request=cell.request,
                    gpus=self.gpus,
                    arrived=cell.arrived,
                    position=lambda: self.planner.queue_position(self.kernel_id, msg_id),
                )
            return await cell.waiter
        except CellRejected as err:
            self.error_reply(cell, "NotebookOSCellRejected", str(err))
            return None
        except asyncio.CancelledError:
            if not cell.interrupted:
                raise
            self.planner.release(self.kernel_id, msg_id)  # also takes it out of the scheduler's queue
            self.error_reply(cell, "KeyboardInterrupt", "interrupted while it waited for GPUs; the cell did not run")
            return None
        finally:
            self._waiting, cell.waiter = None, None
            if notice is not None:  # cleared before the request reaches its executor
                notice.clear()

    async def _attempt_cell(self, cell: PendingCell) -> None:
        msg_id = cell.request.msg_id
        request = CellRequest(self.kernel_id, msg_id, self.gpus, cell.arrived, cell.prefer)
        conflicts = 0
        while True:
            grant = await self._wait_for_grant(cell, request)
            if grant is None:
                return
            registration = self._replicas.registration(grant.replica_id)
            if registration is None:
                self.planner.release(self.kernel_id, msg_id)
                await asyncio.sleep(0.05)
                continue  # the replica went away while we waited
            mark = self._commit.mark()
            self._committing = cell
            try:
                committed = await self._commit.commit(msg_id, cell.attempt, grant, registration)
            except CoordinationError as err:
                self.error_reply(cell, "NotebookOSUnavailable", f"{err}")
                raise CellAborted(str(err)) from err
            finally:
                self._committing = None
            if committed is not None and not self._relay.is_connected(grant.replica_id):
                # Its replica went away while the decision was committed (its lease ended: etcd was out, or it
                # died), and nothing was sent to it: undo the decision (the seq was given to no one) and choose
                # again. A new executor term follows, as after any executor loss.
                log.warning(
                    "kernel %s: replica %s went away while cell %s was committed; choosing again",
                    self.kernel_id,
                    grant.replica_id,
                    msg_id,
                )
                self._commit.rollback(mark)
                self._commit.release(committed.entries)
                self.planner.release(self.kernel_id, msg_id)
                await asyncio.sleep(0.05)
                continue
            if committed is not None:
                cell.seq, cell.entries = committed.seq, committed.entries
                break
            self.planner.release(self.kernel_id, msg_id)
            if cell.interrupted:  # while its decision conflicted: it goes no further
                self.error_reply(cell, "KeyboardInterrupt", "interrupted before it reached a replica; it did not run")
                return
            with contextlib.suppress(CoordinationError):
                await self._commit.flush_releases()  # a deferred release that was in the way goes first
            conflicts += 1
            if conflicts >= MAX_COMMIT_CONFLICTS:
                self.error_reply(
                    cell,
                    "NotebookOSConflict",
                    f"the decision for this cell conflicted in etcd {conflicts} times (GPU ledger or executor key "
                    "held by something else); the cell did not run. Run it again; if this repeats, check "
                    "/api/notebookos/cluster and the gateway log.",
                )
                return
            await asyncio.sleep(0.05)
        await self._send(cell, grant)

    async def _send(self, cell: PendingCell, grant: CellGrant) -> None:
        """Send the committed ``cell`` to its executor and wait for its answer; then its GPUs go."""
        msg_id = cell.request.msg_id
        cell.grant = grant
        cell.started = time.monotonic()
        self._running = cell
        directive = CellDirective(
            seq=cell.seq,
            fence=self._commit.fence,
            gpus=list(grant.devices),
            attempt=cell.attempt,
            interrupted=cell.interrupted,
        )
        metadata = cell.request.metadata()
        metadata[METADATA_KEY] = directive.to_dict()
        forwarded = self.signer.with_metadata(cell.request, metadata)
        await self._relay.send_cell(grant.replica_id, cell.request, forwarded.frames())
        try:
            await cell.done
        finally:
            self._running = None
            self.planner.release(self.kernel_id, msg_id)
            ended = self._last_cell_ended = time.monotonic()
            self._gpu_seconds += (ended - cell.started) * len(grant.devices)
            self._commit.release_entries(msg_id, cell.seq, cell.entries)

    # -- what replicas say --------------------------------------------------------------------------

    async def reply_came(self, link: ReplicaLink, msg: WireMessage) -> bool:
        """Replica ``link`` sent an ``execute_reply``: if it answers the running cell, the client gets it with
        ``metadata.notebookos`` and the cell is over (True); else False."""
        cell = self._running
        if (
            cell is None
            or msg.parent_msg_id != cell.request.msg_id
            or cell.grant is None
            or cell.grant.replica_id != link.replica_id
        ):
            return False
        metadata = msg.metadata()
        ours = dict(metadata.get(METADATA_KEY) or {})
        ours.setdefault("replica", link.replica_id)
        ours.setdefault("host", link.host)
        ours.setdefault("gpus", list(cell.grant.devices))
        ours.update(queued_ms=self._queued_ms(cell), attempt=cell.attempt)
        metadata[METADATA_KEY] = ours
        if isinstance(ours.get("changed"), list):
            self._commit.remember_changed(cell.seq, [str(n) for n in ours["changed"]])
        resident = ours.get("resident")
        if isinstance(resident, list):
            self.planner.note_resident(self.kernel_id, link.replica_id, link.host, [int(d) for d in resident])
        msg = self.signer.with_metadata(msg, metadata)
        await self._relay.send("shell", msg.frames())
        # The executor has the state of this cell in memory already.
        self._replicas.note_applied(link.replica_id, cell.seq)
        self._cells_run += 1
        self._stop_queue_on_error(cell, metadata.get("status") or _reply_status(msg))
        if not cell.done.done():
            cell.done.set_result(None)
        return True

    def output_came(self, parent_msg_id: str) -> None:
        """A replica sent output for ``parent_msg_id``: the running cell's means it began (never re-sent)."""
        cell = self._running
        if cell is not None and parent_msg_id == cell.request.msg_id:
            cell.began_executing = True

    # -- cells answered by the router ---------------------------------------------------------------

    def interrupt_unsent(self) -> bool:
        """Interrupt the cell that has not reached a replica yet; False if there is none.

        A cell waiting for GPUs leaves the queue. A cell whose decision is being committed is marked: its
        directive then tells the executor to answer it as interrupted and run nothing (the seq is taken, so the
        executor still publishes its empty record). Sent on to a replica instead, the interrupt would reach one that
        runs nothing yet, and ipykernel ignores SIGINT between requests: the cell would then run to its end."""
        if self._running is not None:
            return False
        waiting = self._waiting
        if waiting is not None:
            waiting.interrupted = True
            if waiting.waiter is not None:
                waiting.waiter.cancel()
            return True
        committing = self._committing
        if committing is not None:
            committing.interrupted = True
            return True
        return False

    def fail_running(self, cell: PendingCell, registration: ReplicaRegistration, why: str) -> None:
        """The executor of the running ``cell`` is lost. A cell it had not begun is sent again (nothing ran); one
        it began is answered with an error saying so: it is never re-run."""
        if not cell.began_executing:
            cell.retry = True
            cell.done.set_result(None)
            return
        message = (
            f"The replica running this cell ({registration.replica_id} on {registration.host}) stopped: {why}. "
            "This cell was not re-run. The kernel's state as of the previous cell is intact on the other "
            "replicas, and the kernel is back to full strength by itself; run the cell again when ready."
        )
        self.error_reply(cell, "ReplicaLost", message)

    async def answer_running(self, why: str) -> None:
        """Answer the running cell with an error if its executor has not (the kernel is stopped under it, e.g.
        by a restart), and wait until the answer is sent: every execute_request gets its reply."""
        cell = self._running
        if cell is None or cell.done.done():
            return
        sends = self.error_reply(cell, "KernelStopped", why)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*sends), 2)

    def error_reply(self, cell: PendingCell, ename: str, evalue: str) -> list[asyncio.Task[None]]:
        """Answer ``cell`` with an error (reply on shell, error and idle on iopub); returns the sends."""
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
        relay, sends = self._relay, []
        error = self.signer.make(
            "error", {k: content[k] for k in ("ename", "evalue", "traceback")}, cell.request, idents=[b"kernel.error"]
        )
        sends.append(relay.send_soon("iopub", [error.frames(), relay.status(cell.request, "idle").frames()]))
        reply = self.signer.make("execute_reply", content, cell.request, metadata=metadata)
        sends.append(relay.send_soon("shell", [reply.frames()]))
        sends += self._stop_queue_on_error(cell, "error")
        if not cell.done.done():
            cell.done.set_result(None)
        return [send for send in sends if send is not None]

    def _stop_queue_on_error(self, cell: PendingCell, status: object) -> list[asyncio.Task[None] | None]:
        """A failed cell aborts the execute_requests queued behind it, as ipykernel does ("Run All" stops at the
        first error). Here they wait in the router, not in a kernel, so the router answers each "aborted" and none
        reaches a replica (no record, no execution count). Requests that arrive after the reply run."""
        if status != "error" or not _stops_on_error(cell.request):
            return []
        kept: list[PendingCell] = []  # cells adopted from a previous gateway are running already
        sends: list[asyncio.Task[None] | None] = []
        while not self._queue.empty():
            queued = self._queue.get_nowait()
            if any(queued is adopted for adopted in self._adopted):
                kept.append(queued)
            else:
                sends += self._abort_reply(queued)
        for adopted in kept:
            self._queue.put_nowait(adopted)
        return sends

    def _abort_reply(self, cell: PendingCell) -> list[asyncio.Task[None] | None]:
        """Answer a queued ``cell`` "aborted": busy and idle on iopub around the reply, as ipykernel does."""
        relay = self._relay
        metadata = {"status": "aborted", METADATA_KEY: {"queued_ms": self._queued_ms(cell), "aborted": True}}
        reply = self.signer.make("execute_reply", {"status": "aborted"}, cell.request, metadata=metadata)
        sends = [
            relay.send_soon("iopub", [relay.status(cell.request, "busy").frames()]),
            relay.send_soon("shell", [reply.frames()]),
            relay.send_soon("iopub", [relay.status(cell.request, "idle").frames()]),
        ]
        if not cell.done.done():
            cell.done.set_result(None)
        return sends

    @staticmethod
    def _queued_ms(cell: PendingCell) -> float:
        end = cell.started or time.monotonic()
        return round((end - cell.arrived) * 1000.0, 3)
