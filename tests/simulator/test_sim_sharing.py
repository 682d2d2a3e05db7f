"""The simulator with users, quotas and typed pools: the flood scenario's targets, and nothing changes without them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from jupyter_notebookos.simulator.cli import main
from jupyter_notebookos.simulator.costs import CostModel
from jupyter_notebookos.simulator.culling import apply_idle_culling
from jupyter_notebookos.simulator.metrics import PolicyMetrics
from jupyter_notebookos.simulator.scenarios import FLOOD_GPUS_PER_HOST, FLOOD_HOSTS, flood
from jupyter_notebookos.simulator.simulation import Simulation, SimulationConfig
from jupyter_notebookos.simulator.synthetic import generate
from jupyter_notebookos.simulator.users import assign_users

QUOTA_6_OF_8 = {"users": {"alice": {"gpus": 6}}}


def flood_run(kernels: int = 5, seed: int = 0, **knobs: Any) -> PolicyMetrics:
    """Half an hour of the flood scenario on its fixed cluster of 4 hosts x 2 GPUs."""
    config = SimulationConfig(
        policy="notebookos",
        costs=CostModel(gpus_per_host=FLOOD_GPUS_PER_HOST),
        scheduler_options={"min_hosts": FLOOD_HOSTS, "max_hosts": FLOOD_HOSTS, **knobs},
        initial_hosts=FLOOD_HOSTS,
    )
    return Simulation(flood(hours=0.5, flood_kernels=kernels, seed=seed), config).run()


def bob_p50(metrics: PolicyMetrics) -> float:
    return float(np.median(metrics.user_delays["bob"]))


def release_gap_s(metrics: PolicyMetrics) -> float:
    """Mean time between two of alice's cells ending (one release of 2 GPUs)."""
    return (metrics.end_s - 60.0) / len(metrics.user_delays["alice"])


@pytest.fixture(scope="module")
def idle() -> PolicyMetrics:
    return flood_run(kernels=0)


@pytest.fixture(scope="module")
def round_robin() -> PolicyMetrics:
    return flood_run(fair_share=False)


@pytest.fixture(scope="module")
def fair() -> PolicyMetrics:
    return flood_run()


def test_bob_alone_waits_only_for_the_commit(idle: PolicyMetrics) -> None:
    assert bob_p50(idle) == pytest.approx(CostModel().cell_commit_s)
    assert idle.summary()["jain_index"] == 1.0


