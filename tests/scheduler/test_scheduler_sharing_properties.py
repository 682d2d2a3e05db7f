"""Property tests of sharing: random arrivals never take a user or group over a quota, and no cell waits forever."""

from __future__ import annotations

import heapq
import math
from collections import Counter

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from jupyter_notebookos.scheduler import (
    CellFinished,
    Decision,
    HostSpec,
    MigrateThenRun,
    MigrationCompleted,
    MigrationFailed,
    Owner,
    Placement,
    PlacementRefused,
    QueueDispatch,
    RejectCell,
    ReplicaLost,
    RunCell,
    Scheduler,
    WaitInQueue,
)

OWNERS = {
    "alice": Owner("alice", ("ml",)),
    "bob": Owner("bob", ("ml", "vision")),
    "carol": Owner("carol"),
}


class QuotaMachine(RuleBasedStateMachine):
    """Drives a Scheduler with three users under quotas, checking after every step that nobody is over one."""

    def __init__(self) -> None:
        super().__init__()
        self.s: Scheduler
        self.now = 0.0
        self.hosts = 0
        self.kernels = 0
        self.cells = 0
        self.limits: dict[str, dict[str, float]] = {}

    def tick(self, seconds: float = 1.0) -> float:
        self.now += seconds
        return self.now

    @initialize(
        hosts=st.integers(3, 6),
        gpus=st.sampled_from([1, 2, 4]),
        user_gpus=st.integers(1, 4),
        group_gpus=st.integers(2, 6),
        kernels=st.integers(1, 3),
        hours=st.sampled_from([None, 0.02, 0.1]),
        fair_share=st.booleans(),
    )
    def cluster(
        self,
        hosts: int,
        gpus: int,
        user_gpus: int,
        group_gpus: int,
        kernels: int,
        hours: float | None,
        fair_share: bool,
    ) -> None:
        default: dict[str, float] = {"gpus": user_gpus, "kernels": kernels}
        if hours is not None:
            default["gpu_hours_per_day"] = hours
        quotas = {"default": default, "groups": {"ml": {"gpus": group_gpus}}, "users": {"carol": {"gpus": 1}}}
        self.s = Scheduler(
            hosts=[HostSpec(f"h{i}", gpus) for i in range(hosts)],
            quotas=quotas,
            fair_share=fair_share,
            fair_share_max_wait_s=20.0,
            gpus_per_host=gpus,
            subscription_ratio_half_life_s=10.0,
        )
        self.hosts = hosts

    # --- what every decision must respect ---------------------------------------------------------

    def check_started(self, decisions: list[Decision], spent_before: dict[str, float]) -> None:
        quotas = self.s.settings.quotas
        for d in decisions:
            if not isinstance(d, RunCell | MigrateThenRun) or d.gpus == 0:
                continue
            kernel = self.s.model.kernels[d.kernel_id]
            assert kernel.owner is not None
            limit = quotas.resolve(kernel.owner, "gpu_hours_per_day")
            assert spent_before[kernel.owner.user] < limit * 3600.0 or math.isinf(limit), f"{d} after hours ran out"

    def spent(self) -> dict[str, float]:
        return {user: self.s.sharing.spent(("user", user), "day", self.now) for user in OWNERS}

    def dispatch(self) -> None:
        spent = self.spent()
        d = self.s.dispatch_queued(self.now)
        assert isinstance(d, QueueDispatch)
        self.check_started(list(d.started), spent)
        for r in d.rejected:
            assert r.quota is not None and r.quota.limit.startswith("gpu_hours")

    # --- rules ------------------------------------------------------------------------------------

    @rule(user=st.sampled_from(sorted(OWNERS)), gpus=st.integers(0, 3))
    def start_kernel(self, user: str, gpus: int) -> None:
        self.kernels += 1
        before = sum(1 for k in self.s.model.kernels.values() if k.owner is not None and k.owner.user == user)
        d = self.s.start_kernel(f"k{self.kernels}", gpus, self.tick(), OWNERS[user])
        if isinstance(d, PlacementRefused) and d.quota is not None:
            assert d.quota.limit in ("kernels", "gpus"), d
            if d.quota.limit == "kernels":
                assert before >= self.s.settings.quotas.resolve(OWNERS[user], "kernels")
        else:
            assert isinstance(d, Placement | PlacementRefused)

    @precondition(lambda self: self.s.model.kernels)
    @rule(data=st.data(), gpus=st.none() | st.integers(0, 4))
    def request_cell(self, data: st.DataObject, gpus: int | None) -> None:
        kernel_id = data.draw(st.sampled_from(sorted(self.s.model.kernels)))
        self.cells += 1
        spent = self.spent()
        d = self.s.request_cell(kernel_id, f"c{self.cells}", self.tick(), gpus=gpus)
        self.check_started([d], spent)
        if isinstance(d, WaitInQueue) and d.quota is not None:
            assert d.quota.used + d.gpus > d.quota.allowed, d
        assert isinstance(d, RunCell | MigrateThenRun | WaitInQueue | RejectCell)

    @precondition(lambda self: self.s.running_cells())
    @rule(data=st.data(), seconds=st.floats(0.5, 120.0))
    def finish_cell(self, data: st.DataObject, seconds: float) -> None:
        cell = data.draw(st.sampled_from(sorted(self.s.running_cells(), key=lambda c: c.cell_id)))
        d = self.s.cell_finished(cell.kernel_id, cell.cell_id, self.tick(seconds))
        assert isinstance(d, CellFinished)
        self.dispatch()

    @precondition(lambda self: self.s.queued_cells())
    @rule(data=st.data())
    def cancel_queued(self, data: st.DataObject) -> None:
        cell = data.draw(st.sampled_from(self.s.queued_cells()))
        self.s.cell_finished(cell.kernel_id, cell.cell_id, self.tick())

    @precondition(lambda self: self.s.model.migrations)
    @rule(data=st.data(), ok=st.booleans())
    def finish_migration(self, data: st.DataObject, ok: bool) -> None:
        mid = data.draw(st.sampled_from(sorted(self.s.model.migrations)))
        d = self.s.migration_finished(mid, self.tick(), ok=ok)
        assert isinstance(d, MigrationCompleted | MigrationFailed)
        self.dispatch()

    @precondition(lambda self: any(k.replicas for k in self.s.model.kernels.values()))
    @rule(data=st.data())
    def lose_replica(self, data: st.DataObject) -> None:
        kernel = data.draw(st.sampled_from([k for _, k in sorted(self.s.model.kernels.items()) if k.replicas]))
        rid = data.draw(st.sampled_from(sorted(kernel.replicas)))
        assert isinstance(self.s.replica_lost(kernel.kernel_id, rid, self.tick()), ReplicaLost)
        self.dispatch()

    @precondition(lambda self: self.s.model.kernels)
    @rule(data=st.data())
    def stop_kernel(self, data: st.DataObject) -> None:
        self.s.stop_kernel(data.draw(st.sampled_from(sorted(self.s.model.kernels))), self.tick())
        self.dispatch()

    @rule(seconds=st.floats(1.0, 3600.0))
    def time_passes(self, seconds: float) -> None:
        self.tick(seconds)
        self.dispatch()

    @rule()
    def add_host(self) -> None:
        self.hosts += 1
        self.s.add_host(HostSpec(f"h{self.hosts}", self.s.settings.gpus_per_host), self.tick())
        self.dispatch()

    # --- invariants -------------------------------------------------------------------------------

    @invariant()
    def nobody_is_over_a_gpu_or_kernel_quota(self) -> None:
        quotas = self.s.settings.quotas
        used: Counter[str] = Counter()
        group_used: Counter[str] = Counter()
        kernels: Counter[str] = Counter()
        for kernel in self.s.model.kernels.values():
            assert kernel.owner is not None
            kernels[kernel.owner.user] += 1
            if kernel.running is not None:
                used[kernel.owner.user] += len(kernel.running.device_ids)
                for group in kernel.owner.groups:
                    group_used[group] += len(kernel.running.device_ids)
        for user, owner in OWNERS.items():
            assert used[user] <= quotas.resolve(owner, "gpus"), f"{user} holds {used[user]} GPUs"
            assert kernels[user] <= quotas.resolve(owner, "kernels"), f"{user} has {kernels[user]} kernels"
            assert self.s.sharing.in_use(("user", user)) == used[user]
        for group, quota in quotas.groups.items():
            limit = quota.total.gpus
            assert limit is None or group_used[group] <= limit, f"group {group} holds {group_used[group]} GPUs"

    @invariant()
    def quota_waits_are_for_queued_kernels(self) -> None:
        queued = {c.kernel_id for c in self.s.queued_cells()}
        assert set(self.s.dispatcher.quota_waits) <= queued


