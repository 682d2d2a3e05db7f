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
from jupyter_notebookos.coordination.keys import KeyLayout

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
            # The watch still works: the router notices a replica's death and the kernel heals. A follower: killed
            # right after the reply, the executor may not have published that cell's record yet (it goes out just
            # after the reply), and the next cell would rightly say that x's change was lost.
            executor = client.notebookos_kernel(kernel_id)["executor"]
            victim = next(r for r in ready(client, kernel_id) if r["replica_id"] != executor)
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


def test_a_malformed_log_record_is_stepped_over_by_a_new_replica_which_says_so(platform: Platform) -> None:
    client = platform.client
    kernel_id = client.start_kernel(KERNEL)
    try:
        with client.connect(kernel_id) as conn:
            assert conn.execute("a = 1").status == "ok"
            second = conn.execute("b = 2")
            executor, seq = second.notebookos["replica"], int(second.notebookos["seq"])
            # The kernel's own code may write anything to its own log (its etcd role allows it): here, garbage
            # over the record of `b = 2`, which every replica has applied already.
            record_key = KeyLayout("").log_record(kernel_id, seq)
            etcd_admin(platform, (record_key, "{not a record"))
            victim = next(r for r in ready(client, kernel_id) if r["replica_id"] != executor)
            os.kill(victim["pid"], signal.SIGKILL)

            before = {r["replica_id"] for r in ready(client, kernel_id)}

            def replacement() -> str | None:
                now = {r["replica_id"] for r in ready(client, kernel_id)}
                return next(iter(now - before), None) if len(now) == 3 else None

            new_replica = wait_for(replacement, 60, "a replacement that restored past the malformed record")
            # On the new replica `b` is missing (its record was unreadable), and its first cell says so.
            msg_id = conn.send(
                "shell",
                "execute_request",
                {"code": "print(a, 'b' in dir())", "silent": False},
                metadata={"notebookos": {"replica": new_replica}},
            )
            reply = conn.reply(msg_id, timeout=60)
            assert reply["content"]["status"] == "ok", reply["content"]

            def idle(m: dict) -> bool:
                ours = m.get("parent_header", {}).get("msg_id") == msg_id and m["msg_type"] == "status"
                return ours and m["content"]["execution_state"] == "idle"

            while not any(idle(m) for m in conn.pending):  # its output comes before the kernel is idle again
                conn.pending.append(conn.receive(30))
            streams = [
                m["content"]["text"]
                for m in conn.pending
                if m.get("parent_header", {}).get("msg_id") == msg_id and m["msg_type"] == "stream"
            ]
            text = "".join(streams)
            assert "1 False" in text, text
            assert f"log record {seq}) could not be applied on this replica" in text, text
            assert "malformed" in text
    finally:
        with contextlib.suppress(GatewayError):
            client.shutdown_kernel(kernel_id)
