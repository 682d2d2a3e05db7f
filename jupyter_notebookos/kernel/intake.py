"""``CellIntake``: the directed cells a replica took, and those a re-attached gateway gave up."""

from __future__ import annotations

import threading
from collections import OrderedDict

#: Directed cells whose msg_id a replica remembers as taken, and as given up.
CELLS_REMEMBERED = 64


class CellIntake:
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
