"""The discrete-event engine: replays a workload against the real scheduler in simulated time.

One `Simulation` runs one policy. Every decision (placement, executor, queueing, migration, autoscaling)
comes from `jupyter_notebookos.scheduler.Scheduler`, the same object the live gateway drives; this module
only plays the rest of the world: users submitting cells at their trace times, cells running for their
trace durations, containers starting, state restoring, migrations taking time and hosts being provisioned
(all durations from `costs.CostModel`).

Events live in a heap ordered by (time, kind, sequence); the kind order settles ties so that capacity is
freed (hosts ready, cells ending) before it is asked for (sessions starting, cells submitted).

What the engine adds around the scheduler (the scheduler has no view of these):
- Kernels whose placement was refused wait here in FIFO order, with their cells held; the engine asks
  for the hosts the refusal says are short and retries when a host joins or the autoscaler runs.
- A cell that waits in the scheduler's queue with `scale_out_would_help` gets a host asked for it too
  (`scale_out_on_wait`, on by default), unless hosts already being provisioned are unclaimed. The
  scheduler's autoscaler sizes the cluster from committed and queued GPU counts, which cannot see a cell
  blocked by fragmentation (idle GPUs spread over hosts, or on hosts full of replicas).
- A kernel's replicas need `container_start_s` before they can run a cell (not Batch: it pays that per
  cell). A kernel that restarts a culled one (`Session.resumed`) also restores its state from the object
  store first under NotebookOS; Reservation starts a fresh reservation (container start only). Cells
  submitted earlier are held here and count their wait as delay.
- A restore takes `CostModel.restore_time_s` of the state the kernel holds at that moment: the state of
  its last cell that started (`Task.state_bytes`; a restarted kernel starts with the culled one's,
  `Session.restore_bytes`). Migrations restore it on the new replica; Batch before every cell.
- Hosts are billed from the request (`host_provision_s` before they take replicas) until `host_release_s`
  after the scheduler removed them (stop and deprovisioning). A migration holds the GPUs it reserved on
  its target (cell-triggered) and the source replica's host slot until it completes.
- Sessions may have owners (`Session.user`, `groups`) and wanted GPU types (`gpu_types`): the scheduler's quotas,
  fair share and typed placement act on them. With host pools (`Scheduler.pools`), hosts are added per pool:
  what the autoscaler's `add_by_pool` says, and for a waiting kernel or a blocked cell its home pool; each
  pool's hosts are billed by their own GPU count. Hosts are never asked beyond `max_hosts` (or a pool's).
- Sessions are closed loops: a user submits the next cell when the previous one has returned, after the
  idle gap the trace shows between them (trace submission minus trace end of the previous task). So a
  delayed cell delays the rest of its session instead of piling cells up behind it, and each cell's delay
  is measured from its own submission. A session's life is stretched by the same amount: its kernel lives
  on after its last cell returns for as long as the trace's life outlasts the last task.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jupyter_notebookos.scheduler import (
    HostPool,
    HostSpec,
    MigrateThenRun,
    MigrationCompleted,
    MigrationPlan,
    Owner,
    Placement,
    PlacementRefused,
    QueueDispatch,
    RejectCell,
    RunCell,
    ScalingDecision,
    Scheduler,
    WaitInQueue,
    home_pool,
    parse_wants,
)
from jupyter_notebookos.simulator.costs import CostModel
from jupyter_notebookos.simulator.metrics import PolicyMetrics
from jupyter_notebookos.simulator.workload import Workload

# Event kinds, in tie-breaking order at equal times.
HOST_READY = 0
TASK_END = 1
MIGRATION_DONE = 2
SESSION_END = 3
SESSION_START = 4
KERNEL_READY = 5
TASK_SUBMIT = 6
CELL_START = 7
AUTOSCALE = 8
HOST_GONE = 9


@dataclass(frozen=True, slots=True)
class SimulationConfig:
    """How to run one policy: the policy, the cost model and the scheduler's knobs.

    `scheduler_options` are traitlets of `Scheduler` (`scaling_factor`, `min_hosts`, ...); `gpus_per_host`
    comes from the cost model. Metrics count over [`measure_start_s`, `measure_end_s`); the run stops at
    `measure_end_s` when it is finite, else when every session has ended.
    """

    policy: str
    costs: CostModel = field(default_factory=CostModel)
    scheduler_options: dict[str, Any] = field(default_factory=dict)
    autoscale_interval_s: float = 60.0
    initial_hosts: int | None = None
    scale_out_on_wait: bool = True
    measure_start_s: float = -math.inf
    measure_end_s: float = math.inf

    def __post_init__(self) -> None:
        if self.autoscale_interval_s <= 0:
            raise ValueError("the autoscaling interval must be > 0")
        if self.initial_hosts is not None and self.initial_hosts < 0:
            raise ValueError("initial hosts must be >= 0")


class _SessionState:
    __slots__ = (
        "active",
        "causes",
        "held",
        "kernel_ready",
        "outstanding",
        "placed",
        "state_bytes",
        "stopped",
        "submit_at",
    )

    def __init__(self, tasks: int, state_bytes: int) -> None:
        self.active = False
        self.placed = False
        self.kernel_ready = False
        self.stopped = False
        self.held: list[int] = []  # task indexes submitted before the kernel could take them
        self.outstanding = tasks  # tasks not yet finished (or rejected)
        self.submit_at = 0.0  # when the session's current cell was submitted
        self.causes: list[str] = []  # what the current cell waited for, in order
        self.state_bytes = state_bytes  # what the kernel holds now: a restore reads this much


class Simulation:
    """One policy over one workload; call `run()` once."""

    def __init__(
        self,
        workload: Workload,
        config: SimulationConfig,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        self.workload = workload
        self.config = config
        self.costs = config.costs
        self.progress = progress
        options = dict(config.scheduler_options)
        options["gpus_per_host"] = config.costs.gpus_per_host
        self.scheduler = Scheduler(policy=config.policy, **options)
        self.policy = self.scheduler.settings.policy
        self._events: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self._sessions = workload.sessions
        self._state = [_SessionState(len(s.tasks), s.restore_bytes) for s in workload.sessions]
        self._index = {s.session_id: i for i, s in enumerate(workload.sessions)}
        self._waiting: deque[int] = deque()  # sessions whose placement was refused, FIFO
        self._session_need: dict[int, tuple[int, int]] = {}  # waiting session -> (hosts short, GPUs short)
        self._cell_claims: dict[str, int] = {}  # per pool: hosts asked for blocked cells, not yet arrived
        self._pools: dict[str, HostPool] = {p.name: p for p in self.scheduler.settings.pools}
        self._pool_index = {name: i for i, name in enumerate(self._pools)}
        self._provisioning: dict[str, int] = {name: 0 for name in self._pools or [""]}
        self._host_seq = 0
        self._hosts_up = 0
        self._gpus_up = 0  # billed: hosts up (or on the way, or going) by their GPUs
        self._active = 0
        self._migration_cell: dict[int, tuple[int, int]] = {}
        t0, _ = workload.span_s
        self.t0 = t0
        self.metrics = PolicyMetrics.start(self.policy, t0, config.measure_start_s, config.measure_end_s)

    # --- event plumbing -------------------------------------------------------------------------------

    def _push(self, t: float, kind: int, a: int = 0, b: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, kind, self._seq, a, b))

    def run(self) -> PolicyMetrics:
        """Play every event; returns the metrics of the run."""
        if self._pools:  # each pool starts with its minimum
            for name, pool in self._pools.items():
                for _ in range(pool.min_hosts):
                    self._add_host(self.t0, name)
        else:
            initial = self.config.initial_hosts
            if initial is None:
                initial = self.scheduler.settings.min_hosts
            for _ in range(initial):
                self._add_host(self.t0, "")
        self.metrics.provisioned_gpus.set(self.t0, self._gpus_up)
        for i, session in enumerate(self._sessions):
            self._push(session.start_s, SESSION_START, i)
            self._push(session.end_s, SESSION_END, i)
            if session.tasks:
                self._push(session.tasks[0].submit_s, TASK_SUBMIT, i, 0)
        self._push(self.t0, AUTOSCALE)
        stop_at = self.config.measure_end_s
        handlers = {
            HOST_READY: self._on_host_ready,
            TASK_END: self._on_task_end,
            MIGRATION_DONE: self._on_migration_done,
            SESSION_END: self._on_session_end,
            SESSION_START: self._on_session_start,
            KERNEL_READY: self._on_kernel_ready,
            TASK_SUBMIT: self._on_task_submit,
            CELL_START: self._on_cell_start,
            AUTOSCALE: self._on_autoscale,
            HOST_GONE: self._on_host_gone,
        }
        now = self.t0
        events = self._events
        count = 0
        while events:
            t, kind, _, a, b = heapq.heappop(events)
            if t >= stop_at:
                now = stop_at
                break
            now = t
            handlers[kind](now, a, b)
            count += 1
            if self.progress is not None and count % 4096 == 0:
                self.progress(now)
        self.metrics.close(now)
        if self.progress is not None:
            self.progress(now)
        return self.metrics

    # --- hosts ----------------------------------------------------------------------------------------

    def _host_gpus(self, pool: str) -> int:
        return self._pools[pool].gpus if pool else self.costs.gpus_per_host

    def _add_host(self, now: float, pool: str) -> None:
        self._host_seq += 1
        if pool:
            spec = self._pools[pool].host_spec(f"{pool}-{self._host_seq}")
        else:
            spec = HostSpec(f"host-{self._host_seq}", self.costs.gpus_per_host)
        self.scheduler.add_host(spec, now)
        self._hosts_up += 1
        self._gpus_up += spec.gpus

    def _room(self, pool: str) -> float:
        """How many more hosts the pool may have (hosts up and on the way count)."""
        most = self._pools[pool].max_hosts if pool else self.scheduler.settings.max_hosts
        if not most:
            return math.inf
        have = sum(1 for h in self.scheduler.model.hosts.values() if h.pool == pool)
        return most - have - self._provisioning[pool]

    def _provision(self, now: float, count: int, pool: str = "") -> None:
        count = int(min(count, self._room(pool)))
        if count <= 0:
            return
        self._provisioning[pool] += count
        self._hosts_up += count  # billed from the request on
        self._gpus_up += count * self._host_gpus(pool)
        self.metrics.provisioned_gpus.set(now, self._gpus_up)
        if self.metrics.measuring(now):
            self.metrics.scale_outs += count
        for _ in range(count):
            self._push(now + self.costs.host_provision_s, HOST_READY, self._pool_index.get(pool, 0))

    def _on_host_ready(self, now: float, a: int, b: int) -> None:
        pool = list(self._pools)[a] if self._pools else ""
        self._provisioning[pool] -= 1
        self._cell_claims[pool] = max(0, self._cell_claims.get(pool, 0) - 1)
        self._hosts_up -= 1  # _add_host counts it again
        self._gpus_up -= self._host_gpus(pool)
        self._add_host(now, pool)
        self._retry_waiting(now)
        self._dispatch(now)

    def _on_autoscale(self, now: float, a: int, b: int) -> None:
        coming = self._provisioning if self._pools else self._provisioning[""]
        decision = self.scheduler.autoscale(now, coming)
        self._apply_scaling(now, decision)
        self._retry_waiting(now)
        if self._waiting or self._active:
            self._push(now + self.config.autoscale_interval_s, AUTOSCALE)

    def _apply_scaling(self, now: float, decision: ScalingDecision) -> None:
        self._count(decision)
        if decision.add_by_pool:
            for pool, count in decision.add_by_pool:
                self._provision(now, count, pool)
        elif decision.add_hosts:
            self._provision(now, decision.add_hosts)
        for plan in decision.migrations:
            self._begin_migration(now, plan)
        for name in decision.remove:
            gpus = self.scheduler.model.hosts[name].gpus
            self.scheduler.remove_host(name, now)
            self._push(now + self.costs.host_release_s, HOST_GONE, gpus)  # billed until it is gone
            if self.metrics.measuring(now):
                self.metrics.scale_ins += 1
        if decision.undrain:
            self._dispatch(now)

    def _on_host_gone(self, now: float, gpus: int, b: int) -> None:
        self._hosts_up -= 1
        self._gpus_up -= gpus
        self.metrics.provisioned_gpus.set(now, self._gpus_up)

    # --- sessions -------------------------------------------------------------------------------------

    def _on_session_start(self, now: float, i: int, b: int) -> None:
        self._state[i].active = True
        self._active += 1
        if not self._place(now, i):
            self._waiting.append(i)

    def _place(self, now: float, i: int) -> bool:
        """Try to place session i's kernel; False if it must wait for hosts."""
        session = self._sessions[i]
        state = self._state[i]
        owner = Owner(session.user, session.groups) if session.user is not None else None
        decision = self.scheduler.start_kernel(session.session_id, session.gpus, now, owner, session.gpu_types)
        self._count(decision)
        self._session_need.pop(i, None)
        if isinstance(decision, Placement):
            state.placed = True
            self.metrics.committed_gpus.set(now, self.scheduler.model.busy)  # Reservation holds GPUs now
            ready_in = 0.0 if self.policy == "batch" else self.costs.container_start_s
            if session.resumed and self.policy == "notebookos":
                # the culled kernel's state, from the object store
                ready_in += self.costs.restore_time_s(self._restored(now, i, count=True))
            self._push(now + ready_in, KERNEL_READY, i)
            return True
        assert isinstance(decision, PlacementRefused)
        if not decision.scale_out_would_help:
            self._reject_session(now, i)
            return True  # nothing to wait for
        short = max(1, decision.hosts_short)
        self._session_need[i] = (short, short * session.gpus)
        self._request_hosts(now)
        return False

    def _request_hosts(self, now: float) -> None:
        """Provision what waiting kernels and blocked cells are short, minus the hosts already coming.

        The need is recomputed from the current refusals, so retries never ask twice for the same host.
        Waiting kernels share new hosts: they need as many as the most any one is short, or as many as
        hold their missing replicas' GPU requests at the subscription cap (NotebookOS) or one-to-one
        (Reservation), whichever is more. A kernel that still does not fit asks again on its next retry.
        """
        need = dict(self._cell_claims)
        by_pool: dict[str, list[tuple[int, int]]] = {}
        for i, short in self._session_need.items():
            by_pool.setdefault(self._home(i), []).append(short)
        settings = self.scheduler.settings
        for pool, shorts in by_pool.items():
            per_host = float(self._host_gpus(pool))
            if self.policy == "notebookos":
                per_host *= max(1, settings.replicas) * settings.subscription_ratio_cap
            most_short = max(short for short, _ in shorts)
            gpus_short = sum(gpus for _, gpus in shorts)
            need[pool] = need.get(pool, 0) + max(most_short, math.ceil(gpus_short / per_host))
        for pool, count in need.items():
            if count > self._provisioning[pool]:
                self._provision(now, count - self._provisioning[pool], pool)

    def _home(self, i: int) -> str:
        """The pool hosts are asked from for session i's kernel (``""`` without pools)."""
        if not self._pools:
            return ""
        session = self._sessions[i]
        home = home_pool(tuple(self._pools.values()), session.gpus, parse_wants(session.gpu_types))
        return home.name if home is not None else next(iter(self._pools))

    def _reject_session(self, now: float, i: int) -> None:
        state = self._state[i]
        self._session_need.pop(i, None)
        state.stopped = True
        state.placed = False
        self.metrics.rejected_cells += state.outstanding
        state.outstanding = 0
        state.held.clear()
        self._push(now, SESSION_END, i, 1)

    def _retry_waiting(self, now: float) -> None:
        for _ in range(len(self._waiting)):
            i = self._waiting.popleft()
            state = self._state[i]
            if state.stopped or state.placed:
                continue
            if not self._place(now, i):
                self._waiting.append(i)

    def _on_kernel_ready(self, now: float, i: int, b: int) -> None:
        state = self._state[i]
        if state.stopped:
            return
        state.kernel_ready = True
        held, state.held = state.held, []
        for task in held:
            self._request(now, i, task)

    def _on_session_end(self, now: float, i: int, final: int) -> None:
        # A session with tasks ends after its last task returns (see _finish_task), not at its trace end.
        if final or not self._sessions[i].tasks:
            self._stop(now, i)

    def _stop(self, now: float, i: int) -> None:
        state = self._state[i]
        if state.placed:
            self._count(self.scheduler.stop_kernel(self._sessions[i].session_id, now))
        self._session_need.pop(i, None)
        if state.active:
            state.active = False
            self._active -= 1
        was_placed, state.stopped, state.placed = state.placed, True, False
        self.metrics.committed_gpus.set(now, self.scheduler.model.busy)
        if was_placed:  # its GPUs and hosts may let a waiting kernel or a queued cell in
            self._retry_waiting(now)
            self._dispatch(now)

    # --- cells ----------------------------------------------------------------------------------------

    def _on_task_submit(self, now: float, i: int, k: int) -> None:
        state = self._state[i]
        if state.stopped:
            return
        state.submit_at = now
        state.causes = []
        if not state.kernel_ready:
            if not state.placed:
                state.causes.append("queue (scale-out)")  # its kernel waits for hosts to be placed
            state.causes.append("kernel restart" if self._sessions[i].resumed else "kernel start")
            state.held.append(k)
            return
        self._request(now, i, k)

    def _request(self, now: float, i: int, k: int) -> None:
        session = self._sessions[i]
        task = session.tasks[k]
        decision = self.scheduler.request_cell(session.session_id, str(k), now, gpus=task.gpus)
        self._count(decision)
        self._handle_cell(now, decision)

    def _handle_cell(self, now: float, decision: RunCell | MigrateThenRun | WaitInQueue | RejectCell) -> None:
        if isinstance(decision, RunCell):
            self._run_cell(now, decision)
        elif isinstance(decision, MigrateThenRun):
            self._state[self._index[decision.kernel_id]].causes.append("migration")
            self._begin_migration(now, decision.migration)
        elif isinstance(decision, WaitInQueue):
            cause = "queue (scale-out)" if decision.scale_out_would_help else "queue"
            if decision.quota is not None:
                cause = "queue (quota)"
            i = self._index[decision.kernel_id]
            self._state[i].causes.append(cause)
            if decision.scale_out_would_help and self.config.scale_out_on_wait:
                pool = self._home(i)
                self._cell_claims[pool] = self._cell_claims.get(pool, 0) + 1
                self._request_hosts(now)
        elif isinstance(decision, RejectCell):
            i = self._index[decision.kernel_id]
            self.metrics.rejected_cells += 1
            self._finish_task(now, i, int(decision.cell_id))

    def _restored(self, now: float, i: int, count: bool) -> int:
        """The state a restore of session i's kernel reads now, in bytes (measured: ``count`` it as a restore)."""
        state_bytes = self._state[i].state_bytes
        if self.metrics.measuring(now):
            self.metrics.restores += int(count)
            self.metrics.restored_bytes += state_bytes
        return state_bytes

    def _run_cell(self, now: float, decision: RunCell) -> None:
        if decision.reason == "fresh-replica":
            i = self._index[decision.kernel_id]
            overhead = self.costs.batch_cell_overhead_s(self._restored(now, i, count=True))
            self._state[i].causes.append("fresh replica + restore")
        elif decision.reason == "reserved":
            overhead = 0.0  # the session's GPUs are already bound to its only replica
        else:
            overhead = self.costs.cell_commit_s
        self._push(now + overhead, CELL_START, self._index[decision.kernel_id], int(decision.cell_id))

    def _on_cell_start(self, now: float, i: int, k: int) -> None:
        task = self._sessions[i].tasks[k]
        state = self._state[i]
        state.state_bytes = task.state_bytes  # the kernel now holds this cell's model
        cause = " then ".join(dict.fromkeys(state.causes))
        self.metrics.record_start(state.submit_at, now, cause, self._sessions[i].user, task.duration_s, task.gpus)
        self.metrics.busy_gpus.add(now, task.gpus)
        self.metrics.committed_gpus.set(now, self.scheduler.model.busy)
        self._push(now + task.duration_s, TASK_END, i, k)
        for plan in self.scheduler.prepare_moves(now):  # kernels this cell stranded, off its critical path
            self._begin_migration(now, plan)

    def _on_task_end(self, now: float, i: int, k: int) -> None:
        session = self._sessions[i]
        self.metrics.busy_gpus.add(now, -session.tasks[k].gpus)
        self._count(self.scheduler.cell_finished(session.session_id, str(k), now))
        self._finish_task(now, i, k)
        self._dispatch(now)
        self.metrics.committed_gpus.set(now, self.scheduler.model.busy)

    def _finish_task(self, now: float, i: int, k: int) -> None:
        """Task k of session i returned (or was rejected): the user goes on after the trace's gap."""
        state = self._state[i]
        state.outstanding -= 1
        tasks = self._sessions[i].tasks
        if k + 1 < len(tasks):
            self._push(now + max(0.0, tasks[k + 1].submit_s - tasks[k].end_s), TASK_SUBMIT, i, k + 1)
        elif state.outstanding == 0:
            # the kernel lives on as long after its last cell as the trace's life outlasts the last task
            tail = max(0.0, self._sessions[i].end_s - tasks[k].end_s)
            self._push(now + tail, SESSION_END, i, 1)

    def _dispatch(self, now: float) -> None:
        if not len(self.scheduler.queue):
            return
        dispatch: QueueDispatch = self.scheduler.dispatch_queued(now)
        for decision in dispatch.started:
            self._count(decision)
            self._handle_cell(now, decision)
        for rejected in dispatch.rejected:  # GPU-hours ran out while they waited
            self._count(rejected)
            self._handle_cell(now, rejected)

    # --- migrations -----------------------------------------------------------------------------------

    def _begin_migration(self, now: float, plan: MigrationPlan) -> None:
        if self.metrics.measuring(now):
            self.metrics.migrations += 1
        state_bytes = self._restored(now, self._index[plan.kernel_id], count=False)
        self._push(now + self.costs.migration_total_s(state_bytes), MIGRATION_DONE, plan.migration_id)

    def _on_migration_done(self, now: float, migration_id: int, b: int) -> None:
        decision = self.scheduler.migration_finished(migration_id, now)
        self._count(decision)
        self._dispatch(now)
        if isinstance(decision, MigrationCompleted) and decision.run is not None:
            self._push(
                now + self.costs.cell_commit_s,
                CELL_START,
                self._index[decision.run.kernel_id],
                int(decision.run.cell_id),
            )

    def _count(self, decision: object) -> None:
        name = type(decision).__name__
        counts = self.metrics.decision_counts
        counts[name] = counts.get(name, 0) + 1
