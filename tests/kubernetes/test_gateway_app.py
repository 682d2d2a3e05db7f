"""A kernel started through the gateway's REST API on Kubernetes: the chart's kernelspec and gateway config, the
real NotebookOSGatewayApp (Enterprise Gateway, the process proxy, the platform) with etcd auth on, and the fake API.

What the pods must show: every key of the kernelspec's ``process_proxy.config`` (image, resources, timeout),
``KERNEL_*`` overriding it as EG documents, a restricted security context, the kernel's own etcd credentials only
through its Secret, and a clear 400 for a request the deployer's allowlists refuse.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from fakekube import FakeCluster, until, validate_strict
from helmchart import gateway_config, kernelspec, render
from replicas import env_of, register, run_replica_pods
from support import free_port
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from traitlets.config import Config

from jupyter_notebookos.embedded.etcd import EtcdCluster
from jupyter_notebookos.gateway.web.gatewayapp import NotebookOSGatewayApp
from jupyter_notebookos.launchers.kubernetes.objects import kernel_secret_name
from jupyter_notebookos.replication import protocol

pytestmark = pytest.mark.asyncio

TOKEN = "test-gateway-token"
ROOT_PASSWORD = "etcd-root-password-for-this-test"
# An S3 store, so the chart puts kernels in a namespace of their own ("<release namespace>-kernels").
VALUES = {"objectStore": {"type": "s3", "s3": {"url": "s3://notebookos-test/objects"}}}
NAMESPACE = "notebookos-kernels"


@pytest_asyncio.fixture
async def gateway(
    etcd: EtcdCluster, cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[NotebookOSGatewayApp]:
    docs = render(VALUES)
    kernels = tmp_path / "share" / "kernels" / "python3-notebookos"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps(kernelspec(docs)))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "share"))
    monkeypatch.setenv("NOTEBOOKOS_ETCD_PASSWORD", ROOT_PASSWORD)
    config = gateway_config(docs)
    config["NotebookOSGatewayApp"].update(
        etcd_endpoints=etcd.endpoints,
        etcd_prefix=f"/app-{tmp_path.name[-12:]}",
        object_store_url=f"file://{tmp_path}/store",
        state_dir=str(tmp_path / "state"),
        autoscale=False,
    )
    # As the chart's deployment sets them (the chart's own values are checked in test_chart).
    config["EnterpriseGatewayApp"] = {
        "ip": "127.0.0.1",
        "port": free_port(),
        "auth_token": TOKEN,
        "allowed_kernels": ["python3-notebookos"],
    }
    config["KubernetesLauncher"].update(cache_sync_timeout=5.0, orphan_sweep_interval=0.0)
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        cluster.add_node(name, gpus=8)
    cluster.add_config_map(NAMESPACE, config["KubernetesLauncher"]["owner_config_map"])
    app = NotebookOSGatewayApp(config=Config(config))
    app.initialize(argv=[])
    launcher = app.platform.launcher
    launcher.core_api, launcher.watch_factory = cluster.core, cluster.watch  # type: ignore[attr-defined]
    assert app.node_hosts is not None
    app.node_hosts.inventory.core_api = cluster.core
    app.node_hosts.inventory.watch_factory = cluster.watch
    await app.start_platform()
    yield app
    for kernel_id in list(app.kernel_manager.list_kernel_ids()):
        await app.kernel_manager.shutdown_kernel(kernel_id, now=True)
    await app.stop_platform()
    app.http_server.stop()


async def _call(app: NotebookOSGatewayApp, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    response = await AsyncHTTPClient().fetch(
        f"http://127.0.0.1:{app.port}{path}",
        method=method,
        headers={"Authorization": f"token {TOKEN}"},
        body=json.dumps(body) if body is not None else None,
        request_timeout=30,
    )
    return json.loads(response.body) if response.body else None


async def _start_kernel(app: NotebookOSGatewayApp, cluster: FakeCluster, env: dict[str, str]) -> dict[str, Any]:
    """POST /api/kernels while playing kubelet and replicas; returns EG's kernel model."""
    post = asyncio.ensure_future(_call(app, "POST", "/api/kernels", {"name": "python3-notebookos", "env": env}))
    pods = await run_replica_pods(cluster, 3, timeout=15)
    for pod in pods:
        await register(app.platform, pod)
    return dict(await asyncio.wait_for(post, 20))


