"""etcd's own failures as a NotebookOS user meets them: `notebookos up --etcd-members 3`, real kernels."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import time
import urllib.request
from collections.abc import Iterator

import psutil
import pytest
from support import Platform, etcd_member, start_platform, stop_platform, wait_for

from jupyter_notebookos.client import GatewayError
from jupyter_notebookos.embedded.platform import RUNTIME_FILE

KERNEL = "python3-notebookos"


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    started = start_platform(
        tmp_path_factory.mktemp("failover") / "state", "--hosts", "3", "--gpus-per-host", "2", "--etcd-members", "3"
    )
    try:
        yield started
    finally:
        stop_platform(started)


@pytest.fixture
def kernel_id(platform: Platform) -> Iterator[str]:
    """A NotebookOS kernel on the module's platform, shut down after the test: a failed test's report then has its
    replicas' logs (tests/conftest.py), which the shutdown would remove."""
    kernel = platform.client.start_kernel(KERNEL)
    try:
        yield kernel
    finally:
        with contextlib.suppress(GatewayError):
            platform.client.shutdown_kernel(kernel)


def etcd_endpoints(platform: Platform) -> list[str]:
    return list(json.loads((platform.state_dir / RUNTIME_FILE).read_text())["etcd_endpoints"])


def is_leader(endpoint: str) -> bool:
    url = endpoint if endpoint.startswith("http") else f"http://{endpoint}"
    with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/metrics", timeout=1) as reply:
        return re.search(r"^etcd_server_is_leader 1\b", reply.read().decode(), re.MULTILINE) is not None
    return False


def member_healthy(endpoint: str) -> bool:
    with contextlib.suppress(OSError), urllib.request.urlopen(f"http://{endpoint}/health", timeout=1) as reply:
        return bool(json.loads(reply.read()).get("health") == "true")
    return False


@contextlib.contextmanager
def stopped(members: list[psutil.Process]) -> Iterator[None]:
    """Every one of ``members`` SIGSTOPped for the ``with`` block, and continued whatever happens in it."""
    for member in members:
        member.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for member in members:
            member.send_signal(signal.SIGCONT)


def test_sigkill_of_the_etcd_leader_fails_no_cell(platform: Platform, kernel_id: str) -> None:
    client = platform.client
    with client.connect(kernel_id) as conn:
        assert conn.execute("n = 0").status == "ok"
        leader = wait_for(
            lambda: next((e for e in etcd_endpoints(platform) if is_leader(e)), None), 10, "an etcd leader"
        )
        member = etcd_member(leader)
        assert member is not None
        member.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        # Cells right through the election (a new leader within one or two 1 s election timeouts) and after.
        results = []
        while time.monotonic() - killed < 6:
            results.append(conn.execute("n += 1\nn", timeout=30))
        errors = [r.reply["content"] for r in results if r.status != "ok"]
        assert not errors, errors
        assert results[-1].result_text() == str(len(results))
        # `notebookos up` started the killed member again, on its port and data, and it rejoined.
        back = wait_for(lambda: etcd_member(leader), 30, "notebookos up to start the killed etcd member again")
        assert back.pid != member.pid
        wait_for(lambda: member_healthy(leader), 30, "the restarted member to rejoin its cluster")


def test_replicas_outlive_a_60_second_etcd_outage_with_their_memory(platform: Platform, kernel_id: str) -> None:
    client = platform.client
    members = [m for m in map(etcd_member, etcd_endpoints(platform)) if m is not None]  # the live ones
    assert members
    with client.connect(kernel_id) as conn:
        # An open file cannot be pickled: only the process that opened it has it, so it tells whether the
        # replica after the outage is the same process with the same memory, not a replacement from the log.
        first = conn.execute(f"f = open({str(platform.state_dir / 'runtime.json')!r})\nx = 41")
        assert first.status == "ok"
        executor = first.notebookos["replica"]
        seq = int(first.notebookos["seq"])
        wait_for(
            lambda: all(r["applied_seq"] >= seq for r in client.notebookos_kernel(kernel_id)["replicas"]),
            30,
            "every replica to apply the first cell",
        )
        pids = {r["replica_id"]: r["pid"] for r in client.notebookos_kernel(kernel_id)["replicas"]}

        # The outage starts while the next cell runs: its reply reaches the client, and its record (x = 42)
        # goes out when etcd is back, however long the outage (the replica keeps retrying meanwhile).
        caught = conn.send("shell", "execute_request", {"code": "import time\ntime.sleep(1.0)\nx = 42"})
        while conn.reply(caught, 30, channel="iopub")["msg_type"] != "execute_input":
            pass  # the cell's busy status comes first
        with stopped(members):
            began = time.monotonic()
            reply = conn.reply(caught, timeout=30)
            assert reply["content"]["status"] == "ok"
            caught_seq = int(reply["metadata"]["notebookos"]["seq"])
            during = conn.execute("x + 1", timeout=30)
            assert during.status == "error" and "etcd" in during.reply["content"]["evalue"]
            assert time.monotonic() - began < 12, "a cell during the outage must fail fast"
            time.sleep(max(0.0, 60 - (time.monotonic() - began)))

        def served() -> dict | None:
            with contextlib.suppress(TimeoutError):
                msg_id = conn.send(
                    "shell",
                    "execute_request",
                    {"code": "", "silent": False, "user_expressions": {"out": "(f.closed, x + 1)"}},
                    metadata={"notebookos": {"replica": executor}},
                )
                reply = conn.reply(msg_id, timeout=30)
                return reply if reply["content"]["status"] == "ok" else None
            return None

        reply = wait_for(served, 60, "the kernel to serve again after etcd came back", interval=1.0)
        assert reply["content"]["user_expressions"]["out"]["data"]["text/plain"] == "(False, 43)"
        wait_for(
            lambda: all(r["applied_seq"] >= caught_seq for r in client.notebookos_kernel(kernel_id)["replicas"]),
            30,
            "every replica to apply the cell whose record the outage held up",
        )
        after = {r["replica_id"]: r["pid"] for r in client.notebookos_kernel(kernel_id)["replicas"]}
        assert after == pids, "the same replica processes serve again, none was replaced"
        assert all(psutil.pid_exists(pid) for pid in pids.values())


