"""Decision objects: what the scheduler decided, as immutable values that read as one line.

Every public call of :class:`~jupyter_notebookos.scheduler.engine.Scheduler` returns one of these. The
gateway logs ``str(decision)`` and acts on the fields; the simulator counts them; tests assert on both.
``str()`` is computed only when asked, so deciding stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .quotas import QuotaExceeded, QuotaWait


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _devices(ids: tuple[int, ...]) -> str:
    return "no devices" if not ids else "devices " + ",".join(str(i) for i in ids)


@dataclass(frozen=True, slots=True)
class Decision:
    """Base class of every decision; ``str()`` is one human-readable line."""

    def __str__(self) -> str:  # pragma: no cover - every subclass overrides it
        return type(self).__name__


@dataclass(frozen=True, slots=True)
class Ignored(Decision):
    """An event that changed nothing (unknown kernel, cell already finished...), and why."""

    event: str
    reason: str

    def __str__(self) -> str:
        return f"ignored {self.event}: {self.reason}"


# --- kernels and replicas -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplicaSlot:
    """Where one replica of a kernel lives (or is to be started)."""

    kernel_id: str
    replica_id: int
    host: str

    def __str__(self) -> str:
        return f"replica r{self.replica_id} of kernel {self.kernel_id} at {self.host}"


@dataclass(frozen=True, slots=True)
class Placement(Decision):
    """Replicas placed: start one replica on each listed host (already recorded in the model).

    ``held_devices`` is non-empty only for the Reservation policy, which binds GPUs for the session's life.
    """

    kernel_id: str
    gpus: int
    replicas: tuple[ReplicaSlot, ...]
    reason: str
    held_devices: tuple[int, ...] = ()

    @property
    def hosts(self) -> tuple[str, ...]:
        """Hosts of the placed replicas, in replica order."""
        return tuple(r.host for r in self.replicas)

    def __str__(self) -> str:
        if not self.replicas:
            return f"kernel {self.kernel_id} ({_gpus(self.gpus)}) registered without replicas: {self.reason}"
        where = ", ".join(f"r{r.replica_id}@{r.host}" for r in self.replicas)
        return f"kernel {self.kernel_id} ({_gpus(self.gpus)}) placed {where}: {self.reason}"


@dataclass(frozen=True, slots=True)
class PlacementRefused(Decision):
    """No (or not enough) host qualifies for the kernel's replicas; nothing was recorded.

    ``hosts_short`` is how many more qualifying hosts the kernel needs; ``scale_out_would_help`` says
    whether adding hosts of the configured size would fix it. ``quota`` is set when a quota refused it (the
    kernel limit, or more GPUs per cell than the GPU limit allows).
    """

    kernel_id: str
    gpus: int
    reason: str
    hosts_short: int
    scale_out_would_help: bool
    quota: QuotaExceeded | None = None

    def __str__(self) -> str:
        hint = "scaling out would help" if self.scale_out_would_help else "scaling out would not help"
        return f"kernel {self.kernel_id} ({_gpus(self.gpus)}) not placed: {self.reason}; {hint}"


@dataclass(frozen=True, slots=True)
class KernelAdopted(Decision):
    """Kernels that were already running were added to the model (gateway restart)."""

    kernel_ids: tuple[str, ...]
    replicas: tuple[ReplicaSlot, ...]
    running_cells: int

    def __str__(self) -> str:
        where = ", ".join(f"{r.kernel_id}:r{r.replica_id}@{r.host}" for r in self.replicas) or "no replicas"
        return f"adopted {len(self.kernel_ids)} running kernel(s) ({where}), {self.running_cells} cell(s) holding GPUs"


@dataclass(frozen=True, slots=True)
class KernelStopped(Decision):
    """A kernel is gone: its replicas, GPUs and queued cells were released."""

    kernel_id: str
    replicas: tuple[ReplicaSlot, ...]
    released_gpus: int
    dropped_cells: tuple[str, ...]

    def __str__(self) -> str:
        dropped = f", dropped queued cells {', '.join(self.dropped_cells)}" if self.dropped_cells else ""
        return (
            f"kernel {self.kernel_id} stopped: retired {len(self.replicas)} replicas, "
            f"released {_gpus(self.released_gpus)}{dropped}"
        )


@dataclass(frozen=True, slots=True)
class ReplicaRecorded(Decision):
    """A replica reported by the caller (started out of band) is now part of the model."""

    replica: ReplicaSlot

    def __str__(self) -> str:
        return f"recorded {self.replica}"


@dataclass(frozen=True, slots=True)
class ReplicaRefused(Decision):
    """A replica reported by the caller could not be recorded, and why."""

    kernel_id: str
    host: str
    reason: str

    def __str__(self) -> str:
        return f"replica of kernel {self.kernel_id} at {self.host} not recorded: {self.reason}"


@dataclass(frozen=True, slots=True)
class ReplicaLost(Decision):
    """A replica died; its running cell (if any) failed, and a replacement was placed if possible."""

    replica: ReplicaSlot
    failed_cell: str | None
    failed_migration: int | None
    replacement: Placement | PlacementRefused | None

    def __str__(self) -> str:
        parts = [f"lost {self.replica}"]
        if self.failed_cell is not None:
            parts.append(f"cell {self.failed_cell} failed and its GPUs were released")
        if self.failed_migration is not None:
            parts.append(f"migration m{self.failed_migration} failed")
        if self.replacement is not None:
            parts.append(f"replacement: {self.replacement}")
        return "; ".join(parts)


# --- cells ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunCell(Decision):
    """Run the cell on this replica now; its GPUs are committed to the listed devices in the model.

    ``reason`` is one of ``sticky``, ``most-idle``, ``migrated``, ``reserved`` (Reservation policy) or
    ``fresh-replica`` (Batch policy: start ``replica_id`` on ``host`` first). ``detail`` says why.
    ``queued_s`` is how long the cell waited in the scheduler before this decision. ``picked`` says why
    the queue chose it before other users' cells (fair share), when it did.
    """

    kernel_id: str
    cell_id: str
    replica_id: int
    host: str
    gpus: int
    device_ids: tuple[int, ...]
    reason: str
    detail: str
    queued_s: float = 0.0
    picked: str = ""

    def __str__(self) -> str:
        picked = f"; picked: {self.picked}" if self.picked else ""
        return (
            f"cell {self.cell_id} of kernel {self.kernel_id} runs on replica r{self.replica_id} at "
            f"{self.host} ({_gpus(self.gpus)}, {_devices(self.device_ids)}): {self.detail}{picked}"
        )


@dataclass(frozen=True, slots=True)
class MigrationPlan(Decision):
    """Move one replica of a kernel to another host (start there, catch up, retire the old one).

    ``why`` explains the choice of this replica and this target. ``cell_id`` is set when a cell waits for
    this migration; its GPUs are already reserved on the target. The replica on the target is a new one,
    ``new_replica_id`` (handed out now): once the move completes it takes the place of ``replica_id``.
    """

    migration_id: int
    kernel_id: str
    replica_id: int
    source: str
    target: str
    trigger: str  # "cell", "drain", "request" or "prepare"
    why: str
    cell_id: str | None = None
    new_replica_id: int = -1

    def __str__(self) -> str:
        return (
            f"migration m{self.migration_id}: move replica r{self.replica_id} of kernel {self.kernel_id} "
            f"from {self.source} to {self.target} ({self.trigger}): {self.why}"
        )


@dataclass(frozen=True, slots=True)
class MigrateThenRun(Decision):
    """No replica's host can bind the GPUs now: migrate a replica, then run the cell on it.

    The GPUs on the target are reserved for the cell; call ``migration_finished`` when the move is done.
    """

    kernel_id: str
    cell_id: str
    gpus: int
    device_ids: tuple[int, ...]
    migration: MigrationPlan
    queued_s: float = 0.0
    picked: str = ""

    def __str__(self) -> str:
        picked = f"; picked: {self.picked}" if self.picked else ""
        return (
            f"cell {self.cell_id} of kernel {self.kernel_id} waits for a migration and then runs at "
            f"{self.migration.target} ({_gpus(self.gpus)}, {_devices(self.device_ids)} reserved); "
            f"{self.migration}{picked}"
        )


@dataclass(frozen=True, slots=True)
class WaitInQueue(Decision):
    """The cell waits in the scheduler's queue; ask ``dispatch_queued`` when GPUs free up.

    ``quota`` is set when a quota holds it back (the waiting notice shows ``str(quota)``, e.g. "you are using
    4 of your 4 GPUs"); it runs once the user's (or group's) own cells give GPUs back.
    """

    kernel_id: str
    cell_id: str
    gpus: int
    position: int
    reason: str
    scale_out_would_help: bool
    quota: QuotaWait | None = None

    def __str__(self) -> str:
        return (
            f"cell {self.cell_id} of kernel {self.kernel_id} ({_gpus(self.gpus)}) waits in queue "
            f"(position {self.position}): {self.reason}"
        )


@dataclass(frozen=True, slots=True)
class RejectCell(Decision):
    """The request can never be served as asked (or names an unknown kernel); reply with an error.

    ``quota`` is set when a quota refused it: GPU-hours spent (``quota.resets_at`` says when the limit resets,
    in the scheduler's time), or more GPUs than the GPU limit allows at all.
    """

    kernel_id: str
    cell_id: str
    gpus: int
    reason: str
    quota: QuotaExceeded | None = None

    def __str__(self) -> str:
        return f"cell {self.cell_id} of kernel {self.kernel_id} rejected: {self.reason}"


@dataclass(frozen=True, slots=True)
class CellFinished(Decision):
    """A cell ended (or was cancelled while queued); its GPUs are released."""

    kernel_id: str
    cell_id: str
    host: str | None
    released_devices: tuple[int, ...]
    ran_s: float
    was_queued: bool = False
    retired_replica: int | None = None

    def __str__(self) -> str:
        if self.was_queued:
            return f"cell {self.cell_id} of kernel {self.kernel_id} left the queue before running"
        retired = f", retired batch replica r{self.retired_replica}" if self.retired_replica is not None else ""
        return (
            f"cell {self.cell_id} of kernel {self.kernel_id} finished after {self.ran_s:.3f}s at "
            f"{self.host}: released {_devices(self.released_devices)}{retired}"
        )


@dataclass(frozen=True, slots=True)
class QueueDispatch(Decision):
    """Queued cells that can run now, in queue order, and how many still wait.

    ``rejected``: queued cells refused now (their user's GPU-hours ran out while they waited); reply to each
    with its error, as for a ``RejectCell`` from ``request_cell``.
    """

    started: tuple[RunCell | MigrateThenRun, ...]
    still_waiting: int
    rejected: tuple[RejectCell, ...] = ()

    def __str__(self) -> str:
        refused = (
            f"; refused {', '.join(f'{r.cell_id} of {r.kernel_id}' for r in self.rejected)}" if self.rejected else ""
        )
        if not self.started:
            return f"no queued cell can run yet ({self.still_waiting} waiting){refused}"
        cells = ", ".join(f"{d.cell_id} of {d.kernel_id}" for d in self.started)
        return f"dispatched {len(self.started)} queued cells ({cells}); {self.still_waiting} still waiting{refused}"


@dataclass(frozen=True, slots=True)
class QuotasChanged(Decision):
    """The admin changed the quotas; cells that waited for a quota may run now (call ``dispatch_queued``)."""

    changed: tuple[str, ...]
    waiting_on_quota: int

    def __str__(self) -> str:
        what = "; ".join(self.changed) if self.changed else "nothing changed"
        return f"quotas changed: {what}; {self.waiting_on_quota} queued cells wait on a quota"


# --- migration ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MigrationRefused(Decision):
    """A migration cannot be planned; nothing changed."""

    kernel_id: str
    replica_id: int | None
    target: str | None
    reason: str

    def __str__(self) -> str:
        rid = f"r{self.replica_id}" if self.replica_id is not None else "a replica"
        to = f" to {self.target}" if self.target else ""
        return f"cannot migrate {rid} of kernel {self.kernel_id}{to}: {self.reason}"


@dataclass(frozen=True, slots=True)
class MigrationCompleted(Decision):
    """The replica now lives on the target; a cell that waited for it runs there (``run``)."""

    plan: MigrationPlan
    run: RunCell | None

    def __str__(self) -> str:
        then = f"; {self.run}" if self.run is not None else ""
        return (
            f"migration m{self.plan.migration_id} done: replica r{self.plan.replica_id} of kernel "
            f"{self.plan.kernel_id} moved from {self.plan.source} to {self.plan.target} "
            f"(now r{self.plan.new_replica_id}){then}"
        )


@dataclass(frozen=True, slots=True)
class MigrationFailed(Decision):
    """The move failed: the old replica keeps serving; a waiting cell went back to the queue's front."""

    plan: MigrationPlan
    reason: str
    requeued_cell: str | None

    def __str__(self) -> str:
        back = f"; cell {self.requeued_cell} is back at the front of the queue" if self.requeued_cell else ""
        return (
            f"migration m{self.plan.migration_id} failed ({self.reason}): replica r{self.plan.replica_id} of "
            f"kernel {self.plan.kernel_id} keeps serving at {self.plan.source}{back}"
        )


@dataclass(frozen=True, slots=True)
class DrainPlan(Decision):
    """Empty a host: the migrations to run, and replicas that cannot move yet (busy or nowhere to go)."""

    host: str
    migrations: tuple[MigrationPlan, ...]
    stuck: tuple[str, ...]

    def __str__(self) -> str:
        stuck = f"; cannot move yet: {'; '.join(self.stuck)}" if self.stuck else ""
        return f"draining {self.host}: {len(self.migrations)} migrations planned{stuck}"


# --- hosts ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HostChanged(Decision):
    """A host was added, cordoned or uncordoned."""

    host: str
    change: str
    detail: str = ""

    def __str__(self) -> str:
        detail = f": {self.detail}" if self.detail else ""
        return f"host {self.host} {self.change}{detail}"


@dataclass(frozen=True, slots=True)
class HostRemoved(Decision):
    """A host left the cluster; every replica on it was lost (see ``lost``)."""

    host: str
    lost: tuple[ReplicaLost, ...]

    def __str__(self) -> str:
        if not self.lost:
            return f"host {self.host} removed: it held no replicas"
        failed = [r.failed_cell for r in self.lost if r.failed_cell is not None]
        failed_text = f", failed cells {', '.join(failed)}" if failed else ""
        replaced = sum(1 for r in self.lost if isinstance(r.replacement, Placement))
        return f"host {self.host} removed: lost {len(self.lost)} replicas, replaced {replaced}{failed_text}"


# --- autoscaling ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScalingDecision(Decision):
    """Result of one autoscaling round.

    ``add_hosts`` new hosts to provision (with pools, ``add_by_pool`` says how many of each pool);
    ``undrain`` draining hosts to put back in service instead;
    ``drain`` idle hosts chosen for scale-in, whose replicas move by ``migrations``; ``remove`` hosts that
    are drained and empty: remove them now (call ``remove_host``). ``migrations`` also holds the
    ahead-of-time moves of idle kernels listed in ``prepared`` (trigger ``"prepare"``); run them all alike.
    """

    action: str  # "scale-out", "scale-in" or "none"
    current_hosts: int
    target_hosts: int
    reason: str
    add_hosts: int = 0
    undrain: tuple[str, ...] = ()
    drain: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()
    migrations: tuple[MigrationPlan, ...] = field(default=())
    prepared: tuple[str, ...] = ()
    add_by_pool: tuple[tuple[str, int], ...] = ()

    def __str__(self) -> str:
        head = f"autoscaler: {self.current_hosts} hosts, target {self.target_hosts}"
        if self.prepared:
            head += f"; {len(self.prepared)} idle kernels moved ahead of time ({', '.join(self.prepared[:5])})"
        if self.action == "scale-out":
            undrain = f", put back {', '.join(self.undrain)}" if self.undrain else ""
            pools = f" ({', '.join(f'{n} in {p}' for p, n in self.add_by_pool)})" if self.add_by_pool else ""
            return f"{head}: scale out by {self.add_hosts}{pools}{undrain} ({self.reason})"
        if self.action == "scale-in":
            drain = f"drain {', '.join(self.drain)} ({len(self.migrations)} migrations)" if self.drain else ""
            remove = f"remove {', '.join(self.remove)}" if self.remove else ""
            what = "; ".join(p for p in (drain, remove) if p)
            return f"{head}: scale in: {what} ({self.reason})"
        return f"{head}: no change ({self.reason})"
