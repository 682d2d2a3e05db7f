"""The coordination layer: NotebookOS's only door to etcd.

- :class:`Coordinator` (``client``): kv, prefix reads, transactions, leases, resumable watches,
  with per-call deadlines and one mapping of etcd failures onto :mod:`errors`.
- :class:`KeyLayout` (``keys``): the key layout of the whole project, documented in one place.
- ``election``: executor terms and their fencing tokens (the router and the replica's log writer share it).

Nothing else in the project imports the etcd client library.
"""

from jupyter_notebookos.coordination.client import DEFAULT_TIMEOUT, Coordinator
from jupyter_notebookos.coordination.errors import (
    CoordinationError,
    EtcdUnavailable,
    LeaseLost,
    QuorumLost,
    TransactionConflict,
    WatchCompacted,
)
from jupyter_notebookos.coordination.keys import DEFAULT_KEYS, DEFAULT_PREFIX, KeyLayout
from jupyter_notebookos.coordination.kv import EventType, KeyValue, RangeResult, WatchEvent
from jupyter_notebookos.coordination.lease import Lease
from jupyter_notebookos.coordination.txn import Compare, Op, OpResult, TxnResult
from jupyter_notebookos.coordination.watch import Watch

__all__ = [
    "DEFAULT_KEYS",
    "DEFAULT_PREFIX",
    "DEFAULT_TIMEOUT",
    "Compare",
    "CoordinationError",
    "Coordinator",
    "EtcdUnavailable",
    "EventType",
    "KeyLayout",
    "KeyValue",
    "Lease",
    "LeaseLost",
    "Op",
    "OpResult",
    "QuorumLost",
    "RangeResult",
    "TransactionConflict",
    "TxnResult",
    "Watch",
    "WatchCompacted",
    "WatchEvent",
]
