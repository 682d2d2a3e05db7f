"""Fixtures of the Kubernetes tests: a fake cluster at the kubernetes-client boundary, offline validation."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio
from fakekube import IMAGE, NAMESPACE, FakeCluster
from support import etcd_running

from jupyter_notebookos.embedded.etcd import EtcdCluster
from jupyter_notebookos.launchers.kubernetes.launcher import KubernetesLauncher


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    fake = FakeCluster()
    yield fake
    fake.close_streams()


@pytest_asyncio.fixture
async def make_launcher(cluster: FakeCluster) -> AsyncIterator[Callable[..., KubernetesLauncher]]:
    made: list[KubernetesLauncher] = []

    def make(**kwargs: Any) -> KubernetesLauncher:
        settings: dict[str, Any] = {
            "namespace": NAMESPACE,
            "image": IMAGE,
            "etcd_endpoints": "etcd-0.etcd:2379,etcd-1.etcd:2379,etcd-2.etcd:2379",
            "object_store_url": "file:///mnt/notebookos-store",
            "object_store_claim": "notebookos-object-store",
            "core_api": cluster.core,
            "watch_factory": cluster.watch,
            "cache_sync_timeout": 5.0,
            **kwargs,
        }
        launcher = KubernetesLauncher(**settings)
        made.append(launcher)
        return launcher

    yield make
    for launcher in made:
        await launcher.stop()


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """A real one-member etcd per test module (the gateway tests' coordination)."""
    with etcd_running(tmp_path_factory.mktemp("etcd")) as cluster:
        yield cluster
