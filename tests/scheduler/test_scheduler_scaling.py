"""Unit tests: autoscaling rounds, drains, explicit migrations, host changes and the baseline policies."""

from __future__ import annotations

from jupyter_notebookos.scheduler import (
    DrainPlan,
    HostRemoved,
    HostSpec,
    MigrationPlan,
    MigrationRefused,
    Placement,
    PlacementRefused,
    ReplicaLost,
    RunCell,
    Scheduler,
    WaitInQueue,
)


def cluster(n: int, gpus: int = 8, **knobs: object) -> Scheduler:
    return Scheduler(hosts=[HostSpec(f"host-{i}", gpus) for i in range(n)], **knobs)


def test_scale_out_by_the_difference_from_committed_gpus() -> None:
    s = cluster(3, gpus=8, scaling_factor=1.5, idle_host_buffer=1, min_hosts=3)
    for i in range(6):
        s.start_kernel(f"k{i}", 4, now=0.0)
        s.request_cell(f"k{i}", "c", now=0.0)
    d = s.autoscale(now=1.0)
    # 12 GPUs committed (3 hosts x 8 GPUs hold at most 3 cells of 4... 6 asked): queued count too
    assert d.action == "scale-out" and d.current_hosts == 3
    assert d.target_hosts == -(-(s.model.busy + s.queue.gpus_waiting()) * 3 // 16) + 1
    assert d.add_hosts == d.target_hosts - 3
    assert str(d).startswith(f"autoscaler: 3 hosts, target {d.target_hosts}: scale out by {d.add_hosts}")
    again = s.autoscale(now=2.0, hosts_provisioning=d.add_hosts)
    assert again.action == "none"  # hosts already on their way are not asked twice


def test_scale_in_is_slow_drains_idle_hosts_first_and_respects_the_floor() -> None:
    s = cluster(6, gpus=8, min_hosts=4, idle_host_buffer=0, scale_in_delay_s=30.0, max_scale_in_per_round=1)
    s.start_kernel("k1", 1, now=0.0)
    first = s.autoscale(now=0.0)
    assert first.action == "none" and "waiting 30s more" in first.reason
    d = s.autoscale(now=31.0)
    assert d.action == "scale-in" and len(d.drain) == 1
    drained = d.drain[0]
    assert s.host(drained).draining  # type: ignore[union-attr]
    for plan in d.migrations:
        assert plan.source == drained and plan.trigger == "drain"
        s.migration_finished(plan.migration_id, now=32.0)
    if not d.migrations:
        assert drained in d.remove
    s.remove_host(drained, now=33.0)
    follow = s.autoscale(now=34.0)  # the over-target clock restarted: no second drain at once
    assert follow.action == "none"
    later = s.autoscale(now=70.0)
    assert later.action == "scale-in" and later.current_hosts == 5 and later.target_hosts == 4
    for plan in later.migrations:
        s.migration_finished(plan.migration_id, now=71.0)
    for name in later.drain:
        s.remove_host(name, now=72.0)
    assert s.autoscale(now=200.0).action == "none"  # at the floor


def test_busy_hosts_are_never_drained_for_scale_in() -> None:
    s = cluster(4, gpus=1, min_hosts=1, idle_host_buffer=0, scale_in_delay_s=0.0, max_scale_in_per_round=4)
    s.start_kernel("k1", 1, now=0.0)
    run = s.request_cell("k1", "c", now=0.0)
    assert isinstance(run, RunCell)
    d = s.autoscale(now=1.0)
    assert run.host not in d.drain


def test_drain_lists_busy_replicas_as_stuck() -> None:
    s = cluster(4, gpus=2)
    s.start_kernel("k1", 1, now=0.0)
    run = s.request_cell("k1", "c", now=0.0)
    assert isinstance(run, RunCell)
    d = s.drain_host(run.host, now=1.0)
    assert isinstance(d, DrainPlan) and d.migrations == ()
    assert d.stuck == (f"r{run.replica_id} of k1 is running cell c",)
    s.cell_finished("k1", "c", now=2.0)
    again = s.drain_host(run.host, now=3.0)
    assert len(again.migrations) == 1 and again.migrations[0].target == "host-3"  # type: ignore[union-attr]


def test_an_undrained_host_takes_replicas_and_cells_again() -> None:
    s = cluster(3, gpus=1)
    s.drain_host("host-2", now=0.0)
    assert s.host("host-2").draining  # type: ignore[union-attr]
    refused = s.start_kernel("k1", 1, now=1.0)  # three replicas need three hosts that take them
    assert not isinstance(refused, Placement)
    back = s.undrain_host("host-2", now=2.0)
    assert str(back) == "host host-2 back in service: 0 replicas on it"
    assert not s.host("host-2").draining  # type: ignore[union-attr]
    placed = s.start_kernel("k2", 1, now=3.0)
    assert isinstance(placed, Placement) and "host-2" in {r.host for r in placed.replicas}
    assert "unknown host nowhere" in str(s.undrain_host("nowhere", now=4.0))


def test_explicit_migration_validates_the_target() -> None:
    s = cluster(5, gpus=1, subscription_ratio_cap=1.0)
    s.start_kernel("k1", 1, now=0.0)  # host-0, host-1, host-2
    s.start_kernel("k2", 1, now=0.0)  # host-3, host-4, host-0
    s.start_kernel("k3", 1, now=0.0)  # fills host-1..host-4 to ratio 2/3
    cases = {
        "nowhere": "unknown host nowhere",
        "host-1": "host-1 already holds a replica of kernel k1",
    }
    for target, reason in cases.items():
        d = s.request_migration("k1", 0, now=1.0, target=target)
        assert isinstance(d, MigrationRefused) and reason in str(d), d
    s.start_kernel("k4", 1, now=0.0)
    s.start_kernel("k5", 1, now=0.0)
    pairs = [
        (k, h.name)
        for k in ("k1", "k2", "k3", "k4", "k5")
        for h in s.hosts()
        if h.subscription_ratio >= 1.0 and h.name not in {r.host for r in s.kernel(k).replicas}  # type: ignore[union-attr]
    ]
    kernel_id, full = pairs[0]
    d = s.request_migration(kernel_id, s.kernel(kernel_id).replicas[0].replica_id, now=1.0, target=full)  # type: ignore[union-attr]
    assert isinstance(d, MigrationRefused) and f"{full} is full: its subscription ratio would be 1.33" in d.reason
    assert "unknown replica" in str(s.request_migration("k1", 9, now=1.0))
    assert "unknown kernel" in str(s.request_migration("zz", 0, now=1.0))


def test_explicit_migration_picks_least_subscribed_host() -> None:
    s = cluster(4)
    s.start_kernel("k1", 1, now=0.0)
    d = s.request_migration("k1", 1, now=1.0)
    assert isinstance(d, MigrationPlan) and d.target == "host-3" and d.trigger == "request"
    assert str(d) == (
        "migration m1: move replica r1 of kernel k1 from host-1 to host-3 (request): "
        "requested; host-3 is the least subscribed host that accepts it"
    )


def test_host_removal_fails_running_cell_and_places_replacements() -> None:
    s = cluster(4, gpus=1)
    s.start_kernel("k1", 1, now=0.0)
    run = s.request_cell("k1", "c", now=0.0)
    assert isinstance(run, RunCell)
    d = s.remove_host(run.host, now=1.0)
    assert isinstance(d, HostRemoved) and len(d.lost) == 1
    lost = d.lost[0]
    assert isinstance(lost, ReplicaLost) and lost.failed_cell == "c"
    assert isinstance(lost.replacement, Placement) and lost.replacement.hosts == ("host-3",)
    assert s.host("host-3").committed == 0  # type: ignore[union-attr]
    assert "failed cells c" in str(d)


def test_lost_replica_without_room_says_scaling_out_helps_then_recovers() -> None:
    s = cluster(3, gpus=1)
    s.start_kernel("k1", 1, now=0.0)
    gone = s.remove_host("host-0", now=1.0)
    lost = gone.lost[0]  # type: ignore[union-attr]
    assert isinstance(lost, ReplicaLost) and isinstance(lost.replacement, PlacementRefused)
    assert "only 0 hosts accept new replicas" in str(lost)
    assert lost.replacement.scale_out_would_help
    s.add_host(HostSpec("host-new", 1), now=2.0)
    again = s.place_missing_replicas("k1", now=3.0)
    assert isinstance(again, Placement) and again.hosts == ("host-new",)


def test_reservation_holds_gpus_for_the_session() -> None:
    s = cluster(2, gpus=2, policy="reservation")
    p = s.start_kernel("k1", 2, now=0.0)
    assert isinstance(p, Placement) and len(p.replicas) == 1 and p.held_devices == (0, 1)
    assert s.host(p.hosts[0]).committed == 2  # type: ignore[union-attr]  # held while idle
    run = s.request_cell("k1", "c", now=1.0)
    assert isinstance(run, RunCell) and run.reason == "reserved"
    s.cell_finished("k1", "c", now=2.0)
    assert s.host(p.hosts[0]).committed == 2  # type: ignore[union-attr]  # still held
    s.start_kernel("k2", 2, now=0.0)
    refused = s.start_kernel("k3", 1, now=0.0)
    assert isinstance(refused, PlacementRefused) and "idle GPUs to reserve" in refused.reason
    s.stop_kernel("k1", now=3.0)
    assert s.host(p.hosts[0]).committed == 0  # type: ignore[union-attr]


def test_batch_starts_a_fresh_replica_per_cell() -> None:
    s = cluster(2, gpus=1, policy="batch")
    p = s.start_kernel("k1", 1, now=0.0)
    assert isinstance(p, Placement) and p.replicas == ()
    first = s.request_cell("k1", "c1", now=1.0)
    assert isinstance(first, RunCell) and first.reason == "fresh-replica"
    done = s.cell_finished("k1", "c1", now=2.0)
    assert done.retired_replica == first.replica_id  # type: ignore[union-attr]
    second = s.request_cell("k1", "c2", now=3.0)
    assert isinstance(second, RunCell) and second.replica_id != first.replica_id
    s.start_kernel("k2", 1, now=0.0)
    s.request_cell("k2", "x", now=3.0)
    s.start_kernel("k3", 1, now=0.0)
    assert isinstance(s.request_cell("k3", "y", now=3.0), WaitInQueue)


def _fill(s: Scheduler, host: str, gpus: int, now: float) -> None:
    """Commit ``gpus`` GPUs of ``host`` with a kernel that has its only replica there."""
    kid = f"fill-{host}-{gpus}"
    s.start_kernel(kid, gpus, now=now)
    kernel = s.kernel(kid)
    assert kernel is not None
    for replica in kernel.replicas:
        if replica.host == host:
            d = s.request_cell(kid, "c", now=now, prefer=replica.replica_id)
            assert isinstance(d, RunCell) and d.host == host
            return
    raise AssertionError(f"{kid} has no replica on {host}")


def test_idle_kernel_is_moved_ahead_of_time_to_a_host_that_can_bind_its_gpus() -> None:
    s = cluster(3, replicas_per_kernel=3, min_hosts=0, ready_host_buffer=0, executor_fit="sticky")
    s.start_kernel("big", 8, now=0.0)  # replicas on host-0, host-1, host-2
    for h in ("host-0", "host-1", "host-2"):
        _fill(s, h, 1, now=1.0)  # no host can bind 8 GPUs any more
    s.add_host(HostSpec("host-3", 8), now=2.0)
    d = s.autoscale(now=60.0)
    assert d.prepared == ("big",)
    (plan,) = [p for p in d.migrations if p.trigger == "prepare"]
    assert plan.kernel_id == "big" and plan.target == "host-3"
    assert "ahead of time" in plan.why and "idle kernels moved ahead of time (big)" in str(d)
    done = s.migration_finished(plan.migration_id, now=80.0)
    assert done.run is None  # type: ignore[union-attr]
    cell = s.request_cell("big", "c", now=90.0)
    assert isinstance(cell, RunCell) and cell.host == "host-3" and cell.queued_s == 0.0
    assert s.autoscale(now=120.0).prepared == ()  # running kernels are not moved


def test_ahead_of_time_moves_skip_busy_kernels_and_respect_the_round_budget() -> None:
    s = cluster(3, min_hosts=0, ready_host_buffer=0, max_prepare_migrations_per_round=1, scale_in_delay_s=1e9)
    for k in ("a", "b"):
        s.start_kernel(k, 8, now=0.0)
    for h in ("host-0", "host-1", "host-2"):
        _fill(s, h, 1, now=1.0)
    s.add_host(HostSpec("host-3", 8), now=2.0)
    s.add_host(HostSpec("host-4", 8), now=2.0)
    first = s.autoscale(now=60.0)
    assert first.prepared == ("a",)  # one per round, in kernel order among equal requests
    second = s.autoscale(now=120.0)
    assert second.prepared == ("b",)
    targets = {p.target for p in first.migrations + second.migrations if p.trigger == "prepare"}
    assert targets == {"host-3", "host-4"}  # the second kernel does not count on the host the first claimed
    off = cluster(3, min_hosts=0, ready_host_buffer=0, max_prepare_migrations_per_round=0)
    off.start_kernel("a", 8, now=0.0)
    for h in ("host-0", "host-1", "host-2"):
        _fill(off, h, 1, now=1.0)
    off.add_host(HostSpec("host-3", 8), now=2.0)
    assert off.autoscale(now=60.0).prepared == ()


def test_ready_host_buffer_scales_out_when_no_host_can_bind_the_largest_request() -> None:
    s = cluster(3, min_hosts=0, idle_host_buffer=0, ready_host_buffer=2, max_prepare_migrations_per_round=0)
    s.start_kernel("big", 8, now=0.0)
    for h in ("host-0", "host-1", "host-2"):
        _fill(s, h, 1, now=1.0)  # 3 GPUs busy: the GPU count alone asks for 1 host
    d = s.autoscale(now=60.0)
    assert d.action == "scale-out" and d.target_hosts == 5 and d.add_hosts == 2
    assert "3 hosts not ready for 8 GPUs + 2 ready" in d.reason


def test_ready_host_buffer_keeps_ready_hosts_at_scale_in() -> None:
    s = cluster(5, min_hosts=0, idle_host_buffer=0, ready_host_buffer=2, scale_in_delay_s=0)
    s.start_kernel("big", 8, now=0.0)
    d = s.autoscale(now=60.0)  # five idle hosts: three over the buffer... but pending needs its hosts too
    assert d.target_hosts == 2 and d.action == "scale-in" and len(d.drain) == 1
    without = cluster(5, min_hosts=0, idle_host_buffer=0, ready_host_buffer=0, scale_in_delay_s=0)
    without.start_kernel("big", 8, now=0.0)
    assert without.autoscale(now=60.0).target_hosts == 1


def test_ready_host_buffer_applies_to_notebookos_only() -> None:
    s = cluster(5, policy="reservation", min_hosts=0, idle_host_buffer=0, ready_host_buffer=3)
    s.start_kernel("big", 8, now=0.0)  # holds a whole host for the session
    d = s.autoscale(now=60.0)
    assert d.target_hosts == 2 and "ready" not in d.reason  # ceil(8 x 1.1 / 8), no ready hosts on top
