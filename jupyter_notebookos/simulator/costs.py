"""The cost model: how long the platform's own actions take, in simulated seconds.

Every field is a knob of `notebookos simulate` (the option is the field name with dashes). Defaults are
round figures for a cloud GPU cluster; change them to match yours.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True, slots=True)
class CostModel:
    """Durations of platform actions and the host shape.

    - `gpus_per_host`: GPUs on each host (a cloud bill counts hosts up x this x time).
    - `container_start_s`: start a replica container and its kernel process (image cached on the host).
    - `restore_s`: restore a kernel's state from the object store into a fresh replica. Batch pays
      `container_start_s + restore_s` before every cell; NotebookOS pays it when it migrates a replica
      and when it restarts a kernel the idle culler ended.
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
    restore_s: float = 10.0
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

    @property
    def migration_total_s(self) -> float:
        """Time from deciding a migration to the cell starting on the new replica."""
        return self.container_start_s + self.restore_s + self.migration_s

    @property
    def batch_cell_overhead_s(self) -> float:
        """What Batch adds before each cell: a fresh replica and its restored state."""
        return self.container_start_s + self.restore_s
