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


def test_the_culler_ends_an_idle_kernel_with_all_it_held_and_spares_a_connected_one(platform: Platform) -> None:
    """EG's culler as for a plain kernel: an idle kernel nobody has open goes with its replicas, GPU-ledger entries,
    etcd keys and objects; one that a client has open stays however idle (EG's default, ``cull_connected`` False).
    Both side by side, as on a shared platform."""
    client = platform.client
    kept_id = client.start_kernel("python3-notebookos")
    kernel_id = client.start_kernel("python3-notebookos")
    try:
        with client.connect(kept_id) as kept:
            assert kept.execute("1 + 1").result_text() == "2"
            kept_since = time.monotonic()
            kept_pids = [r["pid"] for r in client.notebookos_kernel(kept_id)["replicas"]]
            with client.connect(kernel_id) as conn:
                # A cell on a GPU (a ledger entry while it runs) that leaves a large buffer in the object store.
                code = "import numpy as np\nbig = np.ones(1 << 19)\nint(big.sum())"
                assert conn.execute(code).result_text() == "524288"
            info = client.notebookos_kernel(kernel_id)
            pids = [r["pid"] for r in info["replicas"]]
            assert len(pids) == 3 and all(pids)
            # What an idle kernel costs: its replicas' memory, not GPUs.
            assert info["state"] == "idle" and info["memory_bytes"] > 0
            assert all(r["memory_bytes"] > 10_000_000 for r in info["replicas"])  # a Python process each
            objects = platform.state_dir / "objects" / "kernels" / kernel_id
            wait_for(
                lambda: objects.exists() and any(p.is_file() for p in objects.rglob("*")), 30, "the kernel's objects"
            )
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
            assert [k["kernel_id"] for k in cluster["kernels"]] == [kept_id]
            assert all(h["replicas"] == 1 for h in cluster["hosts"])
            assert "Culling '" in (platform.state_dir / "gateway.log").read_text()

            # The connected one: twice the timeout and several culler rounds later it is still there, and answers.
            time.sleep(max(0.0, 2 * CULL_AFTER_S + 4 - (time.monotonic() - kept_since)))
            assert kept_id in [k["id"] for k in client.request("GET", "/api/kernels")]
            assert [r["pid"] for r in client.notebookos_kernel(kept_id)["replicas"]] == kept_pids
            assert kept.execute("6 * 7").result_text() == "42"
    finally:
        for kid in (kernel_id, kept_id):
            with contextlib.suppress(GatewayError):  # the idle one was culled, as expected
                client.shutdown_kernel(kid)
