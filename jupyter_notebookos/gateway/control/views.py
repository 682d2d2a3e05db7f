"""What the platform shows: ``GET /api/notebookos/cluster``, ``GET /api/notebookos/kernels/{id}``, ``/metrics``."""

from __future__ import annotations

import time
from typing import Any

from jupyter_notebookos.gateway.control.autoscaler import Autoscaler
from jupyter_notebookos.gateway.control.decisionlog import now
from jupyter_notebookos.gateway.control.migrator import MigrationRunner
from jupyter_notebookos.gateway.control.platformmetrics import PlatformMetrics
from jupyter_notebookos.gateway.control.records import KernelRegistry
from jupyter_notebookos.gateway.control.residency import GpuResidency
from jupyter_notebookos.scheduler import Scheduler


class PlatformViews:
    """Summarises the cluster and its kernels for the REST API and the metrics (reads the platform's parts, writes
    only the metrics' gauges)."""

    def __init__(
        self,
        *,
        scheduler: Scheduler,
        kernels: KernelRegistry,
        residency: GpuResidency,
        metrics: PlatformMetrics,
        migrations: MigrationRunner,
        autoscaler: Autoscaler | None,
    ) -> None:
        self.scheduler = scheduler
        self.kernels = kernels
        self.residency = residency
        self.metrics = metrics
        self.migrations = migrations
        self.autoscaler = autoscaler

    def cluster_snapshot(self) -> dict[str, Any]:
        """The body of ``GET /api/notebookos/cluster``."""
        hosts = [
            {
                "name": h.name,
                "gpus": h.gpus,
                "gpus_idle": h.idle,
                "gpus_committed": h.committed,
                "gpus_pending": h.pending,
                "replicas": h.replicas,
                "simulated": h.simulated,
                "cordoned": h.cordoned,
                "draining": h.draining,
                "subscription_ratio": round(h.subscription_ratio, 4),
            }
            for h in self.scheduler.hosts()
        ]
        kernels = [self.kernel_summary(kid) for kid in self.kernels]
        at = now()
        queue = [
            {
                "position": position,
                "kernel_id": q.kernel_id,
                "cell_id": q.cell_id,
                "gpus": q.gpus,
                "waiting_ms": round(max(0.0, at - q.requested_at) * 1000.0, 1),
            }
            for position, q in enumerate(self.scheduler.queued_cells(), start=1)
        ]
        return {
            "hosts": hosts,
            "subscription_ratio": round(self.scheduler.subscription_limit, 4),
            "kernels": kernels,
            "queue": queue,
            "migrations": self.migrations.snapshot(),
            "scaling": self.autoscaler.snapshot() if self.autoscaler is not None else {"enabled": False},
        }

    def kernel_summary(self, kernel_id: str) -> dict[str, Any]:
        """The body of ``GET /api/notebookos/kernels/{kernel_id}``."""
        record = self.kernels[kernel_id]
        router = record.router
        replicas = []
        for rid, handle in sorted(record.replicas.handles().items()):
            registration = record.replicas.registration(rid)
            replicas.append(
                {
                    "replica_id": rid,
                    "host": handle.host,
                    "state": "ready" if registration else "starting",
                    "applied_seq": record.replicas.applied(rid),
                    "pid": registration.pid if registration else handle.pid,
                    "pod": registration.pod if registration else handle.pod,
                    "change_detection": registration.change_detection if registration else None,
                    "gpus_resident": self.residency.resident_on(kernel_id, rid),
                }
            )
        summary = router.summary()
        since_start = time.time() - record.started_at
        held = record.gpus * since_start
        scheduled = self.scheduler.kernel(kernel_id)
        waiting = list(scheduled.queued) if scheduled is not None else []
        cell = scheduled.running if scheduled is not None else None
        # The scheduler knows first: a dispatched cell holds its GPUs before the router has forwarded it.
        if summary["running"] or (cell is not None and cell.started_at is not None):
            state = "running"
        elif cell is not None:
            state = "waiting for a migration"
        else:
            state = "waiting for GPUs" if waiting else "idle"
        return {
            "kernel_id": kernel_id,
            "kernel_name": record.kernel_name,
            "gpus": record.gpus,
            "replicas": replicas,
            "executor": summary["executor"],
            "state": state,
            "waiting_for_gpus": waiting,
            "cells": summary["cells"],
            "queued": summary["queued"],
            "running": summary["running"],
            "gpu_seconds_used": summary["gpu_seconds_used"],
            "gpu_seconds_running": summary["gpu_seconds_running"],
            # Seconds since the kernel's last cell ended (since its start if none ran); None while a cell runs or waits.
            "idle_seconds": _idle_seconds(state, summary["idle_seconds"], summary["cells"], since_start),
            # Where the kernel's state lives: "resident" (its replicas hold it in memory). Hibernation (state in the
            # object store, no replica running, woken by the next cell) is not built yet; it will say "hibernated".
            "residency": "resident",
            # How clients' shell messages reached the router: in-process from this gateway's websocket, or over ZMQ.
            "client_shell_messages": summary["client_shell_messages"],
            # Messages the router handed to this gateway's websocket connections in-process (not over ZMQ).
            "messages_to_clients_in_process": summary["messages_to_clients_in_process"],
            "gpu_seconds_held_if_reserved": round(held, 3),
        }

    def refresh_metrics(self) -> None:
        """Bring the cluster gauges up to date before a scrape."""
        snapshot = self.cluster_snapshot()
        self.metrics.hosts.set(len(snapshot["hosts"]))
        for host in snapshot["hosts"]:
            committed, pending = host["gpus_committed"], host["gpus_pending"]
            self.metrics.gpus.labels(host["name"], "committed").set(committed)
            self.metrics.gpus.labels(host["name"], "pending").set(pending)
            self.metrics.gpus.labels(host["name"], "idle").set(host["gpus_idle"])
            self.metrics.replicas.labels(host["name"]).set(host["replicas"])
            self.metrics.host_subscription_ratio.labels(host["name"]).set(host["subscription_ratio"])
        self.metrics.subscription_ratio.set(snapshot["subscription_ratio"])
        self.metrics.kernels.set(len(snapshot["kernels"]))
        self.metrics.queued_cells.set(len(snapshot["queue"]))
        self.metrics.gpu_seconds_reserved.set(sum(k["gpu_seconds_held_if_reserved"] for k in snapshot["kernels"]))


def _idle_seconds(state: str, since_last_cell: float | None, cells: int, since_start: float) -> float | None:
    if state != "idle":
        return None
    if since_last_cell is not None:
        return since_last_cell
    return round(max(0.0, since_start), 3) if cells == 0 else None