def test_under_a_flood_bob_runs_at_the_next_release_with_fair_share(
    round_robin: PolicyMetrics, fair: PolicyMetrics
) -> None:
    # first come, first served: bob waits for alice's cells queued before his, about two releases
    assert bob_p50(round_robin) >= 1.8 * release_gap_s(round_robin)
    # fair share: about one release gap (the time to the next release on one of his hosts)
    assert bob_p50(fair) <= 1.0 * release_gap_s(fair)
    assert bob_p50(fair) < 0.5 * bob_p50(round_robin)
    assert fair.summary()["jain_index"] > round_robin.summary()["jain_index"]
    # alice loses nothing by it: her cells wait no longer than first come, first served
    assert np.median(fair.user_delays["alice"]) <= np.median(round_robin.user_delays["alice"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_with_alice_held_to_6_of_8_gpus_bob_waits_as_on_an_idle_cluster(idle: PolicyMetrics, seed: int) -> None:
    quota = flood_run(seed=seed, quotas=QUOTA_6_OF_8)
    assert bob_p50(quota) <= 1.2 * bob_p50(idle)
    assert quota.summary()["jain_index"] > 0.95
    busy = quota.busy_gpus.samples_v
    assert max(busy) <= 7  # alice's 6 and bob's 1: never more


def test_with_no_users_the_simulation_is_the_same_with_sharing_knobs_on() -> None:
    workload = apply_idle_culling(generate(sessions=30, hours=4, seed=3), 1800)
    base = Simulation(workload, SimulationConfig(policy="notebookos")).run().summary()
    # owners of one user, no quotas: fair share has nothing to order, and the figures are the same
    owned = assign_users(workload, 1)
    same = Simulation(owned, SimulationConfig(policy="notebookos")).run().summary()
    users = same.pop("users")
    same.pop("jain_index")
    assert same == base and set(users) == {"user0"}


def test_sessions_as_users_keep_their_user_through_the_idle_culler(write_csv) -> None:
    from jupyter_notebookos.simulator.trace import read_workload

    path = write_csv([(1, 0, 5), (1, 100, 5), (2, 3, 10)])  # s0 returns after the culler; s1 once
    workload = apply_idle_culling(assign_users(read_workload(path), "sessions"), 1800)
    owners = {s.session_id: s.user for s in workload.sessions}
    assert owners == {"s0": "s0", "s0.1": "s0", "s1": "s1"}
    dealt = assign_users(read_workload(path), 2, groups=2)
    assert [(s.user, s.groups) for s in dealt.sessions] == [("user0", ("group0",)), ("user1", ("group1",))]


def test_the_flood_scenario_from_the_command_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    quotas = tmp_path / "quotas.json"
    quotas.write_text(json.dumps(QUOTA_6_OF_8))
    assert main(["--scenario", "flood", "--hours", "0.2", "--quotas", str(quotas), "--json", "--no-progress"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert set(document["policies"]) == {"notebookos"}
    figures = document["policies"]["notebookos"]
    assert set(figures["users"]) == {"alice", "bob"} and figures["jain_index"] > 0.9
    assert set(figures["users"]["bob"]["delay_s"]) == {"p50", "p95", "p99", "max"}
    assert document["model"]["sharing"]["quotas"] == QUOTA_6_OF_8
    assert main(["--scenario", "flood", "--hours", "0.1", "--no-progress"]) == 0
    table = capsys.readouterr().out
    assert "delay per user; Jain's fairness index" in table and "alice" in table and "bob" in table


def test_quotas_pools_and_types_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "--synthetic",
        "--sessions",
        "16",
        "--hours",
        "2",
        "--seed",
        "4",
        "--users",
        "4",
        "--groups",
        "2",
        "--quota-gpus",
        "8",
        "--pool",
        "a100*8:1",
        "--pool",
        "h100*8:0:3",
        "--gpu-type-mix",
        "a100=3,h100=1",
        "--policies",
        "notebookos",
        "--json",
        "--no-progress",
    ]
    assert main(args) == 0
    document = json.loads(capsys.readouterr().out)
    sharing = document["model"]["sharing"]
    assert [p["name"] for p in sharing["pools"]] == ["a100", "h100"] and sharing["pools"][1]["max_hosts"] == 3
    assert sharing["quotas"] == {"default": {"gpus": 8.0}} and sharing["gpu_type_mix"] == {"a100": 3.0, "h100": 1.0}
    figures = document["policies"]["notebookos"]
    assert set(figures["users"]) <= {"user0", "user1", "user2", "user3"} and figures["provisioned_gpu_hours"] > 0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--users", "none"], "--users takes 'sessions' or a number of users"),
        (["--pool", "a100*8:x"], "--pool a100*8:x"),
        (["--quota-gpus", "-1"], "quotas: default.gpus must be >= 0"),
        (["--gpu-type-mix", "a100=0"], "needs a type and a weight > 0"),
    ],
)
def test_bad_sharing_options_are_one_line_errors(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(["--synthetic", "--sessions", "4", "--hours", "1", "--no-progress", *extra])
    except SystemExit as exit:  # argparse's own check of the option
        code = exit.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_the_june_trace_is_unchanged_by_users_of_one(real_trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    window = ["--trace", str(real_trace), "--window-hours", "6", "--start-hour", "681", "--warmup-hours", "2"]
    common = [*window, "--policies", "notebookos", "--json", "--no-progress"]
    assert main(common) == 0
    base = json.loads(capsys.readouterr().out)
    assert main([*common, "--users", "1"]) == 0
    one = json.loads(capsys.readouterr().out)
    figures = one["policies"]["notebookos"]
    figures.pop("users"), figures.pop("jain_index")
    one["model"].pop("sharing")
    assert one == base
