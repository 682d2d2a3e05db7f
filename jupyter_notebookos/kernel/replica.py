"""``ReplicaKernel``: an IPython kernel that is one replica of a NotebookOS kernel.

It runs the user's own code like any IPython kernel. What it adds:

- An ``execute_request`` whose metadata carries a :class:`~replication.protocol.CellDirective` is a *directed*
  cell: the replica binds the directive's GPUs, runs the code, releases the GPUs, captures the cell's state
  delta (warning once in the cell's stderr about values that cannot be serialized), replies with
  ``metadata.notebookos = {replica, host, gpus, seq}``, and after the reply pickles the delta, uploads its buffers
  and publishes log record ``directive.seq`` in one fenced etcd transaction. Every directed cell publishes exactly one
  record: also when it changed nothing, raised, was interrupted, or was aborted after an earlier error.
- An ``execute_request`` *without* a directive (a client talking to the replica directly, a test) runs and
  publishes nothing: its effects stay on this replica (and ride along in this replica's next published delta
  if it changed names that a directed cell then captures).
- Log records published by other replicas are applied strictly in ``seq`` order, on the kernel's own loop,
  through the same queue as shell requests, so never while a cell runs.
- Checkpoints: after publishing, the executor checkpoints its namespace when at least ``checkpoint_every``
  records could be deleted (every registered replica applied them).
"""

from __future__ import annotations

import ast
import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import signal
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import zmq
from ipykernel.ipkernel import IPythonKernel

from jupyter_notebookos.gpu.binding import GpuBinding
from jupyter_notebookos.kernel.agent import PublishOutcome, ReplicaAgent
from jupyter_notebookos.kernel.lostchanges import LostChanges
from jupyter_notebookos.kernel.settings import ReplicaSettings
from jupyter_notebookos.kernel.statelog import (
    MAX_CHECKPOINT_PARTS,
    CheckpointPart,
    PendingDelta,
    StateLog,
    collect_unreferenced,
    serialize_delta,
)
from jupyter_notebookos.replication.protocol import (
    FIRST_SEQ,
    METADATA_KEY,
    CellDirective,
    CheckpointPointer,
    LogRecord,
    stops_on_error,
)
from jupyter_notebookos.replication.records import unserializable_warning
from jupyter_notebookos.replication.serialization import SerializationAborted, UnreplicatedValue
from jupyter_notebookos.replication.state import StateDelta, StateTracker
from jupyter_notebookos.waiting import wait_event

#: Unreferenced object-store buffers younger than this survive garbage collection: an upload whose record is
#: not in the log yet (a publication in flight, a checkpoint being written) must not lose its buffers.
GC_GRACE_SECONDS = 60.0

log = logging.getLogger(__name__)

#: How long a directed cell waits for this replica to apply the records before it.
CATCH_UP_TIMEOUT = 30.0

#: Seconds a cell's publication (upload, then the etcd transaction) waits after the reply, unless the next request
#: comes first. Where the replica shares the machine's cores with the gateway (the embedded mode), an upload that
#: starts at once competes with the reply on its way to the client: a 100 MB array cell's reply took 4.7 ms
#: longer to reach the client. 20 ms is well after a reply reached a client on the same machine.
PUBLICATION_DELAY = 0.02
#: Most seconds the main thread waits, after a request, for the I/O thread to have sent its "idle" (see
#: ReplicaKernel._publish_status).
IDLE_HANDOFF_S = 0.005

#: Seconds the kernel waits, idle, after a cell (or a comm message) before it verifies the values no cell
#: reached (StateTracker.verify, in a thread; the next request stops it). While the kernel stays idle it verifies
#: again every VERIFY_PERIOD_S, or 20 times as long as the last verification took, whichever is longer (at most
#: 5 % of a core for a namespace that takes long to fingerprint).
VERIFY_AFTER_S = 1.0
VERIFY_PERIOD_S = 30.0

#: Seconds after a checkpoint was put off (a follower had not applied enough yet) until the executor looks again,
#: if no cell came meanwhile (otherwise a notebook that goes quiet right then keeps its whole log until its next
#: cells); each further look waits twice as long, up to CHECKPOINT_RETRY_MAX_S.
CHECKPOINT_RETRY_S = 2.0
CHECKPOINT_RETRY_MAX_S = 120.0
#: How many records' changed names a replica keeps for its next checkpoint (beyond that it pickles everything).
TOUCHED_RECORDS_KEPT = 4096
#: Directed cells whose msg_id a replica remembers as taken, and as given up (see _CellIntake).
CELLS_REMEMBERED = 64


@contextlib.contextmanager
def _sigint_noted(then: Callable[[], Any] | None = None) -> Iterator[Callable[[], bool]]:
    """Note SIGINT instead of raising it (and call ``then``, if given); yields a function that says whether one came.

    Around the capture of a finished cell's delta it only keeps an interrupt from losing the cell's record."""
    noted = False

    def note(signum: int, frame: Any) -> None:
        nonlocal noted
        noted = True
        if then is not None:
            then()

    try:
        previous = signal.signal(signal.SIGINT, note)
    except ValueError:  # not the main thread
        yield lambda: False
        return
    try:
        yield lambda: noted
    finally:
        signal.signal(signal.SIGINT, previous)


