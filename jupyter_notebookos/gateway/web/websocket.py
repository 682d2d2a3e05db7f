"""The gateway's kernel channels websocket: Enterprise Gateway's handler, made fast and reconnect-safe.

Three faults of the stock handler (EG 3.3 on jupyter_server 1.24) are fixed here, and one hop is saved.

**No TCP_NODELAY.** Kernel messages are small websocket frames; without TCP_NODELAY the kernel's reply waits
behind Nagle's algorithm and the client's delayed ACK. A trivial cell takes about 48 ms instead of about
9 ms. `KernelChannelsHandler.open` sets it on every connection.

**A reconnect with the same session id stalls for minutes.** JupyterLab 4 talking to a Jupyter server with
``--gateway-url`` showed its first cell output only after about 100 s. The chain of causes:

1. When a notebook opens, the browser opens the kernel websocket, closes it again within milliseconds and
   opens a new one with the same ``session_id`` (Lab's ``clientId``); seen on every new notebook.
2. The Jupyter server proxies each browser websocket with one upstream websocket to the gateway
   (jupyter_server 2.x ``gateway/connections.py``, ``GatewayWebSocketConnection``). Its ``disconnect()``
   cannot cancel an upstream ``websocket_connect`` still in flight (tornado futures ignore ``cancel()``), and
   ``_connection_done`` then drops the established upstream websocket without closing it. So the gateway
   holds a first, abandoned connection that nobody reads, and gets a second one with the same session id.
3. jupyter_server 1.24's ``ZMQChannelsHandler._register_session`` (services/kernels/handlers.py) finds the
   first handler as a "stale connection" and *awaits* its ``close()`` inside the second connection's
   handshake. That future resolves only in the stale handler's ``on_close``: its ``close()`` does nothing
   while the stale handler is itself still in its handshake, and once open, its peer never answers the close
   frame. It resolves when the abandoned TCP connection finally dies, after the Jupyter server's upstream
   ``request_timeout`` (42 s by default), and by then the Jupyter server has given up on the second
   handshake too and retries.
4. Handlers whose client already gave up still finish their handshakes, and the stock ``on_close`` also runs
   for a handler that never opened: it decrements a connection count it never incremented and, when the
   count reads zero, "buffers" the session with whatever channels the handler had, possibly none. The
   next retry "restores" that buffer and ``nudge()`` fails with ``KeyError: 'iopub'``; only a later retry
   (if any) gets through. Measured here: no output within 200-300 s; DESIGN.md noted about 100 s.

The fix, in our handler rather than in the installed packages:

- A session's connections never wait for each other, and none is refused. Which of them serves the session is
  settled by what they do: the connection that opened last takes the session's ZMQ streams (handed over
  directly, so nothing queued in them is lost and no second socket claims the ZMQ identity), and the one it took
  them from stays open on standby. A standby connection that receives a message from its client is the live
  one: it takes the streams back before forwarding the message. When the connection holding the streams
  receives a message from its client, the session's standby connections are closed (in the background).
- Why not "the newest connection wins", as this handler first did: the Jupyter server's abandoned upstream
  connection can reach the gateway *after* the live one (arrival order at the gateway is not the browser's
  order). Refusing the live one's handshake (HTTP 409) made the Jupyter server drop the messages its client
  sent meanwhile ("Ignoring message on failed connection") and retry 1-2 s later: a new notebook's first cell
  was lost (CI, 2026-12-03: `print(1+1)` never ran). Closing an opened live connection loses messages the same
  way. A connection that has not said anything cannot be told from an abandoned one; one that speaks can.
- ``on_close`` of a handler that never opened touches neither the connection count nor the buffer; the
  connection holding the streams hands them to a standby connection, if any, instead of closing them.
- ``nudge()`` re-creates any missing or closed channel first, so it never hits a missing channel.
- A handler whose client left during its handshake never creates streams.

Why this is right: a session id names one client, so at most one of its connections is live, and only the live
one sends messages; kernel output goes to the connection that opened last until the live one speaks. The fault
is triggered by the Jupyter server's gateway client, which we do not control (users bring their own
Lab/Notebook), so the gateway must tolerate it.

**A malformed message drops the connection.** The stock ``on_message`` parses what the client sent and lets any
error escape (text that is not JSON, a message without a header, a header that is not an object); tornado then
logs it and aborts the websocket, and with it whatever output was on its way to that client. Here such a message
is logged and ignored, and the connection goes on. (A message over the websocket's size limit still ends the
connection: tornado closes it with code 1009 before any handler sees it.)

**A cell's request took a needless hop.** The stock handler sends every client message to the kernel's ZMQ sockets.
For a NotebookOS kernel those are its router's, in this very process, so each shell message went through two
event loop turns and both ends' ZMQ I/O threads: 0.6 ms of every cell's critical path, measured, for one
function call's worth of work. Here a shell message is handed to the router directly (``_forward``), once
the router has handled the last message this connection sent over ZMQ (so no message overtakes an earlier one
still on its way) and a reply came back over the connection (so the router's ROUTER socket knows where the reply
goes). Measured: 0.24 ms instead of 0.61 ms from the websocket to the router (medians of 13 cells). The other way,
the router hands what it sends its clients to this handler in-process as it sends it (``deliver_from_kernel``,
called by the router's ``ClientSocket``): the stream's receiver gets it at once, as if it came over ZMQ. A reply
(shell, control, stdin) then goes no further; an iopub message still goes over ZMQ, for the kernel manager's
activity watch, and this handler drops that copy when it comes (by its header frame; jupyter_client's session would
refuse it anyway, as a signature seen twice). A connection takes messages in-process only once nothing the router
sent it over ZMQ is still on its way: after it takes the session's streams (a restored buffer, a hand-over),
messages go over ZMQ until the copy of the latest one the router sent has come through this handler. Before that,
a reconnect while a cell printed could get newer output before older output still on its way over ZMQ (measured:
4 of 8 reconnects). New streams have nothing on their way: they take messages in-process at once, nudged or not
(the stock open does not nudge a busy kernel, and a message sent before the new iopub subscription was live was
lost, as with a stock kernel). Lines written to the connection the client closed are lost, as with a plain kernel,
but more of them: a NotebookOS kernel's output reaches the client later (3000 flushed lines: the client had the last
one 1.7-2.1 s after the request, 1.0-1.1 s from a plain kernel; the replica itself took 1.2 s against 0.7-0.9 s).

**A restart may move a NotebookOS kernel to other ports** (its router binds other ones when one was taken meanwhile,
see relay.bind_client_socket). The stock handler notices that only when it restores a buffered session, and only
the first time it asks the kernel manager (``ports_changed`` says so once per kernel). Here every connection's
streams note the port they connect to; streams a connection takes from another, restores from the buffer or kept
open through the restart (checked when its client speaks) are replaced by new ones at the kernel's ports when they
are stale. JupyterLab reconnects after a restart for this reason, and the gateway may see its new connection open
before the old one closes: before, the new one took the old one's streams, and its cells never ran.

`handler_overrides()` lists the URL patterns this module serves, for the gateway app to install in place of
EG's own handler (see `install_overrides`).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable
from typing import Any, ClassVar

import zmq
from enterprise_gateway.services.kernels.handlers import ZMQChannelsHandler
from jupyter_server.base.zmqhandlers import deserialize_binary_message, deserialize_msg_from_ws_v1
from jupyter_server.services.kernels.handlers import ZMQChannelsHandler as ServerChannelsHandler
from jupyter_server.services.kernels.handlers import _kernel_id_regex
from jupyter_server.utils import url_path_join

from jupyter_notebookos.gateway.router.sockets import forget_local_clients, local_clients_of
from jupyter_notebookos.gateway.router.wire import MalformedMessage, WireMessage

WS_V1 = "v1.kernel.websocket.jupyter.org"
#: Messages handed over in-process whose ZMQ copy a stream still waits for, at most (older ones are forgotten: more
#: than ZMQ keeps queued between a PUB and a SUB socket, 1000 each way by default, though TCP buffers hold more; a
#: copy that still comes is known by its signature, which the connection's session has seen: _on_zmq_reply).
HANDED_KEPT = 4096


CHANNELS = ("iopub", "shell", "control", "stdin")

# Relative to the gateway's base_url, as EG's own default handlers are.
CHANNELS_PATTERN = rf"/api/kernels/{_kernel_id_regex}/channels"


class KernelChannelsHandler(ZMQChannelsHandler):
    """EG's kernel websocket with TCP_NODELAY, and a session's connections settled by what they do."""

    channels: dict[str, Any]  # channel name -> ZMQStream, as in the stock handler
    _on_close_called: bool  # tornado's: on_close has run
    _opened: bool
    _proven: bool  # its client sent a message while it held the session's streams
    # Per session key: its opened connections that do not hold the streams (newest last). The holder is the
    # stock handler's ``_open_sessions[session_key]``.
    _standby: ClassVar[dict[str, list[KernelChannelsHandler]]] = {}

    def initialize(self) -> None:
        """Per-connection state, on top of the stock handler's."""
        super().initialize()
        self._opened = False
        self._proven = False
        self._nudging: Any = None  # the stock open's nudge of the kernel, while it runs

    async def _register_session(self) -> None:
        """Name this connection's session; never wait for (or close) an earlier connection of it."""
        self.session_key = f"{self.kernel_id}:{self.session.session}"

    async def open(self, kernel_id: str) -> Any:
        """Open with TCP_NODELAY, taking the session's streams from the connection that holds them, if any."""
        await self._holder_settled()
        if self._on_close_called:
            # The client left during the handshake (tornado already ran on_close): creating streams now
            # would leak them.
            self.close()
            return None
        # Kernel messages are small frames: without this, each one waits on Nagle and delayed ACKs.
        self.set_nodelay(True)
        self._opened = True
        holder = self._open_sessions.get(self.session_key)
        if holder is None or holder is self or not holder.channels or kernel_id not in self.kernel_manager:
            # The stock way: restore a buffered session, or new streams; then nudge the kernel.
            self._renew_buffered_streams()
            restoring = self._buffered() is not None  # else the stock open creates new streams
            connected = super().open(kernel_id)
            if kernel_id in self.kernel_manager and self.channels:
                self._open_sessions[self.session_key] = self
                # New streams (no buffered session restored into them) have nothing on their way: in-process at
                # once. The nudge no longer proves that the iopub subscription is live, and need not: a kernel
                # found busy is not nudged at all, and its output went to a subscription not yet live (lost, as
                # with a stock kernel; CI: a second client's first cell answered without its stream).
                self._take_messages_in_process(fresh=not restoring)
            self._nudging = connected
            return await connected if connected is not None else None
        self.log.warning("Replacing stale connection: %s (it stays open on standby)", self.session_key)
        # The websocket's own set-up (pings) without the stock handler's streams. (mypy cannot see that EG's
        # handler class, untyped, derives from the stock one.)
        super(ServerChannelsHandler, self).open()  # type: ignore[misc]
        km = self.kernel_manager
        km.notify_connect(kernel_id)
        km.add_restart_callback(kernel_id, self.on_kernel_restarted)
        km.add_restart_callback(kernel_id, self.on_restart_failed, "dead")
        self._take_streams_from(holder)
        return None

    async def _holder_settled(self) -> None:
        """Wait while the session's stream holder still nudges the kernel: its nudge listens on the streams and
        unhooks their callbacks when it ends, so they must not change hands before then."""
        while True:
            holder = self._open_sessions.get(getattr(self, "session_key", None))
            nudging = holder._nudging if holder is not None and holder is not self else None
            if nudging is None or nudging.done():
                return
            with contextlib.suppress(Exception):  # its own failure is the holder's to report
                await nudging

    def _take_streams_from(self, holder: KernelChannelsHandler) -> None:
        """Serve the session from now on with ``holder``'s streams; ``holder`` goes on standby."""
        channels, holder.channels = holder.channels, {}
        if self._stale(channels):
            self._renew_streams(channels)
        else:
            for stream in channels.values():
                stream.on_recv_stream(self._on_zmq_reply)
            self.channels = channels
            self._take_messages_in_process()
        self._open_sessions[self.session_key] = self
        self._proven = holder._proven = False
        standby = self._standby.setdefault(self.session_key, [])
        if self in standby:
            standby.remove(self)
        if holder._opened and not holder._on_close_called:
            standby.append(holder)

    async def on_message(self, ws_msg: Any) -> None:
        """Forward a client's message; a standby connection that speaks is the live one and takes the streams."""
        if not self._proven:
            if self._open_sessions.get(self.session_key) is not self:
                await self._holder_settled()
                if self._open_sessions.get(self.session_key) is not self:
                    self._claim()
            self._proven = True
            for other in self._standby.pop(self.session_key, []):
                if other is not self:
                    other.close()  # abandoned: it waits for a close frame its peer never sends (tornado: 5 s)
        if self.channels and self._stale(self.channels):  # kept open through a restart that moved the kernel
            self._renew_streams(self.channels)
        try:
            direct = self._forward(ws_msg)
            if direct is not None:
                await direct
        except Exception as exc:  # what the client sent does not parse as a kernel message
            self.log.warning(
                "Ignored a malformed message from a client of kernel %s (%s: %s)",
                self.kernel_id,
                type(exc).__name__,
                exc,
                exc_info=self.log.isEnabledFor(logging.DEBUG),
            )

    def _forward(self, ws_msg: Any) -> Awaitable[None] | None:
        """Send a client's message to the kernel as the stock handler does, except that a shell message goes
        straight to the kernel's router when it runs in this process and nothing this connection sent over ZMQ
        is still on its way (Relay.takes_shell_directly): the result, then, is the router's handling of it,
        to await. That saves a hop on every cell's critical path; the reply comes back over ZMQ as before."""
        if not self.channels:
            self.log.debug("Received message on closed websocket %r", ws_msg)
            return None
        parts: list[bytes] | None = None
        msg: dict[str, Any] | None = None
        if self.subprotocol == WS_V1:
            channel, parts = deserialize_msg_from_ws_v1(ws_msg)
        else:
            msg = deserialize_binary_message(ws_msg) if isinstance(ws_msg, bytes) else json.loads(ws_msg)
            channel = msg.pop("channel", None)
        if channel is None:
            self.log.warning("No channel specified, assuming shell: %s", msg)
            channel = "shell"
        if channel not in self.channels:
            self.log.warning("No such channel: %r", channel)
            return None
        header = msg["header"] if msg is not None else None
        allowed = self.kernel_manager.allowed_message_types
        if allowed or channel == "shell":
            if header is None:
                assert parts is not None
                header = self.session.unpack(parts[0])
            if allowed and header["msg_type"] not in allowed:
                self.log.warning('Received message of type "%s", which is not allowed. Ignoring.', header["msg_type"])
                return None
        stream = self.channels[channel]

        def send(sink: Any, ident: bytes | None = None) -> None:
            if parts is not None:
                self.session.send_raw(sink, parts, ident=ident)
            else:
                self.session.send(sink, msg, ident=ident)

        if channel == "shell":
            assert header is not None
            router = self._router()
            identity = stream.socket.getsockopt(zmq.IDENTITY)
            live = getattr(stream, "notebookos_replied", False)  # its connection is up: a reply came over it
            if (
                live
                and router is not None
                and router.takes_shell_directly(identity, getattr(stream, "notebookos_sent", None))
            ):
                handover = _Frames()
                send(handover, identity)
                return router.from_client_shell(handover.frames)
            stream.notebookos_sent = header["msg_id"]
        send(stream)
        return None

    def _on_zmq_reply(self, stream: Any, msg_list: list[Any]) -> None:
        """A message from the kernel, for this client: as the stock handler, noting that a shell stream's
        connection is up (the router's replies reach it); but the ZMQ copy of a message the router handed over
        in-process already (see deliver_from_kernel) is dropped."""
        handed: OrderedDict[bytes, None] | None = getattr(stream, "notebookos_handed", None)
        latest = getattr(stream, "notebookos_latest", None)
        wire = _parse(msg_list) if handed is not None or latest is not None else None
        header = wire.header_frame if wire is not None else None
        if handed and header is not None and header in handed:
            del handed[header]
            return
        if handed is not None and wire is not None and wire.signature in self.session.digest_history:
            # A copy whose header was no longer kept (a burst of more than HANDED_KEPT messages, as when the gateway
            # stalled): this connection's session had the message in-process, and would refuse it with an error.
            return
        if latest is not None and header == latest:
            # The router's latest message to this stream came over ZMQ: nothing older is on its way any more.
            stream.notebookos_latest = None
            stream.notebookos_direct = True
        if getattr(stream, "channel", None) == "shell":
            stream.notebookos_replied = True
        super()._on_zmq_reply(stream, msg_list)

    def deliver_from_kernel(self, channel: str, frames: list[bytes]) -> bool:
        """A message the kernel's router (in this process) sends its clients on ``channel``, handed over
        in-process (the router's ClientSocket): if it is this client's (this connection holds the session's
        streams; on the ROUTER channels, it is addressed to the session's identity), the stream's receiver (this
        handler's, or the stock nudge's) gets it now, as if it came over ZMQ. An iopub message's ZMQ copy (the
        kernel manager's activity watch subscribes too) is dropped when it comes; a ROUTER channel's message has
        none. Saves the ZMQ hop on every message a cell sends."""
        stream = self.channels.get(channel)
        if stream is None or self._open_sessions.get(self.session_key) is not self or stream.closed():
            return False
        iopub = self.channels.get("iopub")
        if iopub is None or not getattr(iopub, "notebookos_direct", False):
            # Not yet (see the module docstring): over ZMQ, noting the latest iopub message, whose copy says when.
            if stream is iopub:
                iopub.notebookos_latest = _header_frame(frames)
            return False
        # pyzmq's ZMQStream (pinned: 24.0.1) keeps its receiver here; one that wants zmq.Frame objects (copy=False)
        # gets the ZMQ copy instead.
        receiver = getattr(stream, "_recv_callback", None)
        if receiver is None and stream is iopub:
            # Between the stock open's nudge and its hooking up of the streams' receivers (both done callbacks of
            # the nudge): this handler's own, as a copy queued in the socket would get it a moment later.
            def receiver(frames: list[bytes]) -> None:
                self._on_zmq_reply(stream, frames)

        elif receiver is None or not getattr(stream, "_recv_copy", False):
            return False
        if channel != "iopub":
            identity = getattr(stream, "notebookos_identity", None)
            if identity is None:
                identity = stream.notebookos_identity = stream.socket.getsockopt(zmq.IDENTITY)
            if not frames or frames[0] != identity:
                return False
            frames = frames[1:]  # as the DEALER socket would have received it
        header = _header_frame(frames)
        if header is None:
            return False
        try:
            receiver(frames)
        except Exception:  # as pyzmq would (the ZMQ copy then goes the same way)
            self.log.warning("Handing a kernel message to a client in-process failed", exc_info=True)
            return False
        if channel != "iopub":
            return True  # addressed to this client alone: the router sends no ZMQ copy (ClientSocket)
        handed = getattr(stream, "notebookos_handed", None)
        if handed is None:
            handed = stream.notebookos_handed = OrderedDict()
        handed[header] = None
        while len(handed) > HANDED_KEPT:
            handed.popitem(last=False)  # its copy never came (a subscription not in place yet)
        return True

    def _take_messages_in_process(self, fresh: bool = False) -> None:
        """This connection holds the session's streams now: the kernel's router, if it runs in this process,
        hands it its messages in-process from now on (see deliver_from_kernel), and so does the router a restart
        of the kernel makes (they share the kernel's ``local_clients_of``). ``fresh``: the streams were just
        created, so nothing is on its way over them and in-process delivery starts at once."""
        router = self._router()
        if router is not None:
            router.local_clients.add(self)
        iopub = self.channels.get("iopub")
        if iopub is not None:  # in-process once what is on its way over ZMQ came through (deliver_from_kernel)
            iopub.notebookos_direct = fresh
            iopub.notebookos_latest = None

    def create_stream(self) -> None:
        """The stock streams, each noting the kernel's port it connects to (see _stale)."""
        super().create_stream()
        kernel = self.kernel_manager.get_kernel(self.kernel_id)
        for name, stream in self.channels.items():
            stream.notebookos_port = getattr(kernel, f"{name}_port", None)

    def _stale(self, channels: dict[str, Any]) -> bool:
        """Whether ``channels`` connect to ports the kernel no longer listens at: a restart moved its router
        (relay.bind_client_socket binds other ports when one was taken meanwhile)."""
        try:
            kernel = self.kernel_manager.get_kernel(self.kernel_id)
        except KeyError:
            return False
        for name, stream in channels.items():
            port = getattr(stream, "notebookos_port", None)
            if port is not None and port != getattr(kernel, f"{name}_port", port):
                return True
        return False

    def _renew_streams(self, stale: dict[str, Any]) -> None:
        """This connection's streams: new ones, at the kernel's ports, in place of ``stale``, taking messages
        in-process at once (nothing is on its way over new streams). What the kernel sent before the restart over
        ``stale`` is lost with it; its router was replaced anyway."""
        self._replace_streams(stale)
        for stream in self.channels.values():
            stream.on_recv_stream(self._on_zmq_reply)
        self._take_messages_in_process(fresh=True)

    def _buffered(self) -> dict[str, Any] | None:
        """What the kernel manager buffers for this connection's session (its last connection closed), if anything:
        the stock open restores it."""
        buffered = getattr(self.kernel_manager, "_kernel_buffers", {}).get(self.kernel_id)
        return buffered if buffered and buffered.get("session_key") == self.session_key else None

    def _renew_buffered_streams(self) -> None:
        """The session's buffered streams (its last connection closed), if a restart moved the kernel since, are
        replaced by new ones before the stock open restores them: the stock open checks the kernel manager's
        ``ports_changed``, which says so only once per kernel (to whichever connection asks first). The new ones get
        no receiver here: the stock open hooks them up after it replays the buffer."""
        buffered = self._buffered()
        if buffered is None or not self._stale(buffered["channels"]):
            return
        self._replace_streams(buffered["channels"])
        buffered["channels"], self.channels = self.channels, {}

    def _replace_streams(self, stale: dict[str, Any]) -> None:
        """Close ``stale`` and create new streams at the kernel's ports (in ``self.channels``); the kernel manager's
        record of the ports, which the stock open checks a restored session against, is brought up to date."""
        _close(stale)
        self.channels = {}
        self.create_stream()
        self.kernel_manager.ports_changed(self.kernel_id)
        self.log.info(
            "Kernel %s listens at other ports since its restart: %s connects there", self.kernel_id, self.session_key
        )

    def _router(self) -> Any:
        """This kernel's router, when it runs in this process (a NotebookOS kernel), else None."""
        try:
            kernel = self.kernel_manager.get_kernel(self.kernel_id)
        except KeyError:
            return None
        return getattr(getattr(kernel, "process_proxy", None), "router", None)

    def _claim(self) -> None:
        holder = self._open_sessions.get(self.session_key)
        if holder is not None and holder is not self and holder.channels:
            self.log.warning("Standby connection speaks, it takes the session over: %s", self.session_key)
            self._take_streams_from(holder)
            return
        if self.kernel_id not in self.kernel_manager:
            return  # the kernel is gone: the stock handler ignores the message (no channels)
        # Nobody holds the streams (the holder closed while this one was not on standby): new ones.
        self.create_stream()
        for stream in self.channels.values():
            stream.on_recv_stream(self._on_zmq_reply)
        self._open_sessions[self.session_key] = self
        self._take_messages_in_process()

    def nudge(self) -> Any:
        """Nudge the kernel as the stock handler does, after making sure every channel is open."""
        if any(name not in self.channels or self.channels[name].closed() for name in CHANNELS):
            _close(self.channels)
            self.channels = {}
            self.create_stream()
        return super().nudge()

    def on_close(self) -> None:
        """Release this connection: the stream holder hands them to a standby connection, if there is one, else
        closes or buffers them as the stock handler does; a standby or never-opened one only says goodbye."""
        key = getattr(self, "session_key", None)
        standby = self._standby.get(key, []) if key is not None else []
        if self in standby:
            standby.remove(self)
        if key is not None and not standby:
            self._standby.pop(key, None)
        km = self.kernel_manager
        kernel_id = getattr(self, "kernel_id", None)
        if kernel_id is not None and kernel_id not in km:  # the kernel is gone: no router of it will come again
            local_clients_of(kernel_id).discard(self)
            forget_local_clients(kernel_id)
        holds = key is not None and self._open_sessions.get(key) is self  # only an opened connection holds them
        heir = standby[-1] if holds and standby and self.channels and self.kernel_id in km else None
        if holds and heir is None:
            super().on_close()  # the stock way: buffer the session if this was its last connection
            return
        if heir is not None:
            heir._take_streams_from(self)  # the newest standby connection serves the session now
        if self._opened and self.kernel_id in km:
            km.notify_disconnect(self.kernel_id)
            km.remove_restart_callback(self.kernel_id, self.on_kernel_restarted)
            km.remove_restart_callback(self.kernel_id, self.on_restart_failed, "dead")
        _close(self.channels)
        self.channels = {}
        if not self._close_future.done():
            self._close_future.set_result(None)