TestQuotas = QuotaMachine.TestCase
TestQuotas.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


# --- no starvation --------------------------------------------------------------------------------------

BOUND_S = 30.0
MIGRATION_S = 2.0
LONGEST_S = 20.0

kernel_plan = st.tuples(
    st.sampled_from(sorted(OWNERS)),
    st.integers(1, 2),  # GPUs per cell
    st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.5, LONGEST_S)), min_size=1, max_size=8),  # (gap, run)
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hosts=st.integers(2, 3), plans=st.lists(kernel_plan, min_size=2, max_size=6))
# 1-GPU cells back to back keep both hosts busy: without the bound alice's 2-GPU cell waits 300 s, for all 120
@example(
    hosts=2,
    plans=[("alice", 2, [(0.0, 5.0)] * 3)]
    + [(user, 1, [(0.0, 10.0 + 1.3 * n)] * 30) for n, user in enumerate(("bob", "carol") * 2)],
)
def test_no_cell_waits_forever_under_fair_share(
    hosts: int, plans: list[tuple[str, int, list[tuple[float, float]]]]
) -> None:
    """Users submit cells in closed loops on a fixed cluster: every cell runs, and none waits longer than the
    fair-share bound plus, for each kernel, one longest cell and one migration."""
    s = Scheduler(
        hosts=[HostSpec(f"h{i}", 2) for i in range(hosts)],
        replicas_per_kernel=2,
        fair_share_max_wait_s=BOUND_S,
        subscription_ratio_cap=100.0,
    )
    events: list[tuple[float, int, str, str, int]] = []
    seq = 0

    def push(t: float, kind: str, kernel_id: str, index: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, kernel_id, index))

    cells: dict[str, list[tuple[float, float]]] = {}
    for n, (user, _, steps) in enumerate(plans):
        kernel_id = f"{user}-{n}"
        assert isinstance(s.start_kernel(kernel_id, plans[n][1], 0.0, OWNERS[user]), Placement)
        cells[kernel_id] = steps
        push(steps[0][0], "submit", kernel_id, 0)
    submitted: dict[tuple[str, int], float] = {}
    started: dict[tuple[str, int], float] = {}

    def handle(d: Decision, now: float) -> None:
        if isinstance(d, RunCell):
            key = (d.kernel_id, int(d.cell_id))
            started[key] = now
            push(now + cells[d.kernel_id][key[1]][1], "finish", *key)
        elif isinstance(d, MigrateThenRun):
            push(now + MIGRATION_S, "moved", d.kernel_id, d.migration.migration_id)
        else:
            assert isinstance(d, WaitInQueue), d

    while events:
        now, _, kind, kernel_id, index = heapq.heappop(events)
        if kind == "submit":
            submitted[(kernel_id, index)] = now
            handle(s.request_cell(kernel_id, str(index), now), now)
            continue
        if kind == "finish":
            s.cell_finished(kernel_id, str(index), now)
            if index + 1 < len(cells[kernel_id]):
                push(now + cells[kernel_id][index + 1][0], "submit", kernel_id, index + 1)
        else:
            done = s.migration_finished(index, now)
            assert isinstance(done, MigrationCompleted)
            if done.run is not None:  # a cell waited for it (not an ahead-of-time move)
                handle(done.run, now)
        for d in s.dispatch_queued(now).started:
            handle(d, now)
        for plan in s.prepare_moves(now):
            push(now + MIGRATION_S, "moved", plan.kernel_id, plan.migration_id)

    total = sum(len(v) for v in cells.values())
    assert len(started) == total, f"{total - len(started)} cells never ran"
    bound = BOUND_S + len(plans) * (LONGEST_S + MIGRATION_S) + MIGRATION_S
    waits = {key: started[key] - submitted[key] for key in started}
    worst = max(waits, key=lambda k: waits[k])
    assert waits[worst] <= bound, f"cell {worst} waited {waits[worst]:.1f} s (bound {bound:.0f} s)"
