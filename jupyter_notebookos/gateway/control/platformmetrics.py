"""Prometheus metrics of the gateway, in one registry served at ``/metrics``.

Names follow Prometheus' conventions: base units in the name (``_seconds``, never milliseconds), ``_total`` on
counters, ``_ratio`` on ratios. Gauges that describe the cluster are refreshed from the platform's model just
before each scrape (cheap: the model is in memory), so they can never drift from what
``/api/notebookos/cluster`` shows. ``docs/observability.md`` lists every metric with its unit.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

# No ``*_created`` series: in the text format they read as extra gauges (``notebookos_cells_created``) that no
# dashboard uses. The switch is process-wide; the gateway process has no other Prometheus registry.
disable_created_metrics()

# Interactivity delay buckets (seconds): a cell that starts within 1 s is "immediate" for users.
QUEUED_SECONDS_BUCKETS = (
    0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip


class PlatformMetrics:
    """Every metric the gateway exports."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.hosts = Gauge("notebookos_hosts", "Hosts in the cluster", registry=self.registry)
        self.gpus = Gauge(
            "notebookos_gpus",
            "GPUs per host by state: idle, pending (requested by replicas on the host), committed (running a cell)",
            ["host", "state"],
            registry=self.registry,
        )
        self.subscription_ratio = Gauge(
            "notebookos_subscription_ratio",
            "Cluster subscription ratio: GPUs requested by kernels' replicas per GPU per replica",
            registry=self.registry,
        )
        self.host_subscription_ratio = Gauge(
            "notebookos_host_subscription_ratio",
            "A host's subscription ratio: its pending GPUs / its GPUs / replicas per kernel",
            ["host"],
            registry=self.registry,
        )
        self.kernels = Gauge("notebookos_kernels", "NotebookOS kernels running", registry=self.registry)
        self.replicas = Gauge("notebookos_replicas", "Replicas per host", ["host"], registry=self.registry)
        self.queued_cells = Gauge("notebookos_queued_cells", "Cells waiting for GPUs", registry=self.registry)
        self.queued_seconds = Histogram(
            "notebookos_cell_queued_seconds",
            "Interactivity delay: seconds from a cell's arrival at the gateway to the start of its execution",
            buckets=QUEUED_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.cells = Counter(
            "notebookos_cells_total",
            "Cells by outcome: finished (ran and released its GPUs) or rejected (refused by the scheduler)",
            ["outcome"],
            registry=self.registry,
        )
        self.gpu_seconds_used = Counter(
            "notebookos_gpu_used_seconds_total",
            "GPU-seconds committed to running cells (one GPU for one second counts one)",
            registry=self.registry,
        )
        self.gpu_seconds_reserved = Gauge(
            "notebookos_gpu_reservation_seconds",
            "GPU-seconds that reserving each running kernel's GPUs for its whole life would have held so far",
            registry=self.registry,
        )
        self.migrations = Counter(
            "notebookos_migrations_total",
            "Replica migrations, by reason and outcome",
            ["reason", "outcome"],
            registry=self.registry,
        )
        self.migration_seconds = Histogram(
            "notebookos_migration_seconds",
            "Duration of replica migrations in seconds",
            buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300),
            registry=self.registry,
        )
        self.gpu_evictions = Counter(
            "notebookos_gpu_evictions_total",
            "GPU state moved off a device to host memory because the GPU was given to another replica (sticky GPUs), "
            "by outcome (ok, or failed: the replica did not answer or could not move it)",
            ["outcome"],
            registry=self.registry,
        )
        self.gpu_eviction_seconds = Histogram(
            "notebookos_gpu_eviction_seconds",
            "Seconds one eviction took (part of the waiting cell's queued time)",
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60),
            registry=self.registry,
        )
        self.scaling_events = Counter(
            "notebookos_scaling_events_total",
            "Autoscaler actions, by direction (out: a host added, in: a host removed)",
            ["direction"],
            registry=self.registry,
        )
