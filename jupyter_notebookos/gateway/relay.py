"""The replica router's ZMQ relay: the client-facing sockets, the sockets to each replica, and what goes where.

- Shell requests other than ``execute_request`` go to the current executor (or the most up-to-date replica);
  ``shutdown_request`` goes to all replicas; stdin replies go to the replica that asked.
- iopub: a replica's messages reach clients only when their parent request was routed to that replica,
  so every output arrives exactly once.
- Heartbeats are answered while a quorum of replicas is registered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import zmq
import zmq.asyncio

from jupyter_notebookos.gateway.cells import PendingCell
from jupyter_notebookos.gateway.routerstate import RouterState, log
from jupyter_notebookos.gateway.wire import MalformedMessage, WireMessage
from jupyter_notebookos.launchers.base import LaunchError
from jupyter_notebookos.replication.protocol import METADATA_KEY, ReplicaRegistration, stops_on_error

# What a client may send on a kernel's control channel: interrupts, shutdown, the debugger, and kernel_info
# (read-only; jupyter_server's websocket handler sends it there to see that the kernel answers).
CONTROL_REQUESTS = frozenset({"interrupt_request", "shutdown_request", "debug_request", "kernel_info_request"})

#: How many request ids the router remembers for routing iopub (oldest forgotten first).
ROUTE_MEMORY = 4096
#: How many client connections (shell stream identities) the router remembers the last ZMQ message of.
MAX_CLIENT_STREAMS = 1024


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


#: How many random ports in a kernel's port range the router tries when its chosen one was taken.
PORT_TRIES = 100
#: How long a port in use is tried again before another is taken: a restarted kernel binds its ports again, and
#: the previous router's sockets are closed by ZMQ's I/O thread after their close() returned.
PORT_FREED_WAIT_S = 0.5


async def bind_client_socket(
    sock: zmq.Socket[Any],
    ip: str,
    port: int,
    port_range: tuple[int, int] | None,
    wait_s: float = PORT_FREED_WAIT_S,
) -> int:
    """Bind ``sock`` at ``ip:port``; when that port is still in use after ``wait_s`` and ``port_range`` is given,
    at a free port in it instead ((0, 0): any). The port it bound at."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            sock.bind(f"tcp://{ip}:{port}")
            return port
        except zmq.ZMQError as err:
            if err.errno != zmq.EADDRINUSE or (port_range is None and time.monotonic() >= deadline):
                raise
            if time.monotonic() >= deadline:
                break
        await asyncio.sleep(0.01)
    assert port_range is not None
    lowest, highest = port_range
    if lowest == highest == 0:
        sock.bind(f"tcp://{ip}:*")
        endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        return int(endpoint.rsplit(":", 1)[1])
    return int(sock.bind_to_random_port(f"tcp://{ip}", lowest, highest + 1, PORT_TRIES))


#: Per kernel id: its clients in this process (websocket connections) that take its router's messages in-process.
#: It outlives a router: a kernel restarted replaces its router, and the connections stay (see local_clients_of).
_LOCAL_CLIENTS: dict[str, weakref.WeakSet[LocalClient]] = {}


def local_clients_of(kernel_id: str) -> weakref.WeakSet[LocalClient]:
    """The kernel's local clients: every router the kernel gets (a restart makes a new one) hands them its messages."""
    clients = _LOCAL_CLIENTS.get(kernel_id)
    if clients is None:
        clients = _LOCAL_CLIENTS[kernel_id] = weakref.WeakSet()
    return clients


def forget_local_clients(kernel_id: str) -> None:
    """Drop the kernel's entry once no client is left in it (a kernel shut down, its last connection closed)."""
    clients = _LOCAL_CLIENTS.get(kernel_id)
    if clients is not None and not clients:
        del _LOCAL_CLIENTS[kernel_id]


class LocalClient(Protocol):
    """A client of the kernel in this process (the gateway's websocket connection, see gateway/websocket.py)."""

    def deliver_from_kernel(self, channel: str, frames: list[bytes]) -> bool:
        """Take a message the router sends on ``channel`` (``frames`` as its socket sends them: led by the
        receiver's identity on the ROUTER channels); True if it was this client's and it took it."""


