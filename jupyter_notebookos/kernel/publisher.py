"""``CellPublisher``: a directed cell's state delta, after its reply, as log record ``directive.seq``.

Every directed cell publishes exactly one record: also when it changed nothing, raised, was interrupted, or was
aborted after an earlier error. After the reply the delta is pickled (its large buffers as views of the user's
objects), the buffers are uploaded and the record goes out in one fenced etcd transaction (``kernel/statelog.py``,
``kernel/logwriter.py``). Until the upload is done the namespace must not change: the publisher holds the kernel's
upload gate, which a checkpoint's upload holds too, and :meth:`CellPublisher.quiesce` is what waits for it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from jupyter_notebookos.kernel.follower import LogFollower
from jupyter_notebookos.kernel.logwriter import LogWriter, PublishOutcome
from jupyter_notebookos.kernel.loop import KernelLoop
from jupyter_notebookos.kernel.lostchanges import LostChanges
from jupyter_notebookos.kernel.settings import ReplicaSettings
from jupyter_notebookos.kernel.statelog import PendingDelta, StateLog, serialize_delta
from jupyter_notebookos.kernel.verify import IdleVerifier
from jupyter_notebookos.replication.protocol import CellDirective, LogRecord
from jupyter_notebookos.replication.state import StateDelta, StateTracker

log = logging.getLogger(__name__)

#: Seconds a cell's publication (upload, then the etcd transaction) waits after the reply, unless the next request
#: comes first. Where the replica shares the machine's cores with the gateway (the embedded mode), an upload that
#: starts at once competes with the reply on its way to the client: a 100 MB array cell's reply took 4.7 ms
#: longer to reach the client. 20 ms is well after a reply reached a client on the same machine.
PUBLICATION_DELAY = 0.02


def _chain(source: concurrent.futures.Future[Any], target: concurrent.futures.Future[Any]) -> None:
    """Give ``target`` the outcome of the finished ``source``."""
    if source.cancelled():
        target.cancel()
        return
    exc = source.exception()
    if exc is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())


class CellPublisher:
    """Publishes each directed cell's record (see the module's docstring); owns the upload gate.

    A record refused (or a publication that failed) means this replica's namespace differs from the log: the
    ``follower`` reloads it at the next :meth:`quiesce`. Records go out through the ``writer``, on its thread.
    ``on_written(seq)`` is called on the loop for each record written (the kernel checkpoints after it); the
    ``verifier`` is asked for a verification after it.
    """

    def __init__(
        self,
        kernel: KernelLoop,
        *,
        settings: ReplicaSettings,
        writer: LogWriter,
        statelog: StateLog,
        tracker: StateTracker,
        lost_changes: LostChanges,
        follower: LogFollower,
        verifier: IdleVerifier,
        on_written: Callable[[int], None],
    ) -> None:
        self._kernel = kernel
        self._settings = settings
        self._writer = writer
        self._statelog = statelog
        self._tracker = tracker
        self._lost_changes = lost_changes
        self._follower = follower
        self._verifier = verifier
        self._on_written = on_written
        # The upload gate: the last publication's (or checkpoint's) upload; the namespace must not change before it
        # completes.
        self._uploading: concurrent.futures.Future[None] | None = None
        self._in_flight: set[concurrent.futures.Future[PublishOutcome]] = set()
        self._deferred: tuple[object, Callable[[], None]] | None = None  # a publication's timer, and its start
        self._deferred_lock = threading.Lock()  # shutdown starts it from the control thread
        self._fence = 0

    @property
    def fence(self) -> int:
        """The fence of the last directed cell this replica published (a checkpoint is fenced like it)."""
        return self._fence

    # -- the upload gate -------------------------------------------------------------------------------

    def uploading(self) -> bool:
        """Whether an upload reads the namespace now (it must not change until that is done)."""
        uploading = self._uploading
        return uploading is not None and not uploading.done()

    def hold_namespace(self, uploaded: concurrent.futures.Future[None]) -> None:
        """The namespace must not change before ``uploaded`` is done (a checkpoint's upload): :meth:`quiesce`
        waits for it."""
        self._uploading = uploaded

    async def quiesce(self) -> None:
        """Wait until the namespace may change: the last publication's buffers are uploaded (they are views
        of the user's objects until then), and a refused publication has been repaired."""
        self._verifier.stop()
        self.start_deferred()
        future = self._uploading
        if future is not None:
            # (Even when it is done: the turn of the loop this costs runs what the upload queued first, such as the
            # notice of a refused upload that this cell must show.)
            with contextlib.suppress(Exception):
                await asyncio.wrap_future(future)
            if self._uploading is future:
                self._uploading = None
        self._follower.reload_if_due()

    # -- publishing ------------------------------------------------------------------------------------

    def publish(self, directive: CellDirective, msg_id: str, delta: StateDelta | None) -> None:
        """Pickle, upload and publish record ``directive.seq`` (``delta``: what the cell changed; None: nothing)
        in the background.

        The namespace already holds the cell's effects, so the record counts as applied here at once (the
        publication transaction reports it to etcd); the next cell waits only for the pickling and the upload.
        """
        statelog, writer, tracker = self._statelog, self._writer, self._tracker
        io_loop = self._kernel.io_loop
        assert io_loop is not None
        empty = delta is None or delta.is_empty()
        uploaded: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._fence = directive.fence
        self._follower.own_record(directive.seq, delta.names if delta is not None else ())

        def settle() -> None:
            try:
                tracker.settle()
            except Exception:  # e.g. a buffer that went away: the next cell fingerprints everything again
                log.exception("finishing the state fingerprints failed")
                tracker.reset()

        async def publish(pending: PendingDelta, failure: str | None) -> PublishOutcome:
            started = time.perf_counter()
            if empty:
                # Nothing to upload: build the record here rather than hop to a worker thread for it.
                if tracker.writes is not None:  # (not settle(): the next cell may run already, see below)
                    tracker.writes.release_unneeded()  # pages of buffers no longer tracked are unregistered
                record = statelog.finish(pending, directive.seq, msg_id)
            else:
                assert delta is not None
                try:
                    try:
                        if failure is None:
                            loop = asyncio.get_running_loop()
                            # The checksums capture left for after the reply (new values), then the upload.
                            await loop.run_in_executor(None, settle)
                            record = await loop.run_in_executor(None, statelog.finish, pending, directive.seq, msg_id)
                    except Exception as exc:  # the object store is unreachable or full
                        failure = f"the object store refused them: {type(exc).__name__}: {exc}"
                    if failure is not None:  # close the seq at once
                        log.error("record %d: %s; publishing it as lost", directive.seq, failure)
                        changed = sorted(delta.names)
                        record = LogRecord(
                            directive.seq, "lost", msg_id, self._settings.replica_id, unserializable=changed
                        )
                        # Queued before the next cell, which waits for the upload, may take the notice.
                        io_loop.add_callback(self._changes_not_shared, directive.seq, changed, failure)
                finally:
                    uploaded.set_result(None)
            uploaded_ms = (time.perf_counter() - started) * 1e3
            outcome = await writer.publish(record, directive.fence, hold=empty)
            if not outcome.written:
                changed = sorted({*record.names, *record.deleted})
                io_loop.add_callback(self._changes_refused, directive.seq, changed, outcome.reason)
            took_ms = (time.perf_counter() - started) * 1e3
            # One line per cell at INFO only when there is something to say: a log write per trivial cell
            # is a measurable share of its cost. (An empty record is held back on purpose: its wait is no news.)
            slow = took_ms > 100 and not empty
            level = logging.INFO if pending.views or not outcome.written or slow else logging.DEBUG
            log.log(
                level,
                "record %d (%d names, %d buffers) %s in %.1f ms (upload %.1f ms)%s",
                directive.seq,
                len(record.names),
                len(pending.views),
                "published" if outcome.written else "refused",
                took_ms,
                uploaded_ms,
                "" if outcome.written else f": {outcome.reason}",
            )
            return outcome

        if empty:
            uploaded.set_result(None)  # nothing that the next cell could change under the upload
        else:
            self._uploading = uploaded
        # Counted as in flight from now on (shutdown waits for it), although it starts a moment later.
        outcome: concurrent.futures.Future[PublishOutcome] = concurrent.futures.Future()
        self._in_flight.add(outcome)
        outcome.add_done_callback(lambda f: io_loop.add_callback(self._published, f))

        def submit() -> None:
            # Here, not before the reply: the loop's thread (or shutdown's), before anything may change the namespace.
            pending, failure = self._pickle_delta(directive.seq, None if empty else delta)
            writer.thread.submit(publish(pending, failure)).add_done_callback(lambda f: _chain(f, outcome))

        self.start_deferred()  # records go out in order
        if empty:
            # Start it on the loop's next turn, after ipykernel has published this cell's "idle" status: the
            # client waits for that message, and the publication's etcd round trip need not run ahead of it.
            io_loop.add_callback(submit)
            return
        # Pickling and upload start PUBLICATION_DELAY after the reply, or when the next request comes (quiesce),
        # whichever is first; the next cell waits for the upload in quiesce, as before. Until then the client
        # has the cell's reply and "idle": pickling before them cost the cell a millisecond or so.
        timer = io_loop.call_later(PUBLICATION_DELAY, self.start_deferred)
        with self._deferred_lock:
            self._deferred = (timer, submit)

    def _pickle_delta(self, seq: int, delta: StateDelta | None) -> tuple[PendingDelta, str | None]:
        """Pickle record ``seq``'s ``delta`` with its large buffers out of band (as views of the user's objects).
        Returns it, and why it could not be pickled (None when it could).

        The capture before the reply fingerprinted each value alone, which names what cannot be pickled in time to
        warn in the cell's output; a value that pickled then but not now (with the others, or changed by a
        thread since) is named in the record as not replicated, and the next cell says so."""
        if delta is None:
            return serialize_delta(None, 0), None
        started = time.perf_counter()
        try:
            pending = serialize_delta(delta, self._settings.buffer_threshold)
        except Exception as exc:
            log.exception("pickling the state delta of record %d failed", seq)
            self._tracker.reset()  # its fingerprints count the changes as sent: the next cell looks at everything
            return serialize_delta(None, 0), f"they could not be pickled: {type(exc).__name__}: {exc}"
        late = {name: why for name, why in pending.record.unserializable.items() if name not in delta.unpicklable}
        if late:
            reason = "; ".join(f"{name}: {why}" for name, why in sorted(late.items()))
            self._lost_changes.add(seq, sorted(late), f"they could not be serialized: {reason}", kept=True)
        took_ms = (time.perf_counter() - started) * 1e3
        log.log(
            logging.INFO if pending.views or took_ms > 50 else logging.DEBUG,
            "record %d: delta of %d names pickled in %.1f ms, after the reply",
            seq,
            len(pending.names),
            took_ms,
        )
        return pending, None

    def start_deferred(self) -> None:
        """Start the publication waiting for its delay now (its timer fired, or something must not wait)."""
        with self._deferred_lock:
            deferred, self._deferred = self._deferred, None
        if deferred is not None:
            timer, submit = deferred
            loop = self._kernel.io_loop
            assert loop is not None
            loop.add_callback(loop.remove_timeout, timer)  # the loop's own thread, as tornado wants
            submit()

    def finish(self, timeout: float) -> None:
        """Start the publication waiting for its delay, and wait (up to ``timeout`` seconds each) for those in
        flight: at shutdown, from the control thread."""
        self.start_deferred()
        for future in list(self._in_flight):
            with contextlib.suppress(Exception):
                future.result(timeout=timeout)

    # -- outcomes --------------------------------------------------------------------------------------

    def _published(self, future: concurrent.futures.Future[PublishOutcome]) -> None:
        """A publication finished (main loop): note the outcome; a refused one means the namespace is wrong."""
        self._in_flight.discard(future)
        try:
            outcome = future.result()
        except Exception as exc:
            log.error("publishing a state record failed: %s; reloading the state from the log", exc)
            self._follower.reload_later()
            self._kernel.schedule_dispatch(self.quiesce)
            return
        if outcome.written:
            self._verifier.schedule()
            self._on_written(outcome.seq)
            return
        log.error(
            "log record %d was NOT written: %s. This replica's namespace now differs from the log; it "
            "reloads its state from the checkpoint and the log.",
            outcome.seq,
            outcome.reason,
        )
        self._follower.reload_later()
        self._kernel.schedule_dispatch(self.quiesce)

    def _changes_not_shared(self, seq: int, names: list[str], reason: str) -> None:
        """This replica's own cell ``seq`` could not be uploaded (its record went out as lost, naming the names
        the others mark as not replicated): it keeps the values, and tells the user with the next cell."""
        self._lost_changes.add(seq, names, reason, kept=True)

    def _changes_refused(self, seq: int, names: list[str], reason: str) -> None:
        """This replica's own record ``seq`` was refused: the reload from the log drops the cell's changes, and
        the next cell this replica runs says so."""
        self._lost_changes.add(seq, names, reason, refused=True)
