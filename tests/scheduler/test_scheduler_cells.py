"""Unit tests: placement, executor choice, queueing and rejection, asserted on decision objects."""

from __future__ import annotations

import pytest

from jupyter_notebookos.scheduler import (
    CellFinished,
    HostSpec,
    KernelSpec,
    MigrateThenRun,
    MigrationCompleted,
    MigrationFailed,
    Placement,
    PlacementRefused,
    QueueDispatch,
    RejectCell,
    ReplicaSlot,
    RunCell,
    RunningCellSpec,
    Scheduler,
    WaitInQueue,
)


def cluster(n: int = 4, gpus: int = 8, **knobs: object) -> Scheduler:
    return Scheduler(hosts=[HostSpec(f"host-{chr(97 + i)}", gpus) for i in range(n)], **knobs)


def test_placement_uses_three_distinct_least_subscribed_hosts() -> None:
    s = cluster(4)
    first = s.start_kernel("k1", 2, now=0.0)
    second = s.start_kernel("k2", 2, now=0.0)
    assert isinstance(first, Placement) and isinstance(second, Placement)
    assert first.hosts == ("host-a", "host-b", "host-c")
    assert second.hosts[0] == "host-d"  # the only host without pending GPUs goes first
    assert len(set(second.hosts)) == 3
    assert str(first).startswith("kernel k1 (2 GPUs) placed r0@host-a, r1@host-b, r2@host-c: least subscribed")


def test_admission_refuses_hosts_above_the_cap_and_says_scaling_out_helps() -> None:
    s = cluster(3, gpus=1, subscription_ratio_cap=1.0)
    assert isinstance(s.start_kernel("k1", 1, now=0.0), Placement)  # each host: 1 pending / 1 GPU / 3
    assert isinstance(s.start_kernel("k2", 1, now=0.0), Placement)
    assert isinstance(s.start_kernel("k3", 1, now=0.0), Placement)  # ratio now exactly 1.0 everywhere
    refused = s.start_kernel("k4", 1, now=0.0)
    assert isinstance(refused, PlacementRefused)
    assert refused.hosts_short == 3 and refused.scale_out_would_help
    assert "only 0 hosts qualify, 3 distinct hosts needed: 3 would rise above the subscription ratio limit 1.00" in str(
        refused
    )
    assert s.kernel("k4") is None  # nothing recorded


def test_placement_refused_when_too_few_hosts() -> None:
    s = cluster(2)
    refused = s.start_kernel("k1", 1, now=0.0)
    assert isinstance(refused, PlacementRefused)
    assert "only 2 hosts accept new replicas" in refused.reason


def test_cell_runs_sticky_then_moves_to_most_idle_replica_host() -> None:
    s = cluster(3, gpus=2, executor_fit="sticky")
    s.start_kernel("k1", 2, now=0.0)
    s.start_kernel("k2", 2, now=0.0)  # same three hosts
    first = s.request_cell("k1", "c1", now=1.0)
    assert isinstance(first, RunCell) and first.reason == "most-idle" and first.host == "host-a"
    s.cell_finished("k1", "c1", now=2.0)
    again = s.request_cell("k1", "c2", now=3.0)
    assert isinstance(again, RunCell) and again.reason == "sticky" and again.host == "host-a"
    assert str(again) == (
        "cell c2 of kernel k1 runs on replica r0 at host-a (2 GPUs, devices 0,1): "
        "sticky: previous executor's host host-a has 2 of 2 GPUs idle"
    )
    s.cell_finished("k1", "c2", now=4.0)
    busy = s.request_cell("k2", "x", now=5.0)  # k2's replica r0 is also on host-a
    assert isinstance(busy, RunCell) and busy.host == "host-a"
    moved = s.request_cell("k1", "c3", now=6.0)
    assert isinstance(moved, RunCell) and moved.reason == "most-idle" and moved.host != "host-a"
    assert "previous executor's host host-a has 0 of 2 GPUs idle" in str(moved)