class ClientSocket:
    """One of the router's client-facing sockets. What it sends goes over ZMQ to every client, as from any kernel,
    and at once, in-process, to the kernel's clients in this process (``local``): the gateway's own websocket
    connections, which then drop the ZMQ copy. That saves them a hop (two event loop turns and both ends' ZMQ I/O
    threads) on every message a cell sends them: after a trivial cell, the client had its idle 0.36 ms after the
    router sent it, against 1.6 ms over ZMQ (medians of 21; see docs/architecture.md). Other subscribers (the
    kernel manager's activity watch) get the ZMQ copy of iopub messages as before."""

    def __init__(self, sock: zmq.asyncio.Socket, channel: str, local: weakref.WeakSet[LocalClient]) -> None:
        self.sock = sock
        self.channel = channel
        self.local = local
        self.delivered = 0  # messages taken in-process by a local client

    def send_multipart(self, frames: list[bytes], *args: Any, **kwargs: Any) -> Any:
        """Hand ``frames`` to the local clients, then send them over ZMQ; returns an awaitable.

        On the ROUTER channels (shell, control, stdin) a message goes to one client, named by its first frame: one
        that a local client took needs no ZMQ copy (sending one cost the router about 0.2 ms per message here)."""
        taken = False
        for client in list(self.local):
            try:
                if client.deliver_from_kernel(self.channel, frames):
                    self.delivered += 1
                    taken = True
            except Exception:  # that client gets the ZMQ copy; the others and the router go on
                log.warning("handing a %s message to a client in-process failed", self.channel, exc_info=True)
        if taken and self.channel != "iopub":
            sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            sent.set_result(None)
            return sent
        return self.sock.send_multipart(frames, *args, **kwargs)

    def recv_multipart(self, *args: Any, **kwargs: Any) -> Any:
        return self.sock.recv_multipart(*args, **kwargs)

    def close(self, linger: int | None = None) -> None:
        self.sock.close(linger)


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
        # No high-water mark: ZMQ's PUB/SUB drops what exceeds it (1000 messages each side by default), silently.
        # A cell printing faster than the router forwards (a loaded gateway) lost lines and its idle, and its
        # client then waited for ever; unbounded, ZMQ's I/O thread keeps reading the replica's output.
        self.iopub.setsockopt(zmq.RCVHWM, 0)
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


