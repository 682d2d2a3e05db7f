"""Restarting a NotebookOS kernel through EG's API (what JupyterLab's Kernel > Restart sends).

Same kernel id, every replica back to an empty namespace, the old incarnation's processes, log and objects gone,
its GPUs released, and the clients' websockets still connected; also while a cell runs or waits for GPUs.
Enterprise Gateway's own integration tests ``test_restart`` and ``test_interrupt`` run unchanged against it.
"""

from __future__ import annotations

import json
import time
import unittest
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest
import requests
import websocket
from enterprise_gateway.client import gateway_client
from enterprise_gateway.itests.test_python_kernel import PythonKernelBaseTestCase
from support import Platform, gpus_held_on, wait_for

from jupyter_notebookos.client import GatewayClient, KernelConnection
from jupyter_notebookos.embedded import ports

KERNEL = "python3-notebookos"

# The module's platform (tests/conftest.py): three hosts with one GPU each, so every kernel has a replica on every
# host and one blocker holds them all.
PLATFORM_ARGS = ("--hosts", "3", "--gpus-per-host", "1")


def restart(client: GatewayClient, kernel_id: str) -> float:
    """``POST /api/kernels/{id}/restart``; returns how long it took (seconds)."""
    began = time.monotonic()
    model = client.request("POST", f"/api/kernels/{kernel_id}/restart")
    assert model["id"] == kernel_id
    return time.monotonic() - began


def committed_gpus(client: GatewayClient) -> int:
    return sum(h["gpus_committed"] for h in client.request("GET", "/api/notebookos/cluster")["hosts"])


def run_on(conn: KernelConnection, replica_id: str, code: str) -> dict[str, Any]:
    """Run ``code`` on one replica (the router honours a pinned replica) and return its reply."""
    msg_id = conn.send(
        "shell",
        "execute_request",
        {"code": code, "silent": False, "user_expressions": {"out": "_out"}},
        metadata={"notebookos": {"replica": replica_id}},
    )
    return conn.reply(msg_id, timeout=60)


def objects_of(platform: Platform, kernel_id: str) -> set[Path]:
    root = platform.state_dir / "objects" / "kernels" / kernel_id
    return {p for p in root.rglob("*") if p.is_file()} if root.exists() else set()


# -- Enterprise Gateway's own integration tests -----------------------------------------------------------


class _WithToken:
    """The requests/websocket calls EG's test client makes, carrying the gateway's token (it sends none)."""

    def __init__(self, token: str) -> None:
        self.header = {"Authorization": f"token {token}"}

    def post(self, url: str, **kwargs: Any) -> requests.Response:
        return requests.post(url, headers=self.header, **kwargs)

    def get(self, url: str, **kwargs: Any) -> requests.Response:
        return requests.get(url, headers=self.header, **kwargs)

    def delete(self, url: str, **kwargs: Any) -> requests.Response:
        return requests.delete(url, headers=self.header, **kwargs)

    def create_connection(self, url: str, **kwargs: Any) -> websocket.WebSocket:
        return websocket.create_connection(url, header=[f"{k}: {v}" for k, v in self.header.items()], **kwargs)


class _EgPythonTests(unittest.TestCase, PythonKernelBaseTestCase):
    """EG's ``itests/test_python_kernel.py`` cases, run one at a time against a kernel we start."""

    __test__ = False  # pytest runs the chosen cases through the test below, not all of them on their own

    def runTest(self) -> None:  # unittest wants one; the cases are called by name below
        raise NotImplementedError


@pytest.mark.parametrize("kernelspec", ["python3", KERNEL])
@pytest.mark.parametrize("case", ["test_restart", "test_interrupt"])
def test_enterprise_gateways_own_itests_pass(
    platform: Platform, monkeypatch: pytest.MonkeyPatch, kernelspec: str, case: str
) -> None:
    shim = _WithToken(platform.client.token or "")
    monkeypatch.setattr(gateway_client, "requests", SimpleNamespace(post=shim.post, get=shim.get, delete=shim.delete))
    monkeypatch.setattr(
        gateway_client,
        "websocket",
        SimpleNamespace(
            create_connection=shim.create_connection,
            WebSocketConnectionClosedException=websocket.WebSocketConnectionClosedException,
        ),
    )
    eg = gateway_client.GatewayClient(host=platform.client.url.removeprefix("http://"))
    tests = _EgPythonTests()
    tests.kernel = eg.start_kernel(kernelspec)
    try:
        getattr(tests, case)()
    finally:
        eg.shutdown_kernel(tests.kernel)


