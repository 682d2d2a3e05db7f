"""Which waiting cell gets GPUs next: the order of the queue, quota gates, and fair share's wait bound.

:class:`Dispatcher` owns the wait queue (:class:`~.queue.CellQueue`) and what depends on its order: the
quota waits of queued cells, and the hold an aged cell puts on GPUs (see ``sharing``). The engine hands it a
way to start a cell (executor choice, migration...); the dispatcher decides which cell to try when.

Without owners (or with one user, or fair share off) the order is the queue's own round-robin across
kernels, exactly as before sharing existed; quotas gate cells in either order.

In fair-share order, GPUs go first to cells that can run **in place** (on a replica's host), and only then, in
the same order and the same round, to cells that need a migration: a migration holds the GPUs it reserves for
its whole duration (container start, restore, catch-up: seconds), so taking GPUs another waiting cell could use
at once serves nobody sooner. A cell past the wait bound may migrate in the first pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from .cluster import ClusterModel, Kernel
from .decisions import MigrateThenRun, QueueDispatch, RejectCell, RunCell
from .executor import Blocked
from .gputypes import overlap
from .queue import CellQueue, QueuedCell
from .quotas import QuotaExceeded, QuotaWait
from .sharing import Sharing, Turn

#: How the engine starts a queued cell: (kernel, cell, now, whether it may migrate) -> a decision, or why not.
Starter = Callable[[Kernel, QueuedCell, float, bool], RunCell | MigrateThenRun | Blocked]


class Dispatcher:
    """The wait queue, its fair-share order and its quota gates (see the module)."""

    def __init__(self, model: ClusterModel, sharing: Sharing) -> None:
        self.model = model
        self.sharing = sharing
        self.queue = CellQueue()
        self.quota_waits: dict[str, QuotaWait] = {}  # kernel -> why its head waits on a quota
        self._holder: str | None = None  # a kernel whose aged head holds back other users' cells

    # --- order ------------------------------------------------------------------------------------------

    def turns(self, now: float) -> list[Turn]:
        """The ready kernels in the order their head cells are offered GPUs, each with why (fair share)."""
        ready = self.queue.ready()
        order = self.sharing.order(ready, self.queue.ready_since, now)
        if order is None:
            return [Turn(k, "", False) for k in ready]
        return order

    def cells(self, now: float) -> list[QueuedCell]:
        """Every queued cell, in the order they will be offered GPUs."""
        return self.queue.cells([t.kernel_id for t in self.turns(now)])

    # --- admission of a new request ---------------------------------------------------------------------

    def held_back(self, kernel: Kernel, gpus: int) -> str:
        """Why a new cell must queue behind an aged cell holding GPUs, or ``""``."""
        holder = self._holder
        if holder is None or gpus <= 0 or holder not in self.model.kernels or holder == kernel.kernel_id:
            return ""
        held = self.model.kernels[holder]
        if not self.queue.has(holder) or held.running is not None:
            self._holder = None
            return ""
        if not overlap(held.wants, kernel.wants):
            return ""
        cell = self.queue.head(holder)
        return f"GPUs are held for cell {cell.cell_id} of kernel {holder}, which waited past the fair-share bound"

    def forget(self, kernel_id: str) -> None:
        """The kernel has no head cell waiting any more (it started, or the kernel stopped)."""
        self.quota_waits.pop(kernel_id, None)
        if self._holder == kernel_id:
            self._holder = None

    # --- dispatch ---------------------------------------------------------------------------------------

    def dispatch(self, now: float, start: Starter) -> QueueDispatch:
        """Start the queued cells that can run now, in order (each gets first pick in turn)."""
        model, queue = self.model, self.queue
        started: list[RunCell | MigrateThenRun] = []
        rejected: list[RejectCell] = []
        max_idle = model.max_idle()
        holder: Kernel | None = None
        turns = self.turns(now)
        in_place_first = any(t.why for t in turns)  # fair-share order (see the module)
        deferred: list[Turn] = []
        for turn in turns:
            kernel_id = turn.kernel_id
            kernel = model.kernels[kernel_id]
            head = queue.head(kernel_id)
            if holder is not None and head.gpus > 0 and overlap(holder.wants, kernel.wants):
                continue  # behind an aged cell that needs these GPUs
            quota = self.sharing.gate(kernel, head.gpus, now)
            if isinstance(quota, QuotaExceeded):
                rejected.extend(self._reject(kernel, quota, now))
                continue
            if quota is not None:
                self.quota_waits[kernel_id] = quota
                continue
            self.quota_waits.pop(kernel_id, None)
            if not kernel.wants and head.gpus > max_idle:
                if turn.aged and holder is None:
                    holder = kernel
                continue  # no host anywhere has that many idle GPUs
            decision = start(kernel, head, now, turn.aged or not in_place_first)
            if isinstance(decision, Blocked):
                if decision.would_migrate:
                    deferred.append(turn)
                elif turn.aged and holder is None and decision.scale_out_would_help:
                    holder = kernel
                continue
            self._started(turn, decision, started)
            if head.gpus:
                max_idle = model.max_idle()
        for turn in deferred:  # the cells that need a migration, in the same order
            kernel = model.kernels[turn.kernel_id]
            head = queue.head(turn.kernel_id)
            if holder is not None and head.gpus > 0 and overlap(holder.wants, kernel.wants):
                continue
            decision = start(kernel, head, now, True)
            if not isinstance(decision, Blocked):
                self._started(turn, decision, started)
        self._holder = holder.kernel_id if holder is not None else None
        return QueueDispatch(tuple(started), len(queue), tuple(rejected))

    def _started(self, turn: Turn, decision: RunCell | MigrateThenRun, started: list[RunCell | MigrateThenRun]) -> None:
        self.queue.pop_head(turn.kernel_id)
        self.forget(turn.kernel_id)
        if turn.why:
            decision = dataclasses.replace(decision, picked=turn.why)
        started.append(decision)

    def _reject(self, kernel: Kernel, quota: QuotaExceeded, now: float) -> list[RejectCell]:
        """Refuse the kernel's queued cells that the spent limit refuses (its next ones too: the limit does not
        clear before they would run)."""
        out: list[RejectCell] = []
        queue = self.queue
        refusal: QuotaWait | QuotaExceeded | None = quota
        while queue.has(kernel.kernel_id) and isinstance(refusal, QuotaExceeded):
            head = queue.pop_head(kernel.kernel_id)
            out.append(RejectCell(kernel.kernel_id, head.cell_id, head.gpus, str(refusal), refusal))
            if queue.has(kernel.kernel_id):
                refusal = self.sharing.gate(kernel, queue.head(kernel.kernel_id).gpus, now)
        self.forget(kernel.kernel_id)
        queue.kernel_idle(kernel.kernel_id, now)
        return out

    def gpus_waiting(self) -> int:
        """GPUs the queued cells ask for, but not those a quota holds back (more hosts would not help them)."""
        return self.queue.gpus_waiting(self.quota_waits)
