"""The scheduler: the one policy engine the live gateway and the trace simulator both drive.

It owns a :class:`ClusterModel`, the wait queue and the cluster ratio; every method takes the current
time, applies one event or answers one question, and returns a decision (see ``decisions``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from . import autoscaling, migration, readiness
from .arrivals import ArrivalLog, ReadyBuffer
from .baselines import reserve_session, run_batch, run_reserved
from .cluster import ClusterModel, HostSpec, Kernel, KernelSpec, RunningCellSpec
from .decisions import (
    CellFinished,
    Decision,
    DrainPlan,
    HostChanged,
    HostRemoved,
    Ignored,
    KernelAdopted,
    KernelStopped,
    MigrateThenRun,
    MigrationCompleted,
    MigrationFailed,
    MigrationPlan,
    MigrationRefused,
    Placement,
    PlacementRefused,
    QueueDispatch,
    QuotasChanged,
    RejectCell,
    ReplicaLost,
    ReplicaRecorded,
    ReplicaRefused,
    ReplicaSlot,
    RunCell,
    ScalingDecision,
    WaitInQueue,
)
from .dispatch import Dispatcher
from .executor import Blocked, choose_executor
from .gputypes import parse_wants
from .knobs import SchedulerKnobs
from .placement import place_replicas
from .pools import can_grow, too_big
from .queue import QueuedCell
from .quotas import Owner, Quotas, QuotaWait
from .sharing import AccountUsage, Sharing
from .status import HostStatus, KernelStatus, RunningCell
from .subscription import ClusterRatio
from .usage import UsageRecord


class Scheduler(SchedulerKnobs):
    """Placement, executor choice, queueing, migration planning and autoscaling over one cluster model.

    Build it empty or from a rebuilt state (``hosts``, ``kernels``, ``replicas``, ``running``), then feed
    it events with the current time. Nothing here reads a clock or does I/O.
    """

    def __init__(
        self,
        hosts: Iterable[HostSpec] = (),
        kernels: Iterable[KernelSpec] = (),
        replicas: Iterable[ReplicaSlot] = (),
        running: Iterable[RunningCellSpec] = (),
        usage: Iterable[UsageRecord] = (),
        **kwargs: Any,
    ) -> None:
        """Build the scheduler; the iterables rebuild a model (e.g. from etcd after a gateway restart), ``usage``
        the users' and groups' usage (``usage_records()`` of the previous scheduler).

        Raises ``ValueError`` with a precise message if the state is inconsistent.
        """
        super().__init__(**kwargs)
        self.settings = self._snapshot()
        self.model = ClusterModel()
        self.sharing = Sharing(self.model, self.settings, usage)
        self.dispatcher = Dispatcher(self.model, self.sharing)
        self.queue = self.dispatcher.queue
        self.ratio = ClusterRatio(self.settings.subscription_ratio_cap, self.settings.subscription_ratio_half_life_s)
        self._over_since: float | None = None
        self._pools_over_since: dict[str, float | None] = {}
        self._now = 0.0
        self.arrivals = ArrivalLog(self.settings.ready_host_window_s)
        self._restore(hosts, kernels, replicas, running)

    def _settings_changed(self) -> None:
        self.ratio.cap = self.settings.subscription_ratio_cap
        self.arrivals.window_s = self.settings.ready_host_window_s
        self.sharing.configure(self.settings)

    def adopt(
        self,
        kernels: Iterable[KernelSpec],
        replicas: Iterable[ReplicaSlot],
        running: Iterable[RunningCellSpec] = (),
        now: float = 0.0,
    ) -> KernelAdopted:
        """Add kernels that already run (a restarted gateway re-attaching to them), with their replicas
        and the cells holding GPUs, exactly as recorded in etcd. Raises ``ValueError`` if inconsistent."""
        kernels, replicas, running = list(kernels), list(replicas), list(running)
        self._restore((), kernels, replicas, running)
        self._tick(now)
        return KernelAdopted(tuple(k.kernel_id for k in kernels), tuple(replicas), len(running))

    def _restore(
        self,
        hosts: Iterable[HostSpec],
        kernels: Iterable[KernelSpec],
        replicas: Iterable[ReplicaSlot],
        running: Iterable[RunningCellSpec],
    ) -> None:
        for kernel in self.model.restore(hosts, kernels, replicas, running):
            self.sharing.kernel_added(kernel)

    # --- kernels --------------------------------------------------------------------------------------

    def start_kernel(
        self, kernel_id: str, gpus: int, now: float, owner: Owner | None = None, gpu_types: Iterable[str] = ()
    ) -> Placement | PlacementRefused:
        """Place a new kernel's replicas (recorded in the model) or say why it cannot be placed.

        ``owner``: who it belongs to (quotas and fair share count its cells against the user and their groups);
        ``gpu_types``: the GPU types its cells may use, most preferred first (empty: any whole GPU).
        """
        self._tick(now)
        if kernel_id in self.model.kernels:
            return PlacementRefused(kernel_id, gpus, "a kernel with this id already exists", 0, False)
        try:
            wants = parse_wants(list(gpu_types))
        except ValueError as error:
            return PlacementRefused(kernel_id, gpus, str(error), 0, False)
        too_big = self._too_big(gpus, wants)
        if too_big:
            return PlacementRefused(kernel_id, gpus, too_big, 0, False)
        quota = self.sharing.admit_kernel(owner, gpus)
        if quota is not None:
            return PlacementRefused(kernel_id, gpus, str(quota), 0, False, quota)
        kernel = self.model.add_kernel(kernel_id, gpus, owner, wants)
        self.sharing.kernel_added(kernel)
        decision: Placement | PlacementRefused
        if self.settings.policy == "reservation":
            decision = reserve_session(self.model, kernel, self.settings)
        elif self.settings.policy == "batch":
            decision = Placement(kernel_id, gpus, (), "batch policy: a fresh replica starts for each cell")
        else:
            decision = place_replicas(self.model, kernel, self.settings.replicas, self.ratio.limit, self.settings)
        if isinstance(decision, PlacementRefused):
            self.sharing.kernel_removed(kernel)
            self.model.remove_kernel(kernel)
        self._tick(now)
        return decision

    def place_missing_replicas(self, kernel_id: str, now: float) -> Placement | PlacementRefused | Ignored:
        """Bring a kernel back to its replica count (after a loss whose replacement was refused)."""
        kernel = self.model.kernels.get(kernel_id)
        if kernel is None:
            return Ignored("place missing replicas", f"unknown kernel {kernel_id}")
        self._tick(now)
        missing = self.settings.replicas - len(kernel.replicas)
        if missing <= 0:
            return Ignored("place missing replicas", f"kernel {kernel_id} has all {len(kernel.replicas)} replicas")
        if self.settings.policy == "reservation":
            return reserve_session(self.model, kernel, self.settings)
        decision = place_replicas(self.model, kernel, missing, self.ratio.limit, self.settings, "replacement")
        self._tick(now)
        return decision

    def stop_kernel(self, kernel_id: str, now: float) -> KernelStopped | Ignored:
        """Forget a kernel: release its GPUs, retire its replicas, drop its queued cells."""
        kernel = self.model.kernels.get(kernel_id)
        if kernel is None:
            return Ignored("stop kernel", f"unknown kernel {kernel_id}")
        released = 0
        if kernel.running is not None:
            released += self._release(kernel, now)
        for rid in list(kernel.moving):
            plan = self.model.migrations[kernel.moving[rid][0]]
            migration.abort(self.model, kernel, plan)
        if kernel.hold is not None:
            self.model.release(kernel.hold[0], kernel.hold[1])
            released += len(kernel.hold[1])
            kernel.hold = None
        slots = tuple(ReplicaSlot(kernel_id, rid, h) for rid, h in sorted(kernel.replicas.items()))
        for rid in list(kernel.replicas):
            self.model.remove_replica(kernel, rid)
        dropped = tuple(c.cell_id for c in self.queue.drop_kernel(kernel_id))
        self.dispatcher.forget(kernel_id)
        self.sharing.kernel_removed(kernel)
        self.model.remove_kernel(kernel)
        self._tick(now)
        return KernelStopped(kernel_id, slots, released, dropped)

    # --- cells ----------------------------------------------------------------------------------------

    def request_cell(
        self, kernel_id: str, cell_id: str, now: float, gpus: int | None = None, prefer: int | None = None
    ) -> RunCell | MigrateThenRun | WaitInQueue | RejectCell:
        """Decide where a cell runs. ``gpus`` defaults to the kernel's request; ``prefer`` names a replica
        the client asked for (used when its host can bind the GPUs).

        ``RunCell``: GPUs are committed now; ``MigrateThenRun``: GPUs reserved on the target, call
        ``migration_finished``; ``WaitInQueue``: call ``dispatch_queued`` when GPUs free up;
        ``RejectCell``: reply with an error.
        """
        kernel = self.model.kernels.get(kernel_id)
        need = gpus if gpus is not None else (kernel.gpus if kernel is not None else 0)
        if kernel is None:
            return RejectCell(kernel_id, cell_id, need, f"unknown kernel {kernel_id}")
        if need < 0:
            return RejectCell(kernel_id, cell_id, need, f"a cell cannot ask for {need} GPUs")
        too_big = self._too_big(need, kernel.wants)
        if too_big:
            return RejectCell(kernel_id, cell_id, need, too_big)
        if (kernel.running is not None and kernel.running.cell_id == cell_id) or (
            kernel_id,
            cell_id,
        ) in self.queue:
            return RejectCell(kernel_id, cell_id, need, f"cell {cell_id} is already running or queued")
        quota = self.sharing.gate(kernel, need, now)
        if quota is not None and not isinstance(quota, QuotaWait):
            return RejectCell(kernel_id, cell_id, need, str(quota), quota)
        self._tick(now)
        self.arrivals.record(now, need)
        if kernel.running is not None or self.queue.has(kernel_id):
            busy = kernel.running.cell_id if kernel.running is not None else "an earlier queued cell"
            pos = self.queue.push(QueuedCell(kernel_id, cell_id, need, now, prefer), kernel.running is not None)
            return WaitInQueue(kernel_id, cell_id, need, pos, f"kernel {kernel_id} is busy with {busy}", False)
        held = self.dispatcher.held_back(kernel, need)
        if quota is not None or held:
            pos = self.queue.push(QueuedCell(kernel_id, cell_id, need, now, prefer), False)
            if quota is not None:
                self.dispatcher.quota_waits[kernel_id] = quota
            return WaitInQueue(kernel_id, cell_id, need, pos, str(quota) if quota else held, False, quota)
        decision = self._try_start(kernel, cell_id, need, now, now, prefer)
        if isinstance(decision, Blocked):
            pos = self.queue.push(QueuedCell(kernel_id, cell_id, need, now, prefer), False)
            helps = decision.scale_out_would_help and can_grow(
                self.model, self.settings.pools, self.settings.max_hosts, kernel
            )
            return WaitInQueue(kernel_id, cell_id, need, pos, decision.reason, helps)
        self._tick(now)
        return decision

    def cell_finished(self, kernel_id: str, cell_id: str, now: float) -> CellFinished | Ignored:
        """A cell replied (or was interrupted, or cancelled while queued): release its GPUs.

        Then call ``dispatch_queued``: freed GPUs may let queued cells run.
        """
        kernel = self.model.kernels.get(kernel_id)
        if kernel is None:
            return Ignored("cell finished", f"unknown kernel {kernel_id}")
        cell = kernel.running
        if cell is not None and cell.cell_id == cell_id:
            ran = now - cell.started_at if cell.started_at is not None else 0.0
            devices = cell.device_ids if cell.owns_devices else ()
            self._release(kernel, now)
            retired = None
            if self.settings.policy == "batch" and cell.replica_id in kernel.replicas:
                self.model.remove_replica(kernel, cell.replica_id)
                retired = cell.replica_id
            self._tick(now)
            return CellFinished(kernel_id, cell_id, cell.host, devices, ran, retired_replica=retired)
        if self.queue.remove(kernel_id, cell_id) is not None:
            if not self.queue.has(kernel_id):
                self.dispatcher.forget(kernel_id)
            return CellFinished(kernel_id, cell_id, None, (), 0.0, was_queued=True)
        return Ignored("cell finished", f"cell {cell_id} of kernel {kernel_id} is neither running nor queued")

    def dispatch_queued(self, now: float) -> QueueDispatch:
        """Start the queued cells that can run now, in fair order (each gets first pick in turn): round-robin
        across kernels, or by fair share across users (see ``sharing``). Refuses queued cells whose user's
        GPU-hours ran out while they waited (``QueueDispatch.rejected``)."""
        self._tick(now)

        def start(kernel: Kernel, head: QueuedCell, at: float, migrate: bool) -> RunCell | MigrateThenRun | Blocked:
            return self._try_start(kernel, head.cell_id, head.gpus, head.requested_at, at, head.prefer, migrate)

        decision = self.dispatcher.dispatch(now, start)
        self._tick(now)
        return decision

    # --- replicas -------------------------------------------------------------------------------------

    def replica_lost(self, kernel_id: str, replica_id: int, now: float) -> ReplicaLost | Ignored:
        """A replica died: fail its running cell, drop its migration, place a replacement if possible."""
        kernel = self.model.kernels.get(kernel_id)
        if kernel is None or replica_id not in kernel.replicas:
            return Ignored("replica lost", f"kernel {kernel_id} has no replica r{replica_id}")
        decision = self._lose_replica(kernel, replica_id, now, replace=True)
        self._tick(now)
        return decision

    def replica_added(self, kernel_id: str, replica_id: int, host: str, now: float) -> ReplicaRecorded | ReplicaRefused:
        """Record a replica the caller started itself (validated like a migration target)."""
        kernel = self.model.kernels.get(kernel_id)
        if kernel is None:
            return ReplicaRefused(kernel_id, host, f"unknown kernel {kernel_id}")
        if replica_id in kernel.replicas:
            return ReplicaRefused(kernel_id, host, f"replica r{replica_id} already exists")
        problem = migration.target_problem(self.model, kernel, host, float("inf"), self.settings.replicas)
        if problem:
            return ReplicaRefused(kernel_id, host, problem)
        self.model.add_replica(kernel, self.model.hosts[host], replica_id)
        self._tick(now)
        return ReplicaRecorded(ReplicaSlot(kernel_id, replica_id, host))

    # --- migration ------------------------------------------------------------------------------------

    def request_migration(
        self, kernel_id: str, replica_id: int, now: float, target: str | None = None
    ) -> MigrationPlan | MigrationRefused:
        """Plan a move on demand (REST API); without ``target`` the least subscribed host is chosen."""
        kernel = self.model.kernels.get(kernel_id)
        if kernel is None:
            return MigrationRefused(kernel_id, replica_id, target, f"unknown kernel {kernel_id}")
        unmovable = migration.unmovable(kernel, replica_id)
        if unmovable:
            return MigrationRefused(kernel_id, replica_id, target, unmovable)
        cap, replicas = self.settings.subscription_ratio_cap, self.settings.replicas
        if target is not None:
            problem = migration.target_problem(self.model, kernel, target, cap, replicas)
            if problem:
                return MigrationRefused(kernel_id, replica_id, target, problem)
            host = self.model.hosts[target]
            why = f"requested; {target} accepts it"
        else:
            found = migration.best_target(self.model, kernel, cap, replicas)
            if found is None:
                return MigrationRefused(kernel_id, replica_id, None, "no other host accepts a replica of this kernel")
            host, why = found, f"requested; {found.name} is the least subscribed host that accepts it"
        plan = migration.begin(self.model, kernel, replica_id, host, "request", why)
        self._tick(now)
        return plan

    def migration_finished(
        self, migration_id: int, now: float, ok: bool = True, error: str = ""
    ) -> MigrationCompleted | MigrationFailed | Ignored:
        """The move ended. On success a cell waiting for it runs on the moved replica (``run``)."""
        plan = self.model.migrations.get(migration_id)
        if plan is None:
            return Ignored("migration finished", f"no migration m{migration_id} in flight")
        kernel = self.model.kernels[plan.kernel_id]
        cell = kernel.running
        waiting = cell if cell is not None and cell.migration_id == migration_id else None
        if not ok:
            migration.abort(self.model, kernel, plan)
            requeued = None
            if waiting is not None:
                self._release(kernel, now, requeue=True)
                requeued = waiting.cell_id
            self._tick(now)
            return MigrationFailed(plan, error or "the new replica did not come up", requeued)
        migration.complete(self.model, kernel, plan)
        run = None
        if waiting is not None:
            waiting.migration_id = None
            waiting.started_at = now
            kernel.last_executor = plan.new_replica_id
            run = RunCell(
                kernel.kernel_id,
                waiting.cell_id,
                plan.new_replica_id,
                plan.target,
                waiting.gpus,
                waiting.device_ids,
                "migrated",
                f"migrated from {plan.source}: {plan.why}",
                now - waiting.requested_at,
            )
        self._tick(now)
        return MigrationCompleted(plan, run)

    # --- hosts ----------------------------------------------------------------------------------------

    def add_host(self, spec: HostSpec, now: float) -> HostChanged | Ignored:
        """A host joined (scale-out done, or a node appeared)."""
        try:
            self.model.add_host(spec)
        except ValueError as error:
            return Ignored("add host", str(error))
        self._tick(now)
        kind = "simulated" if spec.simulated else "real"
        return HostChanged(spec.name, "added", f"{spec.gpus} {kind} GPUs")

    def remove_host(self, name: str, now: float) -> HostRemoved | Ignored:
        """A host left: every replica on it is lost (replacements placed elsewhere), its moves fail."""
        host = self.model.hosts.get(name)
        if host is None:
            return Ignored("remove host", f"unknown host {name}")
        self.model.set_draining(host, True)  # nothing new lands here while we clean up
        for kernel_id, rid in list(host.replicas):
            kernel = self.model.kernels[kernel_id]
            moving = kernel.moving.get(rid)
            if moving is not None and moving[1] == name:
                self.migration_finished(moving[0], now, ok=False, error=f"target {name} was removed")
        lost = [
            self._lose_replica(self.model.kernels[kernel_id], rid, now, replace=True)
            for kernel_id, rid in list(host.replicas)
        ]
        self.model.remove_host(name)
        self._tick(now)
        return HostRemoved(name, tuple(lost))

    def cordon_host(self, name: str, now: float, cordoned: bool = True) -> HostChanged | Ignored:
        """Stop (or resume, with ``cordoned=False``) placing new replicas on a host; its replicas stay."""
        host = self.model.hosts.get(name)
        if host is None:
            return Ignored("cordon host", f"unknown host {name}")
        self.model.set_cordoned(host, cordoned)
        return HostChanged(name, "cordoned" if cordoned else "uncordoned", f"{len(host.replicas)} replicas stay")

    def undrain_host(self, name: str, now: float) -> HostChanged | Ignored:
        """Put a draining host back in service (an admin's undo of :meth:`drain_host`); its replicas stay."""
        host = self.model.hosts.get(name)
        if host is None:
            return Ignored("undrain host", f"unknown host {name}")
        self.model.set_draining(host, False)
        self._tick(now)
        return HostChanged(name, "back in service", f"{len(host.replicas)} replicas on it")

    def drain_host(self, name: str, now: float) -> DrainPlan | Ignored:
        """Empty a host by migration; replicas running a cell are listed as stuck (drain again later)."""
        host = self.model.hosts.get(name)
        if host is None:
            return Ignored("drain host", f"unknown host {name}")
        self.model.set_draining(host, True)
        plans, stuck = migration.plan_drain(
            self.model, host, self.settings.subscription_ratio_cap, self.settings.replicas
        )
        self._tick(now)
        return DrainPlan(name, tuple(plans), tuple(stuck))

    # --- autoscaling ----------------------------------------------------------------------------------

    def autoscale(self, now: float, hosts_provisioning: int | Mapping[str, int] = 0) -> ScalingDecision:
        """One autoscaling round. Pass the hosts already being provisioned so they are not asked twice (with
        pools: how many of each pool)."""
        self._tick(now)
        if self.settings.pools:
            provisioning = hosts_provisioning if isinstance(hosts_provisioning, Mapping) else {}
            decision, self._pools_over_since = autoscaling.plan_pools(
                self.model,
                self.settings,
                now,
                self._pools_over_since,
                provisioning,
                autoscaling.pool_views(
                    self.model, self.settings.pools, self.queue.heads(), self.dispatcher.quota_waits
                ),
            )
        else:
            coming = hosts_provisioning if isinstance(hosts_provisioning, int) else sum(hosts_provisioning.values())
            decision, self._over_since = autoscaling.plan_round(
                self.model,
                self.settings,
                now,
                self._over_since,
                coming,
                autoscaling.PoolView.whole(self.model, self.settings, self.dispatcher.gpus_waiting()),
                self.ready_buffer(now).hosts if self.settings.ready_host_probability > 0 else None,
            )
        queued = {c.kernel_id for c in self.queue.cells()} if len(self.queue) else set()
        prepared = readiness.plan_moves(self.model, self.settings, queued)
        if prepared:
            decision = dataclasses.replace(
                decision,
                migrations=decision.migrations + tuple(prepared),
                prepared=tuple(p.kernel_id for p in prepared),
            )
        self._tick(now)
        return decision

    def ready_buffer(self, now: float) -> ReadyBuffer:
        """The ready-host buffer the observed arrivals of largest-request cells call for (see ``arrivals``)."""
        st = self.settings
        largest = max(1, self.model.largest_request)
        probability = st.ready_host_probability or 0.99  # off (0): report what 0.99 would keep
        return self.arrivals.ready_buffer(
            now, largest, st.ready_host_lead_s, probability, st.ready_host_min, st.ready_host_max
        )

    def prepare_moves(self, now: float) -> tuple[MigrationPlan, ...]:
        """Ahead-of-time moves for idle kernels stranded since the last round (see ``readiness``).

        Call it right after a cell took GPUs, off that cell's critical path: the kernels that counted on
        those GPUs get a replica moved now instead of at the next autoscaling round. Run the plans like
        any other migration. Empty unless ``prepare_on_cell_start`` is on.
        """
        if not self.settings.prepare_on_cell_start:
            return ()
        self._tick(now)
        queued = {c.kernel_id for c in self.queue.cells()} if len(self.queue) else set()
        return tuple(readiness.plan_moves(self.model, self.settings, queued))

    # --- queries --------------------------------------------------------------------------------------

    def hosts(self) -> tuple[HostStatus, ...]:
        """Every host, by name."""
        r = self.settings.replicas
        return tuple(HostStatus.of(h, r) for _, h in sorted(self.model.hosts.items()))

    def host(self, name: str) -> HostStatus | None:
        """One host, or None."""
        h = self.model.hosts.get(name)
        return HostStatus.of(h, self.settings.replicas) if h is not None else None

    def kernel(self, kernel_id: str) -> KernelStatus | None:
        """One kernel, or None."""
        k = self.model.kernels.get(kernel_id)
        if k is None:
            return None
        queued = tuple(c.cell_id for c in self.queue.cells() if c.kernel_id == kernel_id)
        return KernelStatus.of(k, queued)

    def running_cells(self) -> tuple[RunningCell, ...]:
        """Every cell holding GPUs (those waiting for a migration included)."""
        return tuple(RunningCell.of(k.running) for k in self.model.kernels.values() if k.running is not None)

    def queued_cells(self) -> tuple[QueuedCell, ...]:
        """Every queued cell, in the order they will be offered GPUs (as of the latest event)."""
        return tuple(self.dispatcher.cells(self._now))

    def quota_wait(self, kernel_id: str) -> QuotaWait | None:
        """Why the kernel's next queued cell waits on a quota (for the waiting notice), or None."""
        return self.dispatcher.quota_waits.get(kernel_id)

    def usage(self, now: float) -> tuple[AccountUsage, ...]:
        """Every user's and group's usage and limits (REST, metrics, the simulator)."""
        return self.sharing.usage(now)

    def usage_records(self) -> tuple[UsageRecord, ...]:
        """The usage to keep across a restart (pass it as ``usage`` to the next scheduler)."""
        return self.sharing.ledger.records()

    # --- quotas ---------------------------------------------------------------------------------------

    def set_quotas(self, quotas: Quotas | Mapping[str, Any], now: float) -> QuotasChanged:
        """The admin changed the quotas at runtime (a ``Quotas`` or its config form). Raises ``ValueError``
        naming a bad entry, and changes nothing then. Call ``dispatch_queued`` next: cells that waited on a
        quota may run now."""
        config = quotas.to_config() if isinstance(quotas, Quotas) else dict(quotas)
        new = Quotas.from_config(config)
        changes = self.settings.quotas.changes(new)
        self.quotas = config
        self._tick(now)
        return QuotasChanged(changes, len(self.dispatcher.quota_waits))

    def migrations(self) -> tuple[MigrationPlan, ...]:
        """Migrations in flight."""
        return tuple(self.model.migrations.values())

    @property
    def subscription_limit(self) -> float:
        """The ratio admission currently enforces (smoothed cluster ratio, capped)."""
        return self.ratio.limit

    # --- internals ------------------------------------------------------------------------------------

    def _tick(self, now: float) -> None:
        self.ratio.observe(now, self.model.demand, self.model.busy)
        self._now = max(self._now, now)

    def _too_big(self, gpus: int, wants: tuple[str, ...] = ()) -> str:
        return too_big(self.model, self.settings.pools, self.settings.gpus_per_host, gpus, wants)

    def _try_start(
        self,
        kernel: Kernel,
        cell_id: str,
        gpus: int,
        requested_at: float,
        now: float,
        prefer: int | None = None,
        migrate: bool = True,
    ) -> RunCell | MigrateThenRun | Blocked:
        policy = self.settings.policy
        if policy == "reservation":
            return run_reserved(kernel, cell_id, requested_at, now)
        if policy == "batch":
            return run_batch(self.model, kernel, cell_id, gpus, requested_at, now)
        return choose_executor(self.model, kernel, cell_id, gpus, requested_at, now, self.settings, prefer, migrate)

    def _release(self, kernel: Kernel, now: float, requeue: bool = False) -> int:
        """Free the running cell's GPUs (charging its owner for them); ``requeue`` puts it back at the queue's
        front."""
        cell = kernel.running
        assert cell is not None
        kernel.running = None
        self.sharing.cell_released(kernel, cell, now)
        released = 0
        if cell.owns_devices:
            self.model.release(cell.host, cell.device_ids)
            released = len(cell.device_ids)
        if requeue:
            self.queue.push_front(QueuedCell(kernel.kernel_id, cell.cell_id, cell.gpus, cell.requested_at))
        else:
            self.queue.kernel_idle(kernel.kernel_id, now)
        return released

    def _lose_replica(self, kernel: Kernel, rid: int, now: float, replace: bool) -> ReplicaLost:
        host = kernel.replicas[rid]
        failed_cell: str | None = None
        failed_migration: int | None = None
        cell = kernel.running
        if kernel.moving.get(rid) is not None:
            plan = self.model.migrations[kernel.moving[rid][0]]
            failed_migration = plan.migration_id
            migration.abort(self.model, kernel, plan)
            if cell is not None and cell.migration_id == plan.migration_id:
                self._release(kernel, now, requeue=True)  # it never ran: it keeps its turn
                cell = None
        if cell is not None and cell.replica_id == rid and cell.migration_id is None:
            failed_cell = cell.cell_id
            self._release(kernel, now)
        if kernel.hold is not None and kernel.hold[0] == host:
            self.model.release(kernel.hold[0], kernel.hold[1])
            kernel.hold = None
        self.model.remove_replica(kernel, rid)
        replacement: Placement | PlacementRefused | None = None
        if replace and self.settings.policy == "notebookos":
            replacement = place_replicas(self.model, kernel, 1, self.ratio.limit, self.settings, "replacement")
        elif replace and self.settings.policy == "reservation":
            replacement = reserve_session(self.model, kernel, self.settings)
        return ReplicaLost(ReplicaSlot(kernel.kernel_id, rid, host), failed_cell, failed_migration, replacement)


__all__ = ["Decision", "Scheduler"]
