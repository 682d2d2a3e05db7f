"""Restore times follow the state a kernel holds: sizes from the trace's model names (or the template's vram, or
the synthetic draw), and every restore, migration and Batch cell pays for what its kernel holds at that moment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_notebookos.simulator.cli import main
from jupyter_notebookos.simulator.costs import CostModel
from jupyter_notebookos.simulator.culling import apply_idle_culling
from jupyter_notebookos.simulator.simulation import Simulation, SimulationConfig
from jupyter_notebookos.simulator.statesize import MODEL_PARAMETERS, model_state_bytes
from jupyter_notebookos.simulator.synthetic import generate
from jupyter_notebookos.simulator.trace import TraceFormatError, read_workload
from jupyter_notebookos.simulator.workload import Session, Task, Workload

GB = 10**9
HEADER = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"


def test_model_names_give_each_task_its_state(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(HEADER + "0,1,10,0,vgg19,5,0\n1,1,20,0,ResNet50,5,0\n2,4,5,0,alexnet,5,0\n")
    one, two = read_workload(trace).sessions  # time goes back at job 2: a new session
    assert [t.state_bytes for t in one.tasks] == [143_667_240 * 16, 25_557_032 * 16]
    assert [t.state_bytes for t in two.tasks] == [61_100_840 * 16]
    assert 0.39 * GB < min(map(model_state_bytes, MODEL_PARAMETERS)) < max(map(model_state_bytes, MODEL_PARAMETERS))
    assert max(map(model_state_bytes, MODEL_PARAMETERS)) < 2.3 * GB
    fixed = read_workload(trace, state_gb=3.5)
    assert {t.state_bytes for s in fixed.sessions for t in s.tasks} == {3_500_000_000}


def test_an_unknown_model_name_is_a_clear_error_unless_a_fixed_size_is_given(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(HEADER + "0,1,10,0,vgg19,5,0\n1,1,20,0,bert-large,5,0\n")
    with pytest.raises(TraceFormatError, match=r"t.csv:3: column 'model_name': unknown model 'bert-large'.*--state-gb"):
        read_workload(trace)
    assert read_workload(trace, state_gb=0.5).tasks == 2
    without = tmp_path / "bare.csv"
    without.write_text("job_id,num_gpu,submit_time,duration\n0,1,10,5\n")
    assert read_workload(without).sessions[0].tasks[0].state_bytes == 0  # restores cost their fixed part only


def test_the_template_vram_is_the_state_size(tmp_path: Path) -> None:
    template = tmp_path / "w.json"
    trainings = [{"start_tick": 1, "duration_in_ticks": 2, "gpus": 1, "vram": 7.5}]
    template.write_text(
        json.dumps({"sessions": [{"id": "a", "start_tick": 0, "stop_tick": 9, "trainings": trainings}]})
    )
    assert read_workload(template).sessions[0].tasks[0].state_bytes == 7_500_000_000
    trainings[0]["vram"] = -1
    template.write_text(
        json.dumps({"sessions": [{"id": "a", "start_tick": 0, "stop_tick": 9, "trainings": trainings}]})
    )
    with pytest.raises(TraceFormatError, match="'vram' must be >= 0"):
        read_workload(template)


def test_synthetic_models_do_not_change_the_rest_of_the_workload() -> None:
    drawn, fixed = generate(sessions=30, hours=4, seed=5), generate(sessions=30, hours=4, seed=5, state_gb=1.0)
    shape = [[(t.submit_s, t.duration_s, t.gpus) for t in s.tasks] for s in drawn.sessions]
    assert shape == [[(t.submit_s, t.duration_s, t.gpus) for t in s.tasks] for s in fixed.sessions]
    sizes = [t.state_bytes for s in drawn.sessions for t in s.tasks]
    assert set(sizes) <= set(map(model_state_bytes, MODEL_PARAMETERS)) and len(set(sizes)) > 3
    assert generate(sessions=30, hours=4, seed=5) == drawn


def test_a_restarted_kernel_restores_what_the_culled_one_held() -> None:
    session = Session.from_tasks("s", (Task(3600, 600, 2, 2 * GB), Task(4800, 600, 2, 3 * GB), Task(30000, 60, 2, GB)))
    first, resumed = apply_idle_culling(Workload("w", (session,)), 1800).sessions
    assert (first.restore_bytes, resumed.resumed, resumed.restore_bytes) == (0, True, 3 * GB)
    costs = CostModel(gpus_per_host=4, container_start_s=7.0, restore_s=1.0, restore_gb_per_s=0.5)
    config = SimulationConfig(
        policy="notebookos", costs=costs, initial_hosts=4, scheduler_options={"min_hosts": 4, "idle_host_buffer": 0}
    )
    metrics = Simulation(Workload("w", (first, resumed)), config).run()
    # the returning cell waits for a container and for 3 GB read at 0.5 GB/s after the fixed second
    assert metrics.delays_s[-1] == pytest.approx(7.0 + 1.0 + 6.0 + costs.cell_commit_s)
    assert metrics.restored_bytes == 3 * GB


class _Recording(Simulation):
    """Notes, for every migration, the state its kernel held when it began and how long it took."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.moves: dict[int, list[float]] = {}

    def _begin_migration(self, now, plan) -> None:  # type: ignore[no-untyped-def]
        self.moves[plan.migration_id] = [now, self._state[self._index[plan.kernel_id]].state_bytes, -1.0]
        super()._begin_migration(now, plan)

    def _on_migration_done(self, now, migration_id, b) -> None:  # type: ignore[no-untyped-def]
        self.moves[migration_id][2] = now
        super()._on_migration_done(now, migration_id, b)


def test_every_migration_restores_the_state_its_kernel_holds() -> None:
    costs = CostModel(container_start_s=5.0, restore_s=1.0, restore_gb_per_s=0.5, migration_s=3.0)
    workload = apply_idle_culling(generate(sessions=40, hours=6, seed=2), 1800)
    sim = _Recording(workload, SimulationConfig(policy="notebookos", costs=costs))
    metrics = sim.run()
    done = [(began, held, ended) for began, held, ended in sim.moves.values() if ended >= 0]
    assert len(done) > 20 and len({held for _, held, _ in done}) > 3
    for began, held, ended in done:
        assert ended - began == pytest.approx(5.0 + 1.0 + held / GB / 0.5 + 3.0)
    resumed = sum(s.restore_bytes for s in workload.sessions if s.resumed)
    assert metrics.restored_bytes == sum(held for _, held, _ in sim.moves.values()) + resumed


def test_the_cli_reports_state_sizes_and_refuses_a_zero_rate(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--synthetic", "--sessions", "12", "--hours", "3", "--seed", "1", "--no-progress", "--json"]
    assert main([*base, "--policies", "batch", "--state-gb", "0"]) == 0
    small = json.loads(capsys.readouterr().out)
    assert main([*base, "--policies", "batch", "--state-gb", "8"]) == 0
    large = json.loads(capsys.readouterr().out)
    assert large["model"]["state"]["mean_gb"] == 8.0 and large["model"]["state"]["restore_mean_s"] == 41.0
    # Batch restores before every cell: 8 GB at 0.2 GB/s adds 40 s to most cells (not the first of a kernel)
    assert large["policies"]["batch"]["delay_s"]["p50"] >= small["policies"]["batch"]["delay_s"]["p50"] + 40
    assert main([*base, "--restore-gb-per-s", "0"]) == 2
    assert "--restore-gb-per-s must be > 0" in capsys.readouterr().err
