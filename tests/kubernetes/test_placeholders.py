"""PlaceholderPool against a fake API: scale-out creates whole-node GPU placeholders, scale-in deletes them."""

from __future__ import annotations

import pytest
from fakekube import NAMESPACE, FakeCluster, validate_strict

from jupyter_notebookos.launchers.base import LaunchError
from jupyter_notebookos.launchers.kubernetes.objects import make_priority_class
from jupyter_notebookos.launchers.kubernetes.placeholders import PlaceholderPool

pytestmark = pytest.mark.asyncio


def pool(cluster: FakeCluster) -> PlaceholderPool:
    return PlaceholderPool(
        namespace=NAMESPACE, gpus_per_node=8, core_api=cluster.core, scheduling_api=cluster.scheduling
    )


async def test_missing_priority_class_is_reported_with_the_fix(cluster: FakeCluster) -> None:
    with pytest.raises(LaunchError, match="PriorityClass 'notebookos-placeholder' does not exist"):
        await pool(cluster).check_priority_class()
    cluster.priority_classes["notebookos-placeholder"] = make_priority_class()
    await pool(cluster).check_priority_class()


async def test_scale_out_then_in_through_placeholders(cluster: FakeCluster) -> None:
    placeholders = pool(cluster)
    decision = await placeholders.scale_to(3)
    assert (decision.before, decision.desired, len(decision.created), decision.pending) == (0, 3, 3, 3)
    assert str(decision).startswith("placeholders: 0 -> 3; created notebookos-placeholder-")
    pods = cluster.pods("component=notebookos-placeholder")
    assert len(pods) == 3
    for pod in pods:
        validate_strict(pod)
        assert pod["spec"]["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "8"}

    # The autoscaler provisioned nodes for two of them.
    names = sorted(p["metadata"]["name"] for p in pods)
    cluster.set_pod_status(NAMESPACE, names[0], {"phase": "Running"}, node="gpu-x")
    cluster.set_pod_status(NAMESPACE, names[1], {"phase": "Running"}, node="gpu-y")
    again = await placeholders.scale_to(3)
    assert (again.created, again.deleted, again.pending) == ((), (), 1)
    assert str(again) == "placeholders: no action, 3 present (1 waiting for a node)"

    # Scale in by two after the scheduler drained gpu-y: its placeholder goes first, then the pending one.
    shrink = await placeholders.scale_to(1, release_nodes=["gpu-y"])
    assert shrink.deleted == (names[1], names[2])
    assert [p["metadata"]["name"] for p in cluster.pods("component=notebookos-placeholder")] == [names[0]]
    assert all(c["grace_period_seconds"] == 0 for c in cluster.called("delete_namespaced_pod"))

    await placeholders.scale_to(0)
    assert cluster.pods() == []


async def test_scale_out_is_capped_and_rejects_negative_targets(cluster: FakeCluster) -> None:
    placeholders = pool(cluster)
    placeholders.max_placeholders = 2
    assert len((await placeholders.scale_to(10)).created) == 2
    with pytest.raises(ValueError, match="0 or more"):
        await placeholders.scale_to(-1)


async def test_placeholders_are_owned_by_the_release_so_uninstall_frees_their_nodes(cluster: FakeCluster) -> None:
    owner = cluster.add_config_map(NAMESPACE, "nbos-notebookos-kernel-owner")
    placeholders = PlaceholderPool(
        namespace=NAMESPACE, core_api=cluster.core, owner_config_map="nbos-notebookos-kernel-owner"
    )
    await placeholders.scale_to(2)
    for pod in cluster.pods("component=notebookos-placeholder"):
        validate_strict(pod)
        (reference,) = pod["metadata"]["ownerReferences"]
        assert (reference["kind"], reference["name"], reference["uid"]) == (
            "ConfigMap",
            "nbos-notebookos-kernel-owner",
            owner["metadata"]["uid"],
        )
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
