"""Network partitions: `notebookos up --host-network netns` makes every simulated host a network namespace, and a
host cut off from etcd and the gateway behaves as a real partitioned machine (its processes run on; its packets are
dropped). Its executor must commit nothing once its lease ran out, and the kernel goes on with the others."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator

import pytest
from support import Platform, start_platform, stop_platform, wait_for

from jupyter_notebookos.client import GatewayError, KernelConnection
from jupyter_notebookos.launchers.hostnet import HostNetwork

KERNEL = "python3-notebookos"


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    reason = HostNetwork.unavailable()
    if reason:
        pytest.skip(reason)
    platform = start_platform(
        tmp_path_factory.mktemp("partition") / "state", "--hosts", "4", "--gpus-per-host", "1",
        "--host-network", "netns",
    )  # fmt: skip
    try:
        yield platform
    finally:
        stop_platform(platform)
        network = HostNetwork.for_state_dir(platform.state_dir)
        assert not (platform.state_dir / "hostnet.json").exists(), "notebookos up left its namespaces behind"
        assert network.namespace("host-0") not in _netns_list()


def _netns_list() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


def on_replica(conn: KernelConnection, replica: str, expression: str, timeout: float = 30) -> str:
    """``expression`` evaluated on one replica (the cell is pinned to it)."""
    msg_id = conn.send(
        "shell",
        "execute_request",
        {"code": "", "silent": False, "user_expressions": {"out": expression}},
        metadata={"notebookos": {"replica": replica}},
    )
    reply = conn.reply(msg_id, timeout=timeout)
    assert reply["content"]["status"] == "ok", reply["content"]
    return str(reply["content"]["user_expressions"]["out"]["data"]["text/plain"])


def test_replicas_live_on_their_hosts_addresses(platform: Platform) -> None:
    client = platform.client
    network = HostNetwork.for_state_dir(platform.state_dir)
    kernel_id = client.start_kernel(KERNEL)
    try:
        with client.connect(kernel_id) as conn:
            for replica in client.notebookos_kernel(kernel_id)["replicas"]:
                address = on_replica(conn, replica["replica_id"], "__import__('os').environ['NOTEBOOKOS_IP']")
                assert address.strip("'").startswith(str(network.subnet.network_address)[:-1]), address
                assert address.strip("'") != network.bridge_ip
    finally:
        with contextlib.suppress(GatewayError):
            client.shutdown_kernel(kernel_id)


def test_a_partitioned_executor_commits_nothing_late_and_the_kernel_goes_on(platform: Platform) -> None:
    client = platform.client
    network = HostNetwork.for_state_dir(platform.state_dir)
    kernel_id = client.start_kernel(KERNEL)
    partitioned = ""
    try:
        with client.connect(kernel_id) as conn:
            first = conn.execute("import time\nx = 1")
            assert first.status == "ok"
            executor, host = first.notebookos["replica"], first.notebookos["host"]
            # A cell on that executor that changes x only after its host was cut off.
            late = conn.send(
                "shell",
                "execute_request",
                {"code": "time.sleep(8)\ny = 'late'\nx = 100", "silent": False},
                metadata={"notebookos": {"replica": executor}},
            )
            time.sleep(1.5)
            network.partition(host)
            partitioned, cut = host, time.monotonic()
            reply = conn.reply(late, timeout=60)
            assert reply["content"]["status"] == "error", reply["content"]
            assert time.monotonic() - cut < 30, "the router must give up on a cut-off executor within seconds"

            after = conn.execute("x += 1\n(x, 'y' in dir())", timeout=60)
            assert after.status == "ok", after.reply["content"]
            assert after.result_text() == "(2, False)" and after.notebookos["host"] != host

            network.heal(host)
            partitioned = ""

            # Back on the network, the old executor's late change stays out: its lease ran out, its record was
            # never committed. Every replica serving the kernel now (the old one rejoined, or its replacement)
            # agrees with the log.
            def three_ready() -> list[str] | None:
                replicas = client.notebookos_kernel(kernel_id)["replicas"]
                ready = [r["replica_id"] for r in replicas if r["state"] == "ready"]
                return ready if len(ready) == 3 else None

            ready = wait_for(three_ready, 90, "three ready replicas after the partition healed", interval=1.0)
            for replica in ready:
                assert on_replica(conn, replica, "(x, 'y' in dir())", timeout=60) == "(2, False)", replica
            final = conn.execute("x += 1\nx", timeout=60)
            assert final.status == "ok" and final.result_text() == "3"
    finally:
        if partitioned:
            network.heal(partitioned)
        with contextlib.suppress(GatewayError):
            client.shutdown_kernel(kernel_id)
