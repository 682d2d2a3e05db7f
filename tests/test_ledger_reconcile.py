"""The gateway reconciles the GPU ledger in etcd with its routers: leftovers go within two rounds, cells in use stay."""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import Platform, etcd_admin, hold_uploads_until, run_on_replica, start_platform, stop_platform, wait_for

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


def test_a_cell_record_stays_until_the_cells_state_is_stored_and_its_gpu_is_free_at_the_reply(
    platform: Platform,
) -> None:
    """A cell's record carries its seq, which a gateway that re-attaches after a crash must find: it stays in etcd
    until the executor has stored the cell's state, across reconcile rounds, although the cell replied and its
    GPU entry went at once."""
    client = platform.client
    kernel_id = client.start_kernel(KERNEL)
    go = Path(tempfile.gettempdir()) / f"notebookos-upload-{uuid.uuid4().hex}"
    cells = f"/kernels/{kernel_id}/cells/"
    try:
        with client.connect(kernel_id) as conn:
            assert conn.execute("import numpy as np").status == "ok"
            replica = client.notebookos_kernel(kernel_id)["executor"]
            run_on_replica(conn, replica, hold_uploads_until(go))
            wait_for(lambda: not etcd_admin(platform, read=cells), 10, "the earlier cells' records to go")
            msg_id = run_on_replica(conn, replica, "big = np.ones(1 << 18)")["parent_header"]["msg_id"]
            wait_for(lambda: not etcd_admin(platform, read="/gpus/"), 10, "the cell's GPU entry to go at its reply")
            time.sleep(3 * ROUND_S + 0.5)  # the reconciler deletes the record of a finished cell within two rounds
            assert list(etcd_admin(platform, read=cells)) == [f"/notebookos{cells}{msg_id}"]
            go.touch()
            wait_for(lambda: not etcd_admin(platform, read=cells), 10, "the record to go once the state is stored")
            assert conn.execute("int(big.sum())").result_text() == str(1 << 18)
    finally:
        go.unlink(missing_ok=True)
        client.shutdown_kernel(kernel_id)
