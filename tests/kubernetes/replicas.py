"""Playing the parts of a cluster no test here can run: the kubelet that runs replica pods, the replica that
registers itself in etcd once up (bound to a lease, as the protocol says), and helpers to read pods."""

from __future__ import annotations

import socket
from typing import Any

from fakekube import FakeCluster, until

from jupyter_notebookos.gateway.control.gatewayplatform import GatewayPlatform
from jupyter_notebookos.replication.protocol import ReplicaRegistration


def free_ports(count: int) -> dict[str, int]:
    socks = [socket.socket() for _ in range(count)]
    for sock in socks:
        sock.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for sock in socks:
        sock.close()
    return dict(zip(("shell", "iopub", "stdin", "control", "hb"), ports, strict=True))


async def register(platform: GatewayPlatform, pod: dict[str, Any]) -> None:
    """What the replica in this pod would do once up: register under its own lease."""
    co = platform.coordinator
    assert co is not None
    labels = pod["metadata"]["labels"]
    lease = await co.grant_lease(30)
    registration = ReplicaRegistration(
        kernel_id=labels["kernel_id"],
        replica_id=labels["replica_id"],
        host=pod["metadata"]["annotations"]["notebookos.io/host"],
        ip="10.0.0.7",
        shell_port=1,
        iopub_port=2,
        stdin_port=3,
        control_port=4,
        hb_port=5,
        pid=1,
        lease=lease.id,
        applied_seq=0,
        pod=pod["metadata"]["name"],
    )
    await co.put(co.keys.replica(registration.kernel_id, registration.replica_id), registration.to_json(), lease=lease)


async def run_replica_pods(
    cluster: FakeCluster, count: int, skip: set[str] | None = None, timeout: float = 5.0
) -> list[dict[str, Any]]:
    """Play scheduler and kubelet: run each replica pod the launcher creates on its pinned node."""
    seen = set(skip or ())
    started: list[tuple[str, str]] = []
    while len(started) < count:
        pod = await until(
            lambda: next(
                (p for p in cluster.pods("component=notebookos-replica") if p["metadata"]["name"] not in seen), None
            ),
            timeout,
        )
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        cluster.run_pod(namespace, name, pinned_node(pod))
        seen.add(name)
        started.append((namespace, name))
    return [cluster.pod(namespace, name) for namespace, name in started]


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def pinned_node(pod: dict[str, Any]) -> str:
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (field,) = terms["nodeSelectorTerms"][0]["matchFields"]
    assert (field["key"], field["operator"]) == ("metadata.name", "In")
    return str(field["values"][0])
