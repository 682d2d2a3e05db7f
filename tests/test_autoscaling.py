"""Embedded autoscaling (issue 5): demand adds simulated hosts after the provisioning delay; idle hosts are
drained by migration, then removed, never below the floor; no cell and no state is lost."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from support import Platform, start_platform, stop_platform, wait_for

from jupyter_notebookos.client import GatewayClient

KERNEL = "python3-notebookos"


def cluster(client: GatewayClient) -> dict:
    return dict(client.request("GET", "/api/notebookos/cluster"))


@pytest.fixture
def autoscaled(tmp_path) -> Iterator[Platform]:  # type: ignore[no-untyped-def]
    platform = start_platform(
        tmp_path / "state",
        "--hosts",
        "3",
        "--gpus-per-host",
        "1",
        "--autoscale",
        "--provisioning-delay",
        "2",
        "--gateway-option",
        "Scheduler.scale_in_delay_s=3",
        "--gateway-option",
        "NotebookOSGatewayApp.autoscale_interval=1",
    )
    try:
        yield platform
    finally:
        stop_platform(platform)


def test_demand_adds_hosts_and_idle_hosts_are_drained_then_removed(autoscaled: Platform) -> None:
    client = autoscaled.client
    sizes: list[int] = []

    def hosts() -> int:
        sizes.append(len(cluster(client)["hosts"]))
        return sizes[-1]

    assert hosts() == 3  # floor (min_hosts 3) with nothing running
    kernel_id = client.start_kernel(KERNEL)
    other = client.start_kernel(KERNEL)
    try:
        with client.connect(kernel_id) as conn, client.connect(other) as busy:
            conn.execute("kept = list(range(5))")
            # Two long cells commit 2 GPUs: target = ceil(2 x 1.1 / 1) + 1 idle = 4 hosts.
            busy.send("shell", "execute_request", {"code": "import time\ntime.sleep(12)", "silent": False})
            conn.send("shell", "execute_request", {"code": "import time\ntime.sleep(12)", "silent": False})
            began = time.monotonic()
            wait_for(lambda: hosts() >= 4, 40, "a scale-out to 4 hosts")
            assert time.monotonic() - began >= 1.5  # the provisioning delay is honoured
            status = cluster(client)["scaling"]
            assert status["enabled"] and any(e["action"] == "scale-out" for e in status["recent"])
            # Load gone: after the scale-in delay an idle host is drained (replicas migrate) and removed.
            wait_for(lambda: hosts() == 3, 90, "a scale-in back to 3 hosts")
            assert min(sizes) >= 3  # never below the floor
            result = conn.execute("kept.append(5)\nkept", timeout=60)
            assert result.result_text() == "[0, 1, 2, 3, 4, 5]"
            names = {h["name"] for h in cluster(client)["hosts"]}
            for kid in (kernel_id, other):
                info = client.notebookos_kernel(kid)
                assert {r["host"] for r in info["replicas"]} <= names and len(info["replicas"]) == 3
        metrics = client.http.get(autoscaled.url + "/metrics", timeout=10).text
        for direction in ("out", "in"):
            line = next(
                x
                for x in metrics.splitlines()
                if x.startswith(f'notebookos_scaling_events_total{{direction="{direction}"}}')
            )
            assert float(line.split()[-1]) >= 1, line
    finally:
        client.shutdown_kernel(kernel_id)
        client.shutdown_kernel(other)
