"""KubernetesLauncher against a fake API: launches, fail-fast reasons, pod loss, migration, re-attach."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
from fakekube import NAMESPACE, FakeCluster, until, validate_strict

from jupyter_notebookos.launchers.base import LaunchError, ReplicaHandle, ReplicaPhase, ReplicaSpec, ReplicaStatus
from jupyter_notebookos.launchers.kubernetes.launcher import KubernetesLauncher

pytestmark = pytest.mark.asyncio

KERNEL = "0b6e3c9a-1f2d-4e5a-8b7c-9d0e1f2a3b4c"


def spec(replica: str = "r0", host: str = "gpu-a", **env: str) -> ReplicaSpec:
    return ReplicaSpec(kernel_id=KERNEL, replica_id=replica, host=host, kernel_name="python3-notebookos", env=env)


async def created_pod(cluster: FakeCluster, replica: str = "r0") -> str:
    """The name of the replica's pod, once the launcher has created it."""
    return await until(
        lambda: next((p["metadata"]["name"] for p in cluster.pods(f"kernel_id={KERNEL},replica_id={replica}")), None)
    )


async def test_launch_returns_once_the_pod_runs_on_its_host(
    cluster: FakeCluster, make_launcher: Callable[..., KubernetesLauncher]
) -> None:
    launcher = make_launcher()
    launch = asyncio.create_task(launcher.start_replica(spec("r0", "gpu-a")))
    name = await created_pod(cluster)
    await asyncio.sleep(0.05)
    assert not launch.done()  # still Pending: the launch waits
    cluster.run_pod(NAMESPACE, name, "gpu-a")
    handle = await asyncio.wait_for(launch, 5)
    assert (handle.kernel_id, handle.replica_id, handle.host, handle.pod) == (KERNEL, "r0", "gpu-a", name)
    (call,) = cluster.called("create_namespaced_pod")
    assert call["namespace"] == NAMESPACE
    validate_strict(call["body"])
    assert (await launcher.status(handle)).phase is ReplicaPhase.RUNNING


async def test_unschedulable_pod_fails_the_launch_fast_with_the_schedulers_reason(
    cluster: FakeCluster, make_launcher: Callable[..., KubernetesLauncher]
) -> None:
    launcher = make_launcher()
    launch = asyncio.create_task(launcher.start_replica(spec("r1", "gpu-b")))
    name = await created_pod(cluster, "r1")
    message = "0/3 nodes are available: 1 Insufficient memory, 2 node(s) didn't match pod anti-affinity rules."
    cluster.add_event(NAMESPACE, name, "FailedScheduling", message)
    with pytest.raises(LaunchError) as caught:
        await asyncio.wait_for(launch, 2)
    assert "cannot start: FailedScheduling: 0/3 nodes are available: 1 Insufficient memory" in str(caught.value)
    assert cluster.called("delete_namespaced_pod")[0]["name"] == name  # no pod left behind
    assert cluster.pods() == []


async def test_unschedulable_condition_fails_fast_but_a_triggered_scale_up_is_waited_for(
    cluster: FakeCluster, make_launcher: Callable[..., KubernetesLauncher]
) -> None:
    launcher = make_launcher()
    launch = asyncio.create_task(launcher.start_replica(spec("r0", "")))
    name = await created_pod(cluster)
    scale_up = "pod triggered scale-up: [{gpu-pool 2->3 (max: 10)}]"
    cluster.add_event(NAMESPACE, name, "TriggeredScaleUp", scale_up, "Normal")
    await until(lambda: launcher._pod_events.get(f"{NAMESPACE}/{name}"))
    unschedulable = {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/2 nodes are available"}
        ],
    }
    cluster.set_pod_status(NAMESPACE, name, unschedulable)
    await asyncio.sleep(0.1)
    assert not launch.done()  # the autoscaler is adding a node
    cluster.run_pod(NAMESPACE, name, "gpu-new")
    assert (await asyncio.wait_for(launch, 5)).host == "gpu-new"

    launch = asyncio.create_task(launcher.start_replica(spec("r1", "")))
    name = await created_pod(cluster, "r1")
    cluster.set_pod_status(NAMESPACE, name, unschedulable)
    with pytest.raises(LaunchError, match="Unschedulable: 0/2 nodes are available"):
        await asyncio.wait_for(launch, 2)


