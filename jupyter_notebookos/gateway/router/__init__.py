"""The replica router of a NotebookOS kernel and its parts (see :mod:`.kernelrouter`).

- :mod:`.kernelrouter`: :class:`ReplicaRouter`, the facade EG and the platform talk to;
- :mod:`.relay` and :mod:`.sockets`: the ZMQ relay between the kernel's clients and its replicas;
- :mod:`.cellqueue`: the kernel's cells, from arrival to reply; :mod:`.cells`: what a cell is, what the router asks
  the planner; :mod:`.waitnotice`: what a client sees while its cell waits;
- :mod:`.commitlog`: the log head and executor term in etcd; :mod:`.ledger`: the GPU ledger's deferred releases;
- :mod:`.replicaset`: the replicas as etcd has them, recorded in :mod:`.replicas`;
- :mod:`.wire`: Jupyter messages as frames, signed; :mod:`.tasks`: the router's background tasks.
"""

from jupyter_notebookos.gateway.router.cells import (
    CellGrant,
    CellPlanner,
    CellRejected,
    CellRequest,
    RouterSettings,
)
from jupyter_notebookos.gateway.router.kernelrouter import ReplicaRouter

__all__ = ["CellGrant", "CellPlanner", "CellRejected", "CellRequest", "ReplicaRouter", "RouterSettings"]
