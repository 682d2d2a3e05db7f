"""The replica router's ZMQ relay: the client-facing sockets, the sockets to each replica, and what goes where.

- Shell requests other than ``execute_request`` go to the current executor (or the most up-to-date replica);
  ``shutdown_request`` goes to all replicas; stdin replies go to the replica that asked.
- iopub: a replica's messages reach clients only when their parent request was routed to that replica,
  so every output arrives exactly once.
- Heartbeats are answered while a quorum of replicas is registered.
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import zmq
import zmq.asyncio

from jupyter_notebookos.gateway.router.sockets import (
    ClientSocket,
    LocalClient,
    ReplicaLink,
    bind_client_socket,
    forget_local_clients,
    local_clients_of,
)
from jupyter_notebookos.gateway.router.tasks import RouterTasks, log
from jupyter_notebookos.gateway.router.wire import MalformedMessage, Signer, WireMessage
from jupyter_notebookos.launchers.base import LaunchError
from jupyter_notebookos.replication.protocol import ReplicaRegistration

# What a client may send on a kernel's control channel: interrupts, shutdown, the debugger, and kernel_info
# (read-only; jupyter_server's websocket handler sends it there to see that the kernel answers).
CONTROL_REQUESTS = frozenset({"interrupt_request", "shutdown_request", "debug_request", "kernel_info_request"})

#: How many request ids the router remembers for routing iopub (oldest forgotten first).
ROUTE_MEMORY = 4096
#: How many client connections (shell stream identities) the router remembers the last ZMQ message of.
MAX_CLIENT_STREAMS = 1024
#: Requests whose "idle" a replica still owes that the router keeps, per replica (the latest; see say_owed_idle).
IDLES_OWED_KEPT = 16


class RelayEvents(Protocol):
    """What the relay tells its router, and asks it: which replica takes a request, and everything about cells."""

    async def on_execute_request(self, msg: WireMessage) -> None:
        """A client sent an ``execute_request``: a cell to queue."""

    async def on_execute_reply(self, link: ReplicaLink, msg: WireMessage) -> bool:
        """Replica ``link`` sent an ``execute_reply``; True when the router answered the client with it (the
        running cell's), False to relay it as any other reply."""

    def on_cell_output(self, parent_msg_id: str) -> None:
        """A replica sent iopub output for ``parent_msg_id``, a request routed to it."""

    def interrupt_unsent(self) -> bool:
        """Interrupt a cell that has not reached a replica yet; False if there is none."""

    async def shutdown_requested(self, msg: WireMessage) -> None:
        """A client asked the kernel to shut down (``msg``, to be sent to every replica)."""

    def target_replica(self, *, prefer_running: bool = False) -> str | None:
        """Where a request other than a cell goes (None: nowhere)."""

    async def until_serving(self) -> None:
        """Return once the kernel answers heartbeats (a quorum of its replicas, or it is stopping)."""


class Relay:
    """The kernel's client-facing sockets and its sockets to each replica: it moves Jupyter messages between them.

    - Shell requests other than ``execute_request`` go where the router says (the current executor, or the most
      up-to-date replica); ``shutdown_request`` goes to all replicas; stdin replies go to the replica that asked.
    - iopub: a replica's messages reach clients only when their parent request was routed to that replica, so every
      output arrives exactly once.
    - Heartbeats are answered while the router says the kernel serves (a quorum of replicas is registered).

    Cells are the router's: the relay hands it each ``execute_request`` and ``execute_reply`` (:class:`RelayEvents`)
    and sends what it is given."""

    def __init__(
        self,
        *,
        kernel_id: str,
        ip: str,
        ports: dict[str, int],
        signer: Signer,
        max_message_bytes: int,
        tasks: RouterTasks,
        events: RelayEvents,
    ) -> None:
        self.kernel_id = kernel_id
        self.ip = ip
        self.signer = signer
        self.max_message_bytes = max_message_bytes
        self._tasks = tasks
        self._events = events
        self._ports = dict(ports)
        self.ctx = zmq.asyncio.Context.instance()
        self.identity = f"notebookos-router-{kernel_id}".encode()
        # The kernel's clients in this process (websocket connections): they get what the router sends to clients
        # in-process (see ClientSocket).
        self.local_clients: weakref.WeakSet[LocalClient] = local_clients_of(kernel_id)
        self._sockets: dict[str, ClientSocket] = {}
        self._links: dict[str, ReplicaLink] = {}
        # Links of replicas whose registration etcd dropped while they ran the cell (why it dropped, too): kept
        # through the rejoin grace, for the cell's output and reply (see ReplicaRouter._replica_gone).
        self._held: dict[str, tuple[ReplicaLink, str]] = {}
        self._routes: OrderedDict[str, str] = OrderedDict()  # request msg_id -> replica id
        self._answers: dict[str, asyncio.Future[dict[str, Any]]] = {}  # the router's own control request -> answer
        self._stdin_owner: str | None = None
        # Per client shell stream (ZMQ identity): the msg_id of the last message handled that came over ZMQ (see
        # takes_shell_directly); and how many shell messages came each way.
        self._zmq_shell_last: OrderedDict[bytes, str] = OrderedDict()
        self._client_messages = {"zmq": 0, "direct": 0}
        # Per replica: the requests of the cells it was sent whose "idle" has not come back yet, oldest first (a
        # replica sends a cell's reply before its idle, and the next cell may follow the reply; see say_owed_idle).
        self._idle_owed: dict[str, list[WireMessage]] = {}

    # -- reading ------------------------------------------------------------------------------------

    @property
    def ports(self) -> dict[str, int]:
        """The kernel's ports, where its client-facing sockets are bound (or will be)."""
        return self._ports

    def is_connected(self, replica_id: str) -> bool:
        """Whether the relay has sockets to replica ``replica_id`` (it is registered)."""
        return replica_id in self._links

    def connected(self) -> list[str]:
        """The replicas the relay has sockets to."""
        return list(self._links)

    def holds(self, replica_id: str) -> bool:
        """Whether the sockets of replica ``replica_id`` are held through the rejoin grace (see :meth:`hold`)."""
        return replica_id in self._held

    def client_socket(self, channel: str) -> ClientSocket | None:
        """The client-facing socket of ``channel`` (None once closed)."""
        return self._sockets.get(channel)

    def client_messages(self) -> dict[str, int]:
        """How clients' shell messages came: over ZMQ, or handed over in-process (``direct``)."""
        return dict(self._client_messages)

    def delivered_in_process(self) -> int:
        """How many messages the kernel's clients in this process took in-process."""
        return sum(sock.delivered for sock in self._sockets.values())

    # -- lifecycle ----------------------------------------------------------------------------------

    async def bind(self, *, port_range: tuple[int, int] | None = None) -> None:
        """Bind the client-facing sockets at the kernel's connection info.

        With ``port_range`` (a kernel starting or restarting: the kernel manager adopts the router's ports before
        its clients connect) a port that another process took since the kernel manager picked it, and that is not
        freed within ``PORT_FREED_WAIT_S``, is replaced by a free one, in the range (lowest, highest) or anywhere
        when that is (0, 0); :attr:`ports` then says which. Without it (a kernel re-attached after a gateway
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
                sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
            if kind == zmq.ROUTER:
                sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
            try:
                port = await bind_client_socket(sock, self.ip, self._ports[name], port_range)
            except zmq.ZMQBaseError as err:  # ZMQBindError (no free port in the range) is not a ZMQError
                sock.close(0)
                raise LaunchError(
                    f"kernel {self.kernel_id}: cannot bind its {name} channel at {self.ip}:{self._ports[name]}: {err}"
                ) from err
            if port != self._ports[name]:
                log.warning(
                    "kernel %s: port %d of its %s channel was taken before the router bound it; it uses %d",
                    self.kernel_id,
                    self._ports[name],
                    name,
                    port,
                )
                self._ports = {**self._ports, name: port}
            self._sockets[name] = ClientSocket(sock, name, self.local_clients)

    def start(self) -> None:
        """Serve the kernel's clients: their shell, control and stdin requests, and heartbeats."""
        self._tasks.spawn(self._client_loop("shell", self._on_client_shell))
        self._tasks.spawn(self._client_loop("control", self._on_client_control))
        self._tasks.spawn(self._client_loop("stdin", self._on_client_stdin))
        self._tasks.spawn(self._heartbeat_loop())

    def close(self) -> None:
        """Close every socket (the router cancelled the loops). Connections in this process stay (see
        :func:`forget_local_clients`) for the kernel's next router."""
        for link in [*self._links.values(), *(held for held, _ in self._held.values())]:
            link.close()
        self._links.clear()
        self._held.clear()
        for sock in self._sockets.values():
            sock.close(0)
        self._sockets.clear()
        forget_local_clients(self.kernel_id)

    # -- replicas' sockets --------------------------------------------------------------------------

    def connect(self, registration: ReplicaRegistration) -> None:
        """Open sockets to a replica that registered (replacing those of an earlier process under its id)."""
        rid = registration.replica_id
        old = self._links.pop(rid, None)
        if old is not None:
            old.close()
        link = ReplicaLink(self.ctx, registration, self.identity)
        self._links[rid] = link
        link.tasks.append(self._tasks.spawn(self._replica_loop(link, link.shell, self._on_replica_shell)))
        link.tasks.append(self._tasks.spawn(self._replica_loop(link, link.control, self._on_replica_control)))
        link.tasks.append(self._tasks.spawn(self._replica_loop(link, link.stdin, self._on_replica_stdin)))
        link.tasks.append(self._tasks.spawn(self._replica_loop(link, link.iopub, self._on_replica_iopub)))

    def disconnect(self, replica_id: str) -> bool:
        """Close the sockets to replica ``replica_id``; False if there were none."""
        link = self._links.pop(replica_id, None)
        if link is None:
            return False
        link.close()
        return True

    def hold(self, replica_id: str, why: str) -> None:
        """Replica ``replica_id``'s registration vanished (``why``) while it ran a cell: keep its sockets, apart,
        for the cell's output and reply, until :meth:`take_held`."""
        link = self._links.pop(replica_id)
        self._held[replica_id] = (link, why)

    def take_held(self, replica_id: str) -> tuple[ReplicaLink, str] | None:
        """The held sockets of replica ``replica_id`` and why they were held (None: none held). They are the
        caller's now: it serves on with them (:meth:`reconnect`) or closes them."""
        return self._held.pop(replica_id, None)

    def reconnect(self, link: ReplicaLink, registration: ReplicaRegistration) -> None:
        """A held replica registered again, the same process: its sockets serve on."""
        link.registration = registration
        self._links[registration.replica_id] = link

    # -- to replicas --------------------------------------------------------------------------------

    def send_cell(self, replica_id: str, request: WireMessage, frames: list[bytes]) -> Awaitable[Any]:
        """Send a cell (``frames``, the client's ``request`` as the router forwards it) to its executor."""
        self.remember_route(request.msg_id, replica_id)
        owed = self._idle_owed.setdefault(replica_id, [])
        owed.append(request)
        del owed[:-IDLES_OWED_KEPT]
        return self._links[replica_id].shell.send_multipart(frames)

    def remember_route(self, msg_id: str, replica_id: str) -> None:
        """Replies and output for request ``msg_id`` come from replica ``replica_id``."""
        self._routes[msg_id] = replica_id
        self._routes.move_to_end(msg_id)
        while len(self._routes) > ROUTE_MEMORY:
            self._routes.popitem(last=False)

    async def forward_shutdown(self, msg: WireMessage) -> None:
        """Send a client's ``shutdown_request`` to every replica (clients get one reply)."""
        for rid, link in list(self._links.items()):
            self.remember_route(msg.msg_id, rid)
            await link.control.send_multipart(msg.frames())

    async def interrupt(self, replica_id: str) -> None:
        """Send replica ``replica_id`` (held or connected) an interrupt of the router's own."""
        held = self._held.get(replica_id)
        link = held[0] if held is not None else self._links.get(replica_id)
        if link is None:
            return
        msg = self.signer.make("interrupt_request", {}, self._synthetic_parent("interrupt_request"), idents=[])
        await link.control.send_multipart(msg.frames())

    async def ask(self, replica_id: str, msg_type: str, content: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send a replica a request of the router's own on its control channel; returns the answer's content
        (status "error" when it is not connected or does not answer within ``timeout`` seconds)."""
        link = self._links.get(replica_id)
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

    # -- to clients ---------------------------------------------------------------------------------

    def status(self, request: WireMessage, state: str) -> WireMessage:
        """An iopub ``status`` message (``busy`` or ``idle``) for ``request``, sent in the kernel's name."""
        return self.signer.make("status", {"execution_state": state}, request, idents=[b"kernel.status"])

    def send(self, channel: str, frames: list[bytes]) -> Awaitable[Any]:
        """Send ``frames`` to the clients on ``channel`` (awaited by the caller: in order with what follows)."""
        return self._sockets[channel].send_multipart(frames)

    def send_soon(self, channel: str, messages: list[list[bytes]]) -> asyncio.Task[None] | None:
        """Send ``messages`` to the clients on ``channel`` in the background, in order; None once the socket is
        closed (nothing is sent)."""
        sock = self._sockets.get(channel)
        if sock is None:
            return None
        return self._tasks.spawn(_send_all(sock, messages))

    def say_owed_idle(self, replica_id: str, *, running: str | None, quiet: bool) -> None:
        """Replica ``replica_id``'s sockets are closed. For each cell it replied to whose "idle" has not come (it
        died in between, or its lease ended then), say "idle" for it: clients wait for both. ``running``: the
        request of a cell it still runs (answered by the router, idle included, or sent again); ``quiet``: the
        kernel is stopping, say nothing."""
        owed = self._idle_owed.pop(replica_id, [])
        owed = [request for request in owed if request.msg_id != running]
        if not owed or "iopub" not in self._sockets or quiet:
            return
        log.warning(
            "kernel %s: replica %s is gone before the idle of %d cell(s) it replied to; saying it for them",
            self.kernel_id,
            replica_id,
            len(owed),
        )
        self.send_soon("iopub", [self.status(request, "idle").frames() for request in owed])

    # -- client side --------------------------------------------------------------------------------

    async def _client_loop(self, name: str, handler: Callable[[WireMessage], Awaitable[None]]) -> None:
        sock = self._sockets[name]
        while True:
            frames = await sock.recv_multipart(copy=True)
            msg = await self._take_from_client(name, handler, frames)
            if name == "shell" and msg is not None and msg.idents:
                self._client_messages["zmq"] += 1
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
        self._client_messages["direct"] += 1
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
            await self._events.on_execute_request(msg)
            return
        target = self._events.target_replica()
        if target is None:
            log.warning("kernel %s: no replica to take %s", self.kernel_id, msg.msg_type)
            return
        self.remember_route(msg.msg_id, target)
        await self._links[target].shell.send_multipart(msg.frames())

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
            await self._events.shutdown_requested(msg)
            return
        if msg.msg_type == "interrupt_request" and self._events.interrupt_unsent():
            reply = self.signer.make("interrupt_reply", {"status": "ok"}, msg)
            await self._sockets["control"].send_multipart(reply.frames())
            return
        target = self._events.target_replica(prefer_running=True)
        if target is None:
            return
        self.remember_route(msg.msg_id, target)
        await self._links[target].control.send_multipart(msg.frames())

    async def _on_client_stdin(self, msg: WireMessage) -> None:
        target = self._stdin_owner or self._events.target_replica(prefer_running=True)
        if target is not None and target in self._links:
            await self._links[target].stdin.send_multipart(msg.frames())

    async def _heartbeat_loop(self) -> None:
        sock = self._sockets["hb"]
        while True:
            frames = await sock.recv_multipart()
            # No answer while a majority of replicas is missing: the client sees the kernel as dead.
            await self._events.until_serving()
            await sock.send_multipart(frames)

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
        if msg.msg_type == "execute_reply" and await self._events.on_execute_reply(link, msg):
            return
        if self._routes.get(msg.parent_msg_id) == link.replica_id:
            await self._sockets["shell"].send_multipart(frames)

    async def _on_replica_control(self, link: ReplicaLink, msg: WireMessage, frames: list[bytes]) -> None:
        if not msg.idents:
            # A reply to the router's own request (ask), or an interrupt's (from a signal).
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
            self._events.on_cell_output(parent)
        elif link.replica_id != self._events.target_replica():
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


async def _send_all(sock: ClientSocket, messages: list[list[bytes]]) -> None:
    for frames in messages:
        await sock.send_multipart(frames)
