"""Malformed values in etcd are logged and skipped or quarantined; they never stop the gateway or a router."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import Platform, etcd_admin, start_platform, stop_platform, wait_for

from jupyter_notebookos.client import GatewayClient, GatewayError

KERNEL = "python3-notebookos"


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    started = start_platform(tmp_path / "state", "--hosts", "3", "--gpus-per-host", "1")
    try:
        yield started
    finally:
        stop_platform(started)


def ready(client: GatewayClient, kernel_id: str) -> list[dict]:
    return [r for r in client.notebookos_kernel(kernel_id)["replicas"] if r["state"] == "ready"]


def test_malformed_registrations_leave_the_routers_watch_running(platform: Platform) -> None:
    client = platform.client
    kernel_id = client.start_kernel(KERNEL)
    try:
        with client.connect(kernel_id) as conn:
            assert conn.execute("x = 1").status == "ok"
            key = f"/kernels/{kernel_id}/replicas/0"
            good = json.loads(etcd_admin(platform, read=key)[f"/notebookos{key}"])
            etcd_admin(
                platform,
                (f"/kernels/{kernel_id}/replicas/garbage", "{not json"),
                (
                    f"/kernels/{kernel_id}/replicas/typed",
                    json.dumps({**good, "replica_id": "typed", "shell_port": "x"}),
                ),
                (f"/kernels/{kernel_id}/replicas/listy", "[1, 2]"),
                (f"/kernels/{kernel_id}/applied/garbage", "many"),
            )
            assert conn.execute("x += 1\nx").result_text() == "2"
            # The watch still works: the router notices a replica's death and the kernel heals.
            victim = ready(client, kernel_id)[0]
            os.kill(victim["pid"], signal.SIGKILL)
            wait_for(
                lambda: (
                    len(ready(client, kernel_id)) == 3
                    and victim["replica_id"] not in {r["replica_id"] for r in ready(client, kernel_id)}
                ),
                60,
                "the replacement of the killed replica",
            )
            assert conn.execute("x", timeout=60).result_text() == "2"
    finally:
        with contextlib.suppress(GatewayError):
            client.shutdown_kernel(kernel_id)


def test_a_restarted_gateway_quarantines_malformed_kernel_records_and_reattaches_the_rest(platform: Platform) -> None:
    client = platform.client
    kernel_id = client.start_kernel(KERNEL)
    with client.connect(kernel_id) as conn:
        assert conn.execute("kept = 'yes'").status == "ok"
    session = json.loads(etcd_admin(platform, read=f"/kernels/{kernel_id}")[f"/notebookos/kernels/{kernel_id}"])
    etcd_admin(
        platform,
        ("/kernels/garbage", "{oops"),
        ("/kernels/listy", "[1, 2]"),
        ("/kernels/wrong", json.dumps({**session, "kernel_id": "someone-else"})),  # a copy under another key
        (f"/kernels/{kernel_id}/cells/bad", "not a cell"),
        (f"/kernels/{kernel_id}/replicas/bad", "{}"),
    )
    gateway = next(p for p in platform.descendants() if "jupyter_notebookos.gateway" in " ".join(p.cmdline()))
    gateway.kill()
    gateway.wait(10)

    def lists_kernel() -> bool:
        with contextlib.suppress(Exception):
            return any(k["id"] == kernel_id for k in client.request("GET", "/api/kernels", timeout=2))
        return False

    wait_for(lists_kernel, 60, "the restarted gateway to re-attach the kernel")
    with client.connect(kernel_id) as conn:
        assert conn.execute("kept", timeout=60).result_text() == "'yes'"
    quarantined = etcd_admin(platform, read="/quarantine/")
    assert set(quarantined) == {f"/notebookos/quarantine/kernels/{k}" for k in ("garbage", "listy", "wrong")}
    why = {k.rsplit("/", 1)[-1]: json.loads(v) for k, v in quarantined.items()}
    assert why["garbage"]["value"] == "{oops" and "not JSON" in why["garbage"]["why"]
    assert "someone-else" in why["wrong"]["why"]
    assert not set(etcd_admin(platform, read="/kernels/")) & {f"/notebookos/kernels/{k}" for k in ("garbage", "listy")}
    client.shutdown_kernel(kernel_id)
