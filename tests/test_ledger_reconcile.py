"""The gateway reconciles the GPU ledger in etcd with its routers: leftovers go within two rounds, cells in use stay."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import Platform, etcd_admin, start_platform, stop_platform, wait_for

KERNEL = "python3-notebookos"
ROUND_S = 1.0


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    started = start_platform(
        tmp_path / "state",
        "--hosts",
        "3",
        "--gpus-per-host",
        "1",
        "--gateway-option",
        f"NotebookOSGatewayApp.ledger_reconcile_interval={ROUND_S}",
    )
    try:
        yield started
    finally:
        stop_platform(started)


def test_leftover_entries_go_within_two_rounds_and_the_gpu_serves_again(platform: Platform) -> None:
    client = platform.client
    kernel_id = client.start_kernel(KERNEL)
    hosts = sorted(r["host"] for r in client.notebookos_kernel(kernel_id)["replicas"])
    with client.connect(kernel_id) as conn:
        # A cell that holds its GPU across several rounds: its entries must stay while it runs.
        running = conn.send("shell", "execute_request", {"code": "import time\ntime.sleep(4)", "silent": False})
        wait_for(
            lambda: any(json.loads(v)["msg_id"] == running for v in etcd_admin(platform, read="/gpus/").values()),
            20,
            "the running cell's GPU entry",
        )
        entries = etcd_admin(platform, read="/gpus/")
        busy_host = next(k.split("/")[-2] for k, v in entries.items() if json.loads(v)["msg_id"] == running)
        free = [h for h in hosts if h != busy_host]
        leftover = {"kernel_id": "a-kernel-long-gone", "replica_id": "0", "msg_id": "m-1"}
        etcd_admin(
            platform,
            (f"/gpus/{free[0]}/0", json.dumps(leftover)),  # a release lost with a dead gateway
            (f"/gpus/{free[1]}/0", "junk"),
            (f"/kernels/{kernel_id}/cells/finished-long-ago", json.dumps({"msg_id": "finished-long-ago"})),
        )
        began = time.monotonic()
        wait_for(
            lambda: set(etcd_admin(platform, read="/gpus/")) == {f"/notebookos/gpus/{busy_host}/0"},
            4 * ROUND_S + 5,
            "the leftover entries to go",
        )
        assert time.monotonic() - began < 4 * ROUND_S + 5
        cells = etcd_admin(platform, read=f"/kernels/{kernel_id}/cells/")
        assert f"/notebookos/kernels/{kernel_id}/cells/{running}" in cells, "a running cell's record stays"
        assert conn.reply(running, timeout=30)["content"]["status"] == "ok"
        quarantined = etcd_admin(platform, read="/quarantine/")
        assert json.loads(quarantined[f"/notebookos/quarantine/gpus/{free[1]}/0"])["value"] == "junk"
        wait_for(lambda: not etcd_admin(platform, read=f"/kernels/{kernel_id}/cells/"), 4 * ROUND_S + 5, "cell records")
        # Every host's GPU serves cells again (a leftover entry would refuse the decision for ever).
        replicas = {r["host"]: r["replica_id"] for r in client.notebookos_kernel(kernel_id)["replicas"]}
        for host, replica in replicas.items():
            msg_id = conn.send("shell", "execute_request", {"code": "1"}, metadata={"notebookos": {"replica": replica}})
            reply = conn.reply(msg_id, timeout=30)
            assert reply["content"]["status"] == "ok" and reply["metadata"]["notebookos"]["host"] == host
    client.shutdown_kernel(kernel_id)
