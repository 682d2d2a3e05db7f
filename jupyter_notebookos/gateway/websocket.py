"""The gateway's kernel channels websocket: Enterprise Gateway's handler, made fast and reconnect-safe.

Two faults of the stock handler (EG 3.3 on jupyter_server 1.24) are fixed here.

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

- A new connection for a session *supersedes* the stale one without waiting for it. If the stale handler had
  opened, its ZMQ streams are handed over through the kernel manager's message buffer (the same mechanism a
  normal reconnect uses), so the new connection adopts them with nothing lost and no clash of ZMQ
  identities; the stale websocket is then closed in the background. If the stale handler was still in its
  handshake, that handshake is refused (HTTP 409) and it never creates streams.
- ``on_close`` of a handler that never opened touches neither the connection count nor the buffer.
- ``nudge()`` re-creates any missing or closed channel first, so it never hits a missing channel.
- A handler whose client left during its handshake never creates streams.

Why this is right: a session id names one client, and the newest connection for it is the live one; an
older one can only be abandoned or dead, so waiting for it can never help, and its ZMQ streams (same
identity) belong to the newcomer. The fault is triggered by the Jupyter server's gateway client, which we
do not control (users bring their own Lab/Notebook), so the gateway must tolerate it.

`handler_overrides()` lists the URL patterns this module serves, for the gateway app to install in place of
EG's own handler (see `install_overrides`).
"""

from __future__ import annotations

from typing import Any

from enterprise_gateway.services.kernels.handlers import ZMQChannelsHandler
from jupyter_server.services.kernels.handlers import _kernel_id_regex
from jupyter_server.utils import url_path_join
from tornado import web

CHANNELS = ("iopub", "shell", "control", "stdin")

# Relative to the gateway's base_url, as EG's own default handlers are.
CHANNELS_PATTERN = rf"/api/kernels/{_kernel_id_regex}/channels"


class KernelChannelsHandler(ZMQChannelsHandler):
    """EG's kernel websocket with TCP_NODELAY, and a session reconnect that never waits on the old socket."""

    channels: dict[str, Any]  # channel name -> ZMQStream, as in the stock handler
    _on_close_called: bool  # tornado's: on_close has run
    _opened: bool
    _superseded: bool

    def initialize(self) -> None:
        """Per-connection state, on top of the stock handler's."""
        super().initialize()
        self._opened = False
        self._superseded = False

    async def pre_get(self) -> None:
        """Authenticate, register the session, wait for the kernel; refuse if superseded meanwhile."""
        await super().pre_get()
        if self._superseded:
            # A newer connection for this session took over while we waited for the kernel.
            raise web.HTTPError(409, f"Connection superseded by a newer one for session {self.session_key}")

    async def _register_session(self) -> None:
        """Register this connection for its session, superseding (not awaiting) any earlier one."""
        self.session_key = f"{self.kernel_id}:{self.session.session}"
        stale = self._open_sessions.get(self.session_key)
        if stale is not None and stale is not self:
            self.log.warning("Replacing stale connection: %s", self.session_key)
            self._supersede(stale)
        if self.kernel_id in self.kernel_manager:
            self._open_sessions[self.session_key] = self

    def _supersede(self, stale: Any) -> None:
        """Take over from `stale`: hand its live streams over to this connection and close it later."""
        stale._superseded = True
        if self._open_sessions.get(self.session_key) is stale:
            self._open_sessions.pop(self.session_key)
        channels = stale.channels
        stale.channels = {}
        km = self.kernel_manager
        if channels and self.kernel_id in km and not self._other_session_buffering():
            # open() finds these in the buffer under our (identical) session key, adopts them, and replays
            # what arrived in between: no message is lost and no second socket claims the ZMQ identity.
            km.start_buffering(self.kernel_id, self.session_key, channels)
        else:
            for stream in channels.values():
                if not stream.closed():
                    stream.on_recv(None)
                    stream.close()
        # Closing waits for the peer's close frame (tornado aborts after 5 s): never wait for it here.
        stale.close()

    def _other_session_buffering(self) -> bool:
        """Whether another session's offline messages are being buffered for this kernel.

        The kernel manager buffers for one session per kernel; starting ours would discard theirs.
        """
        buffers: Any = getattr(self.kernel_manager, "_kernel_buffers", None) or {}
        # .get(): the manager's buffer map is a defaultdict, and indexing would create an entry.
        info: Any = buffers.get(self.kernel_id)
        return bool(info) and info.get("session_key") != self.session_key

    def open(self, kernel_id: str) -> Any:
        """Open the websocket with TCP_NODELAY; a superseded connection closes instead of connecting."""
        if self._superseded or self._on_close_called:
            # Superseded during the handshake, or the client left during it (tornado already ran
            # on_close): creating streams now would leak them.
            self.close()
            return None
        # Kernel messages are small frames: without this, each one waits on Nagle and delayed ACKs.
        self.set_nodelay(True)
        self._opened = True
        return super().open(kernel_id)

    def nudge(self) -> Any:
        """Nudge the kernel as the stock handler does, after making sure every channel is open."""
        if any(name not in self.channels or self.channels[name].closed() for name in CHANNELS):
            for stream in self.channels.values():
                if not stream.closed():
                    stream.on_recv(None)
                    stream.close()
            self.channels = {}
            self.create_stream()
        return super().nudge()

    def on_close(self) -> None:
        """Release this connection; only a connection that opened and still owns its streams buffers."""
        if self._opened and not self._superseded:
            super().on_close()
            return
        if self._open_sessions.get(self.session_key) is self:
            self._open_sessions.pop(self.session_key)
        km = self.kernel_manager
        if self._opened and self.kernel_id in km:
            # Superseded after opening: undo what open() registered; the streams belong to the successor.
            km.notify_disconnect(self.kernel_id)
            km.remove_restart_callback(self.kernel_id, self.on_kernel_restarted)
            km.remove_restart_callback(self.kernel_id, self.on_restart_failed, "dead")
        for stream in self.channels.values():
            if not stream.closed():
                stream.on_recv(None)
                stream.close()
        self.channels = {}
        if not self._close_future.done():
            self._close_future.set_result(None)

    def close(self, code: int | None = None, reason: str | None = None) -> Any:
        """Close the websocket; the returned future resolves in `on_close` (at once if superseded before opening)."""
        future = super().close()
        if self._superseded and not self._opened and not self._close_future.done():
            # Nothing to close yet: the pending handshake fails instead (see pre_get), so do not make a
            # caller wait on an on_close that may never come.
            self._close_future.set_result(None)
        return future


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
