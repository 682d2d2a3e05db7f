"""The cluster's recent events: migrations, scaling rounds and hosts joining or leaving, for the timeline.

Gauges say how the cluster is now; operators also ask what happened: which replica moved where and why, when
the autoscaler added or drained hosts. The platform keeps the last events in memory (a bounded ring, numbered
in order) and serves them at ``GET /api/notebookos/events?since=N``; the dashboard polls for the new ones.
Counters of the same events are in :mod:`jupyter_notebookos.gateway.control.platformmetrics` (they survive the ring).
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from typing import Any

#: How many events the gateway keeps (older ones are dropped; Prometheus keeps the counts).
DEFAULT_CAPACITY = 500


class EventLog:
    """A bounded, numbered log of cluster events. Each event is a JSON-ready dict:

    ``seq`` (1, 2, ...), ``at`` (Unix time), ``kind`` (``migration``, ``scaling``, ``host``), ``action``
    (e.g. ``started``, ``ok``, ``failed``, ``out``, ``in``, ``added``, ``removed``), ``summary`` (one readable
    line), ``kernel_id`` (or None) and the kind's own details.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY, clock: Callable[[], float] = time.time) -> None:
        self._events: deque[dict[str, Any]] = deque(maxlen=capacity)
        self._numbers = itertools.count(1)
        self._clock = clock

    def record(self, kind: str, action: str, summary: str, *, kernel_id: str | None = None, **details: Any) -> None:
        """Add one event."""
        self._events.append(
            {
                "seq": next(self._numbers),
                "at": round(self._clock(), 3),
                "kind": kind,
                "action": action,
                "summary": summary,
                "kernel_id": kernel_id,
                **details,
            }
        )

    @property
    def last(self) -> int:
        """The number of the newest event (0: none yet)."""
        return int(self._events[-1]["seq"]) if self._events else 0

    def since(self, seq: int) -> list[dict[str, Any]]:
        """The events numbered above ``seq``, oldest first."""
        return [dict(e) for e in self._events if e["seq"] > seq]


__all__ = ["DEFAULT_CAPACITY", "EventLog"]
