"""What the platform records about each host and each NotebookOS kernel."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from jupyter_notebookos.gateway.control.access import KernelAccess
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


class KernelRegistry(Mapping[str, KernelRecord]):
    """The NotebookOS kernels this gateway runs, by id: the one record of them that every part of the platform
    reads. Only the platform adds and removes kernels (:meth:`add`, :meth:`remove`)."""

    def __init__(self) -> None:
        self._records: dict[str, KernelRecord] = {}

    def __getitem__(self, kernel_id: str) -> KernelRecord:
        return self._records[kernel_id]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._records))

    def __len__(self) -> int:
        return len(self._records)

    def add(self, record: KernelRecord) -> None:
        """The platform runs ``record``'s kernel from now on (a new incarnation replaces an old one's record)."""
        self._records[record.kernel_id] = record

    def remove(self, kernel_id: str) -> KernelRecord | None:
        """The platform no longer runs the kernel: its record, if there was one."""
        return self._records.pop(kernel_id, None)
