"""The NotebookOS scheduler: pure policy, shared by the live gateway and the trace simulator.

No I/O, no clock reads, no sleeps, no randomness: every call takes ``now`` (float seconds, any epoch) and
returns a frozen decision object whose ``str()`` is one readable line. The model changes only through
these calls, so a decision is also a record of what the model now believes.

Policies (``Scheduler.policy``): ``notebookos`` (3 replicas on distinct hosts, GPUs committed only while a
cell runs, sticky executor, migration), and the baselines ``reservation`` (1 replica, GPUs held for the
session's life) and ``batch`` (a fresh replica per cell), all on the same cluster model.

Example::

    from jupyter_notebookos.scheduler import HostSpec, RunCell, Scheduler, WaitInQueue

    s = Scheduler(hosts=[HostSpec(f"host-{i}", gpus=8) for i in range(4)], scaling_factor=1.2)
    s.start_kernel("k1", gpus=2, now=0.0)          # Placement: r0, r1, r2 on 3 distinct hosts
    d = s.request_cell("k1", "cell-1", now=1.0)    # RunCell | MigrateThenRun | WaitInQueue | RejectCell
    print(d)  # cell cell-1 of kernel k1 runs on replica r0 at host-0 (2 GPUs, devices 0,1): ...
    s.cell_finished("k1", "cell-1", now=5.0)       # CellFinished: GPUs released
    s.dispatch_queued(now=5.0)                     # QueueDispatch: queued cells that can run now
    s.autoscale(now=60.0)                          # ScalingDecision: scale-out / scale-in / none

Protocol for callers:

* ``request_cell`` -> ``RunCell``: the GPUs (``device_ids`` on ``host``) are committed in the model now;
  call ``cell_finished`` on reply/interrupt/death (also if committing it elsewhere failed).
  ``MigrateThenRun``: GPUs are reserved on the target; run ``decision.migration`` and call
  ``migration_finished(id, now, ok=...)``, which returns ``MigrationCompleted.run`` (the ``RunCell``) or
  puts the cell back at the queue's front. ``WaitInQueue``: nothing to do until ``dispatch_queued``.
* After anything that frees GPUs or adds capacity (``cell_finished``, ``migration_finished``,
  ``add_host``, ``stop_kernel``, scaling), call ``dispatch_queued(now)`` and act on each started decision.
  Doing so keeps the queue FIFO-fair (per kernel in order, round-robin across kernels): a new request can
  then only take GPUs no waiting cell could use.
* Replicas and hosts: ``replica_lost`` (places a replacement), ``replica_added``, ``place_missing_replicas``,
  ``add_host``, ``remove_host`` (its replicas are lost), ``cordon_host``, ``drain_host``, ``undrain_host``,
  ``request_migration`` (REST), ``migration_finished``.
* ``autoscale(now, hosts_provisioning)`` -> ``ScalingDecision``: add ``add_hosts`` hosts; drained hosts in
  ``remove`` can be removed now (``remove_host``); ``migrations`` must be run like any other.
* Rebuild after a restart: ``Scheduler(hosts=[HostSpec...], kernels=[KernelSpec...],
  replicas=[ReplicaSlot...], running=[RunningCellSpec...], config=...)``.
* Read-only views: ``hosts()``, ``host(name)``, ``kernel(id)``, ``running_cells()``, ``queued_cells()``,
  ``migrations()``, ``subscription_limit``, ``usage(now)``, ``quota_wait(kernel_id)``.
* Sharing (all optional; without them nothing changes): ``start_kernel(..., owner=Owner(user, groups),
  gpu_types=[...])``; ``WaitInQueue.quota`` (a GPU limit: the waiting notice shows it), ``RejectCell.quota``
  and ``QueueDispatch.rejected`` (GPU-hours spent, with the reset time), ``PlacementRefused.quota`` (the kernel
  limit); ``set_quotas(quotas, now)`` at runtime, then ``dispatch_queued``; ``usage_records()`` to keep usage
  across a restart (``Scheduler(usage=...)``). ``RunCell.picked`` says why fair share chose a queued cell.

Knobs are traitlets on ``Scheduler`` (``c.Scheduler.subscription_ratio_cap = 2.0`` in a config file, or
keyword arguments), snapshotted in ``Scheduler.settings``.
"""

from .cluster import HostSpec, KernelSpec, RunningCellSpec
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
from .engine import Scheduler
from .gputypes import canonical, parse_device_types, parse_wants
from .pools import HostPool, home_pool, parse_pools
from .prewarm import PrewarmSettings, StandbyWindow, standby_window
from .queue import QueuedCell
from .quotas import GroupQuota, Limits, Owner, QuotaExceeded, Quotas, QuotaWait
from .settings import POLICIES, SchedulerSettings
from .sharing import AccountUsage
from .status import HostStatus, KernelStatus, RunningCell
from .usage import UsageRecord

__all__ = [
    "POLICIES",
    "AccountUsage",
    "CellFinished",
    "Decision",
    "DrainPlan",
    "GroupQuota",
    "HostChanged",
    "HostPool",
    "HostRemoved",
    "HostSpec",
    "HostStatus",
    "Ignored",
    "KernelAdopted",
    "KernelSpec",
    "KernelStatus",
    "KernelStopped",
    "Limits",
    "MigrateThenRun",
    "MigrationCompleted",
    "MigrationFailed",
    "MigrationPlan",
    "MigrationRefused",
    "Owner",
    "Placement",
    "PlacementRefused",
    "PrewarmSettings",
    "QueueDispatch",
    "QueuedCell",
    "QuotaExceeded",
    "QuotaWait",
    "Quotas",
    "QuotasChanged",
    "RejectCell",
    "ReplicaLost",
    "ReplicaRecorded",
    "ReplicaRefused",
    "ReplicaSlot",
    "RunCell",
    "RunningCell",
    "RunningCellSpec",
    "ScalingDecision",
    "Scheduler",
    "SchedulerSettings",
    "StandbyWindow",
    "UsageRecord",
    "WaitInQueue",
    "canonical",
    "home_pool",
    "parse_device_types",
    "parse_pools",
    "parse_wants",
    "standby_window",
]
