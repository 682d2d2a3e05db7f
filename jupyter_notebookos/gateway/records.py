"""What the platform records about each host and each NotebookOS kernel."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from jupyter_notebookos.gateway.access import KernelAccess
from jupyter_notebookos.gateway.router import ReplicaRouter
from jupyter_notebookos.gateway.router.replicas import KernelReplicas
from jupyter_notebookos.gpu.discovery import GpuDevice


@dataclass
class HostRecord:
    """A host as the gateway sees it (embedded mode: a simulated host on this machine)."""

    name: str
    devices: list[GpuDevice]

    @property
    def simulated(self) -> bool:
        return all(d.simulated for d in self.devices) if self.devices else True


@dataclass
class KernelRecord:
    """A NotebookOS kernel known to the platform (its replicas: :attr:`replicas`)."""

    kernel_id: str
    kernel_name: str
    gpus: int
    router: ReplicaRouter
    env: dict[str, str]
    started_at: float = field(default_factory=time.time)
    # The kernel's own etcd credentials (what its replicas get; never the gateway's).
    access: KernelAccess | None = None
    # The kernelspec's process_proxy config (image, resources...), given to the launcher with every replica.
    config: dict[str, Any] = field(default_factory=dict)
    # KERNEL_LAUNCH_TIMEOUT (or the kernelspec's launch_timeout) as the process proxy resolved it; None: defaults.
    launch_timeout: float | None = None

    @property
    def replicas(self) -> KernelReplicas:
        """The kernel's replicas: the one record of them, which its router keeps up to date from etcd."""
        return self.router.replicas
