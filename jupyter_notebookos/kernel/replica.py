"""``ReplicaKernel``: an IPython kernel that is one replica of a NotebookOS kernel.

It runs the user's own code like any IPython kernel. What it adds:

- An ``execute_request`` whose metadata carries a :class:`~replication.protocol.CellDirective` is a *directed*
  cell: the replica binds the directive's GPUs, runs the code, releases the GPUs, captures the cell's state
  delta (warning once in the cell's stderr about values that cannot be serialized), replies with
  ``metadata.notebookos = {replica, host, gpus, seq}``, and after the reply publishes it as log record
  ``directive.seq`` (``publisher.py``). Every directed cell publishes exactly one record: also when it changed
  nothing, raised, was interrupted, or was aborted after an earlier error.
- An ``execute_request`` *without* a directive (a client talking to the replica directly, a test) runs and
  publishes nothing: its effects stay on this replica (and ride along in this replica's next published delta
  if it changed names that a directed cell then captures).
- Log records published by other replicas are applied strictly in ``seq`` order, on the kernel's own loop,
  through the same queue as shell requests, so never while a cell runs (``follower.py``).
- Checkpoints: after publishing, the executor checkpoints its namespace when at least ``checkpoint_every``
  records could be deleted (every registered replica applied them; ``checkpointer.py``).
- While it idles, it verifies the values no cell reached (``verify.py``).
- The control requests ``notebookos_cell_request``, ``notebookos_applied_request`` and ``notebookos_evict_request``.

This module keeps what ipykernel calls (its request handlers and hooks); :meth:`ReplicaKernel.attach` builds the
parts that do the rest, each owning its own state, and the kernel answers what they ask of each other.
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import zmq
from ipykernel.ipkernel import IPythonKernel

from jupyter_notebookos.gpu.binding import GpuBinding
from jupyter_notebookos.kernel.agent import ReplicaAgent
from jupyter_notebookos.kernel.checkpointer import Checkpointer
from jupyter_notebookos.kernel.follower import CATCH_UP_TIMEOUT, LogFollower
from jupyter_notebookos.kernel.intake import CellIntake
from jupyter_notebookos.kernel.knowncheckpoint import KnownCheckpoint
from jupyter_notebookos.kernel.lostchanges import LostChanges
from jupyter_notebookos.kernel.publisher import CellPublisher
from jupyter_notebookos.kernel.settings import ReplicaSettings
from jupyter_notebookos.kernel.statelog import StateLog
from jupyter_notebookos.kernel.verify import IdleVerifier
from jupyter_notebookos.replication.objectstore import ObjectStore
from jupyter_notebookos.replication.protocol import METADATA_KEY, CellDirective, stops_on_error
from jupyter_notebookos.replication.records import unserializable_warning
from jupyter_notebookos.replication.state import StateDelta, StateTracker

log = logging.getLogger(__name__)

#: Most seconds the main thread waits, after a request, for the I/O thread to have sent its "idle" (see
#: ReplicaKernel._publish_status).
IDLE_HANDOFF_S = 0.005


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


@dataclass
class _Cell:
    """The directed cell being handled."""

    directive: CellDirective
    msg_id: str
    delta: StateDelta | None = None  # what it changed, pickled after the reply (see CellPublisher.publish)
    warnings: list[str] = field(default_factory=list)


class ReplicaKernel(IPythonKernel):
    """One replica of a NotebookOS kernel. :meth:`attach` wires it to etcd and builds its parts before the loop
    starts: :attr:`follower` (the state log), :attr:`publisher` (each cell's record, and the upload gate),
    :attr:`checkpoints` and :attr:`verifier` (idle verification)."""

    implementation = "notebookos"

    # Set by attach(); class-level defaults keep traitlets' HasTraits machinery out of these.
    settings: ReplicaSettings
    agent: ReplicaAgent
    statelog: StateLog
    gpus: GpuBinding
    tracker: StateTracker
    intake: CellIntake
    lost_changes: LostChanges
    verifier: IdleVerifier
    follower: LogFollower
    publisher: CellPublisher
    checkpoints: Checkpointer

    def attach(self, settings: ReplicaSettings, agent: ReplicaAgent, store: ObjectStore) -> None:
        """Give the kernel its settings, etcd agent and object store, and build its parts (before the loop starts:
        ipykernel builds the kernel, and its shell, before the application has these)."""
        self.settings = settings
        self.agent = agent
        self.gpus = GpuBinding(settings.gpus, sticky=settings.gpu_sticky)
        self.control_handlers["notebookos_evict_request"] = self.evict_request
        self.control_handlers["notebookos_cell_request"] = self.cell_request
        self.control_handlers["notebookos_applied_request"] = self.applied_request
        self.intake = CellIntake()
        assert self.shell is not None
        # The shell's own transformer manager (built once): a new one per cell costs about a millisecond.
        self.tracker = tracker = StateTracker(
            self.shell.user_ns,
            hidden=self.shell.user_ns_hidden,
            transform=self.shell.transform_cell,
            defer_min_bytes=settings.buffer_threshold,  # what records send out of band, uploaded after settle
        )
        # Records send the changed chunks of buffers replicas hold (the tracker's lineage).
        self.statelog = statelog = StateLog(store, settings.replica_id, lineage=tracker.lineage)
        self.shell.ast_transformers.append(_CellTree(tracker))
        # ipykernel sleeps 0.5 ms before every execute_reply (its FIXME: so that the output flushed just before
        # tends to reach clients ahead of the reply). Clients wait for the kernel's "idle", which follows every
        # output of the cell on iopub, so none needs it; here it would only add 0.5 ms to every cell.
        self._execute_sleep = 0.0
        for stream in (sys.stdout, sys.stderr):
            _flush_only_when_written(stream)
        self._cell: _Cell | None = None
        self.lost_changes = LostChanges()  # cells whose changes never reached the log, to tell the user about
        # The parts, each built with what it asks: those built earlier directly, the others through the kernel's
        # methods below (the verifier and the follower come first: the others stop and ask them).
        self.verifier = IdleVerifier(
            self, tracker, excluded=self._no_verification, reading=self._namespace_read, ran_last_cell=self._ran_last
        )
        checkpoint = KnownCheckpoint()
        self.follower = LogFollower(
            self,
            agent=agent,
            statelog=statelog,
            tracker=tracker,
            lost_changes=self.lost_changes,
            checkpoint=checkpoint,
            verifier=self.verifier,
            quiesce=self._quiesce,
        )
        writer = agent.log_writer  # the parts that write the log get the writer alone, not the lease and registration
        self.publisher = CellPublisher(
            self,
            settings=settings,
            writer=writer,
            statelog=statelog,
            tracker=tracker,
            lost_changes=self.lost_changes,
            follower=self.follower,
            verifier=self.verifier,
            on_written=self._record_written,
        )
        self.checkpoints = Checkpointer(
            self,
            settings=settings,
            writer=writer,
            statelog=statelog,
            tracker=tracker,
            checkpoint=checkpoint,
            follower=self.follower,
            publisher=self.publisher,
        )
        for kind in ("comm_open", "comm_msg", "comm_close"):
            if kind in self.shell_handlers:
                self.shell_handlers[kind] = self._comm_handler(self.shell_handlers[kind])

    @property
    def namespace(self) -> dict[str, Any]:
        """The user's namespace (the shell's ``user_ns``)."""
        assert self.shell is not None
        return self.shell.user_ns

    def requests_waiting(self) -> bool:
        """Whether requests are queued for dispatch (see KernelLoop)."""
        return not self.msg_queue.empty()

    # -- what the parts ask of each other ---------------------------------------------------------------

    def _no_verification(self) -> bool:
        """A cell runs, or the namespace is to be reloaded from the log: no verification now."""
        return self._cell is not None or self.follower.reload_due

    def _namespace_read(self) -> bool:
        """An upload or a checkpoint reads the namespace's objects now: a verification waits for it."""
        return self.publisher.uploading() or self.checkpoints.pickling()

    def _ran_last(self) -> bool:
        return self.follower.ran_last_cell()

    async def _quiesce(self) -> None:
        """Wait until the namespace may change (CellPublisher.quiesce)."""
        await self.publisher.quiesce()

    def _record_written(self, seq: int) -> None:
        self.checkpoints.after_publication(seq)

    def _comm_handler(self, handler: Callable[..., Any]) -> Callable[..., Any]:
        """A comm message's handler runs the user's callbacks (widgets), which may change any value: no
        verification runs meanwhile, and one follows."""

        async def handle(*args: Any) -> None:
            self.verifier.stop()
            try:
                result = handler(*args)
                if inspect.isawaitable(result):
                    await result
            finally:
                self.verifier.recheck()

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
                await self.publisher.quiesce()
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
            if not self.publisher.uploading() and (directive is None or self.follower.applied >= directive.seq - 1):
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
                self.publisher.publish(cell.directive, msg_id, None)
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
                f"replica {self.settings.replica_id} has applied the state log up to record {self.follower.applied} "
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
            self.publisher.publish(cell.directive, msg_id, cell.delta)

    async def _ready_to_run(self, directive: CellDirective | None) -> bool:
        """Wait until a cell may run: the namespace may change and, for a directed cell, every earlier record is
        applied; False if those records do not arrive in time."""
        await self.publisher.quiesce()
        return directive is None or await self.follower.catch_up(directive.seq - 1)

    def schedule_dispatch(self, dispatch: Callable[..., Any], *args: Any) -> None:
        """A shell message stops a checkpoint's pickling (it is tried again later): the request comes first."""
        if dispatch == self.dispatch_shell:
            self.checkpoints.request_arrived()
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
            self.publisher.publish(directive, msg["header"]["msg_id"], None)

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
        a cell not taken by now never will be (see CellIntake)."""
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
            stream, "notebookos_applied_reply", {"status": "ok", "applied": self.follower.applied}, parent, ident=ident
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
            self.verifier.stop()  # the state moves: the verification must not pickle it meanwhile
            if self.checkpoints.after_pickling(evict):  # nor a checkpoint: after it, then
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
        self.verifier.stop_soon()  # (this is the control thread: the loop's timers are not ours to touch)
        self.publisher.finish(timeout=10)
        self.agent.revoke()
        return super().do_shutdown(restart)