def test_cell_needing_more_gpus_than_any_host_is_rejected_at_once() -> None:
    s = cluster(3, gpus=4, gpus_per_host=4)
    s.start_kernel("k1", 1, now=0.0)
    rejected = s.request_cell("k1", "c1", now=1.0, gpus=5)
    assert isinstance(rejected, RejectCell)
    assert "asks for 5 GPUs but the largest host has 4" in str(rejected)
    assert isinstance(s.request_cell("nope", "c1", now=1.0), RejectCell)


def test_zero_gpu_cells_never_wait_for_gpus() -> None:
    s = cluster(3, gpus=1)
    s.start_kernel("k1", 0, now=0.0)
    s.start_kernel("hog", 1, now=0.0)
    d = s.request_cell("k1", "c1", now=1.0)
    assert isinstance(d, RunCell) and d.device_ids == () and "no devices" in str(d)


def busy_cluster() -> Scheduler:
    """Hosts a, b, c (1 GPU each) busy with other kernels' cells; host d idle; k1 lives on a, b, c."""
    hogs = [f"hog-{h}" for h in "abc"]
    return Scheduler(
        hosts=[HostSpec(f"host-{h}", 1) for h in "abcd"],
        kernels=[KernelSpec("k1", 1)] + [KernelSpec(k, 1) for k in hogs],
        replicas=[ReplicaSlot("k1", i, f"host-{h}") for i, h in enumerate("abc")]
        + [ReplicaSlot(k, 0, f"host-{k[-1]}") for k in hogs],
        running=[RunningCellSpec(k, "x", 0, (0,), 0.0) for k in hogs],
    )


def test_migration_when_no_replica_host_can_bind() -> None:
    s = busy_cluster()
    decision = s.request_cell("k1", "c1", now=2.0)
    assert isinstance(decision, MigrateThenRun)
    plan = decision.migration
    assert plan.target == "host-d" and plan.trigger == "cell" and plan.cell_id == "c1"
    assert plan.source in ("host-a", "host-b", "host-c")
    assert "no replica's host can bind 1 GPUs now (idle: host-a 0/1, host-b 0/1, host-c 0/1)" in str(decision)
    assert "is on the most subscribed of the kernel's hosts" in plan.why
    assert s.host("host-d").idle == 0  # type: ignore[union-attr]  # reserved for the cell
    done = s.migration_finished(plan.migration_id, now=7.0)
    assert isinstance(done, MigrationCompleted) and done.run is not None
    assert done.run.reason == "migrated" and done.run.host == "host-d"
    assert done.run.queued_s == pytest.approx(5.0)
    hosts = {r.host for r in s.kernel("k1").replicas}  # type: ignore[union-attr]
    assert "host-d" in hosts and plan.source not in hosts and len(hosts) == 3


def test_failed_migration_keeps_old_replica_and_requeues_cell_at_front() -> None:
    s = busy_cluster()
    decision = s.request_cell("k1", "c1", now=2.0)
    assert isinstance(decision, MigrateThenRun)
    failed = s.migration_finished(decision.migration.migration_id, now=3.0, ok=False, error="target died")
    assert isinstance(failed, MigrationFailed) and failed.requeued_cell == "c1"
    assert "keeps serving at" in str(failed) and "back at the front of the queue" in str(failed)
    assert s.host("host-d").idle == 1  # type: ignore[union-attr]
    assert [c.cell_id for c in s.queued_cells()] == ["c1"]
    again = s.dispatch_queued(now=3.0)
    assert isinstance(again.started[0], MigrateThenRun)


