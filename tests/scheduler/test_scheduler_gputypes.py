"""GPU types, MIG slices and host pools: where replicas go, which devices a cell binds, which pool grows."""

from __future__ import annotations

import pytest
from traitlets import TraitError

from jupyter_notebookos.scheduler import (
    HostPool,
    HostSpec,
    KernelSpec,
    MigrateThenRun,
    Placement,
    PlacementRefused,
    RejectCell,
    ReplicaSlot,
    RunCell,
    Scheduler,
    WaitInQueue,
    canonical,
    parse_device_types,
    parse_wants,
)
from jupyter_notebookos.scheduler.gputypes import overlap, serves

A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"  # as NVML names it; the node label has dashes


def mixed(**knobs: object) -> Scheduler:
    hosts = [HostSpec(f"a{i}", 4, gpu_type=A100) for i in range(3)]
    hosts += [HostSpec(f"h{i}", 4, gpu_type=H100) for i in range(3)]
    return Scheduler(hosts=hosts, **knobs)


def test_type_names_from_nvml_node_labels_and_mig_resources_are_one_name() -> None:
    assert canonical("NVIDIA H100 80GB HBM3") == canonical("NVIDIA-H100-80GB-HBM3") == "nvidia-h100-80gb-hbm3"
    assert canonical("nvidia.com/mig-1g.10gb") == canonical("MIG-1g.10gb") == "mig-1g.10gb"
    assert parse_wants("h100, A100,h100") == ("h100", "a100")
    assert parse_device_types("a100*2,mig-1g.10gb*3") == ("a100", "a100", *["mig-1g.10gb"] * 3)
    with pytest.raises(ValueError, match="TYPE\\*COUNT"):
        parse_device_types("a100*two")
    # a kernel that names no type takes any whole GPU, never a MIG slice
    assert serves("a100", ()) and not serves("mig-1g.10gb", ())
    assert serves("mig-1g.10gb", ("mig-1g.10gb",)) and not serves("a100", ("h100",))
    assert overlap((), ("a100",)) and not overlap((), ("mig-1g.10gb",)) and not overlap(("a100",), ("h100",))


def test_replicas_go_only_to_hosts_with_the_wanted_type_and_cells_bind_it() -> None:
    s = mixed()
    placed = s.start_kernel("k", 2, 0.0, gpu_types=["NVIDIA-H100-80GB-HBM3"])
    assert isinstance(placed, Placement) and sorted(placed.hosts) == ["h0", "h1", "h2"]
    run = s.request_cell("k", "c1", 1.0)
    assert isinstance(run, RunCell) and run.host.startswith("h")
    status = s.kernel("k")
    assert status is not None and status.gpu_types == ("nvidia-h100-80gb-hbm3",)
    host = s.host(run.host)
    assert host is not None and host.gpu_types == (("nvidia-h100-80gb-hbm3", 4),)


def test_a_preference_list_runs_on_the_first_type_that_has_room() -> None:
    s = Scheduler(
        hosts=[HostSpec("a0", 4, gpu_type=A100), HostSpec("h0", 4, gpu_type=H100), HostSpec("a1", 4)],
        kernels=[KernelSpec("k", 2, gpu_types=(H100, A100))],
        replicas=[ReplicaSlot("k", 0, "a0"), ReplicaSlot("k", 1, "h0")],
        replicas_per_kernel=2,
    )
    first = s.request_cell("k", "c1", 1.0)
    assert isinstance(first, RunCell) and first.host == "h0"  # preferred, although a0 comes first
    s.cell_finished("k", "c1", 2.0)
    s.model.commit(s.model.hosts["h0"], 3)  # someone else's cells leave h0 one GPU
    second = s.request_cell("k", "c2", 3.0)
    assert isinstance(second, RunCell) and second.host == "a0"
    placed = s.start_kernel("j", 1, 4.0, gpu_types=[H100, A100])
    assert isinstance(placed, Placement) and "a1" not in placed.hosts  # a1's GPUs have no type


def test_a_type_no_host_has_and_no_pool_provides_is_refused_at_start() -> None:
    s = mixed()
    refused = s.start_kernel("k", 1, 0.0, gpu_types=["h200"])
    assert isinstance(refused, PlacementRefused) and not refused.scale_out_would_help
    assert refused.reason == (
        "no host has GPUs of type h200 (this cluster has nvidia-a100-sxm4-80gb x12, nvidia-h100-80gb-hbm3 x12) "
        "and no autoscaling pool provides them; ask for a type the cluster has"
    )
    too_many = s.start_kernel("k", 8, 0.0, gpu_types=[A100])
    assert isinstance(too_many, PlacementRefused)
    assert "the largest host has 4 of them; set KERNEL_GPUS to 4 or fewer" in too_many.reason
    with_pool = mixed(pools=[{"name": "h200", "gpus": 8, "gpu_type": "h200"}])
    waits = with_pool.start_kernel("k", 1, 0.0, gpu_types=["h200"])
    assert isinstance(waits, PlacementRefused) and waits.scale_out_would_help  # a host of the pool would do


def test_mig_slices_serve_only_kernels_that_name_them() -> None:
    slices = ("mig-3g.40gb",) * 2
    s = Scheduler(
        hosts=[HostSpec(f"m{i}", 3, device_types=(A100, *slices)) for i in range(3)],
    )
    assert isinstance(s.start_kernel("plain", 1, 0.0), Placement)
    assert isinstance(s.start_kernel("sliced", 2, 0.0, gpu_types=["nvidia.com/mig-3g.40gb"]), Placement)
    plain = s.request_cell("plain", "c1", 1.0)
    assert isinstance(plain, RunCell) and plain.device_ids == (0,)  # the whole A100, not a slice
    sliced = s.request_cell("sliced", "c2", 1.0)
    assert isinstance(sliced, RunCell) and sliced.device_ids == (1, 2)
    big = s.start_kernel("big", 2, 0.0)  # two whole GPUs: no host has them
    assert isinstance(big, PlacementRefused)


