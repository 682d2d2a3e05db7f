"""``IdleVerifier``: while the kernel idles, verify the values no cell reached, in a thread the next request stops.

A cell's capture fingerprints only what the cell can reach; a thread the user started, or a comm callback, can change
anything. So once the kernel has been idle a moment the verifier runs :meth:`StateTracker.verify` in a thread (what
it finds goes out with the next cell's record), and on a replica without a baseline (a follower, one that restored)
takes the baseline the first cell it runs would otherwise take (:meth:`StateTracker.prepare`). Whatever changes or
reads the namespace stops it first (:meth:`IdleVerifier.stop`) and asks for another later.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import partial

from jupyter_notebookos.kernel.loop import KernelLoop, quick_gil_handoff
from jupyter_notebookos.replication.state import StateTracker

log = logging.getLogger(__name__)

#: Seconds the kernel waits, idle, after a cell (or a comm message) before it verifies the values no cell
#: reached (StateTracker.verify, in a thread; the next request stops it). While the kernel stays idle it verifies
#: again every VERIFY_PERIOD_S, or 20 times as long as the last verification took, whichever is longer (at most
#: 5 % of a core for a namespace that takes long to fingerprint).
VERIFY_AFTER_S = 1.0
VERIFY_PERIOD_S = 30.0


class IdleVerifier:
    """Verifies the namespace in a thread while the kernel idles (see the module's docstring).

    It asks the kernel, when its timer fires, whether it may start: not while ``excluded()`` (a cell runs, or the
    namespace is to be reloaded from the log: what ends that asks for a verification), and only after
    ``reading()`` ends (an upload or a checkpoint reads the same objects). ``ran_last_cell()``: whether this
    replica ran the last cell, whose threads may still write (it then verifies again while idle)."""

    def __init__(
        self,
        kernel: KernelLoop,
        tracker: StateTracker,
        *,
        excluded: Callable[[], bool],
        reading: Callable[[], bool],
        ran_last_cell: Callable[[], bool],
    ) -> None:
        self._kernel = kernel
        self._tracker = tracker
        self._excluded = excluded
        self._reading = reading
        self._ran_last_cell = ran_last_cell
        self._timer: object | None = None
        self._running: tuple[threading.Thread, threading.Event] | None = None

    def prepare_baseline(self) -> None:
        """Without a baseline (a follower, a replica that restored): take it once the kernel has been idle a
        second (see _start), rather than in the first cell this replica runs; at once while the namespace
        is empty (a replica that starts with its kernel), which costs nothing."""
        if self._tracker.has_baseline or self._kernel.io_loop is None:
            return
        if self._running is None and not self._tracker.user_names():
            self._tracker.prepare()
        else:
            self.schedule()

    def schedule(self, delay: float = VERIFY_AFTER_S) -> None:
        """Verify the namespace once the kernel has been idle ``delay`` seconds (see StateTracker.verify)."""
        loop = self._kernel.io_loop
        assert loop is not None
        if self._timer is not None:
            loop.remove_timeout(self._timer)
        self._timer = loop.call_later(delay, self._start)

    def recheck(self) -> None:
        """User code ran outside a cell (a comm message's callbacks, which may change any value): verify again
        once the kernel idles, where something may be left to find."""
        if self._tracker.unverified or self._ran_last_cell():
            self._tracker.unverify()
            self.schedule()

    def stop(self) -> None:
        """Stop a running verification and wait for it (it stops at the next object it pickles)."""
        if self._timer is not None:
            loop = self._kernel.io_loop
            assert loop is not None
            loop.remove_timeout(self._timer)
            self._timer = None
        running, self._running = self._running, None
        if running is not None:
            thread, abort = running
            abort.set()
            thread.join()

    def stop_soon(self) -> None:
        """Tell a running verification to stop, from another thread (the loop's timers are not that thread's to
        touch): at shutdown, from the control thread."""
        running = self._running
        if running is not None:
            running[1].set()

    def _start(self) -> None:
        self._timer = None
        if self._running is not None or self._excluded():
            return
        if self._reading():
            self.schedule()  # a checkpoint or an upload reads the same objects: after it
            return
        abort = threading.Event()
        if not self._tracker.has_baseline:
            # A follower (or a replica that restored): the baseline the first cell it runs would take.
            thread = threading.Thread(target=self._prepare, args=(abort,), name="notebookos-baseline", daemon=True)
        else:
            again = self._ran_last_cell()  # the executor of the last cell watches for threads' writes
            if not self._tracker.unverified:
                if not again:
                    return
                self._tracker.unverify()
            thread = threading.Thread(target=self._verify, args=(abort, again), name="notebookos-verify", daemon=True)
        self._running = (thread, abort)
        thread.start()

    @staticmethod
    def _in_thread(what: str, work: Callable[[], bool]) -> tuple[bool, float]:
        """Run a thread's ``work`` (False: stopped or failed) with the GIL passing to the kernel's loop within
        0.5 ms of a request arriving (instead of Python's default 5 ms); the loop then stops it (stop()).
        Returns whether it finished, and the seconds it took."""
        started = time.perf_counter()
        try:
            with quick_gil_handoff():
                done = work()
        except Exception:
            log.exception("%s failed", what)
            done = False
        return done, time.perf_counter() - started

    def _prepare(self, abort: threading.Event) -> None:
        """The thread that takes the baseline ahead of the first cell (StateTracker.prepare), stopped like the
        verification; tried again after the next record applied, or after a second of quiet."""
        done, took = self._in_thread("taking the namespace's baseline", partial(self._tracker.prepare, abort))
        log.log(
            logging.INFO if done else logging.DEBUG,
            "baseline of the namespace %s in %.1f ms, ahead of a cell on this replica",
            "taken" if done else "stopped",
            took * 1e3,
        )
        loop = self._kernel.io_loop
        assert loop is not None
        loop.add_callback(self._verified, abort, None if done else VERIFY_AFTER_S)

    def _verify(self, abort: threading.Event, again: bool) -> None:
        """The verification thread (see _in_thread)."""
        done, took = self._in_thread("verifying the namespace", partial(self._tracker.verify, abort))
        log.debug("namespace verification %s in %.1f ms", "done" if done else "stopped", took * 1e3)
        if self._tracker.found:
            log.info(
                "verification: %s changed where no cell reached; the next cell's record sends them",
                ", ".join(sorted(self._tracker.found)),
            )
        again = again and done and not abort.is_set()
        loop = self._kernel.io_loop
        assert loop is not None
        loop.add_callback(self._verified, abort, max(VERIFY_PERIOD_S, 20 * took) if again else None)

    def _verified(self, abort: threading.Event, next_in: float | None) -> None:
        """A verification thread ended (the loop): look again in ``next_in`` seconds, if given."""
        if self._running is None or self._running[1] is not abort:
            return  # stopped meanwhile (stop()): what comes next is up to what stopped it
        self._running = None
        if next_in is not None:
            self.schedule(next_in)
