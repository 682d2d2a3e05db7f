"""The scheduler's knobs: every traitlet a deployer sets (``c.Scheduler.<knob>`` in a config file, the chart's
``scheduler`` values), and their snapshot as plain values (:class:`~.settings.SchedulerSettings`).

:class:`SchedulerKnobs` holds configuration only; :class:`~.engine.Scheduler` is one, and reads the snapshot.
"""

from __future__ import annotations

from typing import Any

from traitlets import All, Bool, CaselessStrEnum, Dict, Float, Int, List, TraitError, observe, validate
from traitlets.config import Configurable

from .pools import parse_pools
from .quotas import Quotas
from .settings import POLICIES, SchedulerSettings


class SchedulerKnobs(Configurable):
    """The scheduler's configuration; :attr:`settings` is its snapshot, renewed whenever a knob changes."""

    policy = CaselessStrEnum(
        list(POLICIES),
        default_value="notebookos",
        help="""Scheduling policy: 'notebookos' (replicated kernels, GPUs bound per cell, migration),
        'reservation' (one replica holding its GPUs for the session's life) or 'batch' (a fresh replica
        per cell). The baselines exist for the simulator and the evaluation.""",
    ).tag(config=True)
    replicas_per_kernel = Int(
        3,
        help="Replicas of each kernel, each on a distinct host (NotebookOS policy).",
    ).tag(config=True)
    subscription_ratio_cap = Float(
        6.0,
        help="""Most a host's subscription ratio (pending GPUs / GPUs / replicas per kernel) may reach.
        Admission uses the smaller of this cap and the smoothed cluster ratio (demand / busy GPUs);
        migrations use the cap itself.""",
    ).tag(config=True)
    subscription_ratio_half_life_s = Float(
        60.0,
        help="Half-life in seconds of the EWMA that smooths the cluster subscription ratio (0: none).",
    ).tag(config=True)
    gpus_per_host = Int(
        8,
        help="GPUs of a host added by scale-out; requests above the largest host (or this) are rejected.",
    ).tag(config=True)
    migration_enabled = Bool(
        True,
        help="Migrate a replica when none of a kernel's hosts can bind a cell's GPUs.",
    ).tag(config=True)
    max_concurrent_migrations = Int(
        32,
        help="Most cell-triggered migrations in flight at once; further cells wait in the queue.",
    ).tag(config=True)
    scaling_factor = Float(
        1.1,
        help="Autoscaling: target hosts = ceil(committed GPUs x this / gpus_per_host) + idle_host_buffer.",
    ).tag(config=True)
    min_hosts = Int(3, help="Autoscaling never goes below this many hosts.").tag(config=True)
    idle_host_buffer = Int(1, help="Autoscaling keeps this many hosts' worth of idle GPUs spare.").tag(config=True)
    max_scale_in_per_round = Int(1, help="Most hosts one autoscaling round drains for scale-in.").tag(config=True)
    scale_in_delay_s = Float(
        60.0,
        help="Seconds the cluster must stay above its target before a scale-in round drains a host.",
    ).tag(config=True)
    scale_for_queued_cells = Bool(
        True,
        help="Count the GPUs of queued cells as committed when computing the autoscaling target.",
    ).tag(config=True)
    executor_fit = CaselessStrEnum(
        ["sticky", "best-fit"],
        default_value="best-fit",
        help="""NotebookOS executor choice among replicas whose host can bind a cell's GPUs now. 'sticky': the
        previous executor, else the host with the most idle GPUs. 'best-fit': the host left with the fewest
        idle GPUs (the previous executor on ties), which packs small cells and keeps whole hosts free for
        large ones.""",
    ).tag(config=True)
    ready_host_buffer = Int(
        3,
        help="""Autoscaling keeps at least this many in-service hosts with as many idle GPUs as the largest
        kernel request (a whole idle host when some kernel asks for a whole host), so the largest cells can
        start at once. Counted on top of the GPU-based target only where the idle GPUs are fragmented.""",
    ).tag(config=True)
    ready_host_probability = Float(
        0.0,
        min=0.0,
        max=0.9999,
        help="""NotebookOS: size the ready-host buffer from observed arrivals instead of ready_host_buffer: keep as
        many ready hosts as the arrivals of largest-request cells during ready_host_lead_s reach with this
        probability (a Poisson quantile of the rate seen over ready_host_window_s), between ready_host_min and
        ready_host_max. 0 keeps the fixed ready_host_buffer.""",
    ).tag(config=True)
    ready_host_lead_s = Float(
        240.0, help="Lead time a new ready host takes to arrive (host provisioning plus one autoscaling round)."
    ).tag(config=True)
    ready_host_window_s = Float(1800.0, help="Trailing window over which large-cell arrivals are counted.").tag(
        config=True
    )
    ready_host_min = Int(1, help="Fewest ready hosts when the buffer is sized from arrivals.").tag(config=True)
    ready_host_max = Int(8, help="Most ready hosts when the buffer is sized from arrivals.").tag(config=True)
    max_prepare_migrations_per_round = Int(
        8,
        help="""NotebookOS: most ahead-of-time moves per autoscaling round. An idle kernel none of whose
        replica hosts can bind its GPUs gets one replica moved to a host that can, before its next cell
        arrives (the cell would otherwise wait for that migration). 0 turns this off.""",
    ).tag(config=True)
    headroom_placement = Bool(
        True,
        help="""NotebookOS: place one replica of a new kernel on a host that can bind its whole GPU request
        now (best fit), so its first cell needs no migration; the others on the least subscribed hosts.""",
    ).tag(config=True)
    prepare_on_cell_start = Bool(
        True,
        help="""NotebookOS: plan ahead-of-time moves also right after a cell takes GPUs (prepare_moves),
        not only once per autoscaling round, so kernels stranded by that cell move before their next cell.""",
    ).tag(config=True)
    prepare_min_gpus = Int(
        1,
        help="Ahead-of-time moves only for kernels that ask for at least this many GPUs per cell.",
    ).tag(config=True)

    max_hosts = Int(
        0,
        min=0,
        help="""Autoscaling never goes above this many hosts (0: no bound). With pools, each pool's own
        max_hosts bounds it instead.""",
    ).tag(config=True)
    pools = List(
        Dict(),
        help="""Host pools the autoscaler can add, one per GPU type or MIG layout, cheapest first: e.g.
        [{"name": "a100", "gpus": 8, "gpu_type": "NVIDIA-A100-SXM4-80GB", "min_hosts": 1, "max_hosts": 20},
        {"name": "mig", "gpus": 7, "device_types": "mig-1g.10gb*7"}]. Each host names its pool; each pool is
        scaled on its own, for the kernels whose wanted type it is the first to serve. Empty: one pool of
        gpus_per_host untyped GPUs (autoscaling as without types).""",
    ).tag(config=True)
    quotas = Dict(
        help="""Quotas per user, per group and for everyone: {"default": {...}, "users": {"alice": {...}},
        "groups": {"ml": {..., "per_member": {...}, "weight": 2}}}, each with any of gpus (held at once),
        kernels, gpu_hours_per_day, gpu_hours_per_week, and weight (fair share). A user's own entry wins, then
        the most generous per_member value of their groups, then the default; a group's top-level limits bound
        its members together. "unlimited" lifts a default. Empty: no quotas. The admin may change them at
        runtime (Scheduler.set_quotas).""",
    ).tag(config=True)
    fair_share = Bool(
        True,
        help="""When cells of several users wait for GPUs, offer GPUs first to the user with the least decayed
        GPU-seconds per unit of weight (ties by arrival), instead of round-robin across kernels. One user's own
        kernels keep the round-robin order.""",
    ).tag(config=True)
    fair_share_half_life_s = Float(
        3600.0,
        min=0.0,
        help="Half-life in seconds of the GPU-seconds fair share counts (0: no decay, all usage counts).",
    ).tag(config=True)
    fair_share_max_wait_s = Float(
        600.0,
        min=0.0,
        help="""Fair share's bound on waiting: a cell that waited this long for GPUs goes ahead of every cell that
        has not, oldest first, and holds back later cells of other users that need the same GPUs until it runs
        (0: no bound).""",
    ).tag(config=True)
    quota_reset_utc_offset_h = Float(
        0.0,
        min=-14.0,
        max=14.0,
        help="The GPU-hour quotas' days start at midnight, weeks on Monday at midnight, at this UTC offset.",
    ).tag(config=True)
    quota_clock_offset_s = Float(
        0.0,
        help="""Seconds to add to the scheduler's time to get Unix time (the gateway passes its wall clock minus
        its monotonic clock), so that GPU-hour quotas reset at calendar midnights.""",
    )

    @validate("quotas")
    def _valid_quotas(self, proposal: Any) -> Any:
        try:
            Quotas.from_config(proposal["value"])
        except ValueError as error:
            raise TraitError(str(error)) from None
        return proposal["value"]

    @validate("pools")
    def _valid_pools(self, proposal: Any) -> Any:
        try:
            parse_pools(proposal["value"])
        except ValueError as error:
            raise TraitError(str(error)) from None
        return proposal["value"]

    def _snapshot(self) -> SchedulerSettings:
        values = {name: getattr(self, name) for name in SchedulerSettings.__dataclass_fields__}
        values["quotas"] = Quotas.from_config(self.quotas)
        values["pools"] = parse_pools(self.pools)
        return SchedulerSettings(**values)

    @observe(All)
    def _knob_changed(self, change: Any) -> None:
        if hasattr(self, "settings"):
            self.settings = self._snapshot()
            self._settings_changed()

    def _settings_changed(self) -> None:
        """What follows a knob changed at runtime (the snapshot is new already)."""
