"""GPU nodes as the platform's hosts (Kubernetes): the node inventory's events, applied to the scheduler.

:class:`NodeHosts` listens to a :class:`~jupyter_notebookos.launchers.kubernetes.nodes.NodeInventory` and
applies its events in order, one at a time:

- a node that is ready and has GPUs joins: ``platform.add_host(name, gpus)`` (a node added while not ready,
  or before its device plugin reports GPUs, joins once it is ready with GPUs);
- cordoned (``kubectl cordon``, the cluster autoscaler's or Karpenter's removal taint) or not ready: the
  scheduler stops placing new replicas there (``cordon_host``); uncordoned and ready again: it resumes;
- removed: ``platform.remove_host(name)``: its replicas are lost and their replacements start elsewhere.

A node the autoscaler gave back (:class:`PlaceholderProvisioner`) does not join again by itself: the next
scale-out takes it back if it is still there.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Protocol

from jupyter_notebookos.gateway.control.migrator import SchedulingHost
from jupyter_notebookos.gateway.control.records import HostRecord
from jupyter_notebookos.launchers.kubernetes.nodes import GpuNode, NodeEvent, NodeEventKind, NodeInventory
from jupyter_notebookos.launchers.kubernetes.provisioner import PlaceholderProvisioner


class NodePlatform(SchedulingHost, Protocol):
    """What keeping hosts in step with nodes needs of the gateway platform (which implements it)."""

    @property
    def hosts(self) -> Mapping[str, HostRecord]: ...

    async def add_host(self, name: str, gpus: int, *, simulated: bool = True) -> None:
        """A new host is ready: the scheduler may use it."""

    async def remove_host(self, name: str) -> None:
        """A host leaves the cluster."""


class NodeHosts:
    """Keeps the platform's hosts in step with the cluster's GPU nodes."""

    def __init__(
        self,
        platform: NodePlatform,
        inventory: NodeInventory,
        provisioner: PlaceholderProvisioner | None = None,
    ) -> None:
        self.platform = platform
        self.inventory = inventory
        self.provisioner = provisioner
        self._events: asyncio.Queue[NodeEvent] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        inventory.add_listener(self._events.put_nowait)

    async def start(self) -> None:
        """List the nodes and make the usable ones hosts before returning, then follow changes.

        Call before ``platform.start()``: a restarted gateway re-attaches replicas only on known hosts.
        """
        await self.inventory.start()
        while not self._events.empty():
            await self.apply(self._events.get_nowait())
        self._worker = asyncio.ensure_future(self._follow())

    async def stop(self) -> None:
        """Stop following nodes (the hosts stay as they are)."""
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None
        await self.inventory.stop()

    async def _follow(self) -> None:
        while True:
            event = await self._events.get()
            try:
                await self.apply(event)
            except Exception:  # one bad event must not stop the others
                self.platform.log.exception("applying %s failed", event)

    async def apply(self, event: NodeEvent) -> None:
        """Apply one node event to the platform."""
        node = event.node
        joined = node.name in self.platform.hosts
        if event.kind is NodeEventKind.REMOVED:
            if self.provisioner is not None:
                self.provisioner.node_removed(node.name)
            if joined:
                await self.platform.remove_host(node.name)
            return
        if not joined:
            if node.ready and node.gpus > 0 and (self.provisioner is None or self.provisioner.accepts(node.name)):
                if self.provisioner is not None:
                    # Counted before add_host's etcd write: the host is in the scheduler from its first line, and
                    # the autoscaler must not count it twice (as a host and as a pending placeholder) meanwhile.
                    self.provisioner.node_joined(node.name)
                await self.platform.add_host(node.name, node.gpus, simulated=False)
                if node.cordoned:
                    self._cordon(node)
            return
        if event.kind in (
            NodeEventKind.CORDONED,
            NodeEventKind.UNCORDONED,
            NodeEventKind.NOT_READY,
            NodeEventKind.READY,
        ):
            self._cordon(node)
        elif event.kind is NodeEventKind.GPUS_CHANGED:
            if node.gpus == 0:
                self._cordon(node)
            else:
                self.platform.log.warning(
                    "%s: the scheduler keeps %s's previous GPU count until the node joins again",
                    event,
                    node.name,
                )

    def _cordon(self, node: GpuNode) -> None:
        platform = self.platform
        cordoned = node.cordoned or not node.ready or node.gpus == 0
        platform.log.info("scheduler: %s", platform.scheduler.cordon_host(node.name, platform.now(), cordoned))
        if not cordoned:
            platform.dispatch()
