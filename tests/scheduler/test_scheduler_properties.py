"""Property tests: random event sequences never break the scheduler's accounting or fairness."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from jupyter_notebookos.scheduler import (
    CellFinished,
    HostRemoved,
    HostSpec,
    KernelStopped,
    MigrateThenRun,
    MigrationCompleted,
    MigrationFailed,
    Placement,
    QueueDispatch,
    RejectCell,
    ReplicaLost,
    RunCell,
    Scheduler,
    WaitInQueue,
)


class SchedulerMachine(RuleBasedStateMachine):
    """Drives one Scheduler like the gateway or the simulator would, checking invariants after each step."""

    policy = "notebookos"

    def __init__(self) -> None:
        super().__init__()
        self.s = Scheduler(
            policy=self.policy,
            gpus_per_host=4,
            min_hosts=3,
            scale_in_delay_s=5.0,
            max_scale_in_per_round=2,
            subscription_ratio_half_life_s=10.0,
        )
        self.now = 0.0
        self.hosts_made = 0
        self.live: set[tuple[str, str]] = set()  # cells that must be running or queued
        self.requested: dict[str, list[str]] = {}  # per kernel, in request order
        self.started: set[tuple[str, str]] = set()
        self.next_cell = 0

    # --- helpers ----------------------------------------------------------------------------------

    def tick(self) -> float:
        self.now += 1.0
        return self.now

    def new_host(self, gpus: int) -> None:
        self.hosts_made += 1
        self.s.add_host(HostSpec(f"h{self.hosts_made}", gpus), self.now)

    def on_start(self, d: RunCell | MigrateThenRun) -> None:
        key = (d.kernel_id, d.cell_id)
        assert key in self.live, f"{d} starts a cell that is not waiting"
        earlier = self.requested[d.kernel_id][: self.requested[d.kernel_id].index(d.cell_id)]
        assert not [c for c in earlier if (d.kernel_id, c) in self.live and (d.kernel_id, c) not in self.started], (
            f"{d} overtakes an earlier cell of its own kernel"
        )
        self.started.add(key)

    def forget(self, kernel_id: str, cell_id: str | None) -> None:
        if cell_id is not None:
            self.live.discard((kernel_id, cell_id))
            self.started.discard((kernel_id, cell_id))

    def on_lost(self, d: ReplicaLost) -> None:
        self.forget(d.replica.kernel_id, d.failed_cell)

    def requeued(self, kernel_id: str, cell_id: str | None) -> None:
        if cell_id is not None:
            self.started.discard((kernel_id, cell_id))

    def dispatch(self) -> None:
        before = [(c.kernel_id, c.cell_id) for c in self.s.queued_cells()]
        d = self.s.dispatch_queued(self.now)
        assert isinstance(d, QueueDispatch)
        keys = [(x.kernel_id, x.cell_id) for x in d.started]
        positions = [before.index(k) for k in keys]
        assert positions == sorted(positions), f"dispatch out of queue order: {d}"
        for x in d.started:
            self.on_start(x)
        assert self.s.dispatch_queued(self.now).started == (), "a waiting cell missed its turn"

    # --- rules ------------------------------------------------------------------------------------

    @initialize(
        n=st.integers(4, 8),
        gpus=st.sampled_from([1, 1, 2, 4]),
        kernels=st.lists(st.sampled_from([0, 1, 1, 1, 2]), min_size=2, max_size=10),
    )
    def hosts(self, n: int, gpus: int, kernels: list[int]) -> None:
        for _ in range(n):
            self.new_host(gpus)
        for k in kernels:
            self.start_kernel(k)

    @precondition(lambda self: self.s.model.kernels)
    @rule(data=st.data())
    def burst(self, data: st.DataObject) -> None:
        """Several kernels ask for a cell at once: contention, queueing and migration."""
        names = sorted(self.s.model.kernels)
        for kernel_id in data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=6)):
            self.ask(kernel_id, None)

    @rule(gpus=st.integers(1, 4))
    def add_host(self, gpus: int) -> None:
        self.tick()
        self.new_host(gpus)
        self.dispatch()

    @precondition(lambda self: len(self.s.model.hosts) > 4)
    @rule(data=st.data())
    def remove_host(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.s.model.hosts)))
        d = self.s.remove_host(name, self.tick())
        assert isinstance(d, HostRemoved)
        for lost in d.lost:
            self.on_lost(lost)
        for k, c in list(self.started):  # cells whose migration failed went back to the queue
            if (k, c) in {(q.kernel_id, q.cell_id) for q in self.s.queued_cells()}:
                self.requeued(k, c)
        self.dispatch()

    @precondition(lambda self: self.s.model.hosts)
    @rule(data=st.data(), cordon=st.booleans())
    def cordon(self, data: st.DataObject, cordon: bool) -> None:
        name = data.draw(st.sampled_from(sorted(self.s.model.hosts)))
        self.s.cordon_host(name, self.tick(), cordoned=cordon)

    @rule(gpus=st.integers(0, 3))
    def start_kernel(self, gpus: int) -> None:
        kernel_id = f"k{len(self.requested)}"
        self.requested[kernel_id] = []
        d = self.s.start_kernel(kernel_id, gpus, self.tick())
        if isinstance(d, Placement):
            assert len(set(d.hosts)) == len(d.hosts)

    @precondition(lambda self: self.s.model.kernels)
    @rule(data=st.data())
    def stop_kernel(self, data: st.DataObject) -> None:
        kernel_id = data.draw(st.sampled_from(sorted(self.s.model.kernels)))
        d = self.s.stop_kernel(kernel_id, self.tick())
        assert isinstance(d, KernelStopped)
        for cell in self.requested[kernel_id]:
            self.forget(kernel_id, cell)
        self.dispatch()

    @precondition(lambda self: self.s.model.kernels)
    @rule(data=st.data(), gpus=st.none() | st.integers(0, 5))
    def request_cell(self, data: st.DataObject, gpus: int | None) -> None:
        self.ask(data.draw(st.sampled_from(sorted(self.s.model.kernels))), gpus)

    def ask(self, kernel_id: str, gpus: int | None) -> None:
        cell_id = f"c{self.next_cell}"
        self.next_cell += 1
        self.requested[kernel_id].append(cell_id)
        self.live.add((kernel_id, cell_id))
        d = self.s.request_cell(kernel_id, cell_id, self.tick(), gpus=gpus)
        if isinstance(d, RejectCell):
            assert gpus is not None and gpus > 4
            self.forget(kernel_id, cell_id)
        elif isinstance(d, (RunCell, MigrateThenRun)):
            self.on_start(d)
        else:
            assert isinstance(d, WaitInQueue) and d.position >= 1

    @precondition(lambda self: self.s.running_cells())
    @rule(data=st.data())
    def finish_cell(self, data: st.DataObject) -> None:
        cell = data.draw(st.sampled_from(sorted(self.s.running_cells(), key=lambda c: c.cell_id)))
        d = self.s.cell_finished(cell.kernel_id, cell.cell_id, self.tick())
        assert isinstance(d, CellFinished) and not d.was_queued
        self.forget(cell.kernel_id, cell.cell_id)
        self.dispatch()

    @precondition(lambda self: self.s.queued_cells())
    @rule(data=st.data())
    def cancel_queued(self, data: st.DataObject) -> None:
        cell = data.draw(st.sampled_from(self.s.queued_cells()))
        d = self.s.cell_finished(cell.kernel_id, cell.cell_id, self.tick())
        assert isinstance(d, CellFinished) and d.was_queued
        self.forget(cell.kernel_id, cell.cell_id)

    @precondition(lambda self: any(k.replicas for k in self.s.model.kernels.values()))
    @rule(data=st.data())
    def lose_replica(self, data: st.DataObject) -> None:
        kernel = data.draw(st.sampled_from([k for _, k in sorted(self.s.model.kernels.items()) if k.replicas]))
        rid = data.draw(st.sampled_from(sorted(kernel.replicas)))
        waiting = kernel.running.cell_id if kernel.running and kernel.running.migration_id else None
        d = self.s.replica_lost(kernel.kernel_id, rid, self.tick())
        assert isinstance(d, ReplicaLost)
        self.on_lost(d)
        if d.failed_migration is not None and waiting is not None and d.failed_cell is None:
            self.requeued(kernel.kernel_id, waiting)
        self.dispatch()

    @precondition(lambda self: self.s.model.migrations)
    @rule(data=st.data(), ok=st.booleans())
    def finish_migration(self, data: st.DataObject, ok: bool) -> None:
        mid = data.draw(st.sampled_from(sorted(self.s.model.migrations)))
        d = self.s.migration_finished(mid, self.tick(), ok=ok)
        if isinstance(d, MigrationFailed):
            self.requeued(d.plan.kernel_id, d.requeued_cell)
        else:
            assert isinstance(d, MigrationCompleted)
        self.dispatch()

    @precondition(lambda self: self.s.model.kernels)
    @rule(data=st.data(), pick_target=st.booleans())
    def request_migration(self, data: st.DataObject, pick_target: bool) -> None:
        kernel = data.draw(st.sampled_from([k for _, k in sorted(self.s.model.kernels.items())]))
        rid = data.draw(st.sampled_from(sorted(kernel.replicas) or [0]))
        names = [*sorted(self.s.model.hosts), "nowhere"]
        target = data.draw(st.sampled_from(names)) if pick_target else None
        self.s.request_migration(kernel.kernel_id, rid, self.tick(), target=target)

    @precondition(lambda self: len(self.s.model.hosts) > 4)
    @rule(data=st.data())
    def drain(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.s.model.hosts)))
        self.s.drain_host(name, self.tick())

    @precondition(lambda self: self.s.model.kernels)
    @rule(data=st.data())
    def replace_missing(self, data: st.DataObject) -> None:
        kernel_id = data.draw(st.sampled_from(sorted(self.s.model.kernels)))
        self.s.place_missing_replicas(kernel_id, self.tick())

    @rule(probability=st.sampled_from([0.0, 0.9, 0.99]))
    def size_ready_buffer_from_arrivals(self, probability: float) -> None:
        """Switch between the fixed ready-host buffer and one sized from observed arrivals."""
        self.s.ready_host_probability = probability
        buffer = self.s.ready_buffer(self.now)
        assert self.s.settings.ready_host_min <= buffer.hosts <= self.s.settings.ready_host_max

    @rule()
    def prepare_moves(self) -> None:
        """Ahead-of-time moves right after cells took GPUs: only idle, stranded kernels, to hosts with room."""
        queued = {c.kernel_id for c in self.s.queued_cells()}
        before = {
            k.kernel_id: (k.running is None and not k.moving and k.kernel_id not in queued, set(k.replicas.values()))
            for k in self.s.model.kernels.values()
        }
        idle = {h.name: h.idle for h in self.s.model.hosts.values()}
        plans = self.s.prepare_moves(self.tick())
        assert len(plans) <= self.s.settings.max_prepare_migrations_per_round
        counted: Counter[str] = Counter()
        for plan in plans:
            was_idle, hosts = before[plan.kernel_id]
            gpus = self.s.model.kernels[plan.kernel_id].gpus
            assert was_idle and plan.trigger == "prepare", plan
            assert plan.target not in hosts and plan.source in hosts, plan
            counted[plan.target] += gpus
            assert idle[plan.target] >= gpus, f"{plan} moves to a host that cannot bind {gpus} GPUs"
        self.dispatch()

    @rule(wait=st.floats(0, 20))
    def autoscale(self, wait: float) -> None:
        self.now += wait
        d = self.s.autoscale(self.tick())
        for name in d.remove:
            host = self.s.host(name)
            assert host is not None and host.replicas == 0 and host.committed == 0, f"{d} removes a busy host"
            self.s.remove_host(name, self.now)
        for _ in range(d.add_hosts):
            self.new_host(4)
        self.dispatch()

    # --- invariants -------------------------------------------------------------------------------

    @invariant()
    def gpus_are_accounted(self) -> None:
        running = self.s.running_cells()
        held: Counter[str] = Counter()
        devices: dict[str, list[int]] = {}
        for cell in running:
            if self.policy != "reservation":
                held[cell.host] += len(cell.device_ids)
                devices.setdefault(cell.host, []).extend(cell.device_ids)
        for kernel in self.s.model.kernels.values():
            if kernel.hold is not None:
                held[kernel.hold[0]] += len(kernel.hold[1])
                devices.setdefault(kernel.hold[0], []).extend(kernel.hold[1])
        for host in self.s.hosts():
            assert 0 <= host.committed <= host.gpus, host
            assert host.committed == held[host.name], f"{host}: committed GPUs not owned by running cells"
            ids = devices.get(host.name, [])
            assert len(ids) == len(set(ids)), f"{host.name}: a device is committed twice"
        assert self.s.model.busy == sum(h.committed for h in self.s.hosts())

    @invariant()
    def replicas_on_distinct_live_hosts(self) -> None:
        for kernel in self.s.model.kernels.values():
            hosts = list(kernel.replicas.values()) + [t for _, t in kernel.moving.values()]
            assert len(hosts) == len(set(hosts)), f"kernel {kernel.kernel_id} has two replicas on one host"
            assert all(h in self.s.model.hosts for h in hosts)
            if self.policy == "notebookos":
                assert len(kernel.replicas) <= 3

    @invariant()
    def no_cell_is_lost(self) -> None:
        running = {(c.kernel_id, c.cell_id) for c in self.s.running_cells()}
        queued = [(c.kernel_id, c.cell_id) for c in self.s.queued_cells()]
        assert len(queued) == len(set(queued))
        assert not running & set(queued)
        assert running | set(queued) == self.live, "a cell vanished or appeared"
        assert running <= self.started | running  # every running cell was announced by a decision

    @invariant()
    def pending_matches_replicas(self) -> None:
        expected: Counter[str] = Counter()
        for kernel in self.s.model.kernels.values():
            for h in list(kernel.replicas.values()) + [t for _, t in kernel.moving.values()]:
                expected[h] += kernel.gpus
        for host in self.s.hosts():
            assert host.pending == expected[host.name], host


class ReservationMachine(SchedulerMachine):
    policy = "reservation"


class BatchMachine(SchedulerMachine):
    policy = "batch"


_fast = settings(max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TestNotebookOS = SchedulerMachine.TestCase
TestNotebookOS.settings = _fast
TestReservation = ReservationMachine.TestCase
TestReservation.settings = settings(_fast, max_examples=25)
TestBatch = BatchMachine.TestCase
TestBatch.settings = settings(_fast, max_examples=25)
