"""The pure manifest builders: pods, placeholders and the PriorityClass, validated offline for Kubernetes 1.30."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from fakekube import IMAGE, NAMESPACE, FakeCluster, restricted_violations, validate_strict

from jupyter_notebookos.gateway.control.access import kernel_store_url
from jupyter_notebookos.launchers.base import ReplicaSpec, RequestRefused
from jupyter_notebookos.launchers.kubernetes import objects
from jupyter_notebookos.launchers.kubernetes.launcher import KubernetesLauncher
from jupyter_notebookos.launchers.kubernetes.request import PodSettings, resolve_replica_request
from jupyter_notebookos.launchers.kubernetes.validation import InvalidKernelRequest, check_dns1123_label

KERNEL = "6f1c2a0e-5d0b-4c36-9f4e-2b9d0c1e7a11"
SETTINGS = PodSettings(
    namespace=NAMESPACE,
    image=IMAGE,
    service_account="notebookos-replica",
    node_selector={"nvidia.com/gpu.present": "true"},
    tolerations=({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},),
    etcd_endpoints="etcd-0:2379,etcd-1:2379,etcd-2:2379",
    etcd_tls_secret="notebookos-etcd-client-tls",
    object_store_url="file:///mnt/notebookos-store",
    object_store_claim="notebookos-object-store",
    image_pull_secrets=("regcred",),
    allowed_images=("ghcr.io/alice/*",),
)


def spec(
    env: dict[str, str] | None = None, config: dict[str, Any] | None = None, host: str = "gpu-node-1", gpus: int = 1
) -> ReplicaSpec:
    return ReplicaSpec(
        kernel_id=KERNEL,
        replica_id="r1",
        host=host,
        kernel_name="python3-notebookos",
        env={"KERNEL_USERNAME": "alice", **(env or {})},
        config=config or {},
        gpus=gpus,  # KERNEL_GPUS, as the process proxy resolved it
    )


def build(
    env: dict[str, str] | None = None,
    config: dict[str, Any] | None = None,
    node: str | None = "gpu-node-1",
    gpus: int = 1,
) -> dict[str, Any]:
    replica = spec(env, config, gpus=gpus)
    request = resolve_replica_request(replica, SETTINGS)
    name = objects.replica_pod_name(KERNEL, "r1", "ab12cd")
    return objects.make_replica_pod(replica, request, SETTINGS, name=name, node=node)


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


FULL_ENV = {
    "KERNEL_CPUS": "2",
    "KERNEL_MEMORY": "8Gi",
    "KERNEL_CPUS_LIMIT": "4",
    "KERNEL_MEMORY_LIMIT": "16Gi",
    "KERNEL_UID": "1000",
    "KERNEL_GID": "100",
    "KERNEL_WORKING_DIR": "/home/jovyan/work",
    # EG clients send these as JSON or YAML text.
    "KERNEL_VOLUMES": '[{"name": "home", "persistentVolumeClaim": {"claimName": "claim-alice"}}]',
    "KERNEL_VOLUME_MOUNTS": "[{name: home, mountPath: /home/jovyan/work}]",
}


def test_replica_pod_validates_strictly_against_kubernetes_1_30() -> None:
    validate_strict(build(FULL_ENV))
    validate_strict(build())
    validate_strict(build(node=None))


def test_replica_pod_is_one_never_restarting_replica_kept_apart_from_its_siblings() -> None:
    pod = build(FULL_ENV)
    labels = pod["metadata"]["labels"]
    assert labels["kernel_id"] == KERNEL and labels["replica_id"] == "r1"
    assert labels["component"] == "notebookos-replica"
    assert labels["app.kubernetes.io/name"] == "notebookos"
    assert pod["spec"]["restartPolicy"] == "Never"
    (term,) = pod["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == {"component": "notebookos-replica", "kernel_id": KERNEL}
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    assert pod["spec"]["serviceAccountName"] == "notebookos-replica"


def test_replica_pod_never_requests_gpus_but_carries_the_per_cell_count() -> None:
    pod = build(FULL_ENV, gpus=2)
    (container,) = pod["spec"]["containers"]
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    assert container["resources"] == {
        "requests": {"cpu": "2", "memory": "8Gi"},
        "limits": {"cpu": "4", "memory": "16Gi"},
    }
    env = env_of(pod)
    assert env["KERNEL_GPUS"] == "2"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"


def test_replica_runs_the_notebookos_kernel_with_its_identity_and_cluster_addresses() -> None:
    pod = build(FULL_ENV)
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "jupyter_notebookos.kernel"]
    env = env_of(pod)
    assert env["NOTEBOOKOS_KERNEL_ID"] == KERNEL
    assert env["NOTEBOOKOS_REPLICA_ID"] == "r1"
    assert env["NOTEBOOKOS_HOST"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NOTEBOOKOS_IP"] == "0.0.0.0"
    assert env["NOTEBOOKOS_ADVERTISE_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["NOTEBOOKOS_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["NOTEBOOKOS_ETCD_ENDPOINTS"] == "etcd-0:2379,etcd-1:2379,etcd-2:2379"
    # The kernel's own prefix of the store, as the gateway names it.
    assert env["NOTEBOOKOS_OBJECT_STORE_URL"] == kernel_store_url("file:///mnt/notebookos-store", KERNEL)
    assert env["KERNEL_USERNAME"] == "alice"  # EG's KERNEL_* pass through
    assert "KERNEL_VOLUMES" not in env  # consumed as structure
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {
        "home": "/home/jovyan/work",
        "notebookos-object-store": "/mnt/notebookos-store",
        "notebookos-etcd-tls": "/etc/notebookos/etcd-tls",
    }
    assert pod["spec"]["securityContext"] == {
        "fsGroup": 100,
        "runAsUser": 1000,
        "runAsGroup": 100,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["workingDir"] == "/home/jovyan/work"


def test_pod_pinned_to_a_node_goes_through_the_scheduler_not_nodeName() -> None:
    pod = build(node="gpu-node-7")
    assert "nodeName" not in pod["spec"]
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-node-7"]}]}
    ]
    assert "nodeAffinity" not in build(node=None)["spec"]["affinity"]


def test_kernel_variables_override_the_kernelspec_which_overrides_the_settings() -> None:
    config = {"image_name": "registry.example.com/team/from-kernelspec:1", "cpus": "1", "memory": "2Gi"}
    pod = build(config=config)
    assert pod["spec"]["containers"][0]["image"] == "registry.example.com/team/from-kernelspec:1"
    assert pod["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "1", "memory": "2Gi"}
    pod = build({"KERNEL_IMAGE": "ghcr.io/alice/kernel@sha256:" + "a" * 64, "KERNEL_MEMORY": "3Gi"}, config)
    assert pod["spec"]["containers"][0]["image"].startswith("ghcr.io/alice/kernel@sha256:")
    assert pod["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "1", "memory": "3Gi"}
    assert build()["spec"]["containers"][0]["image"] == IMAGE


def test_pod_names_are_valid_and_unique_per_incarnation() -> None:
    first = objects.replica_pod_name(KERNEL, "r1", "aaaaaa")
    again = objects.replica_pod_name(KERNEL, "r1", "bbbbbb")
    assert first != again and len(first) <= 63
    check_dns1123_label("pod name", first)
    long_name = objects.replica_pod_name("K" * 80, "Replica_1", "abc123")
    assert len(long_name) <= 63 and long_name.endswith("-abc123")


@pytest.mark.parametrize(
    ("env", "config", "expected"),
    [
        ({"KERNEL_CPUS": "lots"}, {}, "KERNEL_CPUS 'lots' is not a Kubernetes resource quantity"),
        ({"KERNEL_MEMORY": "-1Gi"}, {}, "KERNEL_MEMORY '-1Gi' is not a Kubernetes resource quantity"),
        ({"KERNEL_MEMORY": "0"}, {}, "KERNEL_MEMORY '0' must be greater than zero"),
        ({"KERNEL_MEMORY": "4 GB"}, {}, "KERNEL_MEMORY '4 GB' is not a Kubernetes resource quantity"),
        ({"KERNEL_CPUS": "4", "KERNEL_CPUS_LIMIT": "2"}, {}, "KERNEL_CPUS '4' is more than KERNEL_CPUS_LIMIT '2'"),
        ({"KERNEL_MEMORY": "2Gi", "KERNEL_MEMORY_LIMIT": "1024Mi"}, {}, "is more than KERNEL_MEMORY_LIMIT"),
        ({"KERNEL_IMAGE": "My Image:latest"}, {}, "kernel image 'My Image:latest' is not a valid image name"),
        ({"KERNEL_IMAGE": "repo/kernel:bad:tag"}, {}, "kernel image 'repo/kernel:bad:tag'"),
        ({"KERNEL_IMAGE": "quay.io/Team/kernel"}, {}, "kernel image 'quay.io/Team/kernel' is not a valid image"),
        ({}, {"image_name": "ok/image:v1@sha256:xyz"}, "has an invalid digest"),
        ({"KERNEL_NAMESPACE": "Team_A"}, {}, "KERNEL_NAMESPACE 'Team_A' is not a valid DNS-1123 label"),
        ({"KERNEL_NAMESPACE": "a" * 64}, {}, "is not a valid DNS-1123 label"),
        ({"KERNEL_NAMESPACE": "other-team"}, {}, "KERNEL_NAMESPACE 'other-team' is not a namespace this gateway"),
        ({"KERNEL_SERVICE_ACCOUNT_NAME": "Admin!"}, {}, "KERNEL_SERVICE_ACCOUNT_NAME 'Admin!'"),
        ({"KERNEL_UID": "0"}, {}, "KERNEL_UID 0 is prohibited"),
        ({"KERNEL_UID": "alice"}, {}, "KERNEL_UID 'alice' is not an integer"),
        ({"KERNEL_WORKING_DIR": "work"}, {}, "KERNEL_WORKING_DIR 'work' is not an absolute path"),
        ({"KERNEL_VOLUMES": "{not: [valid"}, {}, "KERNEL_VOLUMES"),
        ({"KERNEL_VOLUMES": '"just a string"'}, {}, "is not a list of objects"),
        ({"KERNEL_VOLUMES": '[{"name": "Data_1", "emptyDir": {}}]'}, {}, "KERNEL_VOLUMES entry name 'Data_1'"),
        ({"KERNEL_VOLUMES": '[{"name": "data"}]'}, {}, "has no volume source"),
        (
            {"KERNEL_VOLUME_MOUNTS": '[{"name": "data", "mountPath": "/data"}]'},
            {},
            "names a volume that is not defined",
        ),
        ({}, {"image_name": ""}, None),  # empty config falls back to the setting: valid
    ],
)
def test_bad_kernel_values_are_rejected_with_a_message_naming_them(
    env: dict[str, str], config: dict[str, Any], expected: str | None
) -> None:
    if expected is None:
        build(env, config)
        return
    with pytest.raises(InvalidKernelRequest) as caught:
        build(env, config)
    assert expected in str(caught.value)
    assert ";" in str(caught.value)  # followed by what to do


def test_no_image_anywhere_says_where_to_configure_one() -> None:
    settings = PodSettings(namespace=NAMESPACE)
    with pytest.raises(InvalidKernelRequest, match=r"image_name.*KERNEL_IMAGE.*KubernetesLauncher\.image"):
        resolve_replica_request(spec(), settings)


@pytest.mark.asyncio
async def test_bad_values_fail_before_any_api_call(cluster: FakeCluster) -> None:
    launcher = KubernetesLauncher(namespace=NAMESPACE, image=IMAGE, core_api=cluster.core, watch_factory=cluster.watch)
    with pytest.raises(InvalidKernelRequest, match="KERNEL_MEMORY"):
        await launcher.start_replica(spec({"KERNEL_MEMORY": "a lot"}))
    assert cluster.calls == []


def test_placeholder_pod_requests_a_whole_gpu_node_at_the_lowest_priority() -> None:
    settings = objects.PlaceholderSettings(
        namespace=NAMESPACE,
        gpus_per_node=8,
        node_selector={"karpenter.sh/nodepool": "gpu"},
        tolerations=({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},),
    )
    pod = objects.make_placeholder_pod("notebookos-placeholder-abc123", settings)
    validate_strict(pod)
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["requests"] == {"nvidia.com/gpu": "8"}
    assert pod["spec"]["priorityClassName"] == "notebookos-placeholder"
    assert pod["metadata"]["labels"]["component"] == "notebookos-placeholder"
    assert pod["spec"]["nodeSelector"] == {"karpenter.sh/nodepool": "gpu"}
    with pytest.raises(InvalidKernelRequest, match="at least 1"):
        objects.make_placeholder_pod("p", objects.PlaceholderSettings(namespace=NAMESPACE, gpus_per_node=0))


def test_priority_class_is_the_lowest_that_still_triggers_scale_up_and_never_preempts() -> None:
    priority_class = objects.make_priority_class()
    validate_strict(priority_class)
    assert priority_class["value"] == -10  # cluster-autoscaler's default expendable cutoff
    assert priority_class["preemptionPolicy"] == "Never"
    assert priority_class["globalDefault"] is False


def test_validation_catches_a_malformed_builder_change() -> None:
    """The strict validation used above does reject what the API server would (so it can fail)."""
    pod = build()
    pod["spec"]["containers"][0]["resource"] = {}  # misspelt field
    with pytest.raises(Exception, match="resource"):
        validate_strict(pod)


# --- what a kernel may ask for, and how its pods are locked down ---------------------------------------------


def test_replica_and_placeholder_pods_meet_the_restricted_pod_security_standard() -> None:
    for pod in (build(FULL_ENV), build(), objects.make_placeholder_pod("p-1", objects.PlaceholderSettings("ns"))):
        validate_strict(pod)
        assert restricted_violations(pod) == []
        assert pod["spec"]["automountServiceAccountToken"] is False
    # The checker itself catches what it must.
    bad = build()
    bad["spec"]["containers"][0]["securityContext"] = {}
    bad["spec"]["volumes"].append({"name": "root", "hostPath": {"path": "/"}})
    assert len(restricted_violations(bad)) == 3  # runAsNonRoot and seccomp still come from the pod level
    del bad["spec"]["securityContext"]
    assert len(restricted_violations(bad)) == 5


@pytest.mark.parametrize(
    ("env", "config", "expected"),
    [
        ({"KERNEL_IMAGE": "docker.io/evil/miner:1"}, {}, "KERNEL_IMAGE 'docker.io/evil/miner:1' is not allowed"),
        ({"KERNEL_SERVICE_ACCOUNT_NAME": "default"}, {}, "KubernetesLauncher.allowed_service_accounts"),
        (
            {"KERNEL_VOLUMES": '[{"name": "host", "hostPath": {"path": "/var/run"}}]'},
            {},
            "source type 'hostPath' is not allowed: KubernetesLauncher.allowed_volume_types",
        ),
        (
            {"KERNEL_VOLUMES": '[{"name": "token", "secret": {"secretName": "gateway-token"}}]'},
            {},
            "source type 'secret' is not allowed",
        ),
        (
            {"KERNEL_VOLUMES": '[{"name": "sa", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]'},
            {},
            "source type 'projected' is not allowed",
        ),
        (
            {"KERNEL_VOLUMES": '[{"name": "two", "emptyDir": {}, "configMap": {"name": "x"}}]'},
            {},
            "has 2 volume sources",
        ),
        (
            {
                "KERNEL_VOLUMES": '[{"name": "d", "emptyDir": {}}]',
                "KERNEL_VOLUME_MOUNTS": '[{"name": "d", "mountPath": "/d", "mountPropagation": "Bidirectional"}]',
            },
            {},
            "field 'mountPropagation' is not allowed",
        ),
        (
            {
                "KERNEL_VOLUMES": '[{"name": "d", "emptyDir": {}}]',
                "KERNEL_VOLUME_MOUNTS": '[{"name": "d", "mountPath": "/d", "subPath": "../../etc"}]',
            },
            {},
            "subPath '../../etc' is not allowed",
        ),
        ({}, {"image": "registry.example.com/x:1"}, "process_proxy.config key 'image' is not one this launcher knows"),
    ],
)
def test_requests_beyond_the_deployers_allowlists_are_refused_naming_field_and_rule(
    env: dict[str, str], config: dict[str, Any], expected: str
) -> None:
    with pytest.raises(InvalidKernelRequest) as caught:
        build(env, config)
    assert expected in str(caught.value)
    assert isinstance(caught.value, RequestRefused)  # the gateway answers 400


def test_allowlisted_requests_and_the_deployers_own_choices_pass() -> None:
    settings = dataclasses.replace(
        SETTINGS,
        allowed_service_accounts=("team-a-reader",),
        allowed_volume_sources={"persistentVolumeClaim": ("claim-*",)},
    )
    env = {
        "KERNEL_IMAGE": "ghcr.io/alice/kernel:2",  # matches ghcr.io/alice/*
        "KERNEL_SERVICE_ACCOUNT_NAME": "team-a-reader",
        "KERNEL_VOLUMES": '[{"name": "home", "persistentVolumeClaim": {"claimName": "claim-alice"}}]',
        "KERNEL_VOLUME_MOUNTS": '[{"name": "home", "mountPath": "/home/jovyan", "subPath": "work"}]',
    }
    request = resolve_replica_request(spec(env), settings)
    assert (request.image, request.service_account) == ("ghcr.io/alice/kernel:2", "team-a-reader")
    with pytest.raises(InvalidKernelRequest, match=r"persistentVolumeClaim source 'claim-bob-data' is not allowed"):
        resolve_replica_request(
            spec({"KERNEL_VOLUMES": '[{"name": "h", "persistentVolumeClaim": {"claimName": "claim-bob-data"}}]'}),
            dataclasses.replace(settings, allowed_volume_sources={"persistentVolumeClaim": ("claim-alice",)}),
        )
    # The kernelspec is the deployer's: its image, account and volumes need no allowlist.
    trusted = {
        "image_name": "registry.example.com/team/special:1",
        "service_account_name": "special",
        "volumes": [{"name": "host", "hostPath": {"path": "/data"}}],
    }
    request = resolve_replica_request(spec(config=trusted), SETTINGS)
    assert (request.image, request.service_account) == ("registry.example.com/team/special:1", "special")
    with pytest.raises(InvalidKernelRequest, match="KERNEL_UID 0"):
        resolve_replica_request(spec({"KERNEL_UID": "0"}), dataclasses.replace(SETTINGS, prohibited_uids=()))


def test_a_kernels_credentials_reach_its_pods_only_through_its_own_secret() -> None:
    credentials = {"NOTEBOOKOS_ETCD_USER": "notebookos-kernel-k", "NOTEBOOKOS_ETCD_PASSWORD": "s3cret-pw"}
    replica = dataclasses.replace(spec(), secret_env=credentials, env={**spec().env, **credentials})
    request = resolve_replica_request(replica, SETTINGS)
    pod = objects.make_replica_pod(replica, request, SETTINGS, name="p")
    validate_strict(pod)
    assert "s3cret-pw" not in json.dumps(pod)
    env = env_of(pod)
    secret_name = objects.kernel_secret_name(KERNEL)
    for name in credentials:
        assert env[name] == {"secretKeyRef": {"name": secret_name, "key": name}}
    secret = objects.make_kernel_secret(replica, SETTINGS, NAMESPACE)
    validate_strict(secret)
    assert secret["metadata"]["name"] == secret_name and secret["stringData"] == credentials
    assert secret["metadata"]["labels"]["kernel_id"] == KERNEL


def test_pods_and_secrets_are_owned_by_the_releases_owner_object() -> None:
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "nbos-notebookos-kernel-owner", "uid": "u-1"}
    settings = dataclasses.replace(SETTINGS, owners={NAMESPACE: owner})
    replica = dataclasses.replace(spec(), secret_env={"NOTEBOOKOS_ETCD_PASSWORD": "x"})
    pod = objects.make_replica_pod(replica, resolve_replica_request(replica, settings), settings, name="p")
    placeholder = objects.make_placeholder_pod("p-1", objects.PlaceholderSettings(NAMESPACE, owner=owner))
    secret = objects.make_kernel_secret(replica, settings, NAMESPACE)
    for obj in (pod, placeholder, secret):
        validate_strict(obj)
        (reference,) = obj["metadata"]["ownerReferences"]
        assert {k: reference[k] for k in owner} == owner
    # Another namespace has its own owner (ownerReferences cannot cross namespaces): none known, none set.
    assert "ownerReferences" not in objects.make_kernel_secret(replica, settings, "team-a")["metadata"]
