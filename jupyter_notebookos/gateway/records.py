"""What the platform records about each host and each NotebookOS kernel."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from jupyter_notebookos.gateway.access import KernelAccess
from jupyter_notebookos.gateway.router import ReplicaRouter
from jupyter_notebookos.gpu.discovery import GpuDevice
from jupyter_notebookos.launchers.base import ReplicaHandle


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
    """A NotebookOS kernel known to the platform."""

    kernel_id: str
    kernel_name: str
    gpus: int
    router: ReplicaRouter
    env: dict[str, str]
    handles: dict[str, ReplicaHandle] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)
    next_replica: int = 3
    # The scheduler's replica ids (a migrated replica keeps its id there) -> the replica processes' ids.
    router_ids: dict[int, str] = field(default_factory=dict)
    # The kernel's own etcd credentials (what its replicas get; never the gateway's).
    access: KernelAccess | None = None
    # The kernelspec's process_proxy config (image, resources...), given to the launcher with every replica.
    config: dict[str, Any] = field(default_factory=dict)
    # KERNEL_LAUNCH_TIMEOUT (or the kernelspec's launch_timeout) as the process proxy resolved it; None: defaults.
    launch_timeout: float | None = None

    def router_id(self, scheduler_id: int) -> str:
        """The replica process that stands for the scheduler's replica ``scheduler_id`` now."""
        return self.router_ids.get(scheduler_id, str(scheduler_id))

    def scheduler_id(self, router_id: str) -> int | None:
        """The scheduler's id of the replica process ``router_id`` (None if unknown)."""
        for sid, rid in self.router_ids.items():
            if rid == router_id:
                return sid
        return int(router_id) if router_id.isdigit() and int(router_id) not in self.router_ids else None

    def fresh_router_id(self, wanted: int) -> str:
        """A process id for a new replica: the scheduler's id when free, else the next unused number."""
        used = set(self.handles) | set(self.router_ids.values()) | set(self.router.registrations)
        if str(wanted) not in used:
            self.next_replica = max(self.next_replica, wanted + 1)
            return str(wanted)
        while str(self.next_replica) in used:
            self.next_replica += 1
        self.next_replica += 1
        return str(self.next_replica - 1)
