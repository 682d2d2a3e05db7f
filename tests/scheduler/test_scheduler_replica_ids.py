"""Unit tests: the scheduler hands out every replica id; a migrated replica is a new id in its old place."""

from __future__ import annotations

from jupyter_notebookos.scheduler import (
    HostRemoved,
    HostSpec,
    KernelSpec,
    MigrateThenRun,
    MigrationCompleted,
    MigrationFailed,
    MigrationPlan,
    Placement,
    ReplicaLost,
    ReplicaSlot,
    RunCell,
    Scheduler,
)


def cluster(n: int, gpus: int = 8, **knobs: object) -> Scheduler:
    return Scheduler(hosts=[HostSpec(f"host-{i}", gpus) for i in range(n)], **knobs)


def replicas(s: Scheduler, kernel_id: str) -> list[tuple[int, str]]:
    """The kernel's replicas in the scheduler's own order (the order that breaks ties)."""
    return list(s.model.kernels[kernel_id].replicas.items())


def test_a_migration_target_gets_a_new_id_that_takes_the_old_ones_place() -> None:
    s = cluster(4)
    placed = s.start_kernel("k1", 1, now=0.0)
    assert isinstance(placed, Placement) and [r.replica_id for r in placed.replicas] == [0, 1, 2]
    plan = s.request_migration("k1", 1, now=1.0)
    assert isinstance(plan, MigrationPlan) and plan.replica_id == 1 and plan.new_replica_id == 3
    assert [rid for rid, _ in replicas(s, "k1")] == [0, 1, 2]  # not a replica before the move is done
    done = s.migration_finished(plan.migration_id, now=2.0)
    assert isinstance(done, MigrationCompleted)
    assert replicas(s, "k1") == [(0, "host-0"), (3, plan.target), (2, "host-2")]
    assert f"moved from host-1 to {plan.target} (now r3)" in str(done)
    assert ("k1", 3) in s.model.hosts[plan.target].replicas and ("k1", 1) not in s.model.hosts["host-1"].replicas
    assert "unknown replica" in str(s.request_migration("k1", 1, now=3.0))  # the old id is gone for good


def test_a_failed_migration_keeps_the_old_id_and_never_reuses_the_new_one() -> None:
    s = cluster(5)
    s.start_kernel("k1", 1, now=0.0)
    first = s.request_migration("k1", 0, now=1.0)
    assert isinstance(first, MigrationPlan) and first.new_replica_id == 3
    failed = s.migration_finished(first.migration_id, now=2.0, ok=False, error="did not register")
    assert isinstance(failed, MigrationFailed)
    assert [rid for rid, _ in replicas(s, "k1")] == [0, 1, 2]
    second = s.request_migration("k1", 0, now=3.0)
    assert isinstance(second, MigrationPlan) and second.new_replica_id == 4


def test_replacements_and_migrations_draw_from_one_sequence() -> None:
    s = cluster(5)
    s.start_kernel("k1", 1, now=0.0)
    plan = s.request_migration("k1", 2, now=1.0)
    assert isinstance(plan, MigrationPlan)
    s.migration_finished(plan.migration_id, now=2.0)
    lost = s.replica_lost("k1", 0, now=3.0)
    assert isinstance(lost, ReplicaLost) and isinstance(lost.replacement, Placement)
    assert [r.replica_id for r in lost.replacement.replicas] == [4]
    ids = [rid for rid, _ in replicas(s, "k1")]
    assert sorted(ids) == [1, 3, 4] and len(set(ids)) == 3


def test_ties_still_go_to_the_migrated_replicas_place() -> None:
    # Every host is as idle as the others: best-fit breaks the tie by the replica's place, and a migrated
    # replica keeps its predecessor's (r0 -> r3 here), as it did when it kept the id.
    s = cluster(4)
    s.start_kernel("k1", 1, now=0.0)
    plan = s.request_migration("k1", 0, now=1.0)
    assert isinstance(plan, MigrationPlan) and plan.target == "host-3"
    s.migration_finished(plan.migration_id, now=2.0)
    run = s.request_cell("k1", "c1", now=3.0)
    assert isinstance(run, RunCell) and run.replica_id == 3 and run.host == "host-3"


def test_the_last_executor_stays_sticky_through_its_migration() -> None:
    s = cluster(4)
    s.start_kernel("k1", 1, now=0.0)
    first = s.request_cell("k1", "c1", now=1.0)
    assert isinstance(first, RunCell) and first.replica_id == 0
    s.cell_finished("k1", "c1", now=2.0)
    plan = s.request_migration("k1", 0, now=3.0)
    assert isinstance(plan, MigrationPlan)
    s.migration_finished(plan.migration_id, now=4.0)
    assert s.model.kernels["k1"].last_executor == plan.new_replica_id


def test_a_cell_waiting_for_a_migration_runs_on_the_new_id() -> None:
    s = cluster(4, gpus=2)
    s.start_kernel("k1", 2, now=0.0)
    for host in ("host-0", "host-1", "host-2"):
        s.model.commit(s.model.hosts[host], 2)  # every replica's host is busy: only a move frees GPUs
    decision = s.request_cell("k1", "c", now=1.0)
    assert isinstance(decision, MigrateThenRun)
    plan = decision.migration
    done = s.migration_finished(plan.migration_id, now=2.0)
    assert isinstance(done, MigrationCompleted) and done.run is not None
    assert done.run.replica_id == plan.new_replica_id and done.run.host == plan.target
    lost = s.replica_lost("k1", plan.new_replica_id, now=3.0)  # the cell runs on the new id
    assert isinstance(lost, ReplicaLost) and lost.failed_cell == "c"


def test_removing_a_migrations_target_fails_it_and_the_new_id_never_appears() -> None:
    s = cluster(4)
    s.start_kernel("k1", 1, now=0.0)
    plan = s.request_migration("k1", 1, now=1.0, target="host-3")
    assert isinstance(plan, MigrationPlan)
    gone = s.remove_host("host-3", now=2.0)
    assert isinstance(gone, HostRemoved) and gone.lost == ()
    assert [rid for rid, _ in replicas(s, "k1")] == [0, 1, 2]
    assert s.model.migrations == {}


def test_adopted_replicas_are_ordered_by_id() -> None:
    s = cluster(4)
    slots = [ReplicaSlot("k1", 10, "host-0"), ReplicaSlot("k1", 2, "host-1"), ReplicaSlot("k1", 7, "host-2")]
    s.adopt([KernelSpec("k1", 1)], slots, now=0.0)
    assert [rid for rid, _ in replicas(s, "k1")] == [2, 7, 10]
    run = s.request_cell("k1", "c", now=1.0)
    assert isinstance(run, RunCell) and run.replica_id == 2  # all as idle: the oldest id wins, as before
    plan = s.request_migration("k1", 7, now=2.0)
    assert isinstance(plan, MigrationPlan) and plan.new_replica_id == 11
