"""Host provisioning: how the autoscaler's decisions become hosts, behind one interface.

The scheduler decides how many hosts the cluster needs; a :class:`HostProvisioner` makes that true. In the
embedded mode :class:`SimulatedHostProvisioner` adds simulated hosts after a configurable provisioning delay
(so waiting and queueing behave as on a real cloud) and removes them at once. On Kubernetes the provisioner
creates and deletes placeholder pods, and nodes arrive through the node inventory
(:mod:`jupyter_notebookos.launchers.kubernetes.placeholders`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from traitlets import Float, Int, Unicode
from traitlets.config import LoggingConfigurable

#: Called when a provisioned host is ready: its name and GPU count.
HostReady = Callable[[str, int], Awaitable[None]]


class HostProvisioner(LoggingConfigurable):
    """Adds and removes hosts for the autoscaler. Subclasses implement every method."""

    @property
    def provisioning(self) -> int:
        """Hosts asked for and not ready yet."""
        raise NotImplementedError

    async def provision(self, count: int, on_ready: HostReady) -> None:
        """Ask for ``count`` more hosts; ``on_ready`` is awaited for each once it can take replicas."""
        raise NotImplementedError

    async def release(self, host: str) -> None:
        """Give a drained, empty host back."""
        raise NotImplementedError

    async def close(self) -> None:
        """Cancel what is still being provisioned."""


class SimulatedHostProvisioner(HostProvisioner):
    """Embedded mode: simulated hosts that appear ``provisioning_delay`` seconds after they are asked for."""

    provisioning_delay = Float(
        30.0, config=True, help="Seconds between asking for a simulated host and its being ready (a cloud's boot time)."
    )
    gpus_per_host = Int(8, config=True, help="GPUs of each simulated host the autoscaler adds.")
    name_prefix = Unicode("host-", config=True, help="Names of added hosts: this prefix and a number.")

    def __init__(self, existing: int = 0, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._next = existing
        self._pending: set[asyncio.Task[None]] = set()

    @property
    def provisioning(self) -> int:
        return len(self._pending)

    async def provision(self, count: int, on_ready: HostReady) -> None:
        for _ in range(count):
            name = f"{self.name_prefix}{self._next}"
            self._next += 1
            task = asyncio.ensure_future(self._boot(name, on_ready))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
            self.log.info(
                "provisioning simulated host %s (%d GPUs, ready in %.0f s)",
                name,
                self.gpus_per_host,
                self.provisioning_delay,
            )

    async def _boot(self, name: str, on_ready: HostReady) -> None:
        await asyncio.sleep(self.provisioning_delay)
        await on_ready(name, self.gpus_per_host)

    async def release(self, host: str) -> None:
        self.log.info("released simulated host %s", host)

    async def close(self) -> None:
        for task in list(self._pending):
            task.cancel()
