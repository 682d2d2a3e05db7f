"""The GPU nodes of the cluster, as hosts the scheduler can place replicas on.

:class:`NodeInventory` lists and watches the nodes that carry a configurable label, reads their allocatable
``nvidia.com/gpu``, and reports every change that matters to placement as a :class:`NodeEvent`: a node added
or removed, cordoned (by ``kubectl cordon``, or tainted for removal by the cluster autoscaler or Karpenter),
uncordoned, not ready, ready again, or with a different GPU count. The gateway feeds these events to the
scheduler; this module imports nothing of the scheduler.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from traitlets import Any as AnyTrait
from traitlets import Float, Integer, List, Unicode
from traitlets.config import LoggingConfigurable

from jupyter_notebookos.launchers.base import LaunchError
from jupyter_notebookos.launchers.kubernetes.reflector import Reflector

# Taints that mean "this node is about to go": treat them like a cordon.
REMOVAL_TAINTS = ("ToBeDeletedByClusterAutoscaler", "karpenter.sh/disrupted", "karpenter.sh/disruption")


class NodeEventKind(enum.Enum):
    """What happened to a GPU node."""

    ADDED = "added"
    REMOVED = "removed"
    CORDONED = "cordoned"
    UNCORDONED = "uncordoned"
    NOT_READY = "not-ready"
    READY = "ready"
    GPUS_CHANGED = "gpus-changed"


@dataclass(frozen=True)
class GpuNode:
    """One GPU node as a host: its allocatable GPUs and whether new replicas may go there."""

    name: str
    gpus: int
    ready: bool
    cordoned: bool
    labels: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def usable(self) -> bool:
        """Ready, schedulable and with GPUs: the scheduler may place replicas here."""
        return self.ready and not self.cordoned and self.gpus > 0

    def describe(self) -> str:
        """``8 GPUs, ready, schedulable``."""
        return (
            f"{self.gpus} GPUs, {'ready' if self.ready else 'not ready'}, "
            f"{'cordoned' if self.cordoned else 'schedulable'}"
        )


@dataclass(frozen=True)
class NodeEvent:
    """A change of one GPU node, with the node as it is now (as it was last, for REMOVED)."""

    kind: NodeEventKind
    node: GpuNode
    previous: GpuNode | None = None

    def __str__(self) -> str:
        if self.kind is NodeEventKind.GPUS_CHANGED and self.previous is not None:
            return f"node {self.node.name}: GPUs {self.previous.gpus} -> {self.node.gpus}"
        return f"node {self.node.name} {self.kind.value} ({self.node.describe()})"


def _gpu_count(value: object) -> int:
    try:
        return max(0, int(str(value)))
    except ValueError:
        return 0


def gpu_node_from(obj: dict[str, Any], resource: str = "nvidia.com/gpu") -> GpuNode:
    """A :class:`GpuNode` from an API-shaped Node dict."""
    meta, spec, node_status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in node_status.get("conditions") or [])
    leaving = any(t.get("key") in REMOVAL_TAINTS for t in spec.get("taints") or [])
    return GpuNode(
        name=str(meta.get("name")),
        gpus=_gpu_count((node_status.get("allocatable") or {}).get(resource, 0)),
        ready=ready,
        cordoned=bool(spec.get("unschedulable")) or leaving or bool(meta.get("deletionTimestamp")),
        labels=dict(meta.get("labels") or {}),
    )


def diff_nodes(before: GpuNode | None, after: GpuNode | None) -> list[NodeEvent]:
    """The events that take a node from ``before`` to ``after`` (``None``: not there)."""
    if before is None and after is None:
        return []
    if before is None:
        assert after is not None
        return [NodeEvent(NodeEventKind.ADDED, after)]
    if after is None:
        return [NodeEvent(NodeEventKind.REMOVED, before, before)]
    events = []
    if before.cordoned != after.cordoned:
        events.append(NodeEvent(NodeEventKind.CORDONED if after.cordoned else NodeEventKind.UNCORDONED, after, before))
    if before.ready != after.ready:
        events.append(NodeEvent(NodeEventKind.READY if after.ready else NodeEventKind.NOT_READY, after, before))
    if before.gpus != after.gpus:
        events.append(NodeEvent(NodeEventKind.GPUS_CHANGED, after, before))
    return events


NodeListener = Callable[[NodeEvent], None]


class NodeInventory(LoggingConfigurable):
    """Follows the cluster's GPU nodes through one watch and reports their changes as :class:`NodeEvent`."""

    label_selector = Unicode(
        "nvidia.com/gpu.present=true",
        config=True,
        help="Label selector of the nodes NotebookOS may use (the GPU operator's feature-discovery label by "
        "default; set your node pool's label to dedicate nodes).",
    )
    gpu_resource = Unicode("nvidia.com/gpu", config=True, help="Extended resource that counts a node's GPUs.")
    watch_timeout = Integer(300, config=True, help="Seconds before the node watch is renewed.")
    cache_sync_timeout = Float(30.0, config=True, help="Seconds to wait for the first listing of nodes.")
    ignored_nodes = List(Unicode(), config=True, help="Node names never used as hosts.")

    core_api = AnyTrait(None, allow_none=True, help="A kubernetes CoreV1Api (tests pass a fake).")
    watch_factory = AnyTrait(None, allow_none=True, help="Makes kubernetes.watch.Watch objects (tests: fake).")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.nodes: dict[str, GpuNode] = {}
        self._listeners: list[NodeListener] = []
        self._reflector: Reflector | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def add_listener(self, listener: NodeListener) -> None:
        """Call ``listener(event)`` on the event loop for every node event (also for the initial listing)."""
        self._listeners.append(listener)

    def hosts(self) -> list[GpuNode]:
        """The nodes replicas may be placed on now."""
        return sorted((n for n in self.nodes.values() if n.usable), key=lambda n: n.name)

    def apply(self, kind: str, obj: dict[str, Any]) -> list[NodeEvent]:
        """Update the inventory from one watch change and return the resulting events (no I/O)."""
        node = gpu_node_from(obj, self.gpu_resource)
        if node.name in self.ignored_nodes:
            return []
        before = self.nodes.get(node.name)
        after = None if kind == "DELETED" else node
        if after is None:
            self.nodes.pop(node.name, None)
        else:
            self.nodes[node.name] = after
        return diff_nodes(before, after)

    def _on_change(self, kind: str, obj: dict[str, Any]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        # Apply on the loop, so the inventory and the listeners see the changes in order, in one thread.
        loop.call_soon_threadsafe(self._deliver, kind, obj)

    def _deliver(self, kind: str, obj: dict[str, Any]) -> None:
        for event in self.apply(kind, obj):
            self.log.info("%s", event)
            for listener in self._listeners:
                try:
                    listener(event)
                except Exception:
                    self.log.exception("node listener failed on %s", event)

    async def start(self) -> None:
        """List the GPU nodes, report them as ADDED, then follow changes (idempotent)."""
        if self._reflector is not None:
            return
        self._loop = asyncio.get_running_loop()
        if self.core_api is None:
            from jupyter_notebookos.launchers.kubernetes.api import load_core_api

            self.core_api = await asyncio.to_thread(load_core_api)
        core: Any = self.core_api
        extra: dict[str, Any] = {"watch_factory": self.watch_factory} if self.watch_factory else {}
        self._reflector = Reflector(
            core.list_node,
            name="gpu-nodes",
            label_selector=self.label_selector,
            on_change=self._on_change,
            watch_timeout=self.watch_timeout,
            log=self.log,
            **extra,
        )
        self._reflector.start()
        if not await asyncio.to_thread(self._reflector.synced.wait, self.cache_sync_timeout):
            raise LaunchError(
                f"could not list nodes ({self._reflector.error}) within {self.cache_sync_timeout:.0f}s; the "
                "gateway's service account needs get/list/watch on nodes (the chart's ClusterRole)"
            )
        await asyncio.sleep(0)  # let the initial ADDED events reach the listeners

    async def stop(self) -> None:
        """Stop following nodes."""
        if self._reflector is not None:
            await asyncio.to_thread(self._reflector.stop)
            self._reflector = None
