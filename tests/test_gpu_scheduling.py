"""GPU scheduling live: contention, waiting, lease-bound GPU ledger, KERNEL_GPUS, metrics.

One platform of 4 hosts x 1 simulated GPU serves the module, so a handful of cells is enough to make hosts
busy. Long cells hold their GPU until the test creates a file, so no test depends on sleeps being long
enough on a loaded machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import REPO, Platform, start_platform, stop_platform, wait_for

from jupyter_notebookos.client import GatewayClient, GatewayError, KernelConnection
from jupyter_notebookos.coordination.client import Coordinator
from jupyter_notebookos.gpu.discovery import nvml_devices

KERNEL = "python3-notebookos"


@dataclass
class Kernel:
    """A started kernel with one open websocket, and where its replicas are."""

    kernel_id: str
    conn: KernelConnection
    client: GatewayClient
    seen: list[dict[str, Any]] = field(default_factory=list)

    def info(self) -> dict[str, Any]:
        return self.client.notebookos_kernel(self.kernel_id)

    def hosts(self) -> dict[str, str]:
        """Host -> replica id of the ready replicas."""
        return {r["host"]: r["replica_id"] for r in self.info()["replicas"] if r["state"] == "ready"}

    def send(self, code: str, replica: str | None = None) -> str:
        metadata = {"notebookos": {"replica": replica}} if replica is not None else None
        return self.conn.send("shell", "execute_request", {"code": code, "silent": False}, metadata=metadata)

    def reply(self, msg_id: str, timeout: float = 60.0) -> dict[str, Any]:
        """The execute_reply of ``msg_id``; every message read on the way is kept in ``seen``."""
        for msg in self.seen:
            if msg["channel"] == "shell" and msg["parent_header"].get("msg_id") == msg_id:
                return msg
        deadline = time.monotonic() + timeout
        while True:
            msg = self.conn.receive(deadline - time.monotonic())
            self.seen.append(msg)
            if msg["channel"] == "shell" and msg["parent_header"].get("msg_id") == msg_id:
                return msg

    def drain(self, seconds: float) -> None:
        """Read what arrives for ``seconds`` (into ``seen``)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                self.seen.append(self.conn.receive(left))
            except Exception:  # websocket timeout
                return

    def statuses(self, msg_id: str) -> list[str]:
        return [
            m["content"]["execution_state"]
            for m in self.seen
            if m["msg_type"] == "status" and m["parent_header"].get("msg_id") == msg_id
        ]


@dataclass
class Hold:
    """A cell that keeps its GPU until :meth:`release`."""

    kernel: Kernel
    msg_id: str
    flag: Path
    host: str

    def release(self) -> dict[str, Any]:
        self.flag.touch()
        reply = self.kernel.reply(self.msg_id)
        assert reply["content"]["status"] == "ok", reply["content"]
        return reply


def hold(kernel: Kernel, host: str, tmp: Path) -> Hold:
    """Run a cell on ``kernel``'s replica at ``host`` that holds its GPU until released."""
    flag, started = tmp / f"release-{kernel.kernel_id}", tmp / f"started-{kernel.kernel_id}"
    for path in (flag, started):
        path.unlink(missing_ok=True)
    code = (
        f"import os, time\nopen({str(started)!r}, 'w').close()\n"
        f"while not os.path.exists({str(flag)!r}):\n    time.sleep(0.02)"
    )
    msg_id = kernel.send(code, replica=kernel.hosts()[host])
    wait_for(started.exists, 60, f"the long cell of {kernel.kernel_id} to start on {host}")
    return Hold(kernel, msg_id, flag, host)


def cluster(client: GatewayClient) -> dict[str, Any]:
    return dict(client.request("GET", "/api/notebookos/cluster"))


def committed(client: GatewayClient) -> dict[str, int]:
    return {h["name"]: h["gpus_committed"] for h in cluster(client)["hosts"]}


