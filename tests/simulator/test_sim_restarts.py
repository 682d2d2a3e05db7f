"""The production culler in whole simulations: what each policy pays for a restarted kernel, host billing,
the tail broken down by cause, and NotebookOS's pre-warming."""

from __future__ import annotations

import numpy as np
import pytest

from jupyter_notebookos.scheduler import PrewarmSettings
from jupyter_notebookos.simulator.costs import CostModel
from jupyter_notebookos.simulator.culling import apply_idle_culling
from jupyter_notebookos.simulator.metrics import tail_cause
from jupyter_notebookos.simulator.prewarm import apply_prewarm
from jupyter_notebookos.simulator.simulation import Simulation, SimulationConfig
from jupyter_notebookos.simulator.synthetic import generate
from jupyter_notebookos.simulator.workload import Session, Task, Workload

COSTS = CostModel(gpus_per_host=4, container_start_s=7.0, restore_s=11.0)


def _one_session_returning_after_the_culler() -> Workload:
    # two cells 5 hours apart: with T = 30 min the culler ends the kernel in between
    session = Session.from_tasks("s", (Task(3600, 600, 2), Task(3600 + 5 * 3600, 600, 2)))
    return apply_idle_culling(Workload("w", (session,)), 1800)


def _run(workload: Workload, policy: str, **cost_changes: float):
    costs = CostModel(**{**{f: getattr(COSTS, f) for f in COSTS.__dataclass_fields__}, **cost_changes})
    config = SimulationConfig(
        policy=policy, costs=costs, initial_hosts=4, scheduler_options={"min_hosts": 4, "idle_host_buffer": 0}
    )
    return Simulation(workload, config).run()


@pytest.mark.parametrize(
    ("policy", "second_cell_wait"),
    [("notebookos", 7.0 + 11.0), ("reservation", 7.0), ("batch", 7.0 + 11.0)],
)
def test_a_cell_after_the_culler_starts_a_new_kernel_and_pays_what_the_policy_pays(policy, second_cell_wait):
    workload = _one_session_returning_after_the_culler()
    assert [s.resumed for s in workload.sessions] == [False, True]
    metrics = _run(workload, policy)
    first, second = metrics.delays_s
    # the first kernel was started 30 minutes before its first cell (the lead); Batch pays per cell anyway
    assert first == pytest.approx(18.0 if policy == "batch" else (0.0 if policy == "reservation" else 0.005))
    extra = 0.005 if policy == "notebookos" else 0.0
    assert second == pytest.approx(second_cell_wait + extra)
    assert metrics.summary()["late_by_cause"] == {"kernel start / restore": 2 if policy == "batch" else 1}


def test_the_keep_alive_model_never_restarts_a_kernel():
    session = Session.from_tasks("s", (Task(3600, 600, 2), Task(3600 + 5 * 3600, 600, 2)))
    workload = apply_idle_culling(Workload("w", (session,)), 1800, cull_gaps=False)
    metrics = _run(workload, "notebookos")
    assert max(metrics.delays_s) == pytest.approx(0.005)
    # and Reservation holds the session's GPUs through the 5-hour gap, which the culler would have freed
    held = _run(workload, "reservation").committed_gpus.integral
    culled = _run(_one_session_returning_after_the_culler(), "reservation").committed_gpus.integral
    assert held - culled > 2 * 4 * 3600


def test_a_removed_host_is_billed_until_it_is_released():
    workload = apply_idle_culling(generate(sessions=6, hours=2, seed=3), 1800)

    def bill(release_s: float) -> tuple[float, int]:
        costs = CostModel(gpus_per_host=4, host_release_s=release_s)
        config = SimulationConfig(
            policy="notebookos", costs=costs, initial_hosts=12, scheduler_options={"min_hosts": 3}
        )
        metrics = Simulation(workload, config).run()
        return metrics.provisioned_gpus.integral, metrics.scale_ins

    quick, removed = bill(0.0)
    slow, removed_again = bill(600.0)
    assert removed == removed_again >= 9
    assert slow - quick == pytest.approx(removed * 600.0 * 4)


def test_tail_causes_name_the_costliest_wait():
    assert tail_cause("queue (scale-out) then migration") == "host provisioning"
    assert tail_cause("kernel restart then migration") == "migration"
    assert tail_cause("kernel restart") == "kernel start / restore"
    assert tail_cause("fresh replica + restore") == "kernel start / restore"
    assert tail_cause("queue") == "queueing"
    assert tail_cause("") == "other"


def test_late_and_tail_counts_add_up_on_a_crowded_cluster():
    workload = apply_idle_culling(generate(sessions=40, hours=6, seed=7), 1800)
    metrics = Simulation(workload, SimulationConfig(policy="notebookos")).run()
    summary = metrics.summary()
    late = sum(1 for d in metrics.delays_s if d > 1.0)
    assert late > 0 and sum(summary["late_by_cause"].values()) == late
    p99 = float(np.percentile(metrics.delays_s, 99))
    tail = sum(1 for d in metrics.delays_s if d > 1.0 and d >= p99)
    assert sum(summary["p99_tail_by_cause"].values()) == tail


def test_prewarming_finds_a_return_warm_when_the_sessions_history_covers_it():
    # returns 2 h, 2 h, then 2 h after each cull: from the second return on the history covers them
    tasks = tuple(Task(i * (2 * 3600 + 1800 + 600), 600, 4) for i in range(4))
    workload = apply_idle_culling(Workload("w", (Session.from_tasks("s", tasks),)), 1800)
    assert sum(s.resumed for s in workload.sessions) == 3
    prewarmed, warm, expired = apply_prewarm(workload, PrewarmSettings(quantile=1.0, margin=1.1, default_standby_s=0))
    assert (warm, expired) == (2, 0)
    # with a default window for a session without history, the first return (2 h after the cull) is warm too
    assert apply_prewarm(workload, PrewarmSettings(default_standby_s=3 * 3600))[1:] == (3, 0)
    config = SimulationConfig(policy="notebookos", costs=COSTS, initial_hosts=4, scheduler_options={"min_hosts": 4})
    cold = Simulation(workload, config).run()
    hot = Simulation(prewarmed, config).run()
    assert sorted(cold.delays_s)[-3:] == pytest.approx([18.005] * 3)
    assert sorted(hot.delays_s)[-1] == pytest.approx(18.005)  # only the first return, with no history yet
    assert sorted(hot.delays_s)[-2] == pytest.approx(0.005)


def test_an_expired_standby_window_costs_replica_slots_and_the_return_stays_cold():
    tasks = (Task(0, 600, 8), Task(3 * 3600, 600, 8), Task(20 * 3600, 600, 8))
    workload = apply_idle_culling(Workload("w", (Session.from_tasks("s", tasks),)), 1800)
    prewarmed, warm, expired = apply_prewarm(workload, PrewarmSettings(quantile=1.0, margin=1.0, default_standby_s=0))
    assert (warm, expired) == (0, 1)
    standby = [s for s in prewarmed.sessions if not s.tasks]
    (window,) = standby
    # the first kernel was culled at 2,400 s and the user came back at 10,800 s: that one return sets the
    # standby window after the second kernel's cull; the third return (16 h later) is past it
    first_return = 3 * 3600 - (600 + 1800)
    culled = 3 * 3600 + 600 + 1800
    assert (window.start_s, window.end_s, window.gpus) == (culled, culled + first_return, 8)
