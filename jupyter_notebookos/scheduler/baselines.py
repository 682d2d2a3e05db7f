"""Baseline policies on the same cluster model, for the simulator and the evaluation.

* Reservation: one replica per kernel, whose GPUs are committed at kernel start for the session's life
  (what a stock notebook service does). Cells run at once on the held devices.
* Batch: no long-lived replica; each cell starts a fresh replica on the host with the most idle GPUs
  (state comes from the object store) and the replica is retired when the cell ends.
"""

from __future__ import annotations

from .cluster import Cell, ClusterModel, Kernel
from .decisions import Placement, PlacementRefused, ReplicaSlot, RunCell
from .executor import Blocked
from .settings import SchedulerSettings


def reserve_session(model: ClusterModel, kernel: Kernel, settings: SchedulerSettings) -> Placement | PlacementRefused:
    """Reservation: place the single replica on the host with the most idle GPUs and hold them."""
    host = model.most_idle_host(kernel.gpus, placeable_only=True, wants=kernel.wants)
    if host is None or not host.placeable:
        # most_idle_host only skips cordoned hosts; draining hosts are not in its index
        helps = kernel.gpus <= settings.gpus_per_host
        reason = f"no host that accepts replicas has {kernel.gpus} idle GPUs to reserve for the session"
        return PlacementRefused(kernel.kernel_id, kernel.gpus, reason, 1, helps)
    rid = model.add_replica(kernel, host)
    devices = model.commit(host, kernel.gpus, kernel.wants)
    kernel.hold = (host.name, devices)
    had = host.idle_for(kernel.wants) + kernel.gpus
    why = f"reserved for the session on {host.name}, which had {had} of {host.gpus} GPUs idle"
    return Placement(kernel.kernel_id, kernel.gpus, (ReplicaSlot(kernel.kernel_id, rid, host.name),), why, devices)


def run_reserved(kernel: Kernel, cell_id: str, requested_at: float, now: float) -> RunCell | Blocked:
    """Reservation: the cell runs on the single replica with the session's devices."""
    if kernel.hold is None or not kernel.replicas:
        return Blocked(f"kernel {kernel.kernel_id} holds no reservation (its replica was lost)", True)
    rid, host_name = next(iter(kernel.replicas.items()))
    devices = kernel.hold[1]
    kernel.running = Cell(kernel.kernel_id, cell_id, rid, host_name, devices, requested_at, now, owns_devices=False)
    kernel.last_executor = rid
    detail = f"reserved: the session holds {len(devices)} GPUs on {host_name} for its life"
    return RunCell(
        kernel.kernel_id,
        cell_id,
        rid,
        host_name,
        len(devices),
        devices,
        "reserved",
        detail,
        now - requested_at,
    )


def run_batch(
    model: ClusterModel, kernel: Kernel, cell_id: str, gpus: int, requested_at: float, now: float
) -> RunCell | Blocked:
    """Batch: start a fresh replica for this cell on the placeable host with the most idle GPUs."""
    host = model.most_idle_host(gpus, placeable_only=True, wants=kernel.wants)
    if host is None:
        return Blocked(f"no host that accepts replicas has {gpus} idle GPUs for a fresh replica", True)
    rid = model.add_replica(kernel, host)
    devices = model.commit(host, gpus, kernel.wants)
    kernel.running = Cell(kernel.kernel_id, cell_id, rid, host.name, devices, requested_at, now)
    detail = f"fresh replica: {host.name} had the most idle GPUs ({host.idle_for(kernel.wants) + gpus} of {host.gpus})"
    return RunCell(
        kernel.kernel_id, cell_id, rid, host.name, gpus, devices, "fresh-replica", detail, now - requested_at
    )