def _close(channels: dict[str, Any]) -> None:
    """Close the ZMQ streams of ``channels`` (their receivers unhooked first)."""
    for stream in channels.values():
        if not stream.closed():
            stream.on_recv(None)
            stream.close()


def _parse(msg_list: list[bytes]) -> WireMessage | None:
    """A kernel message's frames, split; None if they are not one."""
    try:
        return WireMessage.parse(msg_list)
    except MalformedMessage:
        return None


def _header_frame(msg_list: list[bytes]) -> bytes | None:
    """The header frame of a kernel message's frames (what tells two messages apart), or None if they are not one."""
    wire = _parse(msg_list)
    return None if wire is None else wire.header_frame


class _Frames:
    """Takes the place of a ZMQ stream for ``Session.send``: keeps the frames it was given (led by the sender's
    identity, as the router's ROUTER socket would have received them)."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def send_multipart(self, frames: list[Any], flags: int = 0, copy: bool = True, track: bool = False) -> None:
        self.frames = [bytes(frame) for frame in frames]


def handler_overrides() -> list[tuple[str, type]]:
    """(URL pattern relative to base_url, handler class) pairs that replace Enterprise Gateway's handlers."""
    return [(CHANNELS_PATTERN, KernelChannelsHandler)]


def install_overrides(handlers: list[tuple], base_url: str) -> list[tuple]:
    """Return EG's handler list with our handlers in place of EG's for the same URL patterns.

    `handlers` are the tuples EG's ``_create_request_handlers`` returns (patterns already rooted at
    `base_url`). Raises LookupError if a pattern is missing, so an EG upgrade that renames a route fails
    loudly instead of silently serving the stock handler.
    """
    replacements = {url_path_join("/", base_url, pattern): cls for pattern, cls in handler_overrides()}
    result = []
    for handler in handlers:
        cls = replacements.pop(handler[0], None)
        result.append(handler if cls is None else (handler[0], cls, *handler[2:]))
    if replacements:
        raise LookupError(f"Enterprise Gateway serves no handler for {sorted(replacements)}")
    return result


__all__ = ["KernelChannelsHandler", "handler_overrides", "install_overrides"]
