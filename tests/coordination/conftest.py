"""Fixtures: real etcd clusters (1 and 3 members) and coordinators connected to them.

``shared_etcd`` is one cluster per module and member count, for tests that leave it intact; each test
gets its own key prefix through ``coordinator``. ``fresh_etcd`` is a new cluster per test, for tests
that kill members. Both are parametrized over 1 and 3 members.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from support import etcd_running

from jupyter_notebookos.coordination import Coordinator
from jupyter_notebookos.embedded.etcd import EtcdCluster

MEMBER_COUNTS = [pytest.param(1, id="1-member"), pytest.param(3, id="3-members")]


@pytest.fixture(scope="module", params=MEMBER_COUNTS)
def shared_etcd(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """A cluster shared by the tests of one module (do not kill its members)."""
    with etcd_running(tmp_path_factory.mktemp("etcd"), request.param) as cluster:
        yield cluster


@pytest.fixture(params=MEMBER_COUNTS)
def fresh_etcd(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EtcdCluster]:
    """A new cluster for one test, which may kill and restart its members."""
    with etcd_running(tmp_path / "etcd", request.param) as cluster:
        yield cluster


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test's own, so tests sharing a cluster do not see each other."""
    return f"/test-{uuid.uuid4().hex[:8]}"


@pytest_asyncio.fixture
async def coordinator(shared_etcd: EtcdCluster, prefix: str) -> AsyncIterator[Coordinator]:
    coordinator = await Coordinator.connect(shared_etcd.endpoints, timeout=3.0, prefix=prefix)
    yield coordinator
    await coordinator.close()
