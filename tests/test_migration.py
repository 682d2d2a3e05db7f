"""Live migration of replicas (issue 5): on demand through REST, and when a cell's replica hosts are all busy."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest
from support import Platform, gpus_held_on, start_platform, stop_platform

from jupyter_notebookos.client import GatewayError

KERNEL = "python3-notebookos"


@pytest.fixture(scope="module")
def one_gpu_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """4 hosts with 1 simulated GPU each: three busy hosts are enough to force a migration."""
    platform = start_platform(tmp_path_factory.mktemp("migration") / "state", "--hosts", "4", "--gpus-per-host", "1")
    try:
        yield platform
    finally:
        stop_platform(platform)


def test_rest_migration_moves_a_replica_and_the_kernel_keeps_working(one_gpu_hosts: Platform) -> None:
    client = one_gpu_hosts.client
    kernel_id = client.start_kernel(KERNEL)
    try:
        with client.connect(kernel_id) as conn:
            conn.execute("import numpy as np\nweights = np.arange(200_000)\nnotes = ['a']")
            info = client.notebookos_kernel(kernel_id)
            hosts = {r["host"] for r in info["replicas"]}
            free = next(
                h["name"] for h in client.request("GET", "/api/notebookos/cluster")["hosts"] if h["name"] not in hosts
            )
            moving = next(r for r in info["replicas"] if r["replica_id"] == info["executor"])
            result = client.request(
                "POST",
                f"/api/notebookos/kernels/{kernel_id}/replicas/{moving['replica_id']}/migrate",
                json={"host": free},
            )
            assert result["from"] == moving["host"] and result["to"] == free
            after = client.notebookos_kernel(kernel_id)
            assert sorted(r["host"] for r in after["replicas"]) == sorted((hosts - {moving["host"]}) | {free})
            assert moving["pid"] not in {r["pid"] for r in after["replicas"]}
            # The moved replica has the state; run on it explicitly.
            msg_id = conn.send(
                "shell",
                "execute_request",
                {"code": "notes.append('b')\nint(weights.sum()), notes"},
                metadata={"notebookos": {"replica": result["replica_id"]}},
            )
            reply = conn.reply(msg_id, 60)
            assert reply["content"]["status"] == "ok"
            assert reply["metadata"]["notebookos"]["host"] == free
            assert conn.execute("notes").result_text() == "['a', 'b']"

            metrics = client.http.get(one_gpu_hosts.url + "/metrics", timeout=10).text
            assert 'notebookos_migrations_total{outcome="ok",reason="request"} 1.0' in metrics

            # Clear 4xx errors for what a user can get wrong.
            base = f"/api/notebookos/kernels/{kernel_id}/replicas"
            some = after["replicas"][0]
            for path, body, status, text in [
                ("/api/notebookos/kernels/nope/replicas/0/migrate", None, 404, "no NotebookOS kernel nope"),
                (f"{base}/99/migrate", None, 404, "has no replica 99"),
                (f"{base}/{some['replica_id']}/migrate", {"host": "host-77"}, 404, "no host 'host-77'"),
                (f"{base}/{some['replica_id']}/migrate", {"host": after["replicas"][1]["host"]}, 409, "refused"),
                (f"{base}/{some['replica_id']}/migrate", "not json", 400, "must be JSON"),
            ]:
                response = client.http.post(
                    one_gpu_hosts.url + path,
                    timeout=30,
                    **({"data": body} if isinstance(body, str) else {"json": body}),
                )
                assert response.status_code == status, (path, response.text)
                assert text in response.json()["message"]
    finally:
        client.shutdown_kernel(kernel_id)


def migration_seconds(metrics: str) -> float:
    """The total seconds of migrations so far, from the gateway's Prometheus text."""
    lines = metrics.splitlines()
    return sum(float(line.split()[-1]) for line in lines if line.startswith("notebookos_migration_seconds_sum"))


def test_a_cell_whose_replica_hosts_are_busy_migrates_and_runs(one_gpu_hosts: Platform) -> None:
    client = one_gpu_hosts.client
    kernel_id = client.start_kernel(KERNEL)
    try:
        with client.connect(kernel_id) as conn:
            conn.execute("state = {'x': 1}")
            hosts = {r["host"] for r in client.notebookos_kernel(kernel_id)["replicas"]}
            # The GPU of each of the kernel's hosts is held by a long cell of another kernel.
            with gpus_held_on(client, hosts, KERNEL, 40):
                moved_before = migration_seconds(client.http.get(one_gpu_hosts.url + "/metrics", timeout=10).text)
                began = time.monotonic()
                result = conn.execute("state['x'] += 1\nstate", timeout=90)
                assert result.status == "ok", result.reply["content"]
                assert result.result_text() == "{'x': 2}"
                meta = result.notebookos
                assert meta["host"] not in hosts  # it ran on the fourth host, after a migration
                assert meta["queued_ms"] <= (time.monotonic() - began) * 1000 + 50
                info = client.notebookos_kernel(kernel_id)
                assert meta["host"] in {r["host"] for r in info["replicas"]} and len(info["replicas"]) == 3
                metrics = client.http.get(one_gpu_hosts.url + "/metrics", timeout=10).text
                assert 'notebookos_migrations_total{outcome="ok",reason="cell"} 1.0' in metrics
                # The move is part of the interactivity delay: the cell waited at least as long as it took.
                moved_s = migration_seconds(metrics) - moved_before
                assert moved_s > 0 and meta["queued_ms"] >= moved_s * 1000, (meta, moved_s)
    finally:
        with contextlib.suppress(GatewayError):
            client.shutdown_kernel(kernel_id)


def test_a_target_killed_during_migration_leaves_the_old_replica_serving(one_gpu_hosts: Platform) -> None:
    import os
    import signal
    import threading

    client = one_gpu_hosts.client
    kernel_id = client.start_kernel(KERNEL)
    try:
        with client.connect(kernel_id) as conn:
            conn.execute("survivor = 'still here'")
            info = client.notebookos_kernel(kernel_id)
            before = {r["replica_id"]: r for r in info["replicas"]}
            moving = info["replicas"][0]
            outcome: dict[str, object] = {}

            def migrate() -> None:
                try:
                    outcome["result"] = client.request(
                        "POST", f"/api/notebookos/kernels/{kernel_id}/replicas/{moving['replica_id']}/migrate"
                    )
                except GatewayError as err:
                    outcome["error"] = str(err)

            thread = threading.Thread(target=migrate)
            thread.start()
            deadline = time.monotonic() + 30
            newcomer = None
            while newcomer is None and time.monotonic() < deadline:
                newcomer = next(
                    (
                        r
                        for r in client.notebookos_kernel(kernel_id)["replicas"]
                        if r["replica_id"] not in before and r["pid"]
                    ),
                    None,
                )
                time.sleep(0.05)
            assert newcomer is not None, "the migration never started a new replica"
            os.kill(newcomer["pid"], signal.SIGKILL)
            thread.join(90)
            assert "error" in outcome, outcome
            assert "HTTP 500" in str(outcome["error"]) and "keeps serving" in str(outcome["error"])
            after = client.notebookos_kernel(kernel_id)
            assert {r["replica_id"] for r in after["replicas"]} == set(before)
            assert conn.execute("survivor").result_text() == "'still here'"
            metrics = client.http.get(one_gpu_hosts.url + "/metrics", timeout=10).text
            assert 'notebookos_migrations_total{outcome="failed",reason="request"} 1.0' in metrics
    finally:
        client.shutdown_kernel(kernel_id)