def test_wait_in_queue_then_dispatch_in_fifo_order() -> None:
    s = cluster(3, gpus=1, migration_enabled=False)
    for k in ("k1", "k2", "k3"):
        s.start_kernel(k, 1, now=0.0)
    runs = [s.request_cell(k, "c", now=1.0) for k in ("k1", "k2", "k3")]
    assert all(isinstance(r, RunCell) for r in runs)
    s.start_kernel("k4", 1, now=1.0)
    s.start_kernel("k5", 1, now=1.0)
    w4 = s.request_cell("k4", "c", now=2.0)
    w5 = s.request_cell("k5", "c", now=3.0)
    assert isinstance(w4, WaitInQueue) and w4.position == 1
    assert isinstance(w5, WaitInQueue) and w5.position == 2
    assert "no replica's host can bind 1 GPUs now" in w4.reason and "migration is disabled" in w4.reason
    s.cell_finished("k1", "c", now=4.0)
    d = s.dispatch_queued(now=4.0)
    assert isinstance(d, QueueDispatch) and [x.kernel_id for x in d.started] == ["k4"]
    assert d.started[0].queued_s == pytest.approx(2.0)
    assert str(d) == "dispatched 1 queued cells (c of k4); 1 still waiting"
    assert s.dispatch_queued(now=4.0).started == ()  # idempotent: nothing more can run


def test_queue_is_round_robin_across_kernels() -> None:
    s = cluster(3, gpus=1, migration_enabled=False)
    for k in ("a", "b", "c", "greedy", "polite"):
        s.start_kernel(k, 1, now=0.0)
    for k in ("a", "b", "c"):
        s.request_cell(k, "x", now=0.0)
    for i in range(3):
        assert isinstance(s.request_cell("greedy", f"g{i}", now=1.0 + i), WaitInQueue)
    assert isinstance(s.request_cell("polite", "p0", now=10.0), WaitInQueue)
    order = []
    for t, k in enumerate(("a", "b", "c")):
        s.cell_finished(k, "x", now=20.0 + t)
        order += [(d.kernel_id, d.cell_id) for d in s.dispatch_queued(now=20.0 + t).started]
        if order and order[-1][0] == "greedy":
            s.cell_finished("greedy", order[-1][1], now=20.5 + t)
            order += [(d.kernel_id, d.cell_id) for d in s.dispatch_queued(now=20.5 + t).started]
    # greedy's second cell goes behind polite, who asked while greedy's first cell waited
    assert order[:2] == [("greedy", "g0"), ("polite", "p0")]


def test_cancel_queued_cell_and_unknown_finish() -> None:
    s = cluster(3, gpus=1)
    s.start_kernel("k1", 1, now=0.0)
    s.request_cell("k1", "c1", now=0.0)
    assert isinstance(s.request_cell("k1", "c2", now=0.0), WaitInQueue)
    left = s.cell_finished("k1", "c2", now=1.0)
    assert isinstance(left, CellFinished) and left.was_queued
    assert "ignored cell finished" in str(s.cell_finished("k1", "zzz", now=1.0))


def test_rebuild_from_ledger_state() -> None:
    s = Scheduler(
        hosts=[HostSpec("h1", 2), HostSpec("h2", 2), HostSpec("h3", 2, device_ids=(4, 5))],
        kernels=[KernelSpec("k1", 2)],
        replicas=[ReplicaSlot("k1", 0, "h1"), ReplicaSlot("k1", 1, "h2"), ReplicaSlot("k1", 5, "h3")],
        running=[RunningCellSpec("k1", "c1", 5, (4, 5), started_at=10.0)],
    )
    assert s.host("h3").idle == 0  # type: ignore[union-attr]
    finished = s.cell_finished("k1", "c1", now=12.0)
    assert isinstance(finished, CellFinished) and finished.released_devices == (4, 5) and finished.ran_s == 2.0
    with pytest.raises(ValueError, match="already committed"):
        Scheduler(
            hosts=[HostSpec("h1", 1)],
            kernels=[KernelSpec("k1", 1), KernelSpec("k2", 1)],
            replicas=[ReplicaSlot("k1", 0, "h1"), ReplicaSlot("k2", 0, "h1")],
            running=[RunningCellSpec("k1", "a", 0, (0,), 0.0), RunningCellSpec("k2", "b", 0, (0,), 0.0)],
        )