class RouterRelay(RouterState):
    """The router's part that moves Jupyter messages between clients and replicas."""

    async def bind(self, *, port_range: tuple[int, int] | None = None) -> None:
        """Bind the client-facing sockets at the kernel's connection info.

        With ``port_range`` (a kernel starting or restarting: the kernel manager adopts the router's ports before
        its clients connect) a port that another process took since the kernel manager picked it, and that is not
        freed within ``PORT_FREED_WAIT_S``, is replaced by a free one, in the range (lowest, highest) or anywhere
        when that is (0, 0); ``self.ports`` then says which. Without it (a kernel re-attached after a gateway
        restart: EG adopts the ports of its record) a taken port is an error."""
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
            try:
                port = await bind_client_socket(sock, self.ip, self.ports[name], port_range)
            except zmq.ZMQBaseError as err:  # ZMQBindError (no free port in the range) is not a ZMQError
                sock.close(0)
                raise LaunchError(
                    f"kernel {self.kernel_id}: cannot bind its {name} channel at {self.ip}:{self.ports[name]}: {err}"
                ) from err
            if port != self.ports[name]:
                log.warning(
                    "kernel %s: port %d of its %s channel was taken before the router bound it; it uses %d",
                    self.kernel_id,
                    self.ports[name],
                    name,
                    port,
                )
                self.ports = {**self.ports, name: port}
            self._sockets[name] = ClientSocket(sock, name, self.local_clients)

    def _replica_registered(self, registration: ReplicaRegistration) -> None:
        rid = registration.replica_id
        rejoined = self._rejoined(registration)
        if rejoined is not None:  # it ran a cell while etcd dropped it: the same connections serve on
            self.links[rid] = rejoined
            self.replicas.register(registration)
            log.info("kernel %s: replica %s registered again while it ran a cell", self.kernel_id, rid)
            return
        old = self.links.pop(rid, None)
        if old is not None:
            old.close()
        link = ReplicaLink(self.ctx, registration, self.identity)
        self.links[rid] = link
        self.replicas.register(registration)
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

    def _status(self, request: WireMessage, state: str) -> WireMessage:
        """An iopub ``status`` message (``busy`` or ``idle``) for ``request``, sent in the kernel's name."""
        return self.signer.make("status", {"execution_state": state}, request, idents=[b"kernel.status"])

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
            idle = self._status(cell.request, "idle")
            self._spawn(self._send_all(iopub, [error.frames(), idle.frames()]))
        if shell is not None:
            reply = self.signer.make("execute_reply", content, cell.request, metadata=metadata)
            self._spawn(self._send_all(shell, [reply.frames()]))
        self._stop_queue_on_error(cell, "error")
        if not cell.done.done():
            cell.done.set_result(None)

    def _stop_queue_on_error(self, cell: PendingCell, status: object) -> None:
        """A failed cell aborts the execute_requests queued behind it, as ipykernel does ("Run All" stops at the
        first error). Here they wait in the router, not in a kernel, so the router answers each "aborted" and none
        reaches a replica (no record, no execution count). Requests that arrive after the reply run."""
        if status != "error" or not _stops_on_error(cell.request):
            return
        kept: list[PendingCell] = []  # cells adopted from a previous gateway are running already
        while not self._queue.empty():
            queued = self._queue.get_nowait()
            if any(queued is adopted for adopted in self.adopted_cells):
                kept.append(queued)
            else:
                self._abort_reply(queued)
        for adopted in kept:
            self._queue.put_nowait(adopted)

    def _abort_reply(self, cell: PendingCell) -> None:
        """Answer a queued ``cell`` "aborted": busy and idle on iopub around the reply, as ipykernel does."""
        iopub, shell = self._sockets.get("iopub"), self._sockets.get("shell")
        if iopub is not None:
            busy = self._status(cell.request, "busy")
            self._spawn(self._send_all(iopub, [busy.frames()]))
        if shell is not None:
            metadata = {"status": "aborted", METADATA_KEY: {"queued_ms": self._queued_ms(cell), "aborted": True}}
            reply = self.signer.make("execute_reply", {"status": "aborted"}, cell.request, metadata=metadata)
            self._spawn(self._send_all(shell, [reply.frames()]))
        if iopub is not None:
            idle = self._status(cell.request, "idle")
            self._spawn(self._send_all(iopub, [idle.frames()]))
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
    async def _send_all(sock: ClientSocket, messages: list[list[bytes]]) -> None:
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
            msg = await self._take_from_client(name, handler, frames)
            if name == "shell" and msg is not None and msg.idents:
                self.client_messages["zmq"] += 1
                last = self._zmq_shell_last
                last[msg.idents[0]] = msg.msg_id
                last.move_to_end(msg.idents[0])
                while len(last) > MAX_CLIENT_STREAMS:
                    last.popitem(last=False)

    def takes_shell_directly(self, identity: bytes, last_sent: str | None) -> bool:
        """Whether the websocket handler (of this process) whose shell stream has ZMQ identity ``identity`` may hand
        its next shell message to :meth:`from_client_shell` rather than send it over ZMQ: once this router has
        handled the last message it sent that way (msg_id ``last_sent``; None: it sent none), so that none
        overtakes one still on its way. (The handler also waits until a reply came back over that stream, so that
        this router's ROUTER socket knows where the reply goes.)"""
        handled = self._zmq_shell_last.get(identity)
        return handled is not None and (last_sent is None or handled == last_sent)

    async def from_client_shell(self, frames: list[bytes]) -> None:
        """A shell message handed over by this process's websocket handler (see takes_shell_directly), handled as
        if it came over ZMQ, without that hop: two event loop turns and both ends' I/O threads, about a third of a
        millisecond on the critical path of every cell."""
        self.client_messages["direct"] += 1
        await self._take_from_client("shell", self._on_client_shell, frames)

    async def _take_from_client(
        self, name: str, handler: Callable[[WireMessage], Awaitable[None]], frames: list[bytes]
    ) -> WireMessage | None:
        """Parse and handle a client's message; returns it (None: malformed, dropped)."""
        try:
            msg = WireMessage.parse(frames)
            _ = msg.header  # parse now, so a bad header is refused here
        except MalformedMessage as err:
            log.warning("kernel %s: dropped a malformed %s message: %s", self.kernel_id, name, err)
            return None
        try:
            await handler(msg)
        except MalformedMessage as err:
            log.warning("kernel %s: dropped a %s message: %s", self.kernel_id, name, err)
        except zmq.ZMQError as err:
            log.warning("kernel %s: could not forward a %s message: %s", self.kernel_id, name, err)
        return msg

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
        if msg.msg_type == "interrupt_request" and self._interrupt_unsent():
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

    def _interrupt_unsent(self) -> bool:
        """Interrupt the cell that has not reached a replica yet; False if there is none.

        A cell waiting for GPUs leaves the queue. A cell whose decision is being committed is marked: its
        directive then tells the executor to answer it as interrupted and run nothing (the seq is taken, so the
        executor still publishes its empty record). Sent on to a replica instead, the interrupt would reach one that
        runs nothing yet, and ipykernel ignores SIGINT between requests: the cell would then run to its end."""
        if self.running is not None:
            return False
        waiting = self.waiting
        if waiting is not None:
            waiting.interrupted = True
            if waiting.waiter is not None:
                waiting.waiter.cancel()
            return True
        committing = self.committing
        if committing is not None:
            committing.interrupted = True
            return True
        return False

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
        return max(self.links, key=lambda r: (self.replicas.applied(r), r))

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
            self.replicas.note_applied(link.replica_id, cell.seq)
            self.cells_run += 1
            self._stop_queue_on_error(cell, metadata.get("status") or _reply_status(msg))
            if not cell.done.done():
                cell.done.set_result(None)
            return
        if self._routes.get(msg.parent_msg_id) == link.replica_id:
            await self._sockets["shell"].send_multipart(frames)

    async def _on_replica_control(self, link: ReplicaLink, msg: WireMessage, frames: list[bytes]) -> None:
        if not msg.idents:
            # A reply to the router's own request (RouterRelay._ask), or an interrupt's (from a signal).
            answer = self._answers.get(msg.parent_msg_id)
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
            owed = self._idle_owed.get(link.replica_id)
            if (
                owed is not None
                and msg.msg_type == "status"
                and msg.content().get("execution_state") == "idle"
                and any(request.msg_id == parent for request in owed)
            ):
                owed[:] = [request for request in owed if request.msg_id != parent]
                if not owed:
                    del self._idle_owed[link.replica_id]
            cell = self.running
            if cell is not None and parent == cell.request.msg_id:
                cell.began_executing = True
        elif link.replica_id != self._target_replica():
            return  # unparented output (e.g. a background thread): from the executor only
        await self._sockets["iopub"].send_multipart(frames)

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