async def test_the_kernelspec_config_and_kernel_variables_reach_locked_down_pods(
    gateway: NotebookOSGatewayApp, cluster: FakeCluster
) -> None:
    spec = kernelspec(render(VALUES))
    config = spec["metadata"]["process_proxy"]["config"]
    model = await _start_kernel(gateway, cluster, {"KERNEL_USERNAME": "alice", "KERNEL_CPUS": "2"})
    kernel_id = model["id"]
    pods = [c["body"] for c in cluster.called("create_namespaced_pod")]  # as the gateway sent them
    assert len(pods) == 3 and {p["metadata"]["labels"]["kernel_id"] for p in pods} == {kernel_id}
    (secret,) = cluster.secrets(f"kernel_id={kernel_id}")
    validate_strict(secret)
    assert secret["metadata"]["name"] == kernel_secret_name(kernel_id)
    password = secret["stringData"][protocol.ENV_ETCD_PASSWORD]
    for pod in pods:
        validate_strict(pod)
        assert pod["metadata"]["namespace"] == NAMESPACE
        (container,) = pod["spec"]["containers"]
        # Every key of the kernelspec's config: the image, the resources (KERNEL_CPUS overriding cpus).
        assert container["image"] == config["image_name"]
        assert container["resources"] == {
            "requests": {"cpu": "2", "memory": config["memory"]},
            "limits": {"memory": config["memory_limit"]},
        }
        # Locked down: Pod Security Standard "restricted", no API token, owned by the release.
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        (owner,) = pod["metadata"]["ownerReferences"]
        assert owner["kind"] == "ConfigMap" and owner["uid"].startswith("uid-")
        # The kernel's own etcd identity only by reference to its Secret; no credential value in the spec.
        env = env_of(pod)
        assert env[protocol.ENV_ETCD_PASSWORD] == {
            "secretKeyRef": {"name": kernel_secret_name(kernel_id), "key": protocol.ENV_ETCD_PASSWORD}
        }
        assert password not in json.dumps(pod) and ROOT_PASSWORD not in json.dumps(pod)
        hmac_key = secret["stringData"][protocol.ENV_KEY]
        assert env[protocol.ENV_KEY]["secretKeyRef"]["key"] == protocol.ENV_KEY and hmac_key not in json.dumps(pod)
        assert TOKEN not in json.dumps(pod)
        # Kernels in their own namespace (the chart's default) cannot mount the release's claim: they reach their
        # objects through the gateway's broker, with their kernel's object token (by reference) and no volume.
        assert env[protocol.ENV_OBJECT_STORE_URL] == f"notebookos-broker://{kernel_id}"
        assert env[protocol.ENV_OBJECT_BROKER_URL].endswith("/api/notebookos/kernels")
        assert env[protocol.ENV_OBJECT_BROKER_TOKEN]["secretKeyRef"]["name"] == kernel_secret_name(kernel_id)
        assert "persistentVolumeClaim" not in json.dumps(pod["spec"].get("volumes", []))
    # Deleting the kernel deletes its pods and its Secret.
    await _call(gateway, "DELETE", f"/api/kernels/{kernel_id}")
    await until(lambda: not cluster.pods(f"kernel_id={kernel_id}") and not cluster.secrets(f"kernel_id={kernel_id}"))


@pytest.mark.parametrize(
    ("env", "field", "rule"),
    [
        ({"KERNEL_IMAGE": "docker.io/mallory/miner:latest"}, "KERNEL_IMAGE", "KubernetesLauncher.allowed_images"),
        (
            {"KERNEL_SERVICE_ACCOUNT_NAME": "nbos-notebookos-gateway"},
            "KERNEL_SERVICE_ACCOUNT_NAME",
            "KubernetesLauncher.allowed_service_accounts",
        ),
        (
            {"KERNEL_VOLUMES": '[{"name": "root", "hostPath": {"path": "/"}}]'},
            "KERNEL_VOLUMES entry 'root' source type",
            "KubernetesLauncher.allowed_volume_types",
        ),
    ],
)
async def test_a_request_the_allowlists_refuse_is_a_400_naming_the_field_and_rule(
    gateway: NotebookOSGatewayApp, cluster: FakeCluster, env: dict[str, str], field: str, rule: str
) -> None:
    with pytest.raises(HTTPClientError) as caught:
        await _call(
            gateway, "POST", "/api/kernels", {"name": "python3-notebookos", "env": {"KERNEL_USERNAME": "alice", **env}}
        )
    assert caught.value.code == 400
    assert caught.value.response is not None
    message = json.loads(caught.value.response.body)["message"]
    assert field in message and rule in message and "is not allowed" in message
    assert cluster.called("create_namespaced_pod") == [] and cluster.called("create_namespaced_secret") == []
