"""``PlaceholderProvisioner``: the autoscaler's host provisioner on Kubernetes.

The gateway never creates nodes. Scale-out asks :class:`~.placeholders.PlaceholderPool` for more placeholder
pods; the cluster autoscaler (or Karpenter) adds a GPU node for each Pending one, and the node joins the
scheduler through the :class:`~.nodes.NodeInventory` (the gateway's node adapter calls ``add_host``), like any
node that appears, whoever added it. Scale-in, after the scheduler drained a host, deletes the placeholder on
that node so the cluster autoscaler may remove it.

A node given back stays a node until the cluster autoscaler removes it; while it is still there, the next
scale-out takes it back at once (``on_ready``) instead of asking for a new one.
"""

from __future__ import annotations

from typing import Any

from jupyter_notebookos.launchers.base import LaunchError
from jupyter_notebookos.launchers.kubernetes.nodes import NodeInventory
from jupyter_notebookos.launchers.kubernetes.placeholders import PlaceholderPool, PlaceholderScaling
from jupyter_notebookos.launchers.provisioning import HostProvisioner, HostReady


class PlaceholderProvisioner(HostProvisioner):
    """Turns ``provision`` / ``release`` into placeholder pods; hosts arrive as GPU nodes."""

    def __init__(self, pool: PlaceholderPool, inventory: NodeInventory, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pool = pool
        self.inventory = inventory
        self._pending = 0
        self._released: set[str] = set()
        self.last: PlaceholderScaling | None = None

    @property
    def provisioning(self) -> int:
        """Placeholders asked for whose node has not joined yet."""
        return self._pending

    def accepts(self, node: str) -> bool:
        """Whether a node may join the scheduler (False for a node given back and not yet taken back)."""
        return node not in self._released

    def node_joined(self, node: str) -> None:
        """A GPU node joined the scheduler: one placeholder fewer is waiting for its node."""
        self._pending = max(0, self._pending - 1)

    def node_removed(self, node: str) -> None:
        """A node left the cluster: nothing to take back any more."""
        self._released.discard(node)

    async def provision(self, count: int, on_ready: HostReady) -> None:
        """Take back nodes given back earlier that are still there, then ask for the rest by placeholders."""
        for name in sorted(self._released):
            node = self.inventory.nodes.get(name)
            if count <= 0:
                break
            if node is None or not node.usable:
                continue
            self._released.discard(name)
            count -= 1
            self.log.info("taking back node %s (%d GPUs), still in the cluster", name, node.gpus)
            await on_ready(name, node.gpus)
        if count <= 0:
            return
        current = await self.pool.list()
        # Placeholders on nodes given back hold nothing for us; the new ones come on top of the others.
        held = [p for p in current if p.node not in self._released]
        decision = await self.pool.scale_to(len(held) + count, avoid_nodes=sorted(self.inventory.nodes))
        self.last = decision
        self._pending = decision.pending
        if decision.errors:
            raise LaunchError(f"could not ask for {count} GPU node(s): {'; '.join(decision.errors)}")

    async def release(self, host: str) -> None:
        """Delete the placeholder on ``host`` (a drained node), so the cluster autoscaler may remove it."""
        current = await self.pool.list()
        self._released.add(host)
        if not any(p.node == host for p in current):
            self.log.info("node %s holds no placeholder; the cluster autoscaler or its operator removes it", host)
            return
        decision = await self.pool.scale_to(len(current) - 1, release_nodes=[host])
        self.last = decision
        if decision.errors:
            raise LaunchError(f"could not give node {host} back: {'; '.join(decision.errors)}")

    async def close(self) -> None:
        """Nothing runs in the background; placeholders stay (a restarted gateway finds them again)."""
