"""Fixtures for the router's parts: a real etcd (one member, shared by a module), a coordinator with a key prefix of
each test's own, and a replica registered in it the way a replica registers (its key bound to its lease)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from support import etcd_running

from jupyter_notebookos.coordination import Coordinator
from jupyter_notebookos.embedded.etcd import EtcdCluster
from jupyter_notebookos.replication.protocol import ReplicaRegistration

KERNEL = "k1"


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """One etcd member for the tests of a module."""
    with etcd_running(tmp_path_factory.mktemp("etcd")) as cluster:
        yield cluster


@pytest_asyncio.fixture
async def coordinator(etcd: EtcdCluster) -> AsyncIterator[Coordinator]:
    """A coordinator whose keys no other test sees."""
    coordinator = await Coordinator.connect(etcd.endpoints, timeout=3.0, prefix=f"/test-{uuid.uuid4().hex[:8]}")
    yield coordinator
    await coordinator.close()


async def register(coordinator: Coordinator, replica_id: str, host: str = "host-0") -> ReplicaRegistration:
    """Register replica ``replica_id`` of kernel :data:`KERNEL` in etcd as a replica does: its registration at its
    key, bound to a lease of its own."""
    lease = await coordinator.grant_lease(60, keepalive=False)  # (outlives any test here)
    registration = ReplicaRegistration(
        KERNEL, replica_id, host, "127.0.0.1", 1, 2, 3, 4, 5, pid=100 + int(replica_id), lease=lease.id, applied_seq=0
    )
    await coordinator.put(coordinator.keys.replica(KERNEL, replica_id), registration.to_json(), lease=lease.id)
    return registration
