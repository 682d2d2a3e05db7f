"""Enterprise Gateway's idle-kernel culler on NotebookOS kernels: a culled kernel leaves nothing behind.

Real etcd, real gateway, real replicas; the culler is EG's own (``MappingKernelManager.cull_idle_timeout``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator

import psutil
import pytest
from support import Platform, start_platform, stop_platform, wait_for

from jupyter_notebookos.client import GatewayError
from jupyter_notebookos.coordination.client import Coordinator

CULL_AFTER_S = 8


def etcd_keys(platform: Platform, prefix: str) -> list[str]:
    """Every key under ``prefix`` (relative to the platform's key prefix) in the platform's etcd."""
    endpoints = json.loads((platform.state_dir / "runtime.json").read_text())["etcd_endpoints"]

    async def read() -> list[str]:
        coordinator = await Coordinator.connect(endpoints, timeout=10, credentials=platform.etcd_root())
        try:
            return [kv.key for kv in await coordinator.get_prefix(f"{coordinator.keys.prefix}/{prefix}")]
        finally:
            await coordinator.close()

    return asyncio.run(read())


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    started = start_platform(
        tmp_path_factory.mktemp("culling") / "state",
        "--hosts", "3", "--gpus-per-host", "1",
        "--gateway-option", f"MappingKernelManager.cull_idle_timeout={CULL_AFTER_S}",
        "--gateway-option", "MappingKernelManager.cull_interval=2",
    )  # fmt: skip
    try:
        yield started
    finally:
        stop_platform(started)


def test_an_idle_notebookos_kernel_is_culled_with_its_replicas_ledger_entries_and_objects(
    platform: Platform,
) -> None:
    client = platform.client
    kernel_id = client.start_kernel("python3-notebookos")
    try:
        with client.connect(kernel_id) as conn:
            # A cell on a GPU (a ledger entry while it runs) that leaves a large buffer in the object store.
            assert conn.execute("import numpy as np\nbig = np.ones(1 << 19)\nint(big.sum())").result_text() == "524288"
        info = client.notebookos_kernel(kernel_id)
        pids = [r["pid"] for r in info["replicas"]]
        assert len(pids) == 3 and all(pids)
        # What an idle kernel costs: its replicas' memory, not GPUs.
        assert info["state"] == "idle" and info["memory_bytes"] > 0
        assert all(r["memory_bytes"] > 10_000_000 for r in info["replicas"])  # a Python process each
        objects = platform.state_dir / "objects" / "kernels" / kernel_id
        wait_for(lambda: objects.exists() and any(p.is_file() for p in objects.rglob("*")), 30, "the kernel's objects")
        assert etcd_keys(platform, f"kernels/{kernel_id}")

        # Nobody connected, nothing running: EG's culler shuts it down as it would a plain kernel.
        wait_for(
            lambda: kernel_id not in [k["id"] for k in client.request("GET", "/api/kernels")],
            CULL_AFTER_S + 60,
            "the culler to shut the idle kernel down",
            interval=0.5,
        )
        with pytest.raises(GatewayError, match="HTTP 404"):
            client.notebookos_kernel(kernel_id)
        _, alive = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], timeout=30)
        assert alive == [], f"replicas left running: {alive}"
        wait_for(lambda: not etcd_keys(platform, f"kernels/{kernel_id}"), 30, "the kernel's etcd keys to go")
        assert etcd_keys(platform, "gpus/") == []
        wait_for(lambda: not objects.exists(), 30, "the kernel's objects to go")
        cluster = client.request("GET", "/api/notebookos/cluster")
        assert cluster["kernels"] == [] and all(h["replicas"] == 0 for h in cluster["hosts"])
        assert "Culling '" in (platform.state_dir / "gateway.log").read_text()
    finally:
        with contextlib.suppress(GatewayError):  # culled, as expected
            client.shutdown_kernel(kernel_id)


def test_a_kernel_with_a_client_connected_is_not_culled(platform: Platform) -> None:
    """EG's default (``cull_connected`` False): a kernel someone has open stays, however idle."""
    client = platform.client
    kernel_id = client.start_kernel("python3-notebookos")
    try:
        with client.connect(kernel_id) as conn:
            assert conn.execute("1 + 1").result_text() == "2"
            pids = [r["pid"] for r in client.notebookos_kernel(kernel_id)["replicas"]]
            # Twice the timeout and several culler rounds later it is still there, and still answers.
            time.sleep(2 * CULL_AFTER_S + 4)
            assert kernel_id in [k["id"] for k in client.request("GET", "/api/kernels")]
            assert [r["pid"] for r in client.notebookos_kernel(kernel_id)["replicas"]] == pids
            assert conn.execute("6 * 7").result_text() == "42"
    finally:
        client.shutdown_kernel(kernel_id)
