"""The dashboard's history without a gateway: queue-wait percentiles from histogram buckets, the bounded ring, each
kernel's GPU-seconds counted once (also when it ends or restarts between samples), GPU-seconds per user and UTC day
written to a real etcd and read back by the next gateway, and the machines' readings with and without NVML."""

from __future__ import annotations

import datetime
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pytest

from jupyter_notebookos.coordination import Coordinator
from jupyter_notebookos.gateway.control.history import (
    ClusterHistory,
    GpuSecondsCounter,
    HistoryRing,
    HistorySample,
    histogram_buckets,
    quantile,
)
from jupyter_notebookos.gateway.control.platformmetrics import PlatformMetrics
from jupyter_notebookos.gateway.control.readings import MachineMemory, MachineReadings
from jupyter_notebookos.gateway.control.usage import GpuUsage, utc_day
from jupyter_notebookos.gpu.discovery import GpuReading, nvml_readings

DAY = datetime.datetime(2025, 3, 1, 23, 59, 55, tzinfo=datetime.UTC).timestamp()  # 5 s before midnight UTC


# -- percentiles ----------------------------------------------------------------------------------------------


def test_quantiles_are_interpolated_within_the_bucket_as_prometheus_does() -> None:
    before = [(0.1, 10.0), (1.0, 10.0), (10.0, 10.0), (float("inf"), 10.0)]
    # 100 cells since: 50 under 0.1 s, 40 in (0.1, 1], 10 in (1, 10].
    after = [(0.1, 60.0), (1.0, 100.0), (10.0, 110.0), (float("inf"), 110.0)]
    assert quantile(0.5, before, after) == pytest.approx(0.1)
    assert quantile(0.7, before, after) == pytest.approx(0.1 + 0.9 * (70 - 50) / 40)
    assert quantile(0.95, before, after) == pytest.approx(1.0 + 9.0 * (95 - 90) / 10)
    assert quantile(0.5, after, after) is None  # nothing started in between
    # Beyond the last finite bound: that bound (what histogram_quantile answers).
    assert quantile(0.99, [], [(1.0, 0.0), (float("inf"), 5.0)]) == 1.0


def test_percentiles_come_from_the_gateways_own_histogram() -> None:
    metrics = PlatformMetrics()
    before = histogram_buckets(metrics.queued_seconds)
    for seconds in [0.003] * 90 + [2.0] * 10:
        metrics.queued_seconds.observe(seconds)
    after = histogram_buckets(metrics.queued_seconds)
    assert 0.002 < quantile(0.5, before, after) <= 0.005  # type: ignore[operator]
    assert 1.0 < quantile(0.99, before, after) <= 2.5  # type: ignore[operator]


def test_the_ring_keeps_the_newest_samples_only() -> None:
    ring = HistoryRing(3)
    for at in range(5):
        ring.add(_sample(float(at)))
    assert len(ring) == 3 and [s.at for s in ring.since(0.0)] == [2.0, 3.0, 4.0]
    assert [s.at for s in ring.since(3.0)] == [4.0]
    with pytest.raises(ValueError, match="at least one sample"):
        HistoryRing(0)


# -- GPU-seconds counted once ---------------------------------------------------------------------------------


@dataclass
class FakeRouter:
    used: float = 0.0
    running: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {"gpu_seconds_used": self.used, "gpu_seconds_running": self.running}


@dataclass
class FakeRecord:
    router: FakeRouter
    env: dict[str, str] = field(default_factory=dict)


def _owner(record: Any) -> str:
    return str(record.env.get("owner", ""))


