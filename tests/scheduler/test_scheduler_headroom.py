"""Property tests of headroom placement: a new kernel's first cell finds a host that can bind it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_notebookos.scheduler import (
    HostSpec,
    KernelSpec,
    Placement,
    ReplicaSlot,
    RunCell,
    RunningCellSpec,
    Scheduler,
)
from jupyter_notebookos.scheduler.readiness import ready
from jupyter_notebookos.scheduler.subscription import admits


def _cluster(busy: list[int], pads: list[tuple[int, int]], headroom: bool) -> Scheduler:
    """8-GPU hosts; host i runs a cell on ``busy[i]`` GPUs; idle kernels (gpus, first host) pad pending."""
    n = len(busy)
    kernels: list[KernelSpec] = []
    replicas: list[ReplicaSlot] = []
    running: list[RunningCellSpec] = []

    def add(kernel_id: str, gpus: int, first: int) -> None:
        kernels.append(KernelSpec(kernel_id, gpus))
        replicas.extend(ReplicaSlot(kernel_id, r, f"h{(first + r) % n}") for r in range(3))

    for i, gpus in enumerate(busy):
        if gpus:
            add(f"run{i}", gpus, i)
            running.append(RunningCellSpec(f"run{i}", "c", 0, tuple(range(gpus)), 0.0))
    for j, (gpus, first) in enumerate(pads):
        add(f"pad{j}", gpus, first % n)
    return Scheduler(
        hosts=[HostSpec(f"h{i}", 8) for i in range(n)],
        kernels=kernels,
        replicas=replicas,
        running=running,
        headroom_placement=headroom,
        min_hosts=1,
    )


states = {
    "busy": st.lists(st.integers(0, 8), min_size=3, max_size=7),
    "pads": st.lists(st.tuples(st.sampled_from([1, 4, 8]), st.integers(0, 6)), max_size=10),
    "gpus": st.sampled_from([1, 2, 4, 8]),
}


@settings(max_examples=80, deadline=None)
@given(**states)
def test_a_new_kernel_is_ready_whenever_some_admitting_host_has_room(busy, pads, gpus):
    s = _cluster(busy, pads, headroom=True)
    limit = s.ratio.limit
    roomy = [
        h
        for h in s.model.hosts.values()
        if h.placeable and h.idle >= gpus and admits(h, gpus, limit, s.settings.replicas)
    ]
    decision = s.start_kernel("k", gpus, 1.0)
    if not isinstance(decision, Placement):
        return
    assert len({slot.host for slot in decision.replicas}) == 3
    if roomy:
        assert ready(s.model, s.model.kernels["k"]), decision
        assert isinstance(s.request_cell("k", "first", 1.0), RunCell)


@settings(max_examples=80, deadline=None)
@given(**states)
def test_headroom_never_refuses_a_kernel_plain_placement_would_place(busy, pads, gpus):
    plain = _cluster(busy, pads, headroom=False).start_kernel("k", gpus, 1.0)
    roomy = _cluster(busy, pads, headroom=True).start_kernel("k", gpus, 1.0)
    assert isinstance(plain, Placement) == isinstance(roomy, Placement)


def test_plain_placement_can_strand_a_first_cell_that_headroom_placement_serves():
    # h0 has 8 idle GPUs but the most replicas; the least subscribed hosts h1..h3 are all busy
    busy, pads = [0, 8, 8, 8], [(8, 0), (8, 0), (8, 2), (8, 3)]
    plain = _cluster(busy, pads, headroom=False)
    assert isinstance(plain.start_kernel("k", 8, 1.0), Placement)
    assert not ready(plain.model, plain.model.kernels["k"])
    roomy = _cluster(busy, pads, headroom=True)
    assert isinstance(roomy.start_kernel("k", 8, 1.0), Placement)
    assert isinstance(roomy.request_cell("k", "first", 1.0), RunCell)


def test_a_small_kernel_takes_the_tightest_host_and_leaves_the_whole_one():
    s = Scheduler(hosts=[HostSpec(f"h{i}", 8) for i in range(4)], min_hosts=1)
    for name, gpus in (("a", 7), ("b", 6), ("c", 4)):  # h0..h2 keep 1, 2 and 4 GPUs idle; h3 is whole
        s.start_kernel(name, gpus, 0.0)
        assert isinstance(s.request_cell(name, "c", 0.0), RunCell)
    idle = {h.name: h.idle for h in s.model.hosts.values()}
    decision = s.start_kernel("small", 2, 1.0)
    assert isinstance(decision, Placement) and "idle GPUs for the next cell" in decision.reason
    hosts = {slot.host for slot in decision.replicas}
    tightest = min((n for n, i in idle.items() if i >= 2), key=lambda n: idle[n])
    assert tightest in hosts
    assert isinstance(s.request_cell("small", "c", 1.0), RunCell)


def test_prepare_moves_right_after_a_cell_strands_a_kernel_and_can_be_turned_off():
    for enabled in (True, False):
        # pad0 (idle, 8 GPUs) sits on h0, h1, h2 and can start a cell only on h2; pad1 sits on h1, h2, h3
        s = _cluster([8, 8, 0, 2, 0], [(8, 0), (8, 1)], headroom=False)
        s.prepare_on_cell_start = enabled
        assert ready(s.model, s.model.kernels["pad0"]) and s.prepare_moves(1.0) == ()
        took = s.request_cell("pad1", "c", 2.0)
        assert isinstance(took, RunCell) and took.host == "h2"
        assert not ready(s.model, s.model.kernels["pad0"])
        plans = s.prepare_moves(2.0)
        if not enabled:
            assert plans == ()
            continue
        (plan,) = plans
        assert (plan.kernel_id, plan.trigger, plan.target) == ("pad0", "prepare", "h4")
