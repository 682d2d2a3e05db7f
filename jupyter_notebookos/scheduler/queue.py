"""The wait queue: FIFO per kernel, round-robin fair across kernels.

A kernel runs one cell at a time, so only the head cell of a kernel that is not running anything can
start. Such kernels are *ready*, kept in the order they became ready: a kernel goes to the back after each
of its cells runs, so a kernel that submits many cells cannot starve others. The queue also remembers since
when each ready kernel's head has waited for GPUs (fair share's wait bound counts from then; see ``dispatch``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class QueuedCell:
    """A cell waiting for GPUs (or for its kernel's previous cell)."""

    kernel_id: str
    cell_id: str
    gpus: int
    requested_at: float
    prefer: int | None = None  # the replica the client asked for, if any


class CellQueue:
    """Queued cells by kernel, plus the fair order of kernels whose head cell may start."""

    def __init__(self) -> None:
        self._cells: dict[str, deque[QueuedCell]] = {}
        self._ready: dict[str, float] = {}  # insertion-ordered: the fair order; since when each is ready
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __contains__(self, key: tuple[str, str]) -> bool:
        cells = self._cells.get(key[0])
        return cells is not None and any(c.cell_id == key[1] for c in cells)

    def has(self, kernel_id: str) -> bool:
        """Whether the kernel has queued cells."""
        return kernel_id in self._cells

    def push(self, cell: QueuedCell, kernel_busy: bool) -> int:
        """Append a cell; returns its 1-based position (among ready kernels, or in its busy kernel)."""
        cells = self._cells.setdefault(cell.kernel_id, deque())
        cells.append(cell)
        self._count += 1
        if kernel_busy:
            return len(cells)
        if cell.kernel_id not in self._ready:
            self._ready[cell.kernel_id] = cell.requested_at
            return len(self._ready)
        return len(self._ready) + len(cells) - 1

    def push_front(self, cell: QueuedCell) -> None:
        """Put a cell back at the very front (its migration failed: it keeps its turn)."""
        self._cells.setdefault(cell.kernel_id, deque()).appendleft(cell)
        self._count += 1
        self._ready.pop(cell.kernel_id, None)
        self._ready = {cell.kernel_id: cell.requested_at, **self._ready}

    def ready(self) -> list[str]:
        """Kernels whose head cell may start, in fair order."""
        return list(self._ready)

    def ready_since(self, kernel_id: str) -> float:
        """Since when a ready kernel's head cell has waited for GPUs (not for its kernel's previous cell)."""
        return self._ready[kernel_id]

    def head(self, kernel_id: str) -> QueuedCell:
        """The oldest queued cell of a kernel."""
        return self._cells[kernel_id][0]

    def pop_head(self, kernel_id: str) -> QueuedCell:
        """Remove a ready kernel's head cell (it starts now); the kernel is busy until it finishes."""
        cells = self._cells[kernel_id]
        cell = cells.popleft()
        self._count -= 1
        if not cells:
            del self._cells[kernel_id]
        self._ready.pop(kernel_id, None)
        return cell

    def kernel_idle(self, kernel_id: str, now: float) -> None:
        """The kernel's running cell ended at ``now``: its next cell (if any) joins the back of the fair order."""
        if kernel_id in self._cells:
            self._ready[kernel_id] = now

    def remove(self, kernel_id: str, cell_id: str) -> QueuedCell | None:
        """Take one cell out (interrupted while queued); None if it is not queued."""
        cells = self._cells.get(kernel_id)
        if not cells:
            return None
        for cell in cells:
            if cell.cell_id == cell_id:
                cells.remove(cell)
                self._count -= 1
                if not cells:
                    del self._cells[kernel_id]
                    self._ready.pop(kernel_id, None)
                return cell
        return None

    def drop_kernel(self, kernel_id: str) -> list[QueuedCell]:
        """Take out every cell of a kernel (it stopped)."""
        cells = self._cells.pop(kernel_id, deque())
        self._ready.pop(kernel_id, None)
        self._count -= len(cells)
        return list(cells)

    def cells(self, ready_order: list[str] | None = None) -> list[QueuedCell]:
        """Every queued cell: ready kernels' cells in fair order (or ``ready_order``), then busy kernels' cells."""
        out: list[QueuedCell] = []
        for kernel_id in self._ready if ready_order is None else ready_order:
            out.extend(self._cells[kernel_id])
        for kernel_id, cells in self._cells.items():
            if kernel_id not in self._ready:
                out.extend(cells)
        return out

    def gpus_waiting(self, exclude: Collection[str] = ()) -> int:
        """GPUs asked for by queued cells (each kernel's head counts: a kernel runs one cell at a time), but
        not those of the kernels in ``exclude``."""
        return sum(cells[0].gpus for kernel_id, cells in self._cells.items() if kernel_id not in exclude)

    def heads(self) -> list[QueuedCell]:
        """The oldest queued cell of every kernel with queued cells."""
        return [cells[0] for cells in self._cells.values()]
