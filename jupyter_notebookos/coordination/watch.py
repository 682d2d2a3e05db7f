"""``Watch``: a stream of changes under a prefix that survives member failures.

A background task holds one etcd watch stream. When the stream breaks (the member died, restarted,
or lost its leader) it opens a new one, on any live member, from the revision after the last event it
delivered. Events of a revision arrive together in one response, so resuming at ``last + 1`` neither
loses nor repeats an event. If etcd has compacted that history, the watch raises
:class:`WatchCompacted` (re-read the state and start a new watch).

Events are queued in memory until the consumer reads them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

import grpc
import grpc.aio

from jupyter_notebookos.coordination import _proto
from jupyter_notebookos.coordination.errors import CoordinationError, PermissionDenied, WatchCompacted
from jupyter_notebookos.coordination.kv import WatchEvent

if TYPE_CHECKING:
    from jupyter_notebookos.coordination._rpc import EtcdRpc

log = logging.getLogger(__name__)

_RECONNECT_INITIAL = 0.05
_RECONNECT_MAX = 1.0


class Watch:
    """Async iterator of :class:`WatchEvent`. Get one from :meth:`Coordinator.watch_prefix`.

    ``async for event in watch`` yields events in revision order; :meth:`aclose` (or ``async with``)
    stops it. :meth:`ready` waits until etcd has accepted the watch.
    """

    def __init__(self, rpc: EtcdRpc, key: str, start_revision: int | None, *, exact: bool = False) -> None:
        self.key = key
        raw = key.encode()
        self._key = raw
        self._range_end = b"" if exact else _proto.prefix_range_end(raw)
        #: The revision the next event may have; the watch resumes from here.
        self.next_revision: int | None = start_revision
        self._rpc = rpc
        self._queue: asyncio.Queue[WatchEvent | BaseException | None] = asyncio.Queue()
        self._ready = asyncio.Event()
        self._denied = False  # the last stream was refused and we logged in again since
        self._closed = False
        self._error: Exception | None = None
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"watch {key}")
        rpc.watches.add(self)

    def __repr__(self) -> str:
        return f"<Watch {self.key!r} next_revision={self.next_revision}>"

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> WatchEvent:
        if self._closed and self._queue.empty():
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is None:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._closed = True
            raise item
        return item

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def ready(self, timeout: float | None = None) -> int:
        """Wait until etcd accepted the watch; returns the first revision it will report.

        Raises what stopped the watch, or :class:`CoordinationError` after ``timeout`` seconds.
        """
        budget = self._rpc.timeout if timeout is None else timeout
        done = asyncio.ensure_future(self._ready.wait())
        try:
            await asyncio.wait({done, self._task}, timeout=budget, return_when=asyncio.FIRST_COMPLETED)
        finally:
            done.cancel()
        if not self._ready.is_set():
            if self._error is not None:
                raise self._error
            raise CoordinationError(f"etcd did not accept a watch on {self.key!r} within {budget} s")
        assert self.next_revision is not None
        return self.next_revision

    async def aclose(self) -> None:
        """Stop watching. Pending events already queued can still be read."""
        if self._closed:
            return
        self._closed = True
        self._rpc.watches.discard(self)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._queue.put_nowait(None)

    async def _run(self) -> None:
        backoff = _RECONNECT_INITIAL
        try:
            while True:
                if await self._stream():
                    backoff = _RECONNECT_INITIAL
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _RECONNECT_MAX)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Handed to the consumer through the queue; not re-raised, so the task never ends with an
            # exception nobody retrieves (asyncio would log it from a finalizer).
            self._error = exc
            self._queue.put_nowait(exc)

    async def _stream(self) -> bool:
        """One watch stream, until it breaks. Returns whether it got as far as being created."""
        rpc = self._rpc
        sent = rpc.metadata
        call = rpc.watch.Watch(metadata=sent)
        created = False
        try:
            await call.write(
                _proto.WatchRequest(
                    create_request=_proto.WatchCreateRequest(
                        key=self._key,
                        range_end=self._range_end,
                        start_revision=self.next_revision or 0,
                        progress_notify=True,
                    )
                )
            )
            while True:
                reply = await call.read()
                if reply is grpc.aio.EOF:
                    log.info("watch %s: stream ended, resuming from revision %s", self.key, self.next_revision)
                    return created
                if reply.compact_revision:
                    raise WatchCompacted(self.key, self.next_revision or 0, reply.compact_revision)
                if reply.created:
                    created = True
                    self._denied = False
                    if self.next_revision is None:
                        self.next_revision = reply.header.revision + 1
                    self._ready.set()
                if reply.canceled:
                    reason = reply.cancel_reason or "no reason given"
                    if "compacted" in reason:
                        raise WatchCompacted(self.key, self.next_revision or 0, 0)
                    if "permission denied" in reason:
                        # etcd says so also for a token that expired or predates a user/role change: log in
                        # again and resume; refused with a token fresh from that, it is a real denial.
                        if rpc.credentials is None or self._denied:
                            raise PermissionDenied(
                                f"watch {self.key}: permission denied (this etcd user may not read these keys)"
                            )
                        self._denied = True
                        await rpc.authenticate(stale=sent)
                        return True
                    log.info("watch %s: cancelled by etcd (%s), resuming", self.key, reason)
                    return created
                if reply.events:
                    floor = self.next_revision or 0
                    highest = floor - 1
                    for event in reply.events:
                        if event.kv.mod_revision < floor:
                            continue  # already delivered before a reconnect
                        self._queue.put_nowait(WatchEvent.from_proto(event))
                        highest = max(highest, event.kv.mod_revision)
                    self.next_revision = max(floor, highest + 1)
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                  grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL):  # fmt: skip
                raise rpc.error(exc, f"watch {self.key}") from exc
            log.info("watch %s: %s (%s), resuming from revision %s", self.key, exc.code().name,
                     exc.details(), self.next_revision)  # fmt: skip
            return created
        finally:
            call.cancel()
