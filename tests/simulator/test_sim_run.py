"""Whole simulations: conservation, the baselines' defining behaviour, determinism."""

from __future__ import annotations

import pytest

from jupyter_notebookos.simulator.costs import CostModel
from jupyter_notebookos.simulator.culling import apply_idle_culling
from jupyter_notebookos.simulator.simulation import Simulation, SimulationConfig
from jupyter_notebookos.simulator.synthetic import generate
from jupyter_notebookos.simulator.workload import Session, Task, Workload

POLICIES = ("notebookos", "reservation", "batch")


@pytest.fixture(scope="module")
def workload() -> Workload:
    # the old keep-alive model: these tests are about what each policy does with a live kernel
    return apply_idle_culling(generate(sessions=40, hours=6, seed=7), 1800, cull_gaps=False)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_task_runs_once_and_busy_gpu_hours_are_conserved(workload: Workload, policy: str):
    metrics = Simulation(workload, SimulationConfig(policy=policy)).run()
    assert metrics.tasks_run == workload.tasks
    assert metrics.decision_counts.get("CellFinished") == workload.tasks
    assert metrics.rejected_cells == 0
    assert len(metrics.delays_s) == workload.tasks and min(metrics.delays_s) >= 0
    assert metrics.busy_gpus.integral == pytest.approx(workload.busy_gpu_seconds())
    assert metrics.busy_gpus.value == 0  # nothing left running
    # a bill can never be below the work done
    assert metrics.provisioned_gpus.integral >= metrics.busy_gpus.integral


def test_reservation_never_delays_a_task_when_capacity_suffices(workload: Workload):
    # enough hosts up front for every session at once; kernels start before their first cell (lead 30 min)
    hosts = len(workload.sessions)
    config = SimulationConfig(policy="reservation", initial_hosts=hosts, scheduler_options={"min_hosts": hosts})
    metrics = Simulation(workload, config).run()
    assert metrics.delays_s and max(metrics.delays_s) == 0.0
    assert metrics.summary()["immediate_fraction"] == 1.0
    assert metrics.decision_counts.get("PlacementRefused", 0) == 0


def test_reservation_holds_gpus_for_the_whole_session():
    session = Session("s", (Task(600, 600, 4), Task(3000, 600, 4)), start_s=0, end_s=7200, life_known=True)
    costs = CostModel(gpus_per_host=4)
    config = SimulationConfig(
        policy="reservation", costs=costs, initial_hosts=1, scheduler_options={"min_hosts": 1, "idle_host_buffer": 0}
    )
    metrics = Simulation(Workload("w", (session,)), config).run()
    # the session's 4 GPUs are committed from its start until its end, although it trains 20 minutes
    assert metrics.committed_gpus.integral == pytest.approx(4 * 7200)
    assert metrics.busy_gpus.integral == pytest.approx(4 * 1200)


def test_batch_pays_start_and_restore_before_every_cell(workload: Workload):
    costs = CostModel(container_start_s=7.0, restore_s=11.0)
    hosts = len(workload.sessions)
    config = SimulationConfig(policy="batch", costs=costs, initial_hosts=hosts, scheduler_options={"min_hosts": hosts})
    metrics = Simulation(workload, config).run()
    assert metrics.restores == workload.tasks
    # with room for everyone, each cell waits exactly for its fresh replica and its restored state: the state
    # the kernel held before the cell (its previous cell's model; none before the first), read at 0.2 GB/s
    held = [
        s.tasks[k - 1].state_bytes if k else s.restore_bytes for s in workload.sessions for k in range(len(s.tasks))
    ]
    assert any(held)
    expected = sorted(7.0 + 11.0 + b / 1e9 / 0.2 for b in held)
    assert sorted(metrics.delays_s) == pytest.approx(expected)
    assert metrics.restored_bytes == sum(held)


def test_notebookos_binds_gpus_only_while_cells_run(workload: Workload):
    hosts = len(workload.sessions)
    config = SimulationConfig(policy="notebookos", initial_hosts=hosts, scheduler_options={"min_hosts": hosts})
    metrics = Simulation(workload, config).run()
    summary = metrics.summary()
    assert summary["immediate_fraction"] == 1.0
    assert max(metrics.delays_s) <= CostModel().cell_commit_s + 1e-9
    assert metrics.committed_gpus.integral == pytest.approx(workload.busy_gpu_seconds(), rel=0.05)


def test_a_seeded_run_is_deterministic():
    def once(seed: int) -> dict:
        w = apply_idle_culling(generate(sessions=25, hours=4, seed=seed), 1800)
        return {p: Simulation(w, SimulationConfig(policy=p)).run().summary() for p in POLICIES}

    assert once(3) == once(3)
    assert once(3) != once(4)