async def test_image_pull_failure_fails_the_launch_fast(
    cluster: FakeCluster, make_launcher: Callable[..., KubernetesLauncher]
) -> None:
    launcher = make_launcher(allowed_images=["registry.example.com/*"])
    launch = asyncio.create_task(launcher.start_replica(spec(KERNEL_IMAGE="registry.example.com/no/such:tag")))
    name = await created_pod(cluster)
    cluster.set_pod_status(
        NAMESPACE,
        name,
        {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": "replica",
                    "image": "registry.example.com/no/such:tag",
                    "state": {"waiting": {"reason": "ErrImagePull", "message": "manifest unknown"}},
                }
            ],
        },
        node="gpu-a",
    )
    with pytest.raises(LaunchError, match="ErrImagePull: manifest unknown"):
        await asyncio.wait_for(launch, 2)
    assert cluster.called("delete_namespaced_pod")[0]["grace_period_seconds"] == 0


async def test_pod_that_fails_before_running_fails_the_launch_with_its_exit(
    cluster: FakeCluster, make_launcher: Callable[..., KubernetesLauncher]
) -> None:
    launcher = make_launcher()
    launch = asyncio.create_task(launcher.start_replica(spec()))
    name = await created_pod(cluster)
    cluster.set_pod_status(
        NAMESPACE,
        name,
        {
            "phase": "Failed",
            "containerStatuses": [
                {"name": "replica", "state": {"terminated": {"reason": "Error", "exitCode": 1, "message": "no etcd"}}}
            ],
        },
        node="gpu-a",
    )
    with pytest.raises(LaunchError, match=r"stopped before it ran: Error \(exit code 1\): no etcd"):
        await asyncio.wait_for(launch, 2)


async def test_launch_times_out_with_advice(
    cluster: FakeCluster, make_launcher: Callable[..., KubernetesLauncher]
) -> None:
    launcher = make_launcher()
    with pytest.raises(LaunchError, match=r"did not start within 0s; raise KubernetesLauncher.launch_timeout"):
        await launcher.start_replica(dataclasses.replace(spec(), launch_timeout=0.2))
    assert cluster.pods() == []


async def test_api_refusal_becomes_a_launch_error_with_the_rbac_hint(
    cluster: FakeCluster, make_launcher: Callable[..., KubernetesLauncher]
) -> None:
    launcher = make_launcher(namespace="forbidden")
    with pytest.raises(LaunchError, match=r"HTTP 403.*check the chart's RBAC"):
        await launcher.start_replica(spec())


