"""Sticky GPUs (`NotebookOSGatewayApp.gpu_sticky`): a replica's GPU state stays on the device between cells, and is
moved off only when the scheduler gives that GPU to another replica, before that replica's cell starts."""

from __future__ import annotations

import contextlib

import requests
from support import Platform, gpus_held_on

from jupyter_notebookos.client import GatewayClient, GatewayError

KERNEL = "python3-notebookos"


# The module platform of tests/conftest.py, with sticky GPUs on.
PLATFORM_ARGS = ("--hosts", "3", "--gpus-per-host", "1", "--gateway-option", "NotebookOSGatewayApp.gpu_sticky=True")


def resident(client: GatewayClient, kernel_id: str) -> dict[str, list[int]]:
    """Replica id -> the devices its GPU state stays on, as the gateway's API says."""
    return {r["replica_id"]: r["gpus_resident"] for r in client.notebookos_kernel(kernel_id)["replicas"]}


def evictions(platform: Platform) -> float:
    text = requests.get(
        f"{platform.url}/metrics", headers={"Authorization": f"token {platform.token}"}, timeout=30
    ).text
    wanted = 'notebookos_gpu_evictions_total{outcome="ok"} '
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(wanted))


def test_gpu_state_stays_between_cells_and_moves_off_when_another_kernel_gets_the_gpu(platform: Platform) -> None:
    client = platform.client
    owner = client.start_kernel(KERNEL)
    try:
        with client.connect(owner) as conn:
            first = conn.execute("x = 1")
            assert first.status == "ok", first.reply["content"]
            replica, host = first.notebookos["replica"], first.notebookos["host"]
            assert first.notebookos["resident"] == first.notebookos["gpus"] == [0]
            assert resident(client, owner)[replica] == [0]
            before = evictions(platform)
            # Its own next cell finds the state where it left it: nothing is moved.
            again = conn.execute("x += 1\nx")
            assert again.result_text() == "2" and again.notebookos["resident"] == [0]
            assert evictions(platform) == before

            # Another kernel's cell gets that very GPU (the other hosts' GPUs are busy): the owner's state moves
            # off first, as part of that cell's wait.
            others = {h["name"] for h in client.request("GET", "/api/notebookos/cluster")["hosts"]} - {host}
            with gpus_held_on(client, others, KERNEL, 60):
                newcomer = client.start_kernel(KERNEL)
                try:
                    with client.connect(newcomer) as other:
                        ran = other.execute("y = 2", timeout=120)
                        assert ran.status == "ok", ran.reply["content"]
                        assert ran.notebookos["host"] == host and ran.notebookos["gpus"] == [0]
                        assert ran.notebookos["resident"] == [0]
                finally:
                    with contextlib.suppress(GatewayError):
                        client.shutdown_kernel(newcomer)
            assert evictions(platform) >= before + 1
            assert resident(client, owner)[replica] == [], "the owner's state was moved off the GPU"
            # And the owner goes on: its state came back to a device with its next cell.
            back = conn.execute("x += 1\nx", timeout=120)
            assert back.status == "ok" and back.result_text() == "3"
    finally:
        with contextlib.suppress(GatewayError):
            client.shutdown_kernel(owner)
