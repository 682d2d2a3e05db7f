"""Scheduler knobs as plain values.

The deployer-facing traitlets live on :class:`~jupyter_notebookos.scheduler.engine.Scheduler` (so
``c.Scheduler.scaling_factor = 1.2`` in a config file reaches them); the engine snapshots them into this
frozen dataclass, which the pure policy modules read (cheaper than traitlet access on the hot path).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .pools import HostPool
from .quotas import Quotas

POLICIES = ("notebookos", "reservation", "batch")


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    """Every scheduler knob; see the traitlets of the same name on ``Scheduler`` for their meaning."""

    policy: str = "notebookos"
    replicas_per_kernel: int = 3
    subscription_ratio_cap: float = 6.0
    subscription_ratio_half_life_s: float = 60.0
    gpus_per_host: int = 8
    migration_enabled: bool = True
    max_concurrent_migrations: int = 32
    scaling_factor: float = 1.1
    min_hosts: int = 3
    idle_host_buffer: int = 1
    max_scale_in_per_round: int = 1
    scale_in_delay_s: float = 60.0
    scale_for_queued_cells: bool = True
    ready_host_buffer: int = 3
    ready_host_probability: float = 0.0
    ready_host_lead_s: float = 240.0
    ready_host_window_s: float = 1800.0
    ready_host_min: int = 1
    ready_host_max: int = 8
    max_prepare_migrations_per_round: int = 8
    prepare_min_gpus: int = 1
    prepare_on_cell_start: bool = True
    executor_fit: str = "best-fit"
    headroom_placement: bool = True
    max_hosts: int = 0
    pools: tuple[HostPool, ...] = ()
    quotas: Quotas = field(default_factory=Quotas)
    fair_share: bool = True
    fair_share_half_life_s: float = 3600.0
    fair_share_max_wait_s: float = 600.0
    quota_reset_utc_offset_h: float = 0.0
    quota_clock_offset_s: float = 0.0

    @property
    def replicas(self) -> int:
        """Replicas per kernel under the active policy (Reservation: 1, Batch: 0 persistent)."""
        if self.policy == "reservation":
            return 1
        if self.policy == "batch":
            return 0
        return self.replicas_per_kernel