def test_a_cell_that_runs_through_an_etcd_outage_longer_than_its_lease_finishes(
    platform: Platform, kernel_id: str
) -> None:
    """etcd ends every replica's lease when it comes back from an outage longer than the lease's TTL (5 s), the
    executor's too, while it runs a cell. The process lives on and registers again; the cell used to fail with
    ReplicaLost at that moment, although nothing was lost. Now the router keeps its connections to the replica
    through the rejoin grace: the output and the reply arrive, and the next cell sees the cell's state."""
    client = platform.client
    members = [m for m in map(etcd_member, etcd_endpoints(platform)) if m is not None]
    assert members
    log = platform.state_dir / "gateway.log"
    with client.connect(kernel_id) as conn:
        assert conn.execute("x = 1").status == "ok"
        pids = {r["replica_id"]: r["pid"] for r in client.notebookos_kernel(kernel_id)["replicas"]}
        logged = len(log.read_text())
        code = "import time\nprint('begun', flush=True)\ntime.sleep(16)\nx = 2\nprint('done')"
        msg_id = conn.send("shell", "execute_request", {"code": code})
        while conn.reply(msg_id, 30, channel="iopub")["msg_type"] != "stream":
            pass  # busy, execute_input, then "begun"
        with stopped(members):
            time.sleep(9)
        finished = conn.collect(msg_id, 60)
        assert finished.status == "ok", finished.reply["content"]
        assert "done\n" in finished.stdout
        since = log.read_text()[logged:]
        assert "registered again while it ran a cell" in since, "etcd did not end the executor's lease"
        after = conn.execute("x + 1", timeout=60)
        assert after.status == "ok" and after.result_text() == "3", after.reply["content"]
        # The cell's record went out, in whatever term the router opened next: every replica applies it.
        seq = int(after.notebookos["seq"])
        wait_for(
            lambda: all(r["applied_seq"] >= seq for r in client.notebookos_kernel(kernel_id)["replicas"]),
            30,
            "every replica to apply the cells of and after the outage",
        )
        assert {r["replica_id"]: r["pid"] for r in client.notebookos_kernel(kernel_id)["replicas"]} == pids


def test_an_interrupt_while_the_router_commits_the_cell_stops_it(platform: Platform, kernel_id: str) -> None:
    """The router commits a cell's decision in etcd before the cell reaches its executor. An interrupt in that
    window went on to a replica that ran nothing yet, and ipykernel ignores SIGINT between requests: the cell
    then ran to its end. etcd is paused here so that the window lasts, shorter than the etcd deadline (5 s)."""
    client = platform.client
    members = [m for m in map(etcd_member, etcd_endpoints(platform)) if m is not None]
    assert members
    with client.connect(kernel_id) as conn:
        assert conn.execute("x = 1").status == "ok"
        with stopped(members):
            msg_id = conn.send("shell", "execute_request", {"code": "import time\ntime.sleep(30)\nx = 2"})
            time.sleep(0.7)  # the router is in the cell's commit, waiting for etcd
            client.interrupt_kernel(kernel_id)
            time.sleep(0.3)
        finished = conn.collect(msg_id, 10)
        assert finished.status == "error" and finished.reply["content"]["ename"] == "KeyboardInterrupt"
        after = conn.execute("x", timeout=30)
        assert after.result_text() == "1", "the interrupted cell ran"