def test_knobs_come_from_traitlets_config() -> None:
    from traitlets.config import Config

    c = Config()
    c.Scheduler.subscription_ratio_cap = 1.5
    c.Scheduler.policy = "batch"
    s = Scheduler(config=c)
    assert s.settings.subscription_ratio_cap == 1.5 and s.settings.policy == "batch"
    assert all(t.help for t in s.traits(config=True).values())


def test_dispatch_starts_several_cells_in_queue_order_after_capacity_arrives() -> None:
    s = cluster(3, gpus=1, max_concurrent_migrations=0)
    for k in ("a", "b", "c", "k4", "k5"):
        s.start_kernel(k, 1, now=0.0)
    for k in ("a", "b", "c"):
        assert isinstance(s.request_cell(k, "x", now=0.0), RunCell)
    w4 = s.request_cell("k4", "x", now=1.0)
    w5 = s.request_cell("k5", "x", now=2.0)
    assert isinstance(w4, WaitInQueue) and "0 migrations are already in flight" in w4.reason
    assert isinstance(w5, WaitInQueue) and not w5.scale_out_would_help
    s.add_host(HostSpec("host-d", 2), now=3.0)
    s.max_concurrent_migrations = 4  # knobs may change at run time
    d = s.dispatch_queued(now=3.0)
    assert [(x.kernel_id, type(x).__name__) for x in d.started] == [("k4", "MigrateThenRun"), ("k5", "MigrateThenRun")]
    assert [x.device_ids for x in d.started] == [(0,), (1,)]  # type: ignore[union-attr]


def test_a_requested_replica_wins_when_its_host_can_bind_the_gpus() -> None:
    s = cluster(3, gpus=1)
    s.start_kernel("k1", 1, now=0.0)
    first = s.request_cell("k1", "c1", now=1.0)
    assert isinstance(first, RunCell) and first.replica_id == 0
    s.cell_finished("k1", "c1", now=2.0)
    asked = s.request_cell("k1", "c2", now=3.0, prefer=2)
    assert isinstance(asked, RunCell) and asked.replica_id == 2 and asked.reason == "requested"
    assert str(asked).endswith("requested by the client: host-c has 1 of 1 GPUs idle")
    s.cell_finished("k1", "c2", now=4.0)
    # Sticky again afterwards: the requested replica is now the previous executor.
    again = s.request_cell("k1", "c3", now=5.0)
    assert isinstance(again, RunCell) and again.replica_id == 2 and again.reason == "sticky"
    s.cell_finished("k1", "c3", now=6.0)
    # A replica that does not exist (or whose host is busy) is ignored: the usual order applies.
    unknown = s.request_cell("k1", "c4", now=7.0, prefer=9)
    assert isinstance(unknown, RunCell) and unknown.reason == "sticky"


def test_best_fit_executor_packs_small_cells_and_keeps_a_whole_host_idle() -> None:
    s = cluster(3, gpus=8)
    s.start_kernel("small", 1, now=0.0)  # a replica on every host
    s.start_kernel("big", 8, now=0.0)
    s.start_kernel("busy", 4, now=0.0)
    busy = s.request_cell("busy", "b", now=1.0)  # 4 GPUs on one host
    assert isinstance(busy, RunCell)
    first = s.request_cell("small", "c1", now=2.0)
    assert isinstance(first, RunCell) and first.reason == "best-fit"
    assert first.host == busy.host  # the 1-GPU cell went to the host that was already partly busy
    assert "fewest idle GPUs that suffice (4 of 8 GPUs idle)" in first.detail
    big = s.request_cell("big", "c", now=3.0)
    assert isinstance(big, RunCell) and big.gpus == 8  # two hosts stayed whole


def test_sticky_executor_spreads_small_cells_onto_whole_hosts() -> None:
    s = cluster(3, gpus=8, executor_fit="sticky")
    s.start_kernel("small", 1, now=0.0)
    s.start_kernel("busy", 4, now=0.0)
    s.request_cell("busy", "b", now=1.0)
    first = s.request_cell("small", "c1", now=2.0)
    assert isinstance(first, RunCell) and first.reason == "most-idle"
    assert "8 of 8 GPUs idle" in first.detail
