"""Nothing is lost silently: a cell whose changes could not be shared is closed at once and the next cell says so."""

from __future__ import annotations

import os
import signal
import time

from support import Platform, wait_for

from jupyter_notebookos.client import GatewayClient, KernelConnection

KERNEL = "python3-notebookos"

# The module's own platform and kernel fixtures (tests/conftest.py): 4 hosts x 2 GPUs, the default.


def ready(client: GatewayClient, kernel_id: str) -> list[dict]:
    return [r for r in client.notebookos_kernel(kernel_id)["replicas"] if r["state"] == "ready"]


def run_on(conn: KernelConnection, replica_id: str, code: str) -> tuple[dict, str]:
    """Run ``code`` on one replica; its reply and its stream output (read until the replica is idle again)."""
    msg_id = conn.send("shell", "execute_request", {"code": code}, metadata={"notebookos": {"replica": replica_id}})
    result = conn.collect(msg_id)
    return result.reply, "".join(o["content"]["text"] for o in result.outputs if o["msg_type"] == "stream")


def test_executor_death_between_reply_and_publication_is_told_with_the_next_cell(
    kernel: tuple[GatewayClient, str],
) -> None:
    client, kernel_id = kernel
    with client.connect(kernel_id) as conn:
        assert conn.execute("x = 1").status == "ok"
        # 320 MB to upload after the reply: the executor is killed before its record can be published.
        changed = conn.execute("import numpy as np\nbig = np.ones(40_000_000)\nx = 2")
        assert changed.status == "ok"
        victim = next(
            r
            for r in client.notebookos_kernel(kernel_id)["replicas"]
            if r["replica_id"] == changed.notebookos["replica"]
        )
        os.kill(victim["pid"], signal.SIGKILL)

        began = time.monotonic()
        after = conn.execute("x", timeout=60)
        assert after.status == "ok" and after.result_text() == "1"
        assert time.monotonic() - began < 20
        assert "were lost" in after.stderr and "big" in after.stderr, after.stderr
        assert "x = 1" in after.stderr and "big is not defined" in after.stderr
        # Told once, not again.
        assert "were lost" not in conn.execute("x").stderr


def test_an_upload_the_object_store_refuses_closes_the_record_at_once(
    platform: Platform, kernel: tuple[GatewayClient, str]
) -> None:
    client, kernel_id = kernel
    store = platform.state_dir / "objects" / "kernels" / kernel_id
    with client.connect(kernel_id) as conn:
        assert conn.execute("import numpy as np\nx = 1\nsmall = np.ones(300_000)").status == "ok"
        wait_for(
            lambda: all(r["applied_seq"] >= 1 for r in client.notebookos_kernel(kernel_id)["replicas"]),
            30,
            "the first cell's record to be published and applied",
        )
        buffers = store / "buffers"
        saved = store / "buffers.saved"
        buffers.rename(saved)
        buffers.write_text("not a directory: every upload fails, even as root")
        try:
            refused = conn.execute("import numpy as np\ny = np.full(300_000, 7.0)\nx = 2")
            assert refused.status == "ok", refused.reply["content"]
            executor = refused.notebookos["replica"]
            began = time.monotonic()
            after, notice = run_on(conn, executor, "_out = x")
            assert time.monotonic() - began < 10, "the next cell must not wait for the refused record"
            assert after["content"]["status"] == "ok"
            assert "could not be shared" in notice and "object store" in notice, notice
            assert "x = 2" in notice and "not replicated" in notice
            # Elsewhere the names are marked, never silently old.
            other = next(r["replica_id"] for r in ready(client, kernel_id) if r["replica_id"] != executor)
            marked, printed = run_on(conn, other, "print(repr(x)[:20], repr(y)[:20])")
            assert marked["content"]["status"] == "ok"
            assert "<not replicated: 'x'" in printed and "<not replicated: 'y'" in printed, printed
        finally:
            buffers.unlink()
            saved.rename(buffers)
        # The store is back: publication resumes, and another replica has the new value.
        wrote = conn.execute("import numpy as np\nz = np.arange(300_000)\nint(z.sum())")
        assert wrote.status == "ok"
        other = next(
            r["replica_id"] for r in ready(client, kernel_id) if r["replica_id"] != wrote.notebookos["replica"]
        )
        reply, _ = run_on(conn, other, "assert int(z.sum()) == 44999850000")
        assert reply["content"]["status"] == "ok", reply["content"]
