"""``Checkpointer``: the executor checkpoints the namespace once enough log records could be deleted.

After a record is written, the executor checkpoints when at least ``checkpoint_every`` records could then be deleted
(every registered replica applied them). The namespace is pickled between requests, in a thread that the next request
stops (it is tried again later); its buffers are uploaded in the background like a record's, under the publisher's
upload gate. The checkpoint transaction is fenced like a publication and requires the record it covers to be in the
log; once it is committed, what it superseded in the object store goes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from jupyter_notebookos.kernel.follower import LogFollower
from jupyter_notebookos.kernel.knowncheckpoint import KnownCheckpoint
from jupyter_notebookos.kernel.logwriter import LogWriter
from jupyter_notebookos.kernel.loop import KernelLoop, quick_gil_handoff
from jupyter_notebookos.kernel.publisher import CellPublisher
from jupyter_notebookos.kernel.settings import ReplicaSettings
from jupyter_notebookos.kernel.statelog import MAX_CHECKPOINT_PARTS, PendingDelta, StateLog, collect_unreferenced
from jupyter_notebookos.replication.protocol import FIRST_SEQ, CheckpointPointer
from jupyter_notebookos.replication.serialization import SerializationAborted
from jupyter_notebookos.replication.state import StateTracker

log = logging.getLogger(__name__)

#: Unreferenced object-store buffers younger than this survive garbage collection: an upload whose record is
#: not in the log yet (a publication in flight, a checkpoint being written) must not lose its buffers.
GC_GRACE_SECONDS = 60.0

#: Seconds after a checkpoint was put off (a follower had not applied enough yet) until the executor looks again,
#: if no cell came meanwhile (otherwise a notebook that goes quiet right then keeps its whole log until its next
#: cells); each further look waits twice as long, up to CHECKPOINT_RETRY_MAX_S.
CHECKPOINT_RETRY_S = 2.0
CHECKPOINT_RETRY_MAX_S = 120.0


def _log_failure(what: str) -> Any:
    def check(future: concurrent.futures.Future[Any]) -> None:
        exc = future.exception()
        if exc is not None:  # a failed checkpoint costs etcd space, never state
            log.warning("%s failed: %s: %s", what, type(exc).__name__, exc)

    return check


class Checkpointer:
    """Checkpoints the namespace (see the module's docstring). What it knows of the kernel's checkpoint is in
    ``checkpoint``; it waits for the namespace through the ``publisher`` (whose upload gate its upload holds),
    checkpoints only what the ``follower`` holds, and commits through the ``writer``."""

    def __init__(
        self,
        kernel: KernelLoop,
        *,
        settings: ReplicaSettings,
        writer: LogWriter,
        statelog: StateLog,
        tracker: StateTracker,
        checkpoint: KnownCheckpoint,
        follower: LogFollower,
        publisher: CellPublisher,
    ) -> None:
        self._kernel = kernel
        self._settings = settings
        self._writer = writer
        self._statelog = statelog
        self._tracker = tracker
        self._checkpoint = checkpoint
        self._follower = follower
        self._publisher = publisher
        self._next_check = FIRST_SEQ
        self._retry: object | None = None  # the timer of a put-off checkpoint's next look
        self._pickling: asyncio.Future[list[PendingDelta]] | None = None
        self._abort: threading.Event | None = None  # stops the checkpoint being pickled, if any

    def after_publication(self, seq: int) -> None:
        """Record ``seq`` was written: checkpoint (a dispatch) if it is ``checkpoint_every`` past the last one."""
        if seq - self._checkpoint.seq >= self._settings.checkpoint_every:
            self._kernel.schedule_dispatch(self._maybe_checkpoint, seq)

    def pickling(self) -> bool:
        """Whether a checkpoint is being pickled (it reads the namespace)."""
        pickling = self._pickling
        return pickling is not None and not pickling.done()

    def request_arrived(self) -> None:
        """A shell request arrived: it comes first, so the checkpoint being pickled, if any, stops (it is tried
        again later)."""
        if self._abort is not None:
            self._abort.set()

    def after_pickling(self, then: Callable[[], None]) -> bool:
        """If a checkpoint is being pickled, stop it and call ``then`` (on the loop) once it ended, and return True;
        else return False."""
        pickling = self._pickling
        if pickling is None or pickling.done():
            return False
        if self._abort is not None:
            self._abort.set()
        pickling.add_done_callback(lambda _: then())
        return True

    async def _maybe_checkpoint(self, seq: int, *, again: float = 0.0) -> None:
        """Checkpoint the namespace if enough log records could then be deleted (a dispatch).

        The namespace is pickled here, between requests; its buffers are uploaded in the background like a
        record's. The checkpoint transaction is fenced like a publication and requires the record it covers
        to be in the log.
        """
        await self._publisher.quiesce()
        every = self._settings.checkpoint_every
        seq = self._follower.applied
        if seq - self._checkpoint.seq < every or (seq < self._next_check and not again):
            return
        writer, statelog, fence = self._writer, self._statelog, self._publisher.fence
        delete, current = await asyncio.wrap_future(writer.thread.submit(writer.checkpoint_due(seq, every)))
        if delete is None:
            # Followers behind: look again a few records later, or in a moment if no cell comes meanwhile.
            self._next_check = seq + max(1, every // 4)
            if self._retry is None:
                wait = min(again * 2, CHECKPOINT_RETRY_MAX_S) if again else CHECKPOINT_RETRY_S
                self._retry = self._kernel.io_loop.call_later(wait, self._again, wait)
            return
        # Pickled in a thread that the next request stops (request_arrived), unless the log has grown to four
        # times the interval: a notebook holding a million small objects takes most of a second here, and its
        # user's next cell would wait for it. Nothing else changes the namespace meanwhile: requests, records and
        # comm messages are dispatched one at a time, after this; an eviction waits (after_pickling).
        abort = None if seq - self._checkpoint.seq >= 4 * every else threading.Event()
        if abort is not None and self._kernel.requests_waiting():
            abort.set()  # a request came while this looked up what the checkpoint may delete
        loop = asyncio.get_running_loop()
        known = self._checkpoint
        if current is not None and current.seq > known.parts_seq and known.touched_since(current.seq) is not None:
            await self._learn_parts(current)  # another replica wrote it (this one was not the executor then)
        kept, groups = known.plan(self._tracker.user_names(), current.seq if current else None, self._tracker.groups)
        since = known.parts_seq
        threshold = self._settings.buffer_threshold
        self._abort = abort
        pickling = time.perf_counter()
        parts_left = max(1, MAX_CHECKPOINT_PARTS - len(kept))
        checkpointing = self._pickling = loop.run_in_executor(
            None,
            partial(statelog.serialize_checkpoint, self._kernel.namespace, groups, threshold, abort, parts_left),
        )
        try:
            with quick_gil_handoff():
                pending = await checkpointing
            pickled_ms = (time.perf_counter() - pickling) * 1e3
        except SerializationAborted:
            log.info("checkpoint at seq %d put off: a request came while the namespace was pickled", seq)
            if self._retry is None:
                self._retry = self._kernel.io_loop.call_later(CHECKPOINT_RETRY_S, self._again, 0.0)
            return
        finally:
            # (Not kept past this: its result holds views of the user's arrays, which must not outlive their names.)
            self._abort, self._pickling = None, None
        uploaded: concurrent.futures.Future[None] = concurrent.futures.Future()
        io_loop = self._kernel.io_loop

        async def commit() -> bool:
            loop = asyncio.get_running_loop()
            started = time.perf_counter()
            try:
                pointer, parts = await loop.run_in_executor(None, statelog.finish_checkpoint, pending, seq, kept)
            finally:
                uploaded.set_result(None)
            await writer.flush_held()  # the checkpoint requires the record it covers to be in the log
            done = await writer.commit_checkpoint(pointer, delete, fence)
            log.info(
                "checkpoint at seq %d %s: pickled in %.1f ms, then written in %.1f ms (%d records deleted; %d parts, "
                "%d of them named again from checkpoint %d)",
                seq,
                "written" if done else "not committed",
                pickled_ms,
                (time.perf_counter() - started) * 1e3,
                len(delete) if done else 0,
                len(parts),
                len(kept),
                since,
            )
            if done:  # what the new checkpoint superseded goes now: old checkpoints, unreferenced buffers
                io_loop.add_callback(known.learned, seq, parts)  # what the next checkpoint may name again
                try:
                    checkpoint_seq, referenced = await writer.referenced_objects()
                    collect = partial(collect_unreferenced, grace_seconds=GC_GRACE_SECONDS)
                    report = await loop.run_in_executor(None, collect, statelog.store, checkpoint_seq, referenced)
                except Exception as exc:  # the next checkpoint tries again
                    log.warning("object-store garbage collection after checkpoint %d failed: %s", seq, exc)
                else:
                    freed = report.deleted_buffers or report.deleted_checkpoints
                    log.log(logging.INFO if freed else logging.DEBUG, "%s", report)
            return done

        known.checkpointed(seq)  # do not try again for this stretch, whatever the outcome
        self._publisher.hold_namespace(uploaded)
        future = writer.thread.submit(commit())
        future.add_done_callback(_log_failure("checkpoint"))

    def _again(self, waited: float) -> None:
        """Look again at a put-off checkpoint, unless another replica ran a cell since (it checkpoints now)."""
        self._retry = None
        if self._follower.ran_last_cell():
            self._kernel.schedule_dispatch(partial(self._maybe_checkpoint, again=waited), self._follower.applied)

    async def _learn_parts(self, pointer: CheckpointPointer) -> None:
        """Learn the parts of the kernel's checkpoint in force, which another replica wrote, from its list in the
        object store; without them this replica's next checkpoint would pickle every name again.

        The records applied here since say which of its parts still hold the values the log has (see
        KnownCheckpoint.plan). Not learned, the checkpoint pickles everything, as it did before: a store that cannot
        be read now costs time, not state."""
        loop = asyncio.get_running_loop()
        try:
            parts = await loop.run_in_executor(None, self._statelog.read_parts, pointer)
        except Exception as exc:
            log.warning(
                "reading the parts of checkpoint %d failed (%s); this checkpoint pickles every name", pointer.seq, exc
            )
            return
        if pointer.seq > self._checkpoint.parts_seq:  # (not if this replica's own, newer checkpoint came meanwhile)
            self._checkpoint.learned(pointer.seq, parts)
