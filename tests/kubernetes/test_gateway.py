"""The gateway platform on Kubernetes: real etcd, the fake API, KubernetesLauncher + NodeInventory + placeholders.

No pod really runs here; where a test needs a replica to be "up", it writes the registration the replica
would write (bound to a lease, as the protocol says).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from fakekube import NAMESPACE, FakeCluster, until, validate_strict
from replicas import env_of, free_ports, pinned_node, register, run_replica_pods
from s3_store import S3Store, s3_store_in_environment

from jupyter_notebookos.embedded.etcd import EtcdCluster
from jupyter_notebookos.gateway.control.gatewayplatform import GatewayPlatform, MigrationRequestError
from jupyter_notebookos.gateway.control.nodehosts import NodeHosts
from jupyter_notebookos.gateway.control.platformsettings import PlatformSettings
from jupyter_notebookos.gateway.router import RouterSettings
from jupyter_notebookos.gateway.router.replicas import Phase
from jupyter_notebookos.launchers.base import LaunchError
from jupyter_notebookos.launchers.kubernetes import (
    KubernetesLauncher,
    NodeInventory,
    PlaceholderPool,
    PlaceholderProvisioner,
)
from jupyter_notebookos.launchers.kubernetes.objects import kernel_secret_name, make_priority_class
from jupyter_notebookos.replication import protocol
from jupyter_notebookos.scheduler import Scheduler

IMAGE = "registry.example.com/notebookos/kernel:0.1.0"
KERNEL = "5d1f7c2e-0a4b-4c3d-9e8f-1a2b3c4d5e6f"


@dataclass
class K8sGateway:
    cluster: FakeCluster
    platform: GatewayPlatform
    launcher: KubernetesLauncher
    inventory: NodeInventory
    provisioner: PlaceholderProvisioner
    nodes: NodeHosts

    def hosts(self) -> dict[str, dict[str, Any]]:
        return {h["name"]: h for h in self.platform.views.cluster_snapshot()["hosts"]}

    def replica_pods(self) -> list[dict[str, Any]]:
        return self.cluster.pods("component=notebookos-replica")


@pytest.fixture(scope="module")
def store() -> Iterator[S3Store]:
    """The platform's S3 store, in this process: a stop removes the kernel's objects there, never at AWS."""
    with s3_store_in_environment("notebookos-store") as started:
        yield started


@pytest_asyncio.fixture
async def gateway(etcd: EtcdCluster, cluster: FakeCluster, store: S3Store, tmp_path: Path) -> AsyncIterator[K8sGateway]:
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        cluster.add_node(name, gpus=8)
    cluster.priority_classes["notebookos-placeholder"] = make_priority_class()
    common: dict[str, Any] = {"core_api": cluster.core, "watch_factory": cluster.watch, "cache_sync_timeout": 5.0}
    launcher = KubernetesLauncher(namespace=NAMESPACE, image=IMAGE, etcd_endpoints="", object_store_url="", **common)
    inventory = NodeInventory(**common)
    pool = PlaceholderPool(namespace=NAMESPACE, core_api=cluster.core, scheduling_api=cluster.scheduling)
    provisioner = PlaceholderProvisioner(pool, inventory)
    scheduler = Scheduler(gpus_per_host=8)
    settings = PlatformSettings(
        etcd_endpoints=etcd.endpoints,
        etcd_prefix=f"/k8s-{tmp_path.name[-12:]}",
        etcd_timeout=3.0,
        gpus_per_host=8,
        state_dir=str(tmp_path),
        object_store_url=f"s3://{store.bucket}/objects",
        router=RouterSettings(launch_timeout=20.0),
    )
    platform = GatewayPlatform(settings, scheduler=scheduler, launcher=launcher, provisioner=provisioner)
    nodes = NodeHosts(platform, inventory, provisioner)
    await nodes.start()
    await platform.start()
    yield K8sGateway(cluster, platform, launcher, inventory, provisioner, nodes)
    await platform.stop()
    await nodes.stop()
    await launcher.stop()


def _start_kernel(platform: GatewayPlatform, **env: str) -> asyncio.Task[Any]:
    return asyncio.ensure_future(
        platform.start_kernel(
            kernel_id=KERNEL,
            kernel_name="python3-notebookos",
            ip="127.0.0.1",
            ports=free_ports(5),
            key=b"0123456789abcdef",
            signature_scheme="hmac-sha256",
            env=env,
            gpus=1,
            launch_timeout=20.0,
        )
    )


@pytest.mark.asyncio
async def test_gpu_nodes_become_hosts_and_follow_cordons_and_removal(gateway: K8sGateway) -> None:
    hosts = gateway.hosts()
    assert sorted(hosts) == ["gpu-a", "gpu-b", "gpu-c"]
    assert all(h["gpus"] == 8 and not h["simulated"] and not h["cordoned"] for h in hosts.values())

    gateway.cluster.add_node("gpu-d", gpus=4, ready=False)  # not ready yet: not a host yet
    await asyncio.sleep(0.2)
    assert "gpu-d" not in gateway.hosts()
    gateway.cluster.modify_node("gpu-d", gpus=4, ready=True)
    await until(lambda: "gpu-d" in gateway.hosts())
    assert gateway.hosts()["gpu-d"]["gpus"] == 4

    gateway.cluster.modify_node("gpu-b", unschedulable=True)  # kubectl cordon
    await until(lambda: gateway.hosts()["gpu-b"]["cordoned"])
    gateway.cluster.modify_node("gpu-b", unschedulable=False)
    await until(lambda: not gateway.hosts()["gpu-b"]["cordoned"])
    gateway.cluster.modify_node("gpu-c", taints=[{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}])
    await until(lambda: gateway.hosts()["gpu-c"]["cordoned"])

    gateway.cluster.delete_node("gpu-c")
    await until(lambda: "gpu-c" not in gateway.hosts())
    assert "gpu-c" not in gateway.platform.hosts


@pytest.mark.asyncio
async def test_kernel_start_creates_three_anti_affine_pods_with_the_replica_protocol(gateway: K8sGateway) -> None:
    start = _start_kernel(gateway.platform)
    pods = await run_replica_pods(gateway.cluster, 3)
    nodes = {pinned_node(p) for p in pods}
    assert nodes == {"gpu-a", "gpu-b", "gpu-c"}  # three distinct hosts, each pinned
    for call in gateway.cluster.called("create_namespaced_pod"):
        validate_strict(call["body"])
    for pod in pods:
        (term,) = pod["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert term["labelSelector"]["matchLabels"]["kernel_id"] == KERNEL
        assert "nvidia.com/gpu" not in json.dumps(pod["spec"]["containers"][0].get("resources", {}))
        env = env_of(pod)
        assert env[protocol.ENV_IP] == "0.0.0.0"
        assert env[protocol.ENV_ADVERTISE_IP] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert env[protocol.ENV_HOST] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        assert env[protocol.ENV_ETCD_ENDPOINTS] == ",".join(gateway.platform.settings.etcd_endpoints)
        assert env[protocol.ENV_ETCD_PREFIX] == gateway.platform.settings.etcd_prefix
        # An S3 store: the replica asks the gateway to sign its object operations and holds no store keys.
        assert env[protocol.ENV_OBJECT_STORE_URL] == f"notebookos-broker://{KERNEL}"
        assert env[protocol.ENV_OBJECT_BROKER_URL] == gateway.platform.settings.object_broker_url
        assert env[protocol.ENV_OBJECT_BROKER_TOKEN] == {
            "secretKeyRef": {"name": kernel_secret_name(KERNEL), "key": protocol.ENV_OBJECT_BROKER_TOKEN}
        }
        assert not any(name.startswith("AWS_") for name in env) and "envFrom" not in pod["spec"]["containers"][0]
        # The kernel's HMAC key only by reference to the kernel's Secret: a pod spec reader cannot sign messages.
        assert env[protocol.ENV_KEY] == {"secretKeyRef": {"name": kernel_secret_name(KERNEL), "key": protocol.ENV_KEY}}
        assert "0123456789abcdef" not in json.dumps(pod)
        assert "NOTEBOOKOS_STATE_DIR" not in env  # the gateway's own directory means nothing in a pod
        devices = json.loads(env[protocol.ENV_GPU_DEVICES])
        assert [d["index"] for d in devices] == list(range(8)) and not any(d["simulated"] for d in devices)
    (secret,) = gateway.cluster.secrets(f"kernel_id={KERNEL}")
    assert secret["stringData"][protocol.ENV_KEY] == "0123456789abcdef"
    assert not start.done()  # waiting for the replicas to register
    for pod in pods:
        await register(gateway.platform, pod)
    router = await asyncio.wait_for(start, 10)
    assert sorted(router.replicas.registrations()) == ["0", "1", "2"]


@pytest.mark.asyncio
async def test_a_pending_pod_with_a_blocking_event_fails_the_kernel_start_fast(gateway: K8sGateway) -> None:
    start = _start_kernel(gateway.platform)
    first = await until(lambda: gateway.replica_pods())
    message = "0/3 nodes are available: 3 Insufficient memory."
    gateway.cluster.add_event(NAMESPACE, first[0]["metadata"]["name"], "FailedScheduling", message)
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(LaunchError, match="FailedScheduling: 0/3 nodes are available: 3 Insufficient memory"):
        await asyncio.wait_for(start, 10)
    assert loop.time() - began < 5  # not the 20 s launch timeout
    await until(lambda: gateway.replica_pods() == [])  # no pod left behind
    assert KERNEL not in gateway.platform.kernels


async def _kernel_on_three_of_four_nodes(gateway: K8sGateway) -> list[dict[str, Any]]:
    """A fourth GPU node, and the kernel started with its three replica pods running and registered."""
    gateway.cluster.add_node("gpu-d", gpus=8)
    await until(lambda: "gpu-d" in gateway.hosts())
    start = _start_kernel(gateway.platform)
    pods = await run_replica_pods(gateway.cluster, 3)
    for pod in pods:
        await register(gateway.platform, pod)
    await asyncio.wait_for(start, 10)
    return pods


@pytest.mark.asyncio
async def test_migration_starts_a_pod_pinned_to_the_target_then_deletes_the_old_one(gateway: K8sGateway) -> None:
    pods = await _kernel_on_three_of_four_nodes(gateway)
    record = gateway.platform.kernels[KERNEL]
    used = {h.host for h in record.replicas.handles().values()}
    (target,) = {"gpu-a", "gpu-b", "gpu-c", "gpu-d"} - used
    old = record.replicas.handles()["0"]
    move = asyncio.ensure_future(gateway.platform.migrate(KERNEL, "0", target))
    (new_pod,) = await run_replica_pods(gateway.cluster, 1, skip={p["metadata"]["name"] for p in pods})
    assert pinned_node(new_pod) == target
    validate_strict(gateway.cluster.called("create_namespaced_pod")[-1]["body"])
    await register(gateway.platform, new_pod)
    result = await asyncio.wait_for(move, 10)
    assert (result["from"], result["to"]) == (old.host, target)
    await until(lambda: old.pod not in {p["metadata"]["name"] for p in gateway.replica_pods()})
    deleted = [c["name"] for c in gateway.cluster.called("delete_namespaced_pod")]
    assert old.pod in deleted and new_pod["metadata"]["name"] not in deleted


@pytest.mark.asyncio
async def test_a_migrated_replica_is_a_new_id_in_the_scheduler_the_router_and_the_rest_view(
    gateway: K8sGateway,
) -> None:
    pods = await _kernel_on_three_of_four_nodes(gateway)
    platform = gateway.platform
    record = platform.kernels[KERNEL]
    seen = {p["metadata"]["name"] for p in pods}

    def ids_everywhere() -> tuple[list[str], list[str], list[str]]:
        scheduled = platform.scheduler.kernel(KERNEL)
        assert scheduled is not None
        return (
            sorted(str(r.replica_id) for r in scheduled.replicas),
            sorted(record.replicas.handles()),
            [r["replica_id"] for r in platform.views.kernel_summary(KERNEL)["replicas"]],
        )

    assert ids_everywhere() == (["0", "1", "2"],) * 3
    for moved, new_id in (("1", "3"), ("3", "4")):
        (target,) = {"gpu-a", "gpu-b", "gpu-c", "gpu-d"} - {h.host for h in record.replicas.handles().values()}
        move = asyncio.ensure_future(platform.migrate(KERNEL, moved, target))
        (new_pod,) = await run_replica_pods(gateway.cluster, 1, skip=seen)
        seen.add(new_pod["metadata"]["name"])
        assert new_pod["metadata"]["labels"]["replica_id"] == new_id  # the id the scheduler handed out
        await register(platform, new_pod)
        result = await asyncio.wait_for(move, 10)
        assert (result["previous_replica_id"], result["replica_id"], result["to"]) == (moved, new_id, target)
        expected = sorted({"0", "2", new_id})
        assert ids_everywhere() == (expected,) * 3
        old = record.replicas.get(moved)  # registered until its lease ends (no pod really stops here)
        assert old is not None and old.handle is None and old.phase is Phase.RETIRING
        with pytest.raises(MigrationRequestError, match=f"has no replica {moved} "):
            await platform.migrate(KERNEL, moved, None)


@pytest.mark.asyncio
async def test_scale_out_asks_for_placeholders_off_existing_hosts_and_scale_in_deletes_them(
    gateway: K8sGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    ready: list[tuple[str, int]] = []
    coordinator = gateway.platform.coordinator
    assert coordinator is not None
    put = coordinator.put

    async def slow_put(key: str, *args: Any, **kwargs: Any) -> int:
        await asyncio.sleep(0.5)  # a slow etcd: a joining host is in the scheduler well before its key is written
        return await put(key, *args, **kwargs)

    monkeypatch.setattr(coordinator, "put", slow_put)

    async def on_ready(name: str, gpus: int) -> None:
        ready.append((name, gpus))
        await gateway.platform.add_host(name, gpus, simulated=False)

    await gateway.provisioner.provision(2, on_ready)
    placeholders = gateway.cluster.pods("component=notebookos-placeholder")
    assert len(placeholders) == 2 and gateway.provisioner.provisioning == 2
    for pod in placeholders:
        validate_strict(pod)
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        (field,) = terms["nodeSelectorTerms"][0]["matchFields"]
        assert field["operator"] == "NotIn" and field["values"] == ["gpu-a", "gpu-b", "gpu-c"]

    # The cluster autoscaler adds a node for one placeholder, which then runs there.
    gateway.cluster.add_node("gpu-new", gpus=8)
    gateway.cluster.run_pod(NAMESPACE, placeholders[0]["metadata"]["name"], "gpu-new")
    await until(lambda: "gpu-new" in gateway.hosts())
    assert gateway.provisioner.provisioning == 1, "a joined node still counted as a placeholder waiting for one"

    # Scale-in: the drained host goes, and so does the placeholder that held its node.
    await gateway.platform.remove_host("gpu-new")
    await gateway.provisioner.release("gpu-new")
    remaining = gateway.cluster.pods("component=notebookos-placeholder")
    assert [p["metadata"]["name"] for p in remaining] == [placeholders[1]["metadata"]["name"]]
    assert "gpu-new" not in gateway.hosts()

    # The node is still there: the next scale-out takes it back instead of asking for another.
    await gateway.provisioner.provision(1, on_ready)
    assert ready == [("gpu-new", 8)]
    assert len(gateway.cluster.pods("component=notebookos-placeholder")) == 1


@pytest.mark.asyncio
async def test_the_kernelspec_config_reaches_replacement_replicas_and_is_recorded_for_a_restart(
    gateway: K8sGateway,
) -> None:
    gateway.cluster.add_node("gpu-d", gpus=8)
    await until(lambda: "gpu-d" in gateway.hosts())
    config = {"cpus": "3", "memory": "5Gi", "memory_limit": "9Gi", "launch_timeout": 20}
    start = asyncio.ensure_future(
        gateway.platform.start_kernel(
            kernel_id=KERNEL,
            kernel_name="python3-notebookos",
            ip="127.0.0.1",
            ports=free_ports(5),
            key=b"0123456789abcdef",
            signature_scheme="hmac-sha256",
            env={"KERNEL_MEMORY": "6Gi"},
            gpus=1,
            launch_timeout=20.0,
            config=config,
        )
    )
    pods = await run_replica_pods(gateway.cluster, 3)
    for pod in pods:
        await register(gateway.platform, pod)
    await asyncio.wait_for(start, 10)
    expected = {"requests": {"cpu": "3", "memory": "6Gi"}, "limits": {"memory": "9Gi"}}  # KERNEL_MEMORY wins
    assert all(p["spec"]["containers"][0]["resources"] == expected for p in pods)
    # A replacement replica (here a migration's target) is built from the same config.
    record = gateway.platform.kernels[KERNEL]
    (target,) = {"gpu-a", "gpu-b", "gpu-c", "gpu-d"} - {h.host for h in record.replicas.handles().values()}
    move = asyncio.ensure_future(gateway.platform.migrate(KERNEL, "0", target))
    (new_pod,) = await run_replica_pods(gateway.cluster, 1, skip={p["metadata"]["name"] for p in pods})
    assert new_pod["spec"]["containers"][0]["resources"] == expected
    await register(gateway.platform, new_pod)
    await asyncio.wait_for(move, 10)
    # The session record a restarted gateway re-attaches from carries it.
    coordinator = gateway.platform.coordinator
    assert coordinator is not None
    session = json.loads((await coordinator.get(coordinator.keys.kernel(KERNEL))).value)
    assert session["config"] == config