def test_each_kernels_gpu_seconds_are_counted_once_also_when_it_ends_or_restarts() -> None:
    counter = GpuSecondsCounter(_owner)
    a, b = FakeRouter(), FakeRouter()
    kernels: dict[str, Any] = {"a": FakeRecord(a, {"owner": "alice"}), "b": FakeRecord(b)}
    assert sorted(counter.take(kernels)) == [("a", "alice", 0.0), ("b", "", 0.0)]
    a.used, a.running, b.used = 3.0, 1.5, 2.0  # a's cell has run 1.5 s so far
    assert sorted(counter.take(kernels)) == [("a", "alice", 4.5), ("b", "", 2.0)]
    a.used, a.running = 6.0, 0.0  # its cell ended: 3 s in all, 1.5 counted already
    b.used = 5.0
    del kernels["b"]  # b ended: what its router counted since is read one last time
    kernels["a"] = FakeRecord(FakeRouter(used=1.0), {"owner": "alice"})  # a restarted: a new router from 0
    assert sorted(counter.take(kernels)) == [("a", "alice", 1.0), ("a", "alice", 1.5), ("b", "", 3.0)]
    assert counter.take(kernels) == [("a", "alice", 0.0)]


# -- the round, with a platform of fakes ----------------------------------------------------------------------


class FakeViews:
    def __init__(self) -> None:
        self.queue: list[dict[str, Any]] = []
        self.committed = 0

    def cluster_snapshot(self) -> dict[str, Any]:
        hosts = [
            {"name": "host-0", "gpus": 2, "gpus_committed": self.committed, "gpus_pending": 3},
            {"name": "host-1", "gpus": 2, "gpus_committed": 0, "gpus_pending": 3},
        ]
        return {"hosts": hosts, "kernels": [], "queue": self.queue}


@dataclass
class FakePlatform:
    views: FakeViews = field(default_factory=FakeViews)
    kernels: dict[str, Any] = field(default_factory=dict)
    metrics: PlatformMetrics = field(default_factory=PlatformMetrics)
    coordinator: Coordinator | None = None


def _readings(local: bool = True) -> MachineReadings:
    return MachineReadings(
        local=local,
        host_gpus=lambda host: [],
        read_process=lambda pid: 1000 * pid,
        read_machine=lambda: MachineMemory(64 * 2**30, 40 * 2**30),
    )


@pytest.mark.asyncio
async def test_a_round_samples_gpus_queue_waits_and_gpu_seconds_per_user() -> None:
    platform = FakePlatform()
    alice, admin = FakeRouter(), FakeRouter()
    platform.kernels = {"k1": FakeRecord(alice, {"owner": "alice"}), "k2": FakeRecord(admin)}
    clock = [DAY]
    history = ClusterHistory(
        platform,  # type: ignore[arg-type]
        owner_of=_owner,
        readings=_readings(),
        clock=lambda: clock[0],
        interval=10.0,
        hours=1.0,
    )
    assert history.ring.capacity == 360
    await history.load()  # no etcd: nothing to read
    first = (await history.sample()).sample
    assert (first.gpus, first.gpus_committed, first.queued_cells, first.cells_started) == (4, 0, 0, 0)
    assert first.queue_wait_seconds == {"p50": None, "p95": None, "p99": None}

    for seconds in (0.004, 0.004, 0.004, 3.0):
        platform.metrics.queued_seconds.observe(seconds)
    platform.views.committed = 2
    platform.views.queue = [{"waiting_ms": 1500.0}, {"waiting_ms": 400.0}]
    alice.running, admin.used = 20.0, 5.0
    clock[0] += 10
    second = (await history.sample()).sample
    assert (second.gpus_committed, second.queued_cells, second.longest_wait_seconds) == (2, 2, 1.5)
    assert second.cells_started == 4
    assert second.queue_wait_seconds["p50"] is not None and second.queue_wait_seconds["p50"] <= 0.005
    assert second.queue_wait_seconds["p99"] is not None and second.queue_wait_seconds["p99"] > 2.5
    assert second.gpu_seconds_by_user == {"alice": 20.0, "(admin)": 5.0}

    snapshot = history.snapshot()
    assert [s["at"] for s in snapshot["samples"]] == [DAY, DAY + 10]
    assert history.snapshot(since=DAY)["samples"][0]["gpus_committed"] == 2
    # The round ran over midnight UTC: both users' seconds are on the new day.
    day = utc_day(DAY + 10)
    assert day != utc_day(DAY)
    assert snapshot["gpu_hours_per_user_per_day"] == [
        {"day": day, "user": "(admin)", "gpu_hours": pytest.approx(5 / 3600, abs=1e-6)},
        {"day": day, "user": "alice", "gpu_hours": pytest.approx(20 / 3600, abs=1e-6)},
    ]
    view: dict[str, Any] = {
        "kernels": [{"kernel_id": "k1", "gpu_seconds_used": 0.0, "gpu_seconds_running": 26.0, "replicas": []}],
        "hosts": [],
    }
    history.annotate(view)
    assert view["kernels"][0]["gpu_seconds_total"] == 26.0  # 20 counted at the sample, 6 since


