"""Fixtures shared by the whole suite (helpers live in support.py, importable from every test directory)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from support import Platform, etcd_running, kernel_of, platform_running

from jupyter_notebookos.client import GatewayClient
from jupyter_notebookos.coordination import Coordinator
from jupyter_notebookos.embedded import ports
from jupyter_notebookos.embedded.etcd import EtcdCluster


def _own_port_range() -> None:
    """Give this pytest-xdist worker a share of the ports platforms are started on, so that a port one worker
    picked and has not bound yet is never picked by the other (the platforms it starts inherit the range)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2 or ports.ENV_RANGE in os.environ:
        return
    low, high = ports.pick_range()
    share = (high - low + 1) // count
    first = low + int(worker[2:]) * share
    os.environ[ports.ENV_RANGE] = f"{first}-{first + share - 1}"


_own_port_range()

#: How much of a platform's gateway log a failed test reports (CI keeps no files of a run).
LOG_TAIL_LINES = 60
#: ... and of each of its replicas' logs (those of kernels still running when the test failed).
REPLICA_LOG_TAIL_LINES = 15


def _tail(path: Path, lines: int) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A test that failed with a platform in use (a fixture that is one, or holds one as ``.platform``) reports the
    end of that platform's gateway log and of its replicas' logs."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for name, value in getattr(item, "funcargs", {}).items():
        platform = value if isinstance(value, Platform) else getattr(value, "platform", None)
        if not isinstance(platform, Platform):
            continue
        log = platform.state_dir / "gateway.log"
        if log.exists():
            report.sections.append((f"end of the gateway log of fixture {name!r}", _tail(log, LOG_TAIL_LINES)))
        for replica_log in sorted((platform.state_dir / "replicas").glob("*/*.log")):
            report.sections.append(
                (
                    f"end of replica log {replica_log.parent.name[:8]}/{replica_log.name} of fixture {name!r}",
                    _tail(replica_log, REPLICA_LOG_TAIL_LINES),
                )
            )


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Platform]:
    """A fresh embedded platform (4 hosts x 2 simulated GPUs, 1 etcd member)."""
    with platform_running(tmp_path / "state", "--hosts", "4", "--gpus-per-host", "2") as platform:
        yield platform


@pytest.fixture(scope="session")
def shared_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """One platform for the tests that only read or use their own kernels."""
    state_dir = tmp_path_factory.mktemp("shared") / "state"
    with platform_running(state_dir, "--hosts", "4", "--gpus-per-host", "2") as platform:
        yield platform


@pytest.fixture(scope="module")
def platform(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """A platform of the test module's own (its tests may kill replicas): ``notebookos up`` with the module's
    ``PLATFORM_ARGS`` (default: 4 hosts x 2 simulated GPUs). A module may define its own ``platform`` instead."""
    args = getattr(request.module, "PLATFORM_ARGS", ("--hosts", "4", "--gpus-per-host", "2"))
    name = request.module.__name__.rpartition(".")[2]
    with platform_running(tmp_path_factory.mktemp(name) / "state", *args) as started:
        yield started


@pytest.fixture
def kernel(platform: Platform) -> Iterator[tuple[GatewayClient, str]]:
    """A NotebookOS kernel on the module's platform, shut down after the test."""
    with kernel_of(platform.client, "python3-notebookos") as started:
        yield started


# -- etcd alone: real clusters (1 and 3 members) and coordinators connected to them ----------------------------
# ``shared_etcd`` is one cluster per module and member count, for tests that leave it intact; each test gets its own
# key prefix through ``coordinator``. ``fresh_etcd`` is a new cluster per test, for tests that kill members. Both
# are parametrized over 1 and 3 members.

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