class _QuickGilHandoff:
    """While a thread pickles the namespace for the kernel, a request that arrives gets the GIL within 0.5 ms,
    not Python's default 5 ms (the switch interval is the process's).

    Counted: a checkpoint (on the loop) and a verification (in a thread) can overlap and end in either order. Each
    saving and restoring the interval itself, the one that began second and ended last put back the 0.5 ms it had
    found, and the user's code ran with it from then on (more GIL switches with any thread of its own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._previous = 0.0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._users == 0:
                self._previous = sys.getswitchinterval()
                sys.setswitchinterval(min(self._previous, 0.0005))
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    sys.setswitchinterval(self._previous)


_quick_gil_handoff = _QuickGilHandoff()


def _log_failure(what: str) -> Any:
    def check(future: concurrent.futures.Future[Any]) -> None:
        exc = future.exception()
        if exc is not None:  # a failed checkpoint costs etcd space, never state
            log.warning("%s failed: %s: %s", what, type(exc).__name__, exc)

    return check


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


def _flush_only_when_written(stream: Any) -> None:
    """Make ``stream`` (ipykernel's OutStream) skip a flush when nothing was written to it since the last one.

    ipykernel flushes stdout and stderr twice per cell, before the reply and before "idle", and each flush waits
    for a round trip to its I/O thread even when there is nothing to send: about 0.3 ms each on an idle machine,
    so a cell that prints nothing waited some 1.3 ms for four empty flushes. Skipping an empty one changes no
    message and no order: the stream's buffer is all a flush sends, and iopub messages (idle included) keep their
    order through the one I/O thread that sends them all. Left as it is where ipykernel's OutStream differs."""
    lock, buffers, flush = (getattr(stream, name, None) for name in ("_buffer_lock", "_buffers", "flush"))
    if lock is None or not isinstance(buffers, dict) or flush is None:
        return

    def flush_if_written() -> None:
        with stream._buffer_lock:
            written = any(buffer.tell() for buffer in stream._buffers.values())
        if written or stream._subprocess_flush_pending:
            flush()

    stream.flush = flush_if_written


class _CellTree(ast.NodeTransformer):
    """Hands the state tracker the syntax tree IPython compiles each cell from, unchanged (IPython calls every
    AST transformer of the shell with it), so that the capture need not parse the cell again. Should user code
    remove it from ``ast_transformers``, the capture parses the cell's source itself, as before."""

    def __init__(self, tracker: StateTracker) -> None:
        self.tracker = tracker

    def visit(self, node: ast.AST) -> ast.AST:
        if isinstance(node, ast.Module):
            self.tracker.note_tree(node)
        return node


class _CellIntake:
    """The directed cells this replica took, and those a gateway gave up: a gateway that re-attached asks
    whether the last cell its predecessor decided reached this replica (see ReplicaKernel.cell_request); one
    that had not by the answer is refused should it still come, so the answer holds. The control thread asks
    while the shell's loop takes cells, hence the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._taken: OrderedDict[str, None] = OrderedDict()
        self._given_up: OrderedDict[str, None] = OrderedDict()

    def take(self, msg_id: str) -> bool:
        """A directed cell arrived: False if it was given up (it must not run)."""
        with self._lock:
            if msg_id in self._given_up:
                return False
            _remember(self._taken, msg_id)
            return True

    def taken_else_given_up(self, msg_id: str) -> bool:
        """Whether the cell was taken; one that was not is given up from now on."""
        with self._lock:
            if msg_id in self._taken:
                return True
            _remember(self._given_up, msg_id)
            return False


def _remember(kept: OrderedDict[str, None], msg_id: str) -> None:
    kept[msg_id] = None
    while len(kept) > CELLS_REMEMBERED:
        kept.popitem(last=False)


@dataclass
class _Cell:
    """The directed cell being handled."""

    directive: CellDirective
    msg_id: str
    delta: StateDelta | None = None  # what it changed, pickled after the reply (see _start_publication)
    warnings: list[str] = field(default_factory=list)


class ReplicaKernel(IPythonKernel):
    """One replica of a NotebookOS kernel. :meth:`attach` wires it to etcd before the loop starts."""

    implementation = "notebookos"

    # Set by attach(); class-level defaults keep traitlets' HasTraits machinery out of these.
    settings: ReplicaSettings
    agent: ReplicaAgent
    statelog: StateLog
    gpus: GpuBinding
    tracker: StateTracker
    _checkpoint_abort: threading.Event | None = None  # stops the checkpoint being pickled, if any

    def attach(self, settings: ReplicaSettings, agent: ReplicaAgent, statelog: StateLog) -> None:
        """Give the kernel its settings, etcd agent and state log (before the loop starts)."""
        self.settings = settings
        self.agent = agent
        self.statelog = statelog
        self.gpus = GpuBinding(settings.gpus, sticky=settings.gpu_sticky)
        self.control_handlers["notebookos_evict_request"] = self.evict_request
        self.control_handlers["notebookos_cell_request"] = self.cell_request
        self.control_handlers["notebookos_applied_request"] = self.applied_request
        self.intake = _CellIntake()
        assert self.shell is not None
        # The shell's own transformer manager (built once): a new one per cell costs about a millisecond.
        self.tracker = StateTracker(
            self.shell.user_ns,
            hidden=self.shell.user_ns_hidden,
            transform=self.shell.transform_cell,
            defer_min_bytes=settings.buffer_threshold,  # what records send out of band, uploaded after settle
        )
        statelog.lineage = self.tracker.lineage  # records send the changed chunks of buffers replicas hold
        self.shell.ast_transformers.append(_CellTree(self.tracker))
        # ipykernel sleeps 0.5 ms before every execute_reply (its FIXME: so that the output flushed just before
        # tends to reach clients ahead of the reply). Clients wait for the kernel's "idle", which follows every
        # output of the cell on iopub, so none needs it; here it would only add 0.5 ms to every cell.
        self._execute_sleep = 0.0
        for stream in (sys.stdout, sys.stderr):
            _flush_only_when_written(stream)
        self.applied = FIRST_SEQ - 1
        self._records: dict[int, LogRecord] = {}
        self._record_arrived = asyncio.Event()
        self._cell: _Cell | None = None
        # The last publication's upload (the namespace must not change before it completes).
        self._uploading: concurrent.futures.Future[None] | None = None
        self._in_flight: set[concurrent.futures.Future[PublishOutcome]] = set()
        self._deferred: tuple[object, Callable[[], None]] | None = None  # a publication's timer, and its start
        self._deferred_lock = threading.Lock()  # shutdown starts it from the control thread
        self._needs_resync = False
        self.lost_changes = LostChanges()  # cells whose changes never reached the log, to tell the user about
        self._last_fence = 0
        self._checkpoint_seq = FIRST_SEQ - 1  # the latest checkpoint this replica knows of
        self._next_checkpoint_check = FIRST_SEQ
        self._checkpoint_retry: object | None = None  # the timer of a put-off checkpoint's next look
        self._own_seq = FIRST_SEQ - 1  # the last record this replica published as the executor
        self._checkpointing: asyncio.Future[list[PendingDelta]] | None = None
        # The parts of the latest checkpoint this replica wrote or restored from (None: none known), which
        # records changed which names since (seq -> names; None: not known), and the last seq whose entry was
        # dropped to bound that map: a checkpoint names a part again only if no record since changed its names.
        self._parts: list[CheckpointPart] | None = None
        self._parts_seq = FIRST_SEQ - 1
        self._touched: dict[int, frozenset[str] | None] = {}
        self._touched_dropped = FIRST_SEQ - 1
        self._verify_timer: object | None = None
        self._verifying: tuple[threading.Thread, threading.Event] | None = None
        for kind in ("comm_open", "comm_msg", "comm_close"):
            if kind in self.shell_handlers:
                self.shell_handlers[kind] = self._comm_handler(self.shell_handlers[kind])

    # -- restore ---------------------------------------------------------------------------------------

    def restore(self) -> int:
        """Load the checkpoint and the log records after it into the namespace; returns the etcd revision
        the log was read at (watch from the next one)."""
        snapshot = self.agent.read_snapshot()
        self._touched.clear()
        self._touched_dropped = FIRST_SEQ - 1
        self._known_parts(FIRST_SEQ - 1, None)
        if snapshot.checkpoint is not None:
            self._checkpoint_seq = snapshot.checkpoint.seq
            checkpoint = self.statelog.read_checkpoint(snapshot.checkpoint)
            for record in checkpoint.records:
                self.tracker.apply(record, self.statelog.store)
            self.applied = snapshot.checkpoint.seq
            self._known_parts(checkpoint.seq, checkpoint.parts or None)
        for rec in sorted(snapshot.records, key=lambda r: r.seq):
            if rec.seq == self.applied + 1:
                self._apply_one(rec)
            elif rec.seq > self.applied + 1:
                self._records[rec.seq] = rec  # a gap: wait for the router to close it
        self.tracker.reset()
        log.info(
            "restored %d names up to log seq %d (checkpoint %s, %d records)",
            len(self.tracker.user_names()),
            self.applied,
            snapshot.checkpoint.seq if snapshot.checkpoint else "none",
            len(snapshot.records),
        )
        return snapshot.revision

    @property
    def namespace(self) -> dict[str, Any]:
        """The user's namespace (the shell's ``user_ns``)."""
        assert self.shell is not None
        return self.shell.user_ns

    # -- following the log -----------------------------------------------------------------------------

    def on_record(self, record: LogRecord) -> None:
        """A log record arrived (called on the coordination thread)."""
        if record.seq <= self.applied:
            # Our own record coming back (or one a restore covered): _queue_record would drop it, so do not
            # wake the kernel's loop for it. A stale read of ``applied`` only means a wasted wake-up.
            return
        assert self.io_loop is not None
        self.io_loop.add_callback(self._queue_record, record)

    def _queue_record(self, record: LogRecord) -> None:
        if record.seq <= self.applied:
            return  # our own record, or one a restore already covered
        self._records[record.seq] = record
        self._record_arrived.set()
        self.schedule_dispatch(self._apply_ready)

    async def _apply_ready(self) -> None:
        """Apply every record that is next in line (a dispatch: runs between shell requests)."""
        await self._quiesce()
        self._apply_pending()

    def _apply_pending(self) -> None:
        applied = self.applied
        while (record := self._records.pop(self.applied + 1, None)) is not None:
            self._apply_one(record)
        for seq in [s for s in self._records if s <= self.applied]:
            del self._records[seq]
        if self.applied > applied:
            self.prepare_baseline()

    def _apply_one(self, record: LogRecord) -> None:
        started = time.perf_counter()
        if record.kind == "lost" and record.unserializable:
            # Its executor kept these but could not upload them: a marker here, never a stale value.
            reason = f"log record {record.seq}: its executor could not upload these names to the object store"
            for name in record.unserializable:
                self.namespace[name] = UnreplicatedValue(name, reason)
            self.tracker.refresh(list(record.unserializable))
            self.lost_changes.add(record.seq, list(record.unserializable), "the object store refused them")
        elif record.kind == "lost":
            self.lost_changes.add(record.seq, [*record.names, *record.deleted], "its replica stopped first")
        elif record.kind == "malformed":
            self.lost_changes.add_unreadable(record.seq)
        else:
            self.lost_changes.forget_before(record.seq)
        changed = None if record.kind == "malformed" else [*record.names, *record.deleted, *record.unserializable]
        self._note_touched(record.seq, changed)
        if record.kind == "delta":
            try:
                state = self.statelog.load(record)
                if state is not None:
                    self.tracker.apply(state, self.statelog.store)
            except Exception as exc:
                # The names exist on the executor; here they explain why they cannot be used.
                reason = f"applying log record {record.seq} failed: {type(exc).__name__}: {exc}"
                log.error("%s (names %s)", reason, ", ".join(record.names))
                for name in record.deleted:
                    self.namespace.pop(name, None)
                for name in [*record.names, *record.unserializable]:
                    self.namespace[name] = UnreplicatedValue(name, reason)
                self.tracker.refresh([*record.names, *record.deleted])
        self.applied = record.seq
        self.agent.report_applied(record.seq)
        log.debug(
            "applied record %d (%s) in %.1f ms",
            record.seq,
            record.kind,
            (time.perf_counter() - started) * 1e3,
        )

    async def _catch_up(self, target: int) -> bool:
        """Apply records until ``target`` is applied; False if they do not arrive in time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CATCH_UP_TIMEOUT
        while True:
            # A baseline taken or a verification begun while this waited reads the namespace: it stops first.
            self._stop_verify()
            self._apply_pending()
            if self.applied >= target:
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            self._record_arrived.clear()
            await wait_event(self._record_arrived, min(remaining, 1.0))

    async def _quiesce(self) -> None:
        """Wait until the namespace may change: the last publication's buffers are uploaded (they are views
        of the user's objects until then), and a refused publication has been repaired."""
        self._stop_verify()
        self._start_deferred()
        future = self._uploading
        if future is not None:
            # (Even when it is done: the turn of the loop this costs runs what the upload queued first, such as the
            # notice of a refused upload that this cell must show.)
            with contextlib.suppress(Exception):
                await asyncio.wrap_future(future)
            if self._uploading is future:
                self._uploading = None
        if self._needs_resync:
            self._resync()

    def _on_published(self, future: concurrent.futures.Future[PublishOutcome]) -> None:
        """A publication finished (main loop): note the outcome; a refused one means the namespace is wrong."""
        self._in_flight.discard(future)
        try:
            outcome = future.result()
        except Exception as exc:
            log.error("publishing a state record failed: %s; reloading the state from the log", exc)
            self._needs_resync = True
            self.schedule_dispatch(self._quiesce)
            return
        if outcome.written:
            self._schedule_verify()
            if outcome.seq - self._checkpoint_seq >= self.settings.checkpoint_every:
                self.schedule_dispatch(self._maybe_checkpoint, outcome.seq)
            return
        log.error(
            "log record %d was NOT written: %s. This replica's namespace now differs from the log; it "
            "reloads its state from the checkpoint and the log.",
            outcome.seq,
            outcome.reason,
        )
        self._needs_resync = True
        self.schedule_dispatch(self._quiesce)

    def _changes_not_shared(self, seq: int, names: list[str], reason: str) -> None:
        """This replica's own cell ``seq`` could not be uploaded (its record went out as lost, naming the names
        the others mark as not replicated): it keeps the values, and tells the user with the next cell."""
        self.lost_changes.add(seq, names, reason, kept=True)

    def _changes_refused(self, seq: int, names: list[str], reason: str) -> None:
        """This replica's own record ``seq`` was refused: the reload from the log drops the cell's changes, and
        the next cell this replica runs says so."""
        self.lost_changes.add(seq, names, reason, refused=True)

    def _resync(self) -> None:
        """Reload the namespace from the checkpoint and the log (after a refused publication)."""
        self._needs_resync = False
        for name in self.tracker.user_names():
            self.namespace.pop(name, None)
        self.applied = FIRST_SEQ - 1
        self.tracker.reset()
        self.tracker.lineage.clear()  # the memory the other replicas' patches were for is gone
        self.restore()
        self._apply_pending()
        self.agent.report_applied(self.applied)
        self.prepare_baseline()

    # -- verifying what no cell reached -------------------------------------------------------------------

    def prepare_baseline(self) -> None:
        """Without a baseline (a follower, a replica that restored): take it once the kernel has been idle a
        second (see _start_verify), rather than in the first cell this replica runs; at once while the namespace
        is empty (a replica that starts with its kernel), which costs nothing."""
        if self.tracker.has_baseline or self.io_loop is None:
            return
        if self._verifying is None and not self.tracker.user_names():
            self.tracker.prepare()
        else:
            self._schedule_verify()

    def _schedule_verify(self, delay: float = VERIFY_AFTER_S) -> None:
        """Verify the namespace once the kernel has been idle ``delay`` seconds (see StateTracker.verify)."""
        loop = self.io_loop
        assert loop is not None
        if self._verify_timer is not None:
            loop.remove_timeout(self._verify_timer)
        self._verify_timer = loop.call_later(delay, self._start_verify)

    def _start_verify(self) -> None:
        self._verify_timer = None
        if self._cell is not None or self._verifying is not None or self._needs_resync:
            return
        uploading, checkpointing = self._uploading, self._checkpointing
        if (uploading is not None and not uploading.done()) or (checkpointing is not None and not checkpointing.done()):
            self._schedule_verify()  # a checkpoint or an upload reads the same objects: after it
            return
        abort = threading.Event()
        if not self.tracker.has_baseline:
            # A follower (or a replica that restored): the baseline the first cell it runs would take.
            thread = threading.Thread(target=self._prepare, args=(abort,), name="notebookos-baseline", daemon=True)
        else:
            again = self.applied == self._own_seq  # the executor of the last cell watches for threads' writes
            if not self.tracker.unverified:
                if not again:
                    return
                self.tracker.unverify()
            thread = threading.Thread(target=self._verify, args=(abort, again), name="notebookos-verify", daemon=True)
        self._verifying = (thread, abort)
        thread.start()

    @staticmethod
    def _in_thread(what: str, work: Callable[[], bool]) -> tuple[bool, float]:
        """Run a thread's ``work`` (False: stopped or failed) with the GIL passing to the kernel's loop within
        0.5 ms of a request arriving (instead of Python's default 5 ms); the loop then stops it (_quiesce).
        Returns whether it finished, and the seconds it took."""
        started = time.perf_counter()
        try:
            with _quick_gil_handoff():
                done = work()
        except Exception:
            log.exception("%s failed", what)
            done = False
        return done, time.perf_counter() - started

    def _prepare(self, abort: threading.Event) -> None:
        """The thread that takes the baseline ahead of the first cell (StateTracker.prepare), stopped like the
        verification; tried again after the next record applied, or after a second of quiet."""
        done, took = self._in_thread("taking the namespace's baseline", partial(self.tracker.prepare, abort))
        log.log(
            logging.INFO if done else logging.DEBUG,
            "baseline of the namespace %s in %.1f ms, ahead of a cell on this replica",
            "taken" if done else "stopped",
            took * 1e3,
        )
        assert self.io_loop is not None
        self.io_loop.add_callback(self._verified, abort, None if done else VERIFY_AFTER_S)

    def _verify(self, abort: threading.Event, again: bool) -> None:
        """The verification thread (see _in_thread)."""
        done, took = self._in_thread("verifying the namespace", partial(self.tracker.verify, abort))
        log.debug("namespace verification %s in %.1f ms", "done" if done else "stopped", took * 1e3)
        if self.tracker.found:
            log.info(
                "verification: %s changed where no cell reached; the next cell's record sends them",
                ", ".join(sorted(self.tracker.found)),
            )
        again = again and done and not abort.is_set()
        assert self.io_loop is not None
        self.io_loop.add_callback(self._verified, abort, max(VERIFY_PERIOD_S, 20 * took) if again else None)

    def _verified(self, abort: threading.Event, next_in: float | None) -> None:
        """A verification thread ended (the loop): look again in ``next_in`` seconds, if given."""
        if self._verifying is None or self._verifying[1] is not abort:
            return  # stopped meanwhile (_stop_verify): what comes next is up to what stopped it
        self._verifying = None
        if next_in is not None:
            self._schedule_verify(next_in)

    def _stop_verify(self) -> None:
        """Stop a running verification and wait for it (it stops at the next object it pickles)."""
        if self._verify_timer is not None:
            assert self.io_loop is not None
            self.io_loop.remove_timeout(self._verify_timer)
            self._verify_timer = None
        verifying, self._verifying = self._verifying, None
        if verifying is not None:
            thread, abort = verifying
            abort.set()
            thread.join()

    def _comm_handler(self, handler: Callable[..., Any]) -> Callable[..., Any]:
        """A comm message's handler runs the user's callbacks (widgets), which may change any value: no
        verification runs meanwhile, and one follows."""

        async def handle(*args: Any) -> None:
            self._stop_verify()
            try:
                result = handler(*args)
                if inspect.isawaitable(result):
                    await result
            finally:
                if self.tracker.unverified or self.applied == self._own_seq:
                    self.tracker.unverify()
                    self._schedule_verify()

        return handle

    # -- directed cells --------------------------------------------------------------------------------

    @staticmethod
    def directive_of(parent: dict[str, Any]) -> CellDirective | None:
        """The request's CellDirective, or None for a plain request. Raises ValueError when malformed."""
        raw = (parent.get("metadata") or {}).get(METADATA_KEY)
        if raw is None:
            return None
        try:
            return CellDirective.from_dict(raw)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed metadata.{METADATA_KEY} directive {raw!r}: {exc}") from exc

    async def execute_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """Run a cell; for a directed cell, publish its state record after the reply."""
        try:
            directive = self.directive_of(parent)
        except ValueError as exc:
            with _sigint_noted():  # (see below)
                await self._quiesce()
            self._reply_error(stream, ident, parent, "NotebookOSDirectiveError", str(exc))
            return
        msg_id = parent["header"]["msg_id"]
        if directive is not None and not self.intake.take(msg_id):
            log.warning("cell %s (record %d) came after the gateway gave it up: refused", msg_id, directive.seq)
            self._reply_error(
                stream,
                ident,
                parent,
                "NotebookOSCellGivenUp",
                "this cell reached its replica after the gateway that decided it had died and its successor had "
                "given it up; nothing ran. Run it again.",
            )
            return
        cell = None if directive is None else _Cell(directive, msg_id)
        # Before the cell's code runs it may wait (the last cell's upload, records to apply): seconds with GBs. An
        # interrupt meanwhile is noted, not raised: ipykernel's handler raises it wherever the main thread is, here
        # the event loop, and that ended the replica. The cell is answered as interrupted at once, and runs not at
        # all; its (empty) record still waits for what the cell waited for, so that records keep their order.
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()
        answered = False
        if cell is not None and cell.directive.interrupted:
            # The client interrupted it while the router committed it, before it reached this replica.
            self._reply_interrupted(stream, ident, parent, cell)
            answered = True
        with _sigint_noted(lambda: loop.call_soon_threadsafe(woken.set)) as interrupted:
            uploading = self._uploading
            if (uploading is None or uploading.done()) and (directive is None or self.applied >= directive.seq - 1):
                caught_up = await self._ready_to_run(directive)  # the common case: nothing to wait for
            else:
                ready = loop.create_task(self._ready_to_run(directive))
                signalled = loop.create_task(woken.wait())
                await asyncio.wait({ready, signalled}, return_when=asyncio.FIRST_COMPLETED)
                signalled.cancel()
                if interrupted() and not ready.done() and not answered:
                    self._reply_interrupted(stream, ident, parent, cell)
                    answered = True
                caught_up = await ready
        if answered or (caught_up and interrupted()):
            if not answered:
                self._reply_interrupted(stream, ident, parent, cell)
            if cell is not None and caught_up:
                self._start_publication(cell.directive, msg_id, None)
            elif cell is not None:
                log.warning(
                    "cell %s (record %d), answered as interrupted, has no record: records before it did not arrive "
                    "within %.0f s",
                    msg_id,
                    cell.directive.seq,
                    CATCH_UP_TIMEOUT,
                )
            return
        if directive is None:
            await super().execute_request(stream, ident, parent)
            return
        if not caught_up:
            self._reply_error(
                stream,
                ident,
                parent,
                "NotebookOSReplicaBehind",
                f"replica {self.settings.replica_id} has applied the state log up to record {self.applied} "
                f"but this cell is record {directive.seq}; the records in between did not arrive within "
                f"{CATCH_UP_TIMEOUT:.0f} s. Nothing ran.",
            )
            return
        assert cell is not None
        self._cell = cell
        self.agent.keep_lease_from_helper()  # this replica runs user code: a GIL hold must not end its lease
        try:
            await super().execute_request(stream, ident, parent)
        finally:
            cell, self._cell = self._cell, None
            self._start_publication(cell.directive, msg_id, cell.delta)

    async def _ready_to_run(self, directive: CellDirective | None) -> bool:
        """Wait until a cell may run: the namespace may change and, for a directed cell, every earlier record is
        applied; False if those records do not arrive in time."""
        await self._quiesce()
        return directive is None or await self._catch_up(directive.seq - 1)

    def _start_publication(self, directive: CellDirective, msg_id: str, delta: StateDelta | None) -> None:
        """Pickle, upload and publish record ``directive.seq`` (``delta``: what the cell changed; None: nothing)
        in the background.

        The namespace already holds the cell's effects, so the record counts as applied here at once (the
        publication transaction reports it to etcd); the next cell waits only for the pickling and the upload.
        """
        statelog, agent, tracker = self.statelog, self.agent, self.tracker
        io_loop = self.io_loop
        assert io_loop is not None
        empty = delta is None or delta.is_empty()
        uploaded: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.applied = max(self.applied, directive.seq)
        self._last_fence = directive.fence
        self._own_seq = directive.seq
        self._note_touched(directive.seq, delta.names if delta is not None else ())

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
                            directive.seq, "lost", msg_id, self.settings.replica_id, unserializable=changed
                        )
                        # Queued before the next cell, which waits for the upload, may take the notice.
                        io_loop.add_callback(self._changes_not_shared, directive.seq, changed, failure)
                finally:
                    uploaded.set_result(None)
            uploaded_ms = (time.perf_counter() - started) * 1e3
            outcome = await agent.publish(record, directive.fence, hold=empty)
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
        loop = self.io_loop
        assert loop is not None
        # Counted as in flight from now on (shutdown waits for it), although it starts a moment later.
        outcome: concurrent.futures.Future[PublishOutcome] = concurrent.futures.Future()
        self._in_flight.add(outcome)
        outcome.add_done_callback(lambda f: loop.add_callback(self._on_published, f))

        def submit() -> None:
            # Here, not before the reply: the loop's thread (or shutdown's), before anything may change the namespace.
            pending, failure = self._pickle_delta(directive.seq, None if empty else delta)
            agent.thread.submit(publish(pending, failure)).add_done_callback(lambda f: _chain(f, outcome))

        self._start_deferred()  # records go out in order
        if empty:
            # Start it on the loop's next turn, after ipykernel has published this cell's "idle" status: the
            # client waits for that message, and the publication's etcd round trip need not run ahead of it.
            loop.add_callback(submit)
            return
        # Pickling and upload start PUBLICATION_DELAY after the reply, or when the next request comes (_quiesce),
        # whichever is first; the next cell waits for the upload in _quiesce, as before. Until then the client
        # has the cell's reply and "idle": pickling before them cost the cell a millisecond or so.
        timer = loop.call_later(PUBLICATION_DELAY, self._start_deferred)
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
            pending = serialize_delta(delta, self.settings.buffer_threshold)
        except Exception as exc:
            log.exception("pickling the state delta of record %d failed", seq)
            self.tracker.reset()  # its fingerprints count the changes as sent: the next cell looks at everything
            return serialize_delta(None, 0), f"they could not be pickled: {type(exc).__name__}: {exc}"
        late = {name: why for name, why in pending.record.unserializable.items() if name not in delta.unpicklable}
        if late:
            reason = "; ".join(f"{name}: {why}" for name, why in sorted(late.items()))
            self.lost_changes.add(seq, sorted(late), f"they could not be serialized: {reason}", kept=True)
        took_ms = (time.perf_counter() - started) * 1e3
        log.log(
            logging.INFO if pending.views or took_ms > 50 else logging.DEBUG,
            "record %d: delta of %d names pickled in %.1f ms, after the reply",
            seq,
            len(pending.names),
            took_ms,
        )
        return pending, None

    def _start_deferred(self) -> None:
        """Start the publication waiting for its delay now (its timer fired, or something must not wait)."""
        with self._deferred_lock:
            deferred, self._deferred = self._deferred, None
        if deferred is not None:
            timer, submit = deferred
            assert self.io_loop is not None
            self.io_loop.add_callback(self.io_loop.remove_timeout, timer)  # the loop's own thread, as tornado wants
            submit()

    async def _maybe_checkpoint(self, seq: int, *, again: float = 0.0) -> None:
        """Checkpoint the namespace if enough log records could then be deleted (a dispatch).

        The namespace is pickled here, between requests; its buffers are uploaded in the background like a
        record's. The checkpoint transaction is fenced like a publication and requires the record it covers
        to be in the log.
        """
        await self._quiesce()
        every = self.settings.checkpoint_every
        seq = self.applied
        if seq - self._checkpoint_seq < every or (seq < self._next_checkpoint_check and not again):
            return
        agent, statelog, fence = self.agent, self.statelog, self._last_fence
        delete, current = await asyncio.wrap_future(agent.thread.submit(agent.checkpoint_due(seq, every)))
        if delete is None:
            # Followers behind: look again a few records later, or in a moment if no cell comes meanwhile.
            self._next_checkpoint_check = seq + max(1, every // 4)
            if self._checkpoint_retry is None:
                wait = min(again * 2, CHECKPOINT_RETRY_MAX_S) if again else CHECKPOINT_RETRY_S
                assert self.io_loop is not None
                self._checkpoint_retry = self.io_loop.call_later(wait, self._checkpoint_again, wait)
            return
        # Pickled in a thread that the next request stops (schedule_dispatch), unless the log has grown to four
        # times the interval: a notebook holding a million small objects takes most of a second here, and its
        # user's next cell would wait for it. Nothing else changes the namespace meanwhile: requests, records and
        # comm messages are dispatched one at a time, after this; an eviction waits (evict_request).
        abort = None if seq - self._checkpoint_seq >= 4 * every else threading.Event()
        if abort is not None and not self.msg_queue.empty():
            abort.set()  # a request came while this looked up what the checkpoint may delete
        loop = asyncio.get_running_loop()
        if current is not None and current.seq > self._parts_seq and self._touched_since(current.seq) is not None:
            await self._learn_parts(current)  # another replica wrote it (this one was not the executor then)
        kept, groups = self._checkpoint_plan(self.tracker.user_names(), current.seq if current else None)
        since = self._parts_seq
        threshold = self.settings.buffer_threshold
        self._checkpoint_abort = abort
        pickling = time.perf_counter()
        parts_left = max(1, MAX_CHECKPOINT_PARTS - len(kept))
        checkpointing = self._checkpointing = loop.run_in_executor(
            None, partial(statelog.serialize_checkpoint, self.namespace, groups, threshold, abort, parts_left)
        )
        try:
            with _quick_gil_handoff():
                pending = await checkpointing
            pickled_ms = (time.perf_counter() - pickling) * 1e3
        except SerializationAborted:
            log.info("checkpoint at seq %d put off: a request came while the namespace was pickled", seq)
            if self._checkpoint_retry is None:
                assert self.io_loop is not None
                self._checkpoint_retry = self.io_loop.call_later(CHECKPOINT_RETRY_S, self._checkpoint_again, 0.0)
            return
        finally:
            # (Not kept past this: its result holds views of the user's arrays, which must not outlive their names.)
            self._checkpoint_abort, self._checkpointing = None, None
        uploaded: concurrent.futures.Future[None] = concurrent.futures.Future()

        async def commit() -> bool:
            loop = asyncio.get_running_loop()
            started = time.perf_counter()
            try:
                pointer, parts = await loop.run_in_executor(None, statelog.finish_checkpoint, pending, seq, kept)
            finally:
                uploaded.set_result(None)
            await agent.flush_held()  # the checkpoint requires the record it covers to be in the log
            done = await agent.commit_checkpoint(pointer, delete, fence)
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
                assert self.io_loop is not None
                self.io_loop.add_callback(self._known_parts, seq, parts)  # what the next checkpoint may name again
                try:
                    checkpoint_seq, referenced = await agent.referenced_objects()
                    collect = partial(collect_unreferenced, grace_seconds=GC_GRACE_SECONDS)
                    report = await loop.run_in_executor(None, collect, statelog.store, checkpoint_seq, referenced)
                except Exception as exc:  # the next checkpoint tries again
                    log.warning("object-store garbage collection after checkpoint %d failed: %s", seq, exc)
                else:
                    freed = report.deleted_buffers or report.deleted_checkpoints
                    log.log(logging.INFO if freed else logging.DEBUG, "%s", report)
            return done

        self._checkpoint_seq = seq  # do not try again for this stretch, whatever the outcome
        self._uploading = uploaded
        future = agent.thread.submit(commit())
        future.add_done_callback(_log_failure("checkpoint"))

    async def _learn_parts(self, pointer: CheckpointPointer) -> None:
        """Learn the parts of the kernel's checkpoint in force, which another replica wrote, from its list in the
        object store; without them this replica's next checkpoint would pickle every name again.

        The records applied here since say which of its parts still hold the values the log has (see
        _checkpoint_plan). Not learned, the checkpoint pickles everything, as it did before: a store that cannot
        be read now costs time, not state."""
        loop = asyncio.get_running_loop()
        try:
            parts = await loop.run_in_executor(None, self.statelog.read_parts, pointer)
        except Exception as exc:
            log.warning(
                "reading the parts of checkpoint %d failed (%s); this checkpoint pickles every name", pointer.seq, exc
            )
            return
        if pointer.seq > self._parts_seq:  # (not if this replica's own, newer checkpoint came meanwhile)
            self._known_parts(pointer.seq, parts)

    def _checkpoint_plan(self, names: list[str], current: int | None) -> tuple[list[CheckpointPart], list[list[str]]]:
        """What the next checkpoint names again and what it pickles: the parts of the kernel's checkpoint now
        (``current``) whose names are all still there, that no record since changed, and that share no object
        with a name outside the part; and the other names, in the groups that share objects (one group when the
        state tracker does not know them; see StateTracker.groups)."""
        groups, present = self.tracker.groups, set(names)
        kept: list[CheckpointPart] = []
        touched = self._touched_since(self._parts_seq)
        if self._parts is not None and current == self._parts_seq and touched is not None and groups is not None:
            for part in self._parts:
                alone = all(groups.get(name, part.names) <= part.names for name in part.names)
                if alone and part.names <= present and not part.names & touched:
                    kept.append(part)
        covered = {name for part in kept for name in part.names}
        rest = [name for name in names if name not in covered]
        if groups is None:
            return kept, [rest]
        order = {name: i for i, name in enumerate(rest)}
        plan: list[list[str]] = []
        seen: set[str] = set()
        for name in rest:
            if name not in seen:
                group = groups.get(name, frozenset((name,)))
                members = sorted((n for n in group | {name} if n in order), key=order.__getitem__)
                seen.update(members)
                plan.append(members)
        return kept, plan

    def _note_touched(self, seq: int, names: Iterable[str] | None) -> None:
        """Record ``seq`` (applied here, or published by this replica) changed ``names`` (None: not known)."""
        if seq <= self._parts_seq:
            return
        self._touched[seq] = None if names is None else frozenset(names)
        while len(self._touched) > TOUCHED_RECORDS_KEPT:
            oldest = min(self._touched)
            del self._touched[oldest]
            self._touched_dropped = max(self._touched_dropped, oldest)

    def _touched_since(self, seq: int) -> set[str] | None:
        """The names the records after ``seq`` changed; None when that is not known."""
        if self._touched_dropped > seq:
            return None
        names: set[str] = set()
        for after, changed in self._touched.items():
            if after > seq:
                if changed is None:
                    return None
                names |= changed
        return names

    def _known_parts(self, seq: int, parts: list[CheckpointPart] | None) -> None:
        """The checkpoint at ``seq`` (written or read here) has ``parts`` (None: none to name again)."""
        self._parts, self._parts_seq = parts, seq
        for after in [s for s in self._touched if s <= seq]:
            del self._touched[after]

    def _checkpoint_again(self, waited: float) -> None:
        """Look again at a put-off checkpoint, unless another replica ran a cell since (it checkpoints now)."""
        self._checkpoint_retry = None
        if self.applied == self._own_seq:
            self.schedule_dispatch(partial(self._maybe_checkpoint, again=waited), self.applied)

    def schedule_dispatch(self, dispatch: Callable[..., Any], *args: Any) -> None:
        """A shell message stops a checkpoint's pickling (it is tried again later): the request comes first."""
        if self._checkpoint_abort is not None and dispatch == self.dispatch_shell:
            self._checkpoint_abort.set()
        super().schedule_dispatch(dispatch, *args)

    def _publish_status(self, status: str, channel: str, parent: dict[str, Any] | None = None) -> None:
        """Publish a status as ipykernel does; after a shell request, its reply goes first and the "idle" goes
        out at once.

        Clients wait for both. ipykernel queues the reply, hands the idle to its iopub thread and then sends the
        reply; that thread sends the idle only once it gets the GIL, when the main thread next blocks: 1.3 ms
        later, measured after a trivial cell, so the idle, not the reply, was what the client waited for. Here the
        reply is sent first and the main thread then waits (without the GIL) until the iopub thread has sent the
        idle, at most IDLE_HANDOFF_S."""
        if status != "idle" or channel != "shell" or self.shell_stream is None or self.iopub_thread is None:
            super()._publish_status(status, channel, parent)
            return
        self.shell_stream.flush(zmq.POLLOUT)
        super()._publish_status(status, channel, parent)
        sent = threading.Event()
        self.iopub_thread.schedule(sent.set)  # runs after the idle's send: the thread takes its events in order
        sent.wait(IDLE_HANDOFF_S)

    def _reply_error(self, stream: Any, ident: Any, parent: dict[str, Any], ename: str, evalue: str) -> None:
        content = {"status": "error", "ename": ename, "evalue": evalue, "traceback": [f"{ename}: {evalue}"]}
        assert self.session is not None
        self.session.send(
            stream, "execute_reply", content, parent, metadata={METADATA_KEY: self._reply_metadata(None)}, ident=ident
        )

    def _reply_interrupted(self, stream: Any, ident: Any, parent: dict[str, Any], cell: _Cell | None) -> None:
        """Answer a cell interrupted before its code ran (the caller publishes a directed one's empty record)."""
        evalue = "interrupted before the cell began; nothing ran"
        content = {"ename": "KeyboardInterrupt", "evalue": evalue, "traceback": [f"KeyboardInterrupt: {evalue}"]}
        assert self.session is not None
        if stops_on_error(parent.get("content") or {}):
            self._abort_queues()  # as ipykernel does for a failed cell ("Run All" stops here), before the reply goes
        self.session.send(self.iopub_socket, "error", content, parent, ident=self._topic("error"))
        reply = {"status": "error", "execution_count": self.execution_count, **content}
        self.session.send(
            stream, "execute_reply", reply, parent, metadata={METADATA_KEY: self._reply_metadata(cell)}, ident=ident
        )

    def _send_abort_reply(self, stream: Any, msg: dict[str, Any], idents: Any) -> None:
        """An aborted directed cell (an earlier cell failed) still publishes its (empty) record."""
        super()._send_abort_reply(stream, msg, idents)
        try:
            directive = self.directive_of(msg)
        except ValueError:
            return
        if directive is not None and self.intake.take(msg["header"]["msg_id"]):  # (one given up has no record)
            self._start_publication(directive, msg["header"]["msg_id"], None)

    async def do_execute(
        self,
        code: str,
        silent: bool,
        store_history: bool = True,
        user_expressions: dict[str, Any] | None = None,
        allow_stdin: bool = False,
        *,
        cell_meta: dict[str, Any] | None = None,
        cell_id: str | None = None,
    ) -> dict[str, Any]:
        """Run the code; around a directed cell, bind/release GPUs and capture the delta."""
        cell = self._cell
        if cell is None:
            return await super().do_execute(
                code,
                silent,
                store_history,
                user_expressions,
                allow_stdin,
                cell_meta=cell_meta,
                cell_id=cell_id,
            )
        ns = self.namespace
        notice = self.lost_changes.take_message(cell.directive.seq, ns)
        if notice:
            self._warn([notice])
        self.tracker.before_cell(code)
        try:
            bound = self.gpus.bind(cell.directive.gpus, ns)
            cell.warnings.extend(bound.warnings)
        except ValueError as exc:
            cell.warnings.append(f"NotebookOS: {exc}")
        self._warn(cell.warnings)
        try:
            reply: dict[str, Any] = await super().do_execute(
                code,
                silent,
                store_history,
                user_expressions,
                allow_stdin,
                cell_meta=cell_meta,
                cell_id=cell_id,
            )
        finally:
            with _sigint_noted():  # an interrupt must not lose the record
                captured = time.perf_counter()
                messages = self.gpus.release(ns).warnings
                try:
                    cell.delta = delta = self.tracker.after_cell()
                    warning = unserializable_warning(delta.unpicklable)
                    if warning:
                        messages.append(warning)
                    took_ms = (time.perf_counter() - captured) * 1e3
                    log.log(
                        logging.INFO if took_ms > 50 else logging.DEBUG,
                        "cell %d: delta of %d names captured in %.1f ms before the reply",
                        cell.directive.seq,
                        len(delta.names),
                        took_ms,
                    )
                except Exception as exc:
                    log.exception("capturing the state delta failed")
                    self.tracker.reset()
                    messages.append(
                        f"NotebookOS: this cell's changes could not be captured ({type(exc).__name__}: {exc}); "
                        "they will not survive a failover or migration of this kernel."
                    )
                self._warn(messages)
        return reply

    def _warn(self, messages: list[str]) -> None:
        """Show ``messages`` in the running cell's output (its stderr stream)."""
        for message in messages:
            print(message, file=sys.stderr, flush=True)

    def finish_metadata(self, parent: dict[str, Any], metadata: dict[str, Any], reply_content: dict[str, Any]) -> Any:
        """Add ``metadata.notebookos`` to the reply; a failed cell's queue is aborted before its reply goes."""
        metadata = super().finish_metadata(parent, metadata, reply_content)
        metadata[METADATA_KEY] = self._reply_metadata(self._cell)
        if reply_content.get("status") == "error" and stops_on_error(parent.get("content") or {}):
            # ipykernel aborts the requests queued behind a failed cell ("Run All" stops there) after it queued the
            # reply: its _abort_queues flushes the shell stream, which sends the reply and then takes in what has
            # arrived, so a request its client sent on seeing the reply could be aborted too (CI: the cell after
            # an interrupt, answered "aborted", when the main thread lost the CPU right after the send). Aborting
            # here, before the reply is queued, takes in only what arrived before it; ipykernel's own call then
            # queues what came later behind this call's end of aborting, and it runs.
            self._abort_queues()
        return metadata

    def _reply_metadata(self, cell: _Cell | None) -> dict[str, Any]:
        info: dict[str, Any] = {
            "replica": self.settings.replica_id,
            "host": self.settings.host,
            "gpus": list(cell.directive.gpus) if cell else [],
            "seq": cell.directive.seq if cell else None,
        }
        if self.gpus.resident:
            info["resident"] = self.gpus.resident  # sticky: the state stays on these devices until evicted
        delta = cell.delta if cell is not None else None
        if delta is not None and delta.unpicklable:
            info["unserializable"] = sorted(delta.unpicklable)
        if delta is not None and not delta.is_empty():
            # The router keeps these until the record is published: if this replica dies first, the record it
            # closes as lost names them, and the next cell's output tells the user.
            info["changed"] = sorted(delta.names)
        return info

    # -- a re-attached gateway's question --------------------------------------------------------------

    async def cell_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """``notebookos_cell_request`` (control channel), from a gateway that re-attached: did this replica take
        the cell ``msg_id`` (the last one the previous gateway decided it runs)? Answered from this thread at once;
        a cell not taken by now never will be (see _CellIntake)."""
        assert self.session is not None
        msg_id = str((parent.get("content") or {}).get("msg_id", ""))
        taken = self.intake.taken_else_given_up(msg_id)
        self.session.send(stream, "notebookos_cell_reply", {"status": "ok", "taken": taken}, parent, ident=ident)

    async def applied_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """``notebookos_applied_request`` (control channel): the last record whose state this replica holds, from
        the router when the replica's applied key in etcd stays behind the log (the key went with a lease etcd
        ended). Answered from this thread at once."""
        assert self.session is not None
        self.session.send(
            stream, "notebookos_applied_reply", {"status": "ok", "applied": self.applied}, parent, ident=ident
        )

    # -- GPU eviction ----------------------------------------------------------------------------------

    async def evict_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """``notebookos_evict_request`` (control channel): the GPU this replica's state stays on (sticky
        release) is given to someone else; move the state to host memory. Runs on the shell's loop, between
        requests, and replies with the names moved, the devices freed and the seconds it took."""
        loop = self.io_loop
        assert loop is not None and self.session is not None
        done: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()

        def evict() -> None:
            self._stop_verify()  # the state moves: the verification must not pickle it meanwhile
            checkpointing = self._checkpointing
            if checkpointing is not None and not checkpointing.done():  # nor a checkpoint: after it, then
                if self._checkpoint_abort is not None:
                    self._checkpoint_abort.set()
                checkpointing.add_done_callback(lambda _: evict())
                return
            try:
                devices = self.gpus.resident
                result = self.gpus.evict(self.namespace)
                done.set_result(
                    {
                        "status": "ok",
                        "devices": devices if not self.gpus.resident else [],
                        "offloaded": result.offloaded,
                        "seconds": result.seconds,
                        "warnings": result.warnings,
                    }
                )
            except Exception as exc:
                done.set_result({"status": "error", "ename": type(exc).__name__, "evalue": str(exc)})

        loop.add_callback(evict)
        content = await asyncio.wrap_future(done)
        self.session.send(stream, "notebookos_evict_reply", content, parent, ident=ident)

    # -- shutdown --------------------------------------------------------------------------------------

    def do_shutdown(self, restart: bool) -> dict[str, Any]:
        """Revoke the lease (registration, applied and GPU keys vanish at once), then stop as usual."""
        verifying = self._verifying
        if verifying is not None:
            verifying[1].set()  # (this is the control thread: the loop's timers are not ours to touch)
        self._start_deferred()
        for future in list(self._in_flight):
            with contextlib.suppress(Exception):
                future.result(timeout=10)
        self.agent.revoke()
        return super().do_shutdown(restart)
