"""The gateway's platform: the cluster model, etcd, and (later) launchers and replica routers.

One instance lives in the gateway process. Handlers read it; it owns every long-lived resource and
starts/stops them in order.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from jupyter_notebookos.coordination import keys
from jupyter_notebookos.coordination.client import Coordinator
from jupyter_notebookos.gateway.metrics import PlatformMetrics
from jupyter_notebookos.gpu.discovery import GpuDevice, host_devices, nvml_devices


@dataclass
class HostRecord:
    """A host as the gateway sees it (embedded mode: a simulated host on this machine)."""

    name: str
    devices: list[GpuDevice]

    @property
    def simulated(self) -> bool:
        return all(d.simulated for d in self.devices) if self.devices else True


class GatewayPlatform:
    """Everything NotebookOS adds to the gateway process."""

    def __init__(
        self,
        *,
        etcd_endpoints: list[str],
        etcd_prefix: str,
        etcd_timeout: float,
        simulated_hosts: int,
        gpus_per_host: int,
        state_dir: str,
        object_store_url: str,
        log: logging.Logger | Any,
    ) -> None:
        self.etcd_endpoints = etcd_endpoints
        self.etcd_prefix = etcd_prefix
        self.etcd_timeout = etcd_timeout
        self.state_dir = state_dir
        self.object_store_url = object_store_url
        self.log = log
        self.metrics = PlatformMetrics()
        real = nvml_devices()
        self.hosts = {
            name: HostRecord(name, host_devices(name, gpus_per_host, real=real))
            for name in (f"host-{i}" for i in range(simulated_hosts))
        }
        self.coordinator: Coordinator | None = None

    async def start(self) -> None:
        """Connect to etcd and publish the hosts."""
        self.coordinator = await Coordinator.connect(self.etcd_endpoints, timeout=self.etcd_timeout)
        for host in self.hosts.values():
            record = {
                "name": host.name,
                "gpus": len(host.devices),
                "simulated": host.simulated,
                "devices": [{"index": d.index, "uuid": d.uuid, "name": d.name} for d in host.devices],
            }
            await self.coordinator.put(keys.host(host.name, prefix=self.etcd_prefix), json.dumps(record))
        self.log.info(
            "NotebookOS platform up: %d hosts, %d GPUs, etcd at %s",
            len(self.hosts),
            sum(len(h.devices) for h in self.hosts.values()),
            ",".join(self.etcd_endpoints),
        )

    async def stop(self) -> None:
        """Release etcd."""
        if self.coordinator is not None:
            await self.coordinator.close()
            self.coordinator = None

    def cluster_snapshot(self) -> dict[str, Any]:
        """The body of ``GET /api/notebookos/cluster``."""
        hosts = [
            {
                "name": h.name,
                "gpus": len(h.devices),
                "gpus_committed": 0,
                "gpus_pending": 0,
                "replicas": 0,
                "simulated": h.simulated,
            }
            for h in self.hosts.values()
        ]
        return {"hosts": hosts, "subscription_ratio": 0.0, "kernels": []}

    def refresh_metrics(self) -> None:
        """Bring the cluster gauges up to date before a scrape."""
        snapshot = self.cluster_snapshot()
        self.metrics.hosts.set(len(snapshot["hosts"]))
        for host in snapshot["hosts"]:
            committed, pending = host["gpus_committed"], host["gpus_pending"]
            self.metrics.gpus.labels(host["name"], "committed").set(committed)
            self.metrics.gpus.labels(host["name"], "pending").set(pending)
            self.metrics.gpus.labels(host["name"], "idle").set(host["gpus"] - committed)
            self.metrics.replicas.labels(host["name"]).set(host["replicas"])
        self.metrics.subscription_ratio.set(snapshot["subscription_ratio"])
        self.metrics.kernels.set(len(snapshot["kernels"]))
