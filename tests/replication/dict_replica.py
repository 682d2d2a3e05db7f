"""A replica namespace in this process (a plain dict, no IPython), able to run cells and publish records."""

from __future__ import annotations

from typing import Any

from replication_harness import published

from jupyter_notebookos.kernel.statelog import StateLog
from jupyter_notebookos.replication.objectstore import ObjectStore
from jupyter_notebookos.replication.records import StateRecord
from jupyter_notebookos.replication.state import StateDelta, StateTracker

MIB = 1 << 20


class DictReplica:
    """Runs cells with ``exec`` under a state tracker (write tracking where the kernel offers it); records
    send buffers of 1 MiB or more out of band, as chunks of the lineages the other replicas hold."""

    def __init__(self, store: ObjectStore):
        self.ns: dict[str, Any] = {"__name__": "__main__"}
        self.store = store
        self.tracker = StateTracker(self.ns, transform=lambda code: code, defer_min_bytes=MIB)
        self.statelog = StateLog(store, "dict-replica", lineage=self.tracker.lineage)

    def step(self, code: str) -> tuple[StateDelta, StateRecord]:
        """Run ``code``; its delta and the record that publishes it."""
        self.tracker.before_cell(code)
        exec(code, self.ns)
        delta = self.tracker.after_cell()
        self.tracker.settle()
        return delta, published(self.statelog, delta, MIB)

    def run(self, code: str) -> StateRecord:
        """Run ``code``; the record that publishes it."""
        return self.step(code)[1]

    def apply(self, record: StateRecord) -> None:
        self.tracker.apply(record, self.store)
