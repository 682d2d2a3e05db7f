"""The GPU ledger reconciled with the scheduler, periodically (one reconciler per gateway).

The ledger in etcd (``/gpus/{host}/{device}`` entries and ``/kernels/{kid}/cells/{msg_id}`` records) and the
scheduler's running cells are kept in step by the routers, cell by cell. Whatever slips through (a release lost
with a gateway that died, an entry written by hand, a malformed value, a cell the scheduler still counts although
no router runs it) is found here: every round lists the ledger and the cells the routers hold (running, waiting,
adopted); an entry or scheduler cell that belongs to none of them in two rounds in a row, unchanged, goes. So no
entry outlives its cell by more than two rounds (plus one etcd call); entries whose release is merely deferred
(:class:`~jupyter_notebookos.gateway.router.ledger.LedgerReleases`) are left to it. A round returns a
:class:`ReconcileRound` that logs as one line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from jupyter_notebookos.coordination.client import Coordinator
from jupyter_notebookos.coordination.kv import KeyValue
from jupyter_notebookos.coordination.quarantine import quarantine
from jupyter_notebookos.coordination.txn import Compare, Op
from jupyter_notebookos.gateway.router.ledger import LedgerReleases
from jupyter_notebookos.gateway.upkeep.rounds import PeriodicRounds
from jupyter_notebookos.scheduler import Scheduler

#: Seconds between two rounds (the default of ``NotebookOSGatewayApp.ledger_reconcile_interval``).
DEFAULT_RECONCILE_INTERVAL = 10.0


@dataclass
class ReconcileRound:
    """What one round found and did."""

    entries: int = 0  # ledger entries and cell records looked at
    deleted: list[str] = field(default_factory=list)  # entries of no live cell, deleted
    quarantined: list[str] = field(default_factory=list)  # malformed entries, moved aside
    released: list[str] = field(default_factory=list)  # "kernel/cell" the scheduler counted but no router ran
    suspects: int = 0  # seen without a live cell for the first time: gone next round unless it changes

    @property
    def acted(self) -> bool:
        return bool(self.deleted or self.quarantined or self.released)

    def __str__(self) -> str:
        if not self.acted:
            return f"ledger reconciled: {self.entries} entries, all in use ({self.suspects} to look at again)"
        parts = []
        if self.deleted:
            parts.append(f"deleted {len(self.deleted)} entries of finished cells ({', '.join(self.deleted)})")
        if self.quarantined:
            parts.append(f"quarantined {len(self.quarantined)} malformed ({', '.join(self.quarantined)})")
        if self.released:
            parts.append(f"released {len(self.released)} cells no router runs ({', '.join(self.released)})")
        return "ledger reconciled: " + "; ".join(parts)


class CellHolder(Protocol):
    """A kernel's router, as the reconciler sees it."""

    def live_cells(self) -> set[str]:
        """The msg_ids of the cells it holds (running, waiting, adopted, or replied with their state unpublished)."""


class LedgerReconciler(PeriodicRounds):
    """Runs :meth:`run_round` every ``interval`` seconds while the platform runs.

    ``routers()`` says which kernels this gateway runs now, by id, and the cells their routers hold; ``release``
    frees a cell's GPUs in the scheduler (the platform's planner)."""

    activity = "reconciling the GPU ledger"

    def __init__(
        self,
        *,
        coordinator: Coordinator,
        ledger: LedgerReleases,
        scheduler: Scheduler,
        routers: Callable[[], Mapping[str, CellHolder]],
        release: Callable[[str, str], None],
        interval: float = DEFAULT_RECONCILE_INTERVAL,
    ) -> None:
        self.coordinator = coordinator
        self.ledger = ledger
        self.scheduler = scheduler
        self.routers = routers
        self.release = release
        self.interval = interval
        self._suspect_entries: dict[str, int] = {}  # key -> mod_revision when first seen without a live cell
        self._suspect_cells: set[tuple[str, str]] = set()

    def live_cells(self) -> set[tuple[str, str]]:
        """(kernel, msg_id) of every cell a router holds: running, waiting for GPUs, adopted, or replied but
        with its state record not published yet (its cell record holds its seq until then)."""
        return {(kernel_id, msg_id) for kernel_id, router in self.routers().items() for msg_id in router.live_cells()}

    async def run_round(self) -> ReconcileRound:
        """One pass over the ledger and the scheduler's running cells."""
        co, ledger = self.coordinator, self.ledger
        live = self.live_cells()  # before the read: a cell that starts meanwhile is new, not leaked
        keys = co.keys
        found: list[tuple[KeyValue, tuple[str, str] | None]] = []
        for kv in await co.get_prefix(keys.gpus_prefix()):
            found.append((kv, entry_cell(kv)))
        for kernel_id in list(self.routers()):
            for kv in await co.get_prefix(keys.cells_prefix(kernel_id)):
                found.append((kv, (kernel_id, keys.last_segment(kv.key)) if _is_json_object(kv) else None))
        outcome = ReconcileRound(entries=len(found))
        suspects: dict[str, int] = {}
        for kv, cell in found:
            if ledger.holds(kv.key) or (cell is not None and cell in live):
                continue
            if self._suspect_entries.get(kv.key) != kv.mod_revision:
                suspects[kv.key] = kv.mod_revision  # first sight (or it changed): look again next round
                continue
            if cell is None:
                if await quarantine(co, kv, "not a GPU-ledger entry or cell record"):
                    outcome.quarantined.append(keys.relative(kv.key))
                continue
            result = await co.txn([Compare.mod_revision(kv.key, "==", kv.mod_revision)], [Op.delete(kv.key)])
            if result.succeeded:
                outcome.deleted.append(keys.relative(kv.key))
        self._suspect_entries = suspects
        outcome.suspects = len(suspects)
        # The scheduler's side: GPUs it counts for a cell no router holds are free in truth.
        kernels = self.routers()
        orphans = {
            (c.kernel_id, c.cell_id)
            for c in self.scheduler.running_cells()
            if c.kernel_id in kernels and (c.kernel_id, c.cell_id) not in live
        }
        for kernel_id, cell_id in orphans & self._suspect_cells:
            self.release(kernel_id, cell_id)
            outcome.released.append(f"{kernel_id}/{cell_id}")
        self._suspect_cells = orphans - self._suspect_cells
        return outcome


def _is_json_object(kv: KeyValue) -> bool:
    try:
        return isinstance(json.loads(kv.value), dict)
    except ValueError:
        return False


def entry_cell(kv: KeyValue) -> tuple[str, str] | None:
    """(kernel, msg_id) a GPU-ledger entry names, or None when it is malformed."""
    try:
        entry = json.loads(kv.value)
    except ValueError:
        return None
    if not isinstance(entry, dict):
        return None
    kernel_id, msg_id = entry.get("kernel_id"), entry.get("msg_id")
    return (kernel_id, msg_id) if isinstance(kernel_id, str) and isinstance(msg_id, str) else None
