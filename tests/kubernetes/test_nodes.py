"""NodeInventory against a fake API: GPU nodes become hosts; additions, removals and cordons become events."""

from __future__ import annotations

import pytest
from fakekube import FakeCluster, until

from jupyter_notebookos.launchers.kubernetes.nodes import (
    GpuNode,
    NodeEvent,
    NodeEventKind,
    NodeInventory,
    diff_nodes,
)


@pytest.fixture
def inventory(cluster: FakeCluster):  # type: ignore[no-untyped-def]
    cluster.add_node("gpu-a", gpus=8)
    cluster.add_node("gpu-b", gpus=4)
    cluster.put("nodes", {**cluster.node_object("cpu-1"), "metadata": {"name": "cpu-1", "labels": {}}}, "ADDED")
    return NodeInventory(core_api=cluster.core, watch_factory=cluster.watch, cache_sync_timeout=5.0)


def kinds(events: list[NodeEvent]) -> list[tuple[str, NodeEventKind]]:
    return [(e.node.name, e.kind) for e in events]


@pytest.mark.asyncio
async def test_gpu_nodes_are_listed_as_hosts_and_followed(cluster: FakeCluster, inventory: NodeInventory) -> None:
    events: list[NodeEvent] = []
    inventory.add_listener(events.append)
    await inventory.start()
    try:
        assert cluster.called("list_node")[0]["label_selector"] == "nvidia.com/gpu.present=true"
        assert sorted(kinds(events)) == [("gpu-a", NodeEventKind.ADDED), ("gpu-b", NodeEventKind.ADDED)]
        assert [(n.name, n.gpus) for n in inventory.hosts()] == [("gpu-a", 8), ("gpu-b", 4)]
        events.clear()

        cluster.add_node("gpu-c", gpus=8)  # the autoscaler added a node
        await until(lambda: events)
        assert kinds(events) == [("gpu-c", NodeEventKind.ADDED)]
        assert str(events[0]) == "node gpu-c added (8 GPUs, ready, schedulable)"

        events.clear()
        cluster.modify_node("gpu-a", unschedulable=True)  # kubectl cordon
        await until(lambda: events)
        assert kinds(events) == [("gpu-a", NodeEventKind.CORDONED)]
        assert [n.name for n in inventory.hosts()] == ["gpu-b", "gpu-c"]

        events.clear()
        cluster.modify_node("gpu-a")
        await until(lambda: events)
        assert kinds(events) == [("gpu-a", NodeEventKind.UNCORDONED)]

        events.clear()  # the cluster autoscaler marks a node for removal
        cluster.modify_node("gpu-c", taints=[{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}])
        await until(lambda: events)
        assert kinds(events) == [("gpu-c", NodeEventKind.CORDONED)]

        events.clear()
        cluster.modify_node("gpu-b", gpus=4, ready=False)  # kubelet stopped reporting
        await until(lambda: events)
        assert kinds(events) == [("gpu-b", NodeEventKind.NOT_READY)]

        events.clear()
        cluster.delete_node("gpu-b")  # node lost: its replicas are lost too
        await until(lambda: events)
        assert kinds(events) == [("gpu-b", NodeEventKind.REMOVED)]
        assert "gpu-b" not in inventory.nodes

        events.clear()
        cluster.modify_node("gpu-a", gpus=6)
        await until(lambda: events)
        assert str(events[0]) == "node gpu-a: GPUs 8 -> 6"
    finally:
        await inventory.stop()


def test_node_diff_is_pure_and_complete() -> None:
    ready = GpuNode("n", gpus=8, ready=True, cordoned=False)
    assert diff_nodes(None, None) == []
    assert kinds(diff_nodes(None, ready)) == [("n", NodeEventKind.ADDED)]
    assert kinds(diff_nodes(ready, None)) == [("n", NodeEventKind.REMOVED)]
    assert diff_nodes(ready, ready) == []
    changed = GpuNode("n", gpus=0, ready=False, cordoned=True)
    assert [e.kind for e in diff_nodes(ready, changed)] == [
        NodeEventKind.CORDONED,
        NodeEventKind.NOT_READY,
        NodeEventKind.GPUS_CHANGED,
    ]
    assert not changed.usable and ready.usable
    assert not GpuNode("n", gpus=0, ready=True, cordoned=False).usable  # device plugin not up yet