def test_migration_moves_a_typed_kernel_only_to_a_host_of_its_type() -> None:
    s = Scheduler(
        hosts=[HostSpec(f"a{i}", 2, gpu_type="a100") for i in range(4)]
        + [HostSpec(f"h{i}", 2, gpu_type="h100") for i in range(4)],
        kernels=[KernelSpec("k", 2, gpu_types=("h100",)), KernelSpec("busy", 2, gpu_types=("h100",))],
        replicas=[ReplicaSlot("k", r, f"h{r}") for r in range(3)] + [ReplicaSlot("busy", r, f"h{r}") for r in range(3)],
    )
    for r in range(3):  # the kernel's three hosts are full
        s.model.commit(s.model.hosts[f"h{r}"], 2)
    decision = s.request_cell("k", "c1", 1.0)
    assert isinstance(decision, MigrateThenRun) and decision.migration.target == "h3"
    again = Scheduler(
        hosts=[HostSpec(f"a{i}", 2, gpu_type="a100") for i in range(4)]
        + [HostSpec(f"h{i}", 2, gpu_type="h100") for i in range(3)],
        kernels=[KernelSpec("k", 2, gpu_types=("h100",))],
        replicas=[ReplicaSlot("k", r, f"h{r}") for r in range(3)],
    )
    for r in range(3):
        again.model.commit(again.model.hosts[f"h{r}"], 2)
    waiting = again.request_cell("k", "c1", 1.0)  # idle A100s do not help
    assert isinstance(waiting, WaitInQueue) and "of type h100" in waiting.reason
    refused = again.request_migration("k", 0, 2.0, target="a0")
    assert "a0 has no GPUs of type h100" in str(refused)


def test_cell_gpus_above_the_largest_host_of_the_type_are_rejected() -> None:
    s = mixed()
    s.start_kernel("k", 2, 0.0, gpu_types=[A100])
    rejected = s.request_cell("k", "c1", 1.0, gpus=6)
    assert isinstance(rejected, RejectCell) and "of type nvidia-a100-sxm4-80gb" in rejected.reason


def pooled(**knobs: object) -> Scheduler:
    pools = [
        {"name": "a100", "gpus": 4, "gpu_type": "a100", "min_hosts": 1, "max_hosts": 6},
        {"name": "h100", "gpus": 4, "gpu_type": "h100", "max_hosts": 2},
    ]
    hosts = [HostPool.from_config(pools[0]).host_spec(f"a100-{i}") for i in range(3)]
    return Scheduler(hosts=hosts, pools=pools, ready_host_buffer=0, idle_host_buffer=0, scale_in_delay_s=0, **knobs)


def test_an_idle_pool_shrinks_to_its_minimum_and_a_type_only_a_pool_has_asks_for_hosts() -> None:
    s = pooled()
    refused = s.start_kernel("k", 4, 0.0, gpu_types=["h100"])
    assert isinstance(refused, PlacementRefused) and refused.scale_out_would_help  # a host of pool h100 would do
    d = s.autoscale(60.0)
    assert d.action == "scale-in" and d.add_hosts == 0 and len(d.drain) == 1 and d.drain[0].startswith("a100")
    assert "pool a100: 1 (" in d.reason and "pool h100: 0 (" in d.reason


def test_waiting_cells_scale_out_their_home_pool_only() -> None:
    s = Scheduler(
        hosts=[HostSpec("a100-0", 4, gpu_type="a100", pool="a100")]
        + [HostSpec(f"h100-{i}", 4, gpu_type="h100", pool="h100") for i in range(3)],
        pools=[{"name": "a100", "gpus": 4, "gpu_type": "a100"}, {"name": "h100", "gpus": 4, "gpu_type": "h100"}],
        ready_host_buffer=0,
    )
    for k in ("k1", "k2", "k3", "k4"):
        assert isinstance(s.start_kernel(k, 4, 0.0, gpu_types=["h100"]), Placement)
        s.request_cell(k, f"{k}-c", 0.0)
    d = s.autoscale(60.0)
    assert d.action == "scale-out" and d.add_by_pool == (("h100", d.add_hosts),) and d.add_hosts >= 1
    assert f"scale out by {d.add_hosts} ({d.add_hosts} in h100)" in str(d)


def test_max_hosts_bounds_the_target_and_a_full_cluster_does_not_ask_for_hosts() -> None:
    s = Scheduler(hosts=[HostSpec(f"h{i}", 1) for i in range(3)], max_hosts=3, min_hosts=3)
    for k in ("k1", "k2", "k3", "k4"):
        s.start_kernel(k, 1, 0.0)
        s.request_cell(k, f"{k}-c", 0.0)
    d = s.autoscale(60.0)
    assert d.target_hosts == 3 and d.add_hosts == 0 and "maximum 3" in d.reason
    waiting = [q for q in s.queued_cells()]
    assert waiting
    s.start_kernel("k5", 1, 61.0)
    late = s.request_cell("k5", "x", 61.0)
    assert isinstance(late, WaitInQueue) and not late.scale_out_would_help


def test_bad_pools_are_named() -> None:
    with pytest.raises(TraitError, match="host pool x: 3 GPUs need 3 device types"):
        Scheduler(pools=[{"name": "x", "gpus": 3, "device_types": ["a100"]}])
    with pytest.raises(TraitError, match="distinct"):
        Scheduler(pools=[{"name": "x", "gpus": 1}, {"name": "x", "gpus": 2}])