async def test_evicted_and_deleted_replicas_report_why(
    cluster: FakeCluster, make_launcher: Callable[..., KubernetesLauncher]
) -> None:
    launcher = make_launcher()
    handles = []
    for replica, node in (("r0", "gpu-a"), ("r1", "gpu-b")):
        launch = asyncio.create_task(launcher.start_replica(spec(replica, node)))
        cluster.run_pod(NAMESPACE, await created_pod(cluster, replica), node)
        handles.append(await asyncio.wait_for(launch, 5))
    evicted, lost = handles

    cluster.set_pod_status(
        NAMESPACE,
        evicted.pod or "",
        {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."},
    )
    status = await _status_when(launcher, evicted, ReplicaPhase.FAILED)
    assert status.reason == "Evicted: The node was low on resource: memory."

    # The node is lost: its pods are deleted (pod GC / taint eviction).
    assert [h.replica_id for h in await launcher.replicas_on_host("gpu-b")] == ["r1"]
    cluster.core.delete_namespaced_pod(lost.pod or "", NAMESPACE)
    status = await _status_when(launcher, lost, ReplicaPhase.EXITED)
    assert status.reason == "pod was deleted"
    assert await launcher.find_replicas(KERNEL) == []


async def _status_when(launcher: KubernetesLauncher, handle: ReplicaHandle, phase: ReplicaPhase) -> ReplicaStatus:
    status = ReplicaStatus(ReplicaPhase.UNKNOWN)
    for _ in range(500):
        status = await launcher.status(handle)
        if status.phase is phase:
            return status
        await asyncio.sleep(0.01)
    raise AssertionError(f"{handle.pod} never reached {phase}: {status}")


async def test_stop_replica_deletes_politely_or_now(
    cluster: FakeCluster, make_launcher: Callable[..., KubernetesLauncher]
) -> None:
    launcher = make_launcher()
    launch = asyncio.create_task(launcher.start_replica(spec()))
    cluster.run_pod(NAMESPACE, await created_pod(cluster), "gpu-a")
    handle = await asyncio.wait_for(launch, 5)
    await launcher.stop_replica(handle)
    assert cluster.called("delete_namespaced_pod")[-1] == {
        "name": handle.pod,
        "namespace": NAMESPACE,
        "grace_period_seconds": None,
    }
    await launcher.stop_replica(handle, now=True)  # already gone: not an error
    assert cluster.called("delete_namespaced_pod")[-1]["grace_period_seconds"] == 0


async def test_migration_starts_a_pinned_pod_on_the_target_then_retires_the_old_one(
    cluster: FakeCluster, make_launcher: Callable[..., KubernetesLauncher]
) -> None:
    launcher = make_launcher()
    handles = {}
    for replica, node in (("r0", "gpu-a"), ("r1", "gpu-b"), ("r2", "gpu-c")):
        launch = asyncio.create_task(launcher.start_replica(spec(replica, node)))
        cluster.run_pod(NAMESPACE, await created_pod(cluster, replica), node)
        handles[replica] = await asyncio.wait_for(launch, 5)

    # Move r1 to gpu-d: a new pod (new name, same replica id) pinned to the target node.
    launch = asyncio.create_task(launcher.start_replica(spec("r1", "gpu-d")))
    new_name = await until(
        lambda: next(
            (n for p in cluster.pods("replica_id=r1") if (n := p["metadata"]["name"]) != handles["r1"].pod),
            None,
        )
    )
    body = cluster.pod(NAMESPACE, new_name)
    pin = body["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert pin["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["gpu-d"]
    cluster.run_pod(NAMESPACE, new_name, "gpu-d")
    moved = await asyncio.wait_for(launch, 5)
    await launcher.stop_replica(handles["r1"])
    await _status_when(launcher, handles["r1"], ReplicaPhase.EXITED)
    assert sorted(h.host for h in await launcher.find_replicas(KERNEL)) == ["gpu-a", "gpu-c", "gpu-d"]
    assert moved.host == "gpu-d"


async def test_a_restarted_gateway_reattaches_to_running_replicas(
    cluster: FakeCluster, make_launcher: Callable[..., KubernetesLauncher]
) -> None:
    first = make_launcher()
    for replica, node in (("r0", "gpu-a"), ("r1", "gpu-b"), ("r2", "gpu-c")):
        launch = asyncio.create_task(first.start_replica(spec(replica, node)))
        cluster.run_pod(NAMESPACE, await created_pod(cluster, replica), node)
        await asyncio.wait_for(launch, 5)
    # A finished pod of an earlier incarnation is not re-attached.
    other = first.build_pod(spec("r3", "gpu-d"))
    other["status"] = {"phase": "Failed", "reason": "Evicted"}
    cluster.put("pods", other, "ADDED")
    await first.stop()

    restarted = make_launcher()
    handles = await restarted.find_replicas(KERNEL)
    assert [(h.replica_id, h.host) for h in handles] == [("r0", "gpu-a"), ("r1", "gpu-b"), ("r2", "gpu-c")]
    assert [(await restarted.status(h)).phase for h in handles] == [ReplicaPhase.RUNNING] * 3
    assert {h.kernel_id for h in await restarted.all_replicas()} == {KERNEL}
    assert await restarted.find_replicas("another-kernel") == []


async def test_a_kernels_secret_is_created_once_for_its_replicas_and_deleted_with_it(
    cluster: FakeCluster, make_launcher: Callable[..., KubernetesLauncher]
) -> None:
    cluster.add_config_map(NAMESPACE, "nbos-notebookos-kernel-owner")
    launcher = make_launcher(owner_config_map="nbos-notebookos-kernel-owner")
    credentials = {"NOTEBOOKOS_ETCD_USER": "notebookos-kernel-x", "NOTEBOOKOS_ETCD_PASSWORD": "pw-of-this-kernel"}
    launches = [
        asyncio.create_task(launcher.start_replica(dataclasses.replace(spec(r, h), secret_env=credentials)))
        for r, h in (("r0", "gpu-a"), ("r1", "gpu-b"), ("r2", "gpu-c"))
    ]
    for replica, node in (("r0", "gpu-a"), ("r1", "gpu-b"), ("r2", "gpu-c")):
        cluster.run_pod(NAMESPACE, await created_pod(cluster, replica), node)
    await asyncio.wait_for(asyncio.gather(*launches), 5)
    assert len(cluster.called("create_namespaced_secret")) == 1
    (secret,) = cluster.secrets(f"kernel_id={KERNEL}")
    assert secret["stringData"] == credentials
    assert secret["metadata"]["ownerReferences"][0]["name"] == "nbos-notebookos-kernel-owner"
    for call in cluster.called("create_namespaced_pod"):
        assert "pw-of-this-kernel" not in str(call["body"])
        assert call["body"]["metadata"]["ownerReferences"][0]["uid"].startswith("uid-")
    await launcher.forget_kernel(KERNEL)
    await until(lambda: cluster.secrets(f"kernel_id={KERNEL}") == [])


async def test_the_sweep_deletes_only_old_objects_of_kernels_the_gateway_does_not_run(
    cluster: FakeCluster, make_launcher: Callable[..., KubernetesLauncher]
) -> None:
    launcher = make_launcher(orphan_grace=600.0)
    secret_env = {"NOTEBOOKOS_ETCD_PASSWORD": "pw"}
    ours = asyncio.create_task(launcher.start_replica(dataclasses.replace(spec("r0", "gpu-a"), secret_env=secret_env)))
    cluster.run_pod(NAMESPACE, await created_pod(cluster), "gpu-a")
    await asyncio.wait_for(ours, 5)
    # What a gateway that crashed left behind: a kernel's pod and Secret that no kernel record names.
    crashed = make_launcher()
    lost = "9f8e7d6c-0000-4000-8000-000000000001"
    lost_spec = ReplicaSpec(lost, "r0", "gpu-b", "python3-notebookos", secret_env=secret_env)
    crashed_launch = asyncio.create_task(crashed.start_replica(lost_spec))
    lost_pod = await until(lambda: next((p for p in cluster.pods(f"kernel_id={lost}")), None))
    cluster.run_pod(NAMESPACE, lost_pod["metadata"]["name"], "gpu-b")
    await asyncio.wait_for(crashed_launch, 5)
    assert await launcher.sweep_orphans() == []  # young: perhaps a kernel being started right now
    cluster.age(601)
    key = f"{NAMESPACE}/{lost_pod['metadata']['name']}"
    aged = cluster.pod(NAMESPACE, lost_pod["metadata"]["name"])["metadata"]["creationTimestamp"]
    await until(lambda: (launcher._find_cached(key) or {}).get("metadata", {}).get("creationTimestamp") == aged)
    deleted = await launcher.sweep_orphans()
    assert sorted((o.kind, o.kernel_id) for o in deleted) == [("Pod", lost), ("Secret", lost)]
    assert cluster.pods(f"kernel_id={lost}") == [] and cluster.secrets(f"kernel_id={lost}") == []
    assert len(cluster.pods(f"kernel_id={KERNEL}")) == 1 and len(cluster.secrets(f"kernel_id={KERNEL}")) == 1


async def test_replicas_get_etcds_ca_in_their_namespace_and_no_client_key(
    cluster: FakeCluster, make_launcher: Callable[..., KubernetesLauncher], tmp_path: Path
) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    launcher = make_launcher(etcd_ca_file=str(ca), instance="nbos")
    launch = asyncio.create_task(launcher.start_replica(spec()))
    cluster.run_pod(NAMESPACE, await created_pod(cluster), "gpu-a")
    await asyncio.wait_for(launch, 5)
    (secret,) = [s for s in cluster.secrets() if s["metadata"]["name"] == "nbos-etcd-ca"]
    assert secret["stringData"] == {"ca.crt": ca.read_text()}
    validate_strict(secret)
    pod = cluster.called("create_namespaced_pod")[0]["body"]
    assert {"name": "notebookos-etcd-tls", "secret": {"secretName": "nbos-etcd-ca"}} in pod["spec"]["volumes"]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["NOTEBOOKOS_ETCD_CA_CERT"] == "/etc/notebookos/etcd-tls/ca.crt"
    assert "NOTEBOOKOS_ETCD_CERT" not in env and "NOTEBOOKOS_ETCD_KEY" not in env
