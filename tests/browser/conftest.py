"""Fixtures: our gateway (with etcd), JupyterLab from .venv-lab pointed at it, headless Chromium.

Every process starts on a free 127.0.0.1 port with its state in a temporary directory and in its own
process group; teardown kills the groups, so nothing outlives the tests.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab_stack import Browser, Service, missing_browser_tools, start_browser, start_gateway, start_lab
from support import etcd_running

from jupyter_notebookos.embedded.etcd import EtcdCluster


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A temporary directory for one module's processes, logs and state."""
    return tmp_path_factory.mktemp("lab-stack")


@pytest.fixture(scope="module")
def etcd(workdir: Path) -> Iterator[EtcdCluster]:
    """A one-member etcd cluster for our gateway app."""
    with etcd_running(workdir / "etcd") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def notebookos_gateway(workdir: Path, etcd: EtcdCluster) -> Iterator[Service]:
    """Our gateway app (NotebookOSGatewayApp), as `notebookos up` runs it."""
    env = {
        "NOTEBOOKOS_ETCD_ENDPOINTS": ",".join(etcd.endpoints),
        "NOTEBOOKOS_STATE_DIR": str(workdir / "state"),
        # etcd auth on, as everywhere: the gateway turns it on with this root password.
        "NOTEBOOKOS_ETCD_PASSWORD": secrets.token_urlsafe(24),
    }
    gateway = start_gateway(workdir, "notebookos", extra_env=env)
    try:
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture(scope="module")
def handler_gateway(workdir: Path) -> Iterator[Service]:
    """Enterprise Gateway with only our kernel channels handler installed (starts fast, needs no etcd)."""
    gateway = start_gateway(workdir, "handler")
    try:
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture(scope="module")
def lab(workdir: Path, notebookos_gateway: Service) -> Iterator[Service]:
    """JupyterLab from .venv-lab with --gateway-url on our gateway."""
    reason = missing_browser_tools()
    if reason:
        pytest.skip(reason)
    server = start_lab(workdir, notebookos_gateway)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    """A fresh headless Chromium (new profile) for one test."""
    reason = missing_browser_tools()
    if reason:
        pytest.skip(reason)
    chromium = start_browser(tmp_path)
    try:
        yield chromium
    finally:
        chromium.quit()
