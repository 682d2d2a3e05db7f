"""Simulated hosts as network namespaces (launchers/hostnet.py): every host joined to the bridge keeps reaching the
bridge's address (where etcd and the gateway listen) however many hosts join after it."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_notebookos.launchers.hostnet import HostNetwork

CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()"


@pytest.fixture
def network(tmp_path: Path) -> Iterator[HostNetwork]:
    reason = HostNetwork.unavailable()
    if reason:
        pytest.skip(reason)
    network = HostNetwork.for_state_dir(tmp_path / "state")
    try:
        yield network
    finally:
        network.remove()


def test_hosts_joined_earlier_still_reach_the_bridge_when_more_join(network: HostNetwork) -> None:
    network.ensure_bridge()
    with socket.create_server((network.bridge_ip, 0)) as server:
        server.settimeout(10)
        port = server.getsockname()[1]
        joined: list[str] = []
        for index in range(8):
            host = f"host-{index}"
            network.ensure_host(host)
            joined.append(host)
            # A new port must not change the bridge's MAC address under the ARP caches of the hosts joined before.
            assert (
                network.bridge_mac
                in subprocess.run(
                    ["ip", "link", "show", network.bridge], capture_output=True, text=True, check=True
                ).stdout
            )
            for earlier in joined:
                done = subprocess.run(
                    network.command(earlier, [sys.executable, "-c", CONNECT, network.bridge_ip, str(port)]),
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
                assert done.returncode == 0, f"{earlier} cannot reach the bridge after {host} joined: {done.stderr}"
                server.accept()[0].close()
