"""The cost model: how long the platform's own actions take, in simulated seconds.

Every field is a knob of `notebookos simulate` (the option is the field name with dashes). Defaults are
round figures for a cloud GPU cluster; change them to match yours.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from jupyter_notebookos.simulator.statesize import GB


@dataclass(frozen=True, slots=True)
class CostModel:
    """Durations of platform actions and the host shape.

    - `gpus_per_host`: GPUs on each host (a cloud bill counts hosts up x this x time).
    - `container_start_s`: start a replica container and its kernel process (image cached on the host).
    - `restore_s` and `restore_gb_per_s`: restoring a kernel's state from the object store into a fresh
      replica takes `restore_s` (read the pointer, open the store, replay the log's tail) plus the state's
      size over `restore_gb_per_s` (one replica reads its objects one after another: about one S3 stream).
      Sizes come from `statesize`. Batch pays `container_start_s` and a restore before every cell;
      NotebookOS pays a restore when it migrates a replica and when it restarts a kernel the idle culler
      ended.
    - `migration_s`: extra time of a migration beyond start and restore (catch up with the log, retire the
      old replica, commit the new placement).
    - `host_provision_s`: from asking for a host to the host accepting replicas (VM boot, node join);
      billed.
    - `host_release_s`: from the scheduler removing a host to the cloud no longer billing it (stop,
      deprovision).
    - `cell_commit_s`: per-cell cost of NotebookOS's executor election (one etcd transaction).
    """

    gpus_per_host: int = 8
    container_start_s: float = 5.0
    restore_s: float = 1.0
    restore_gb_per_s: float = 0.2
    migration_s: float = 5.0
    host_provision_s: float = 180.0
    host_release_s: float = 60.0
    cell_commit_s: float = 0.005

    def __post_init__(self) -> None:
        if self.gpus_per_host < 1:
            raise ValueError("gpus_per_host must be at least 1")
        for f in fields(self):
            if getattr(self, f.name) < 0:
                raise ValueError(f"{f.name} must be >= 0")
        if self.restore_gb_per_s <= 0:
            raise ValueError("restore_gb_per_s must be > 0")

    def restore_time_s(self, state_bytes: int) -> float:
        """Restoring ``state_bytes`` of kernel state from the object store."""
        return self.restore_s + state_bytes / GB / self.restore_gb_per_s

    def migration_total_s(self, state_bytes: int) -> float:
        """Time from deciding a migration to the cell starting on the new replica."""
        return self.container_start_s + self.restore_time_s(state_bytes) + self.migration_s

    def batch_cell_overhead_s(self, state_bytes: int) -> float:
        """What Batch adds before each cell: a fresh replica and its restored state."""
        return self.container_start_s + self.restore_time_s(state_bytes)