def metrics(client: GatewayClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.http.get(client.url + "/metrics", timeout=30)
    response.raise_for_status()
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def metric(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    """A sample's value. A counter's that is absent is 0: a labelled counter appears once it first counts (a test
    that runs before any cell finished on the platform sees no ``outcome="finished"`` sample yet)."""
    key = (name, tuple(sorted(labels.items())))
    if key not in samples and name.endswith(("_total", "_count", "_bucket")):
        return 0.0
    return samples[key]


def etcd(platform: Platform, prefix_of: Callable[[Coordinator], str]) -> dict[str, tuple[dict[str, Any], int]]:
    """Keys under a prefix in the platform's etcd: key -> (JSON value, lease id)."""
    endpoints = json.loads((platform.state_dir / "runtime.json").read_text())["etcd_endpoints"]

    async def read() -> dict[str, tuple[dict[str, Any], int]]:
        coordinator = await Coordinator.connect(endpoints, timeout=10, credentials=platform.etcd_root())
        try:
            found = await coordinator.get_prefix(prefix_of(coordinator))
            return {kv.key: (json.loads(kv.value), kv.lease) for kv in found}
        finally:
            await coordinator.close()

    return asyncio.run(read())


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    started = start_platform(tmp_path_factory.mktemp("gpus") / "state", "--hosts", "4", "--gpus-per-host", "1")
    try:
        yield started
    finally:
        stop_platform(started)


@pytest.fixture(scope="module")
def kernels(platform: Platform) -> Iterator[list[Kernel]]:
    """Six 1-GPU kernels (3 replicas each on the 4 hosts), started once for the module."""
    client = platform.client
    started: list[Kernel] = []
    try:
        for _ in range(6):
            kernel_id = client.start_kernel(KERNEL)
            started.append(Kernel(kernel_id, client.connect(kernel_id), client))
        yield started
    finally:
        for kernel in started:
            kernel.conn.close()
            with contextlib.suppress(GatewayError):
                client.shutdown_kernel(kernel.kernel_id)


def test_a_busy_host_sends_the_next_kernels_cell_to_another_replicas_host(
    platform: Platform, kernels: list[Kernel], tmp_path: Path
) -> None:
    first, second = kernels[0], kernels[1]
    shared = sorted(set(first.hosts()) & set(second.hosts()))[0]  # 3 of 4 hosts each: they share two
    # The second kernel's last cell ran at the shared host, so that is where it would stay (sticky).
    warm = second.reply(second.send("'warm'", replica=second.hosts()[shared]))
    assert warm["metadata"]["notebookos"]["host"] == shared
    held = hold(first, shared, tmp_path)
    try:
        assert committed(platform.client)[shared] == 1
        reply = second.reply(second.send("import os\nos.environ['CUDA_VISIBLE_DEVICES']"))
        meta = reply["metadata"]["notebookos"]
        assert reply["content"]["status"] == "ok"
        assert meta["host"] != shared and meta["host"] in second.hosts()
        assert meta["replica"] == second.hosts()[meta["host"]] and meta["gpus"] == [0]
        assert meta["queued_ms"] < 5000  # it did not wait for the busy host
        info = second.info()
        assert info["executor"] == meta["replica"]
    finally:
        held.release()
    wait_for(lambda: committed(platform.client)[shared] == 0, 10, f"{shared}'s GPU to be idle again")


def _busy_every_host(kernels: list[Kernel], hosts: list[str], tmp: Path) -> list[Hold]:
    """Hold every host's GPU, each with another kernel that has a replica there."""
    placed = {k.kernel_id: set(k.hosts()) for k in kernels}
    for order in itertools.permutations(kernels, len(hosts)):
        if all(host in placed[k.kernel_id] for k, host in zip(order, hosts, strict=True)):
            return [hold(k, host, tmp) for k, host in zip(order, hosts, strict=True)]
    raise AssertionError(f"no assignment of kernels to hosts: {placed}")


def test_a_cell_waits_fifo_while_every_host_is_busy_and_runs_when_gpus_free(
    platform: Platform, kernels: list[Kernel], tmp_path: Path
) -> None:
    client = platform.client
    hosts = [h["name"] for h in cluster(client)["hosts"]]
    holders, first, second = kernels[:4], kernels[4], kernels[5]
    before = metrics(client)
    holds = _busy_every_host(holders, hosts, tmp_path)
    released: list[Hold] = []
    try:
        assert committed(client) == dict.fromkeys(hosts, 1)
        began = time.monotonic()
        first_flag = tmp_path / "first-may-end"
        first_id = first.send(
            f"import os, time\nwhile not os.path.exists({str(first_flag)!r}):\n    time.sleep(0.02)\n"
            "os.environ['CUDA_VISIBLE_DEVICES']"
        )
        time.sleep(0.2)  # the second cell arrives later: FIFO means it also starts later
        second_id = second.send("'second'")

        def both_queued() -> list[dict[str, Any]] | None:
            queue = cluster(client)["queue"]
            return queue if len(queue) >= 2 else None

        queue = wait_for(both_queued, 10, "the queue to show both cells")
        assert [(q["kernel_id"], q["cell_id"]) for q in queue][:2] == [
            (first.kernel_id, first_id),
            (second.kernel_id, second_id),
        ]
        assert [q["position"] for q in queue] == [1, 2] and all(q["gpus"] == 1 for q in queue)
        assert first.info()["state"] == "waiting for GPUs"

        # While waiting: the client sees the kernel busy, status and metrics show the queue.
        first.drain(1.0)
        assert "idle" not in first.statuses(first_id)
        shown_busy = "busy" in first.statuses(first_id)
        status = subprocess.run(
            [sys.executable, "-m", "jupyter_notebookos.cli", "status", "--state-dir", str(platform.state_dir)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
            env={**os.environ, "COLUMNS": "250"},
        )
        assert status.returncode == 0, status.stderr
        assert "Queued cells (2" in status.stdout and first_id[:8] in status.stdout
        assert "waiting for GPUs" in status.stdout
        waiting = metrics(client)
        assert metric(waiting, "notebookos_queued_cells") == 2
        assert all(metric(waiting, "notebookos_gpus", host=h, state="idle") == 0 for h in hosts)
        assert all(metric(waiting, "notebookos_gpus", host=h, state="committed") == 1 for h in hosts)
        # A CPU-only kernel's cells never wait for GPUs.
        cpu_id = client.start_kernel(KERNEL, env={"KERNEL_GPUS": "0"})
        try:
            with client.connect(cpu_id) as conn:
                cpu = conn.execute("import os\nos.environ.get('CUDA_VISIBLE_DEVICES')")
                assert cpu.status == "ok" and cpu.notebookos["gpus"] == [] and cpu.result_text() in ("''", "None")
                assert cpu.notebookos["queued_ms"] < 5000
        finally:
            client.shutdown_kernel(cpu_id)

        # A GPU frees on a host both waiting kernels could use: the first in line gets it, the second waits on.
        freed = next(h for h in holds if h.host in first.hosts() and h.host in second.hosts())
        waited_ms = (time.monotonic() - began) * 1000.0
        freed.release()
        released.append(freed)
        wait_for(lambda: committed(client)[freed.host] == 1, 10, f"the first cell to take {freed.host}'s GPU")
        assert [q["cell_id"] for q in cluster(client)["queue"]] == [second_id]
        assert first.info()["state"] == "running"

        # Then the second, on another host of its own.
        other = next(h for h in holds if h not in released and h.host in second.hosts())
        other.release()
        released.append(other)
        reply = second.reply(second_id)
        assert reply["content"]["status"] == "ok" and reply["metadata"]["notebookos"]["host"] == other.host
        first_flag.touch()
        reply = first.reply(first_id)
        meta = reply["metadata"]["notebookos"]
        assert reply["content"]["status"] == "ok" and meta["host"] == freed.host
        assert reply_text(first, first_id) == repr(",".join(map(str, meta["gpus"])))
        assert meta["queued_ms"] >= waited_ms - 1000
        wait_for(lambda: not cluster(client)["queue"], 10, "the queue to empty")
    finally:
        first_flag.touch()
        for held in holds:
            if held not in released:
                held.release()
    after = metrics(client)
    histogram = "notebookos_cell_queued_seconds_count"
    # Four holding cells, two queued cells and the CPU-only kernel's cell at least.
    assert metric(after, histogram) - metric(before, histogram) >= 7
    slow = "notebookos_cell_queued_seconds_bucket"
    assert metric(after, slow, le="1.0") - metric(before, slow, le="1.0") <= 5  # the two waited longer
    assert metric(after, "notebookos_queued_cells") == 0
    assert metric(after, "notebookos_cells_total", outcome="finished") > metric(
        before, "notebookos_cells_total", outcome="finished"
    )
    assert shown_busy, "the client must see the kernel busy while its cell waits for GPUs"


def reply_text(kernel: Kernel, msg_id: str) -> str:
    """The text/plain execute_result of ``msg_id`` among the messages read so far."""
    kernel.drain(0.5)  # iopub may trail the reply
    for m in kernel.seen:
        if m["msg_type"] == "execute_result" and m["parent_header"].get("msg_id") == msg_id:
            return str(m["content"]["data"]["text/plain"])
    return ""


def test_sigkill_of_the_executor_mid_cell_frees_its_gpu_through_its_lease(
    platform: Platform, kernels: list[Kernel], tmp_path: Path
) -> None:
    kernel = kernels[2]
    host = sorted(kernel.hosts())[0]
    held = hold(kernel, host, tmp_path)
    assert committed(platform.client)[host] == 1
    ledger = etcd(platform, lambda c: c.keys.gpus_prefix())
    entry = f"/notebookos/gpus/{host}/0"
    assert set(ledger) == {entry}
    value, lease = ledger[entry]
    assert value["kernel_id"] == kernel.kernel_id and value["msg_id"] == held.msg_id
    registrations = etcd(platform, lambda c: c.keys.kernel_prefix(kernel.kernel_id) + "replicas/")
    executor = next(v for v, _ in registrations.values() if v["host"] == host)
    assert lease != 0 and lease == executor["lease"]  # bound to the executor's lease

    os.kill(executor["pid"], signal.SIGKILL)
    wait_for(lambda: committed(platform.client)[host] == 0, 10, "the killed executor's GPU to be idle")
    assert entry not in etcd(platform, lambda c: c.keys.gpus_prefix())
    reply = kernel.reply(held.msg_id, 30)
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "ReplicaLost"
    # The kernel is whole again and its next cell gets a GPU as usual.
    wait_for(lambda: len(kernel.hosts()) == 3, 60, "a replacement replica")
    again = kernel.reply(kernel.send("'again'"))
    assert again["content"]["status"] == "ok" and again["metadata"]["notebookos"]["gpus"] == [0]


def test_metrics_account_gpus_per_host_and_gpu_seconds(platform: Platform, kernels: list[Kernel]) -> None:
    client = platform.client
    kernel = kernels[3]
    before = metrics(client)
    reply = kernel.reply(kernel.send("import time\ntime.sleep(1.0)"))
    assert reply["content"]["status"] == "ok"
    after = metrics(client)
    snapshot = cluster(client)
    for host in snapshot["hosts"]:
        name = host["name"]
        assert metric(after, "notebookos_gpus", host=name, state="committed") == host["gpus_committed"] == 0
        assert metric(after, "notebookos_gpus", host=name, state="idle") == host["gpus_idle"] == 1
        assert metric(after, "notebookos_gpus", host=name, state="pending") == host["gpus_pending"] > 0
        assert metric(after, "notebookos_host_subscription_ratio", host=name) == pytest.approx(
            host["subscription_ratio"]
        )
    assert metric(after, "notebookos_subscription_ratio") == pytest.approx(snapshot["subscription_ratio"])
    assert metric(after, "notebookos_hosts") == 4
    histogram = "notebookos_cell_queued_seconds_count"
    assert metric(after, histogram) == metric(before, histogram) + 1
    used = metric(after, "notebookos_gpu_used_seconds_total")
    assert used - metric(before, "notebookos_gpu_used_seconds_total") >= 0.9  # one GPU for the 1 s cell
    reserved = metric(after, "notebookos_gpu_reservation_seconds")
    assert reserved > used  # reservation would have held each kernel's GPU since it started


def test_two_gpu_kernels_bind_both_devices(shared_up: Platform) -> None:
    client = shared_up.client  # 4 hosts x 2 GPUs
    kernel_id = client.start_kernel(KERNEL, env={"KERNEL_GPUS": "2"})
    try:
        with client.connect(kernel_id) as conn:
            result = conn.execute(
                "import os\nfrom jupyter_notebookos.gpu.binding import current_devices\n"
                "os.environ['CUDA_VISIBLE_DEVICES'], current_devices()"
            )
            assert result.status == "ok", result.reply["content"]
            assert result.notebookos["gpus"] == [0, 1]
            assert result.result_text() == "('0,1', [0, 1])"
        host = result.notebookos["host"]
        wait_for(lambda: committed(client)[host] == 0, 10, "both GPUs to be released")
    finally:
        client.shutdown_kernel(kernel_id)


def test_gpu_check_skips_cleanly_without_a_gpu() -> None:
    if nvml_devices():
        pytest.skip("this machine has an NVIDIA GPU: run benchmarks/gpu_check.py itself")
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check.py")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "skipped: no NVIDIA GPU (NVML not found)"
    assert time.monotonic() - began < 30  # it starts no platform


def test_interrupting_a_cell_that_waits_for_gpus_takes_it_out_of_the_queue(
    platform: Platform, kernels: list[Kernel], tmp_path: Path
) -> None:
    client = platform.client
    hosts = [h["name"] for h in cluster(client)["hosts"]]
    holds = _busy_every_host(kernels[:4], hosts, tmp_path)
    try:
        waiter = kernels[4]
        marker = tmp_path / "must-not-run"
        msg_id = waiter.send(f"open({str(marker)!r}, 'w').close()")
        wait_for(lambda: any(q["cell_id"] == msg_id for q in cluster(client)["queue"]), 10, "the cell to queue")
        client.interrupt_kernel(waiter.kernel_id)
        reply = waiter.reply(msg_id, timeout=20)
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        assert "did not run" in reply["content"]["evalue"]
        assert not any(q["cell_id"] == msg_id for q in cluster(client)["queue"])
        waiter.drain(0.5)
        assert waiter.statuses(msg_id)[-1] == "idle"
    finally:
        for held in holds:
            held.release()
    assert not marker.exists()
    # The kernel is fine afterwards.
    after = waiter.reply(waiter.send("'after'"), timeout=60)
    assert after["content"]["status"] == "ok"
