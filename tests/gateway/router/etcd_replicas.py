"""A kernel's replicas as they stand in a real etcd, for the tests of the router's parts (the ``coordinator`` fixture
of tests/conftest.py gives each test its own key prefix in a real cluster)."""

from __future__ import annotations

from jupyter_notebookos.coordination import Coordinator
from jupyter_notebookos.replication.protocol import ReplicaRegistration

KERNEL = "k1"


async def register(coordinator: Coordinator, replica_id: str, host: str = "host-0") -> ReplicaRegistration:
    """Register replica ``replica_id`` of kernel :data:`KERNEL` in etcd as a replica does: its registration at its
    key, bound to a lease of its own."""
    lease = await coordinator.grant_lease(60, keepalive=False)  # (outlives any test here)
    registration = ReplicaRegistration(
        KERNEL, replica_id, host, "127.0.0.1", 1, 2, 3, 4, 5, pid=100 + int(replica_id), lease=lease.id, applied_seq=0
    )
    await coordinator.put(coordinator.keys.replica(KERNEL, replica_id), registration.to_json(), lease=lease.id)
    return registration