# -- GPU-seconds per user and day in etcd ---------------------------------------------------------------------


@pytest.mark.asyncio
async def test_usage_per_user_and_day_survives_in_etcd_and_old_days_go(coordinator: Coordinator) -> None:
    usage = GpuUsage(retention_days=2)
    odd = ["alice", "a/b", "@admin", "ünï cödé"]
    for i, user in enumerate(odd):
        usage.add(f"k{i}", user, 3600.0 * (i + 1), DAY)
    usage.add("k-admin", "", 1800.0, DAY + 120)  # the admin's, the next UTC day
    first = await usage.flush(coordinator)
    assert first.written == 5 + 5 and first.deleted == 0  # 5 kernels, 5 (day, user) totals
    assert (await usage.flush(coordinator)).written == 0  # nothing changed: nothing written

    # The next gateway reads what this one wrote.
    reread = GpuUsage(retention_days=2)
    assert await reread.load(coordinator) == 10
    assert reread.per_user_per_day() == usage.per_user_per_day()
    users = {(r["user"], r["gpu_hours"]) for r in reread.per_user_per_day()}
    assert {("alice", 1.0), ("a/b", 2.0), ("@admin", 3.0), ("ünï cödé", 4.0), ("(admin)", 0.5)} == users
    assert reread.kernel_total("k1") == 7200.0

    # k1 ended while no gateway ran; a day later, the first day falls out of the retention.
    reread.keep_only({"k0", "k2", "k3", "k-admin"})
    reread.prune(DAY + 2 * 86400)
    done = await reread.flush(coordinator)
    assert done.deleted == 1 + 4
    third = GpuUsage(retention_days=2)
    await third.load(coordinator)
    assert third.kernel_total("k1") == 0.0 and third.kernel_total("k0") == 3600.0
    assert third.per_user_per_day() == [{"day": utc_day(DAY + 120), "user": "(admin)", "gpu_hours": 0.5}]


@pytest.mark.asyncio
async def test_a_restarted_history_adds_to_the_totals_a_previous_gateway_wrote(coordinator: Coordinator) -> None:
    def history_of(platform: FakePlatform) -> ClusterHistory:
        return ClusterHistory(
            platform,  # type: ignore[arg-type]
            owner_of=_owner,
            readings=_readings(),
            interval=5.0,
            usage_write_interval=0.0,
        )

    before = FakePlatform(coordinator=coordinator)
    router = FakeRouter()
    before.kernels = {"k": FakeRecord(router, {"owner": "bob"})}
    history = history_of(before)
    await history.load()
    router.used = 100.0
    assert (await history.sample()).flushed is not None  # written at every round here
    router.used = 130.0
    await history.stop()  # the last seconds are written as the gateway stops

    after = FakePlatform(coordinator=coordinator)
    again = FakeRouter(used=0.0)  # the re-attached kernel's new router counts from 0
    after.kernels = {"k": FakeRecord(again, {"owner": "bob"})}
    restarted = history_of(after)
    await restarted.load()
    again.used = 20.0
    await restarted.sample()
    assert restarted.usage.kernel_total("k") == 150.0
    assert sum(r["gpu_hours"] for r in restarted.snapshot()["gpu_hours_per_user_per_day"]) == pytest.approx(
        150 / 3600, abs=1e-6
    )


