"""Read-only snapshots of the model, for the REST API, metrics, the simulator and tests."""

from __future__ import annotations

from dataclasses import dataclass

from .cluster import Cell, Host, Kernel
from .decisions import ReplicaSlot


@dataclass(frozen=True, slots=True)
class HostStatus:
    """One host's GPUs by state, its load and its flags."""

    name: str
    gpus: int
    idle: int
    committed: int
    pending: int
    subscription_ratio: float
    replicas: int
    simulated: bool
    cordoned: bool
    draining: bool
    pool: str = ""
    gpu_types: tuple[tuple[str, int], ...] = ()  # (type, devices), untyped devices under ""

    @staticmethod
    def of(host: Host, replicas_per_kernel: int) -> HostStatus:
        """Snapshot a host."""
        return HostStatus(
            host.name,
            host.gpus,
            host.idle,
            host.committed,
            host.pending,
            host.subscription_ratio(replicas_per_kernel),
            len(host.replicas),
            host.simulated,
            host.cordoned,
            host.draining,
            host.pool,
            tuple(sorted(host.type_counts.items())),
        )


@dataclass(frozen=True, slots=True)
class RunningCell:
    """A cell holding GPUs; ``started_at`` is None while it waits for its migration."""

    kernel_id: str
    cell_id: str
    replica_id: int
    host: str
    device_ids: tuple[int, ...]
    requested_at: float
    started_at: float | None
    migration_id: int | None

    @staticmethod
    def of(cell: Cell) -> RunningCell:
        """Snapshot a cell."""
        return RunningCell(
            cell.kernel_id,
            cell.cell_id,
            cell.replica_id,
            cell.host,
            cell.device_ids,
            cell.requested_at,
            cell.started_at,
            cell.migration_id,
        )


@dataclass(frozen=True, slots=True)
class KernelStatus:
    """One kernel: its replicas, current executor, running and queued cells, replicas on the move."""

    kernel_id: str
    gpus: int
    replicas: tuple[ReplicaSlot, ...]
    executor: int | None
    running: RunningCell | None
    queued: tuple[str, ...]
    moving: tuple[int, ...]
    held_devices: tuple[int, ...]
    user: str | None = None
    groups: tuple[str, ...] = ()
    gpu_types: tuple[str, ...] = ()

    @staticmethod
    def of(kernel: Kernel, queued: tuple[str, ...]) -> KernelStatus:
        """Snapshot a kernel."""
        return KernelStatus(
            kernel.kernel_id,
            kernel.gpus,
            tuple(ReplicaSlot(kernel.kernel_id, rid, h) for rid, h in sorted(kernel.replicas.items())),
            kernel.last_executor,
            RunningCell.of(kernel.running) if kernel.running is not None else None,
            queued,
            tuple(sorted(kernel.moving)),
            kernel.hold[1] if kernel.hold is not None else (),
            kernel.owner.user if kernel.owner is not None else None,
            kernel.owner.groups if kernel.owner is not None else (),
            kernel.wants,
        )
