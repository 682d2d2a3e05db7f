"""The router's sockets: those its clients connect to (:class:`ClientSocket`) and those to one replica
(:class:`ReplicaLink`), how the client-facing ones are bound, and the kernel's clients in this process."""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any, Protocol

import zmq
import zmq.asyncio

from jupyter_notebookos.gateway.router.tasks import log
from jupyter_notebookos.replication.protocol import ReplicaRegistration

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
    """A client of the kernel in this process (the gateway's websocket connection, see gateway/web/websocket.py)."""

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