# -- the machines ---------------------------------------------------------------------------------------------


def _view() -> dict[str, Any]:
    replicas = [
        {"replica_id": "0", "host": "host-0", "pid": 3, "pod": None, "state": "ready"},
        {"replica_id": "1", "host": "host-1", "pid": 4, "pod": None, "state": "starting"},
    ]
    return {
        "kernels": [{"kernel_id": "k", "replicas": replicas}],
        "hosts": [{"name": "host-0", "simulated": True}, {"name": "host-1", "simulated": True}],
    }


def test_replica_and_host_memory_and_health_without_nvml() -> None:
    assert nvml_readings(["GPU-0"]) == {}  # no NVML on this machine: no readings, no error
    readings = MachineReadings(
        local=True,
        host_gpus=lambda host: ["GPU-0"],  # even a host that names a real GPU gets no readings without NVML
        read_process=lambda pid: 1000 * pid,
        read_machine=lambda: MachineMemory(64 * 2**30, 40 * 2**30),
    )
    view = _view()
    readings.refresh(view["kernels"], ["host-0", "host-1"])
    readings.annotate(view)
    kernel = view["kernels"][0]
    assert [r["memory_bytes"] for r in kernel["replicas"]] == [3000, 4000] and kernel["memory_bytes"] == 7000
    host0, host1 = view["hosts"]
    assert host0["memory_bytes"] == 3000 and host0["shares_machine_memory"] is True
    assert host0["machine_memory_total_bytes"] == 64 * 2**30
    assert "gpu_readings" not in host0  # no NVML: the fields are left out
    assert (host0["health"], host0["problems"]) == ("ok", [])
    assert host1["health"] == "attention" and host1["problems"] == ["1 replica(s) not registered yet"]


def test_pods_memory_is_unknown_to_the_gateway() -> None:
    readings = _readings(local=False)
    view = _view()
    readings.refresh(view["kernels"], ["host-0", "host-1"])
    readings.annotate(view)
    assert view["kernels"][0]["memory_bytes"] is None
    assert view["hosts"][0]["memory_bytes"] is None and view["hosts"][0]["shares_machine_memory"] is False


def test_nvml_readings_of_real_gpus_reach_the_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    gpus = {b"GPU-a": (37, 2 * 2**30, 80 * 2**30), b"GPU-b": (99, 79 * 2**30, 80 * 2**30)}
    fake.NVMLError = NVMLError  # type: ignore[attr-defined]
    fake.nvmlInit = lambda: None  # type: ignore[attr-defined]
    fake.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    fake.nvmlDeviceGetHandleByUUID = lambda uuid: uuid  # type: ignore[attr-defined]
    fake.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=gpus[h][0])  # type: ignore[attr-defined]
    fake.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=gpus[h][1], total=gpus[h][2])  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)

    assert nvml_readings(["GPU-a"]) == {"GPU-a": GpuReading("GPU-a", 37, 2 * 2**30, 80 * 2**30)}
    readings = MachineReadings(
        local=True,
        host_gpus=lambda host: ["GPU-a", "GPU-b"] if host == "host-0" else [],
        read_process=lambda pid: 1,
        read_machine=lambda: MachineMemory(64 * 2**30, 40 * 2**30),
    )
    view = _view()
    readings.refresh(view["kernels"], ["host-0", "host-1"])
    readings.annotate(view)
    host0 = view["hosts"][0]
    assert [g["utilization_percent"] for g in host0["gpu_readings"]] == [37, 99]
    assert host0["health"] == "attention" and "GPU 1 memory is 99% full" in host0["problems"]
    assert "gpu_readings" not in view["hosts"][1]


def _sample(at: float) -> HistorySample:
    return HistorySample(at, 4, 0, 0, 0, 0.0, 0, {"p50": None, "p95": None, "p99": None})