def test_a_plain_kernels_ports_are_none_that_binding_port_zero_hands_out(platform: Platform) -> None:
    """EG's ``test_interrupt`` above once lost its cells in CI, as it does when a port of the plain kernel (EG had
    picked it by binding port 0) is bound by another process first: for any port but shell, ipykernel stays alive
    serving nothing, and the gateway aborts the websocket after two 60 s waits (reproduced with the iopub port).
    The gateway now picks them below the ephemeral range, where no port-0 bind lands (in the part kept for kernels)."""
    kernel_id = platform.client.start_kernel("python3")
    try:
        with platform.client.connect(kernel_id) as conn:
            result = conn.execute("import ipykernel\nprint(ipykernel.get_connection_info())")
        bound = {name: port for name, port in json.loads(result.stdout).items() if name.endswith("_port")}
        kernels = ports.kernel_range()  # the platform's: it inherits this process's environment
        assert kernels is not None
        assert len(bound) == 5 and all(kernels[0] <= port <= kernels[1] for port in bound.values()), (bound, kernels)
    finally:
        platform.client.shutdown_kernel(kernel_id)


# -- what a user of a NotebookOS kernel sees ----------------------------------------------------------------


def test_restart_empties_every_replica_and_keeps_the_clients_connected(
    platform: Platform, kernel: tuple[GatewayClient, str]
) -> None:
    client, kernel_id = kernel
    with client.connect(kernel_id) as first, client.connect(kernel_id) as second:
        state = first.execute("import numpy as np\nbig = np.ones(4_000_000)\nx = 123")
        assert state.status == "ok"
        before = client.notebookos_kernel(kernel_id)
        state = first.execute("y = 2")  # a second record: the log's head is past anything a new start has
        head = max(r["applied_seq"] for r in client.notebookos_kernel(kernel_id)["replicas"])
        wait_for(
            lambda: all(r["applied_seq"] >= head for r in client.notebookos_kernel(kernel_id)["replicas"]),
            30,
            "every replica to apply the cell",
        )
        old_objects = objects_of(platform, kernel_id)
        assert old_objects, "the 32 MB array should have gone to the object store"
        old_pids = [r["pid"] for r in before["replicas"]]

        took = restart(client, kernel_id)

        after = client.notebookos_kernel(kernel_id)
        assert len(after["replicas"]) == 3 and all(r["state"] == "ready" for r in after["replicas"])
        assert not set(old_pids) & {r["pid"] for r in after["replicas"]}
        for pid in old_pids:
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert not old_objects & objects_of(platform, kernel_id), "the old incarnation's objects are gone"
        assert head >= 1 and all(r["applied_seq"] < head for r in after["replicas"]), "the old log is gone"
        # Every replica, not just the executor, starts from nothing.
        for replica in after["replicas"]:
            reply = run_on(first, replica["replica_id"], "_out = sorted(k for k in ('x', 'big') if k in globals())")
            assert reply["content"]["status"] == "ok"
            assert reply["content"]["user_expressions"]["out"]["data"]["text/plain"] == "[]", replica
        # The second tab, untouched during the restart, still works on the same websocket.
        again = second.execute("x = 1\nx + 1")
        assert again.status == "ok" and again.result_text() == "2"
        assert again.notebookos["attempt"] == 1
    assert took < 30


def test_restart_while_a_cell_runs_interrupts_it_and_releases_its_gpu(kernel: tuple[GatewayClient, str]) -> None:
    client, kernel_id = kernel
    with client.connect(kernel_id) as conn:
        conn.execute("x = 1")
        msg_id = conn.send("shell", "execute_request", {"code": "import time\ntime.sleep(120)", "silent": False})
        wait_for(lambda: committed_gpus(client) == 1, 20, "the cell to hold its GPU")
        took = restart(client, kernel_id)
        reply = conn.reply(msg_id, timeout=20)
        assert reply["content"]["status"] == "error"
        assert committed_gpus(client) == 0
        assert client.notebookos_kernel(kernel_id)["running"] is None
        after = conn.execute("'x' in globals()")
        assert after.status == "ok" and after.result_text() == "False"
    assert took < 30


def test_restart_while_a_cell_waits_for_gpus_takes_it_out_of_the_queue(
    platform: Platform, kernel: tuple[GatewayClient, str], tmp_path: Path
) -> None:
    client, kernel_id = kernel
    hosts = {r["host"] for r in client.notebookos_kernel(kernel_id)["replicas"]}
    marker = tmp_path / "must-not-run"
    with client.connect(kernel_id) as conn:
        with gpus_held_on(client, hosts, KERNEL, 60):
            msg_id = conn.send("shell", "execute_request", {"code": f"open({str(marker)!r}, 'w').close()"})
            queue = lambda: client.request("GET", "/api/notebookos/cluster")["queue"]  # noqa: E731
            wait_for(lambda: any(q["cell_id"] == msg_id for q in queue()), 20, "the cell to wait for a GPU")
            took = restart(client, kernel_id)
            reply = conn.reply(msg_id, timeout=20)
            assert reply["content"]["status"] == "error" and "did not run" in reply["content"]["evalue"]
            assert not any(q["kernel_id"] == kernel_id for q in queue())
            assert took < 30, "the restart must not wait for GPUs"
        after = conn.execute("'restarted'")
        assert after.status == "ok" and after.result_text() == "'restarted'"
    assert not marker.exists()
