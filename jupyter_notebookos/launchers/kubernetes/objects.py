"""Kubernetes manifests for NotebookOS, built by pure functions (no API calls, no clock, no randomness).

What goes into them comes validated from :mod:`.request` (which checks values with :mod:`.validation`).

- :func:`make_replica_pod` builds one replica's Pod: ``restartPolicy: Never``, required anti-affinity on
  ``kubernetes.io/hostname`` among the kernel's replicas, GPU node selector and tolerations, the NVIDIA
  runtime class, and *no* ``nvidia.com/gpu`` request: GPUs are bound per cell, not per pod.
- :func:`make_placeholder_pod` and :func:`make_priority_class` build the lowest-priority pods that ask for
  a whole GPU node, so the cluster autoscaler (or Karpenter) adds nodes when the scheduler scales out.

Manifests are plain dicts in the API's JSON shape, so they validate offline and go straight to the client.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jupyter_notebookos.launchers.base import ReplicaSpec
from jupyter_notebookos.launchers.kubernetes.request import (
    ETCD_TLS_MOUNT_PATH,
    ETCD_TLS_VOLUME,
    OBJECT_STORE_VOLUME,
    PodSettings,
    ReplicaPodRequest,
)
from jupyter_notebookos.launchers.kubernetes.validation import (
    ENV_NAME,
    InvalidKernelRequest,
    check_dns1123_subdomain,
    check_image,
    check_label_value,
)
from jupyter_notebookos.replication import protocol
from jupyter_notebookos.replication.brokerfs import PROTOCOL as BROKER_PROTOCOL

# Labels every NotebookOS pod carries; the launcher's watch selects on them.
COMPONENT_LABEL = "component"
REPLICA_COMPONENT = "notebookos-replica"
PLACEHOLDER_COMPONENT = "notebookos-placeholder"
SECRET_COMPONENT = "notebookos-kernel-credentials"
KERNEL_ID_LABEL = "kernel_id"
REPLICA_ID_LABEL = "replica_id"
APP_NAME = "notebookos"
HOST_ANNOTATION = "notebookos.io/host"
GPUS_ANNOTATION = "notebookos.io/gpus-per-cell"
HOSTNAME_TOPOLOGY_KEY = "kubernetes.io/hostname"
GPU_RESOURCE = "nvidia.com/gpu"
REPLICA_CONTAINER = "replica"
REPLICA_COMMAND = ("python", "-m", "jupyter_notebookos.kernel")
# The uid of the pause image's user (nobody), for placeholder pods.
PAUSE_UID = 65535
SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")

# Environment of the gateway process that must not leak into a pod (EG passes the kernel's env through).
_PROCESS_ONLY_ENV = frozenset(
    {
        "PATH",
        "HOME",
        "HOSTNAME",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "LD_LIBRARY_PATH",
        "PYTHONHOME",
        "VIRTUAL_ENV",
        "_",
    }
)
# The platform's variables that only make sense in the gateway's own file system.
_GATEWAY_ONLY_ENV = frozenset({"NOTEBOOKOS_STATE_DIR"})
# KERNEL_* variables consumed here as structure rather than passed on as text.
_STRUCTURED_ENV = frozenset({"KERNEL_VOLUMES", "KERNEL_VOLUME_MOUNTS"})


# --- names and labels ---------------------------------------------------------------------------------------


def replica_pod_name(kernel_id: str, replica_id: str, suffix: str) -> str:
    """``nbos-<kernel>-<replica>-<suffix>``: unique per incarnation, so a migration target never collides."""
    base = re.sub(r"[^a-z0-9-]+", "-", f"nbos-{kernel_id}-{replica_id}".lower()).strip("-")
    tail = re.sub(r"[^a-z0-9]+", "", suffix.lower())
    return f"{base[: 62 - len(tail)].rstrip('-')}-{tail}" if tail else base[:63].rstrip("-")


def common_labels(settings: PodSettings, component: str) -> dict[str, str]:
    """Labels shared by every pod this package creates (``app.kubernetes.io/*`` + ``component``)."""
    return {
        **settings.extra_labels,
        "app.kubernetes.io/name": APP_NAME,
        "app.kubernetes.io/instance": settings.instance,
        "app.kubernetes.io/component": component.removeprefix("notebookos-"),
        "app.kubernetes.io/managed-by": "notebookos-gateway",
        "app.kubernetes.io/part-of": APP_NAME,
        COMPONENT_LABEL: component,
    }


def replica_selector(kernel_id: str | None = None) -> str:
    """The label selector of all replica pods, or of one kernel's."""
    selector = f"{COMPONENT_LABEL}={REPLICA_COMPONENT}"
    return f"{selector},{KERNEL_ID_LABEL}={kernel_id}" if kernel_id else selector


# --- pods ---------------------------------------------------------------------------------------------------


def _brokered(spec: ReplicaSpec) -> bool:
    """Whether the replica reaches its objects through the gateway's object broker (no store access of its own)."""
    return spec.env.get(protocol.ENV_OBJECT_STORE_URL, "").startswith(f"{BROKER_PROTOCOL}://")


def _replica_env(spec: ReplicaSpec, request: ReplicaPodRequest, settings: PodSettings) -> list[dict[str, Any]]:
    ours: dict[str, str] = {
        protocol.ENV_KERNEL_ID: spec.kernel_id,
        protocol.ENV_REPLICA_ID: spec.replica_id,
        # Bind on every interface of the pod; the router connects to the pod IP (advertised below).
        protocol.ENV_IP: "0.0.0.0",
        "KERNEL_ID": spec.kernel_id,
        "KERNEL_GPUS": str(request.gpus),
        "KERNEL_NAMESPACE": request.namespace,
        "KERNEL_IMAGE": request.image,
        # No nvidia.com/gpu request, so the device plugin assigns nothing: the NVIDIA runtime exposes every
        # GPU of the node, and the replica binds the committed devices per cell.
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
    }
    # The platform passes its own etcd endpoints and object store; the launcher's settings, where given, are
    # the addresses as seen from replica pods (an empty setting must not blank the platform's).
    if settings.etcd_endpoints:
        ours[protocol.ENV_ETCD_ENDPOINTS] = settings.etcd_endpoints
    # A brokered store (the gateway signs each object operation) needs no store address, keys or volume in the pod.
    brokered = _brokered(spec)
    if settings.object_store_url and not brokered:
        ours[protocol.ENV_OBJECT_STORE_URL] = kernel_store_url(settings.object_store_url, spec.kernel_id)
    if settings.object_store_endpoint_url and not brokered:
        ours["AWS_ENDPOINT_URL"] = settings.object_store_endpoint_url
    devices = spec.env.get(protocol.ENV_GPU_DEVICES)
    if devices and settings.real_gpus:
        ours[protocol.ENV_GPU_DEVICES] = _real_gpu_devices(devices)
    if settings.etcd_tls_secret:
        ours.update(
            {
                protocol.ENV_ETCD_CA_CERT: f"{ETCD_TLS_MOUNT_PATH}/ca.crt",
                protocol.ENV_ETCD_CERT: f"{ETCD_TLS_MOUNT_PATH}/tls.crt",
                protocol.ENV_ETCD_KEY: f"{ETCD_TLS_MOUNT_PATH}/tls.key",
            }
        )
    elif settings.etcd_ca_secret:
        ours[protocol.ENV_ETCD_CA_CERT] = f"{ETCD_TLS_MOUNT_PATH}/ca.crt"
    downward = {protocol.ENV_HOST, protocol.ENV_POD_NAME, "NOTEBOOKOS_POD_NAMESPACE", protocol.ENV_ADVERTISE_IP}
    passed = {
        name: str(value)
        for name, value in spec.env.items()
        if name not in _PROCESS_ONLY_ENV
        and name not in _STRUCTURED_ENV
        and name not in _GATEWAY_ONLY_ENV
        and name not in downward
        and name not in kernel_secret_values(spec)
        and ENV_NAME.match(name)
    }
    env: list[dict[str, Any]] = [{"name": n, "value": v} for n, v in sorted({**passed, **ours}.items())]
    # The kernel's own credentials: references into its Secret, never values in the pod spec.
    secret = kernel_secret_name(spec.kernel_id)
    env.extend(
        {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": name}}}
        for name in sorted(kernel_secret_values(spec))
        if name not in ours
    )
    # The node and pod are known only once scheduled: take them from the downward API.
    for name, path in (
        (protocol.ENV_HOST, "spec.nodeName"),
        (protocol.ENV_POD_NAME, "metadata.name"),
        ("NOTEBOOKOS_POD_NAMESPACE", "metadata.namespace"),
        (protocol.ENV_ADVERTISE_IP, "status.podIP"),
    ):
        env.append({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}})
    return env


def kernel_store_url(object_store_url: str, kernel_id: str) -> str:
    """The kernel's own prefix of the object store, as the gateway's ``access.kernel_store_url`` makes it (the
    launcher's URL is the same store as replicas reach it, so the kernel's prefix must stay)."""
    return f"{object_store_url.rstrip('/')}/kernels/{kernel_id}"


def kernel_secret_name(kernel_id: str) -> str:
    """The name of the Secret holding one kernel's own credentials (``nbos-<kernel>-credentials``)."""
    base = re.sub(r"[^a-z0-9-]+", "-", f"nbos-{kernel_id}".lower()).strip("-")
    return f"{base[:240].rstrip('-')}-credentials"


def kernel_secret_selector(kernel_id: str | None = None) -> str:
    """The label selector of kernels' credential Secrets, or of one kernel's."""
    selector = f"{COMPONENT_LABEL}={SECRET_COMPONENT}"
    return f"{selector},{KERNEL_ID_LABEL}={kernel_id}" if kernel_id else selector


def owner_references(settings: PodSettings, namespace: str) -> list[dict[str, Any]]:
    """The ownerReferences that tie an object of ``namespace`` to the release (its owner object there), if any."""
    owner = settings.owners.get(namespace)
    if not owner:
        return []
    return [
        {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": owner["name"],
            "uid": owner["uid"],
            "blockOwnerDeletion": False,
        }
    ]


#: Variables of a replica's plain environment that are secrets of its kernel: the HMAC key that signs its Jupyter
#: messages (whoever can read a pod spec must not be able to forge them). They go into the kernel's Secret too.
SECRET_ENV_NAMES = frozenset({protocol.ENV_KEY})


def kernel_secret_values(spec: ReplicaSpec) -> dict[str, str]:
    """What of ``spec`` goes into the kernel's Secret: its ``secret_env`` and the secrets among its variables."""
    return {
        **{name: str(spec.env[name]) for name in SECRET_ENV_NAMES if spec.env.get(name)},
        **spec.secret_env,
    }


def make_kernel_secret(spec: ReplicaSpec, settings: PodSettings, namespace: str) -> dict[str, Any]:
    """The Secret with one kernel's own credentials (:func:`kernel_secret_values`), which its replica pods reference.

    Owned by the release's owner object (uninstall removes it); the launcher deletes it with the kernel.
    """
    check_label_value("kernel id", spec.kernel_id)
    values = kernel_secret_values(spec)
    for name in values:
        if not SECRET_KEY.match(name):
            raise InvalidKernelRequest(f"secret variable name {name!r} cannot be a Kubernetes Secret key")
    metadata: dict[str, Any] = {
        "name": kernel_secret_name(spec.kernel_id),
        "namespace": namespace,
        "labels": {
            **common_labels(settings, SECRET_COMPONENT),
            KERNEL_ID_LABEL: spec.kernel_id,
        },
    }
    owners = owner_references(settings, namespace)
    if owners:
        metadata["ownerReferences"] = owners
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "Opaque",
        "stringData": dict(sorted(values.items())),
    }


def make_etcd_ca_secret(name: str, namespace: str, ca_pem: str, settings: PodSettings) -> dict[str, Any]:
    """The Secret with only the CA of etcd's certificates, which replica pods in ``namespace`` mount."""
    check_dns1123_subdomain("etcd CA secret name", name)
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": common_labels(settings, "notebookos-etcd-ca"),
    }
    owners = owner_references(settings, namespace)
    if owners:
        metadata["ownerReferences"] = owners
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "Opaque",
        "stringData": {"ca.crt": ca_pem},
    }


#: Pod Security Standard "restricted", for every container we create.
RESTRICTED_CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def restricted_pod_security(uid: int, gid: int) -> dict[str, Any]:
    """A pod securityContext that Pod Security Standard "restricted" admits (non-root, RuntimeDefault seccomp)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": gid,
        # EG's convention: fsGroup 100 ('users') keeps /home/jovyan writable whatever the uid.
        "fsGroup": 100,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _real_gpu_devices(raw: str) -> str:
    """The platform's device list for the node, marked real: the node's GPUs, numbered as NVML does."""
    try:
        items = json.loads(raw)
        return json.dumps([{"index": int(d["index"]), "uuid": "", "simulated": False} for d in items])
    except (ValueError, TypeError, KeyError):
        return raw  # the replica reports the malformed value itself


def _node_pin(node: str) -> dict[str, Any]:
    # matchFields on metadata.name (as DaemonSets do) keeps the pod going through the scheduler, so
    # anti-affinity and resources are still checked and a misfit shows as FailedScheduling, unlike nodeName.
    return {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
        }
    }


def make_replica_pod(
    spec: ReplicaSpec,
    request: ReplicaPodRequest,
    settings: PodSettings,
    *,
    name: str,
    node: str | None = None,
) -> dict[str, Any]:
    """The Pod of one replica. ``node`` pins it to that node (the scheduler's host, a migration target)."""
    check_label_value("kernel id", spec.kernel_id)
    check_label_value("replica id", spec.replica_id)
    check_dns1123_subdomain("pod name", name)
    labels: dict[str, str] = {
        **common_labels(settings, REPLICA_COMPONENT),
        KERNEL_ID_LABEL: spec.kernel_id,
        REPLICA_ID_LABEL: spec.replica_id,
    }
    annotations: dict[str, str] = {**settings.extra_annotations, GPUS_ANNOTATION: str(request.gpus)}
    if node:
        annotations[HOST_ANNOTATION] = node

    resources: dict[str, dict[str, str]] = {}
    for bucket, cpu, memory in (
        ("requests", request.cpus, request.memory),
        ("limits", request.cpus_limit, request.memory_limit),
    ):
        values = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v}
        if values:
            resources[bucket] = values

    volumes = [dict(v) for v in request.volumes]
    mounts = [dict(m) for m in request.volume_mounts]
    brokered = _brokered(spec)
    if settings.object_store_claim and not brokered:
        volumes.append(
            {"name": OBJECT_STORE_VOLUME, "persistentVolumeClaim": {"claimName": settings.object_store_claim}}
        )
        mounts.append({"name": OBJECT_STORE_VOLUME, "mountPath": settings.object_store_mount_path})
    etcd_secret = settings.etcd_tls_secret or settings.etcd_ca_secret
    if etcd_secret:
        volumes.append({"name": ETCD_TLS_VOLUME, "secret": {"secretName": etcd_secret}})
        mounts.append({"name": ETCD_TLS_VOLUME, "mountPath": ETCD_TLS_MOUNT_PATH, "readOnly": True})

    container: dict[str, Any] = {
        "name": REPLICA_CONTAINER,
        "image": request.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": list(REPLICA_COMMAND),
        "env": _replica_env(spec, request, settings),
        "securityContext": dict(RESTRICTED_CONTAINER_SECURITY),
    }
    if settings.object_store_secret and not brokered:
        container["envFrom"] = [{"secretRef": {"name": settings.object_store_secret}}]
    if resources:
        container["resources"] = resources
    if mounts:
        container["volumeMounts"] = mounts
    if request.working_dir:
        container["workingDir"] = request.working_dir

    affinity: dict[str, Any] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchLabels": {COMPONENT_LABEL: REPLICA_COMPONENT, KERNEL_ID_LABEL: spec.kernel_id}
                    },
                    "topologyKey": HOSTNAME_TOPOLOGY_KEY,
                }
            ]
        }
    }
    if node:
        affinity["nodeAffinity"] = _node_pin(node)

    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": settings.termination_grace_period,
        "affinity": affinity,
        "containers": [container],
        # Replicas talk to etcd and the gateway, never to the Kubernetes API.
        "automountServiceAccountToken": False,
    }
    if request.service_account:
        pod_spec["serviceAccountName"] = request.service_account
    if request.runtime_class_name:
        pod_spec["runtimeClassName"] = request.runtime_class_name
    if request.node_selector:
        pod_spec["nodeSelector"] = dict(request.node_selector)
    if request.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in request.tolerations]
    if settings.priority_class_name:
        pod_spec["priorityClassName"] = settings.priority_class_name
    if settings.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in settings.image_pull_secrets]
    if volumes:
        pod_spec["volumes"] = volumes
    pod_spec["securityContext"] = restricted_pod_security(request.uid, request.gid)

    metadata: dict[str, Any] = {
        "name": name,
        "namespace": request.namespace,
        "labels": labels,
        "annotations": annotations,
    }
    owners = owner_references(settings, request.namespace)
    if owners:
        metadata["ownerReferences"] = owners
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


# --- placeholders -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlaceholderSettings:
    """How placeholder pods ask the cluster autoscaler (or Karpenter) for one whole GPU node each."""

    namespace: str
    gpus_per_node: int = 8
    priority_class_name: str = "notebookos-placeholder"
    image: str = "registry.k8s.io/pause:3.10"
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, Any]] = ()
    instance: str = "notebookos"
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    # The release's owner object in ``namespace`` ({"apiVersion", "kind", "name", "uid"}): uninstall removes
    # placeholders with it, so they never keep GPU nodes up after the release is gone.
    owner: Mapping[str, str] = field(default_factory=dict)


def placeholder_selector() -> str:
    """The label selector of placeholder pods."""
    return f"{COMPONENT_LABEL}={PLACEHOLDER_COMPONENT}"


def make_placeholder_pod(name: str, settings: PlaceholderSettings, avoid_nodes: Sequence[str] = ()) -> dict[str, Any]:
    """A pause container requesting a whole node's GPUs at the lowest priority.

    Pending, it makes the cluster autoscaler add a GPU node; running, it keeps that node from being
    removed. It never preempts anything, and the GPU request keeps other GPU workloads off the node.
    ``avoid_nodes`` (the nodes that already are hosts) keeps it off them: replica pods request no GPUs, so
    a host's GPUs look free to Kubernetes and a placeholder would otherwise fit there and add nothing.
    """
    check_dns1123_subdomain("placeholder pod name", name)
    check_image("placeholder image", settings.image)
    if settings.gpus_per_node < 1:
        raise InvalidKernelRequest(
            f"placeholder gpus_per_node {settings.gpus_per_node} must be at least 1: a placeholder must ask "
            "for a whole GPU node for the autoscaler to add one"
        )
    labels = common_labels(
        PodSettings(namespace=settings.namespace, instance=settings.instance, extra_labels=settings.extra_labels),
        PLACEHOLDER_COMPONENT,
    )
    gpus = str(settings.gpus_per_node)
    spec: dict[str, Any] = {
        "restartPolicy": "Always",
        "priorityClassName": settings.priority_class_name,
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": {COMPONENT_LABEL: PLACEHOLDER_COMPONENT}},
                        "topologyKey": HOSTNAME_TOPOLOGY_KEY,
                    }
                ]
            }
        },
        "containers": [
            {
                "name": "pause",
                "image": settings.image,
                "resources": {"requests": {GPU_RESOURCE: gpus}, "limits": {GPU_RESOURCE: gpus}},
                "securityContext": dict(RESTRICTED_CONTAINER_SECURITY),
            }
        ],
        "securityContext": restricted_pod_security(PAUSE_UID, PAUSE_UID),
    }
    if avoid_nodes:
        spec["affinity"]["nodeAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": sorted(avoid_nodes)}]}
                ]
            }
        }
    if settings.node_selector:
        spec["nodeSelector"] = dict(settings.node_selector)
    if settings.tolerations:
        spec["tolerations"] = [dict(t) for t in settings.tolerations]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": labels,
            **({"ownerReferences": owner_references(_owned(settings), settings.namespace)} if settings.owner else {}),
        },
        "spec": spec,
    }


def _owned(settings: PlaceholderSettings) -> PodSettings:
    return PodSettings(namespace=settings.namespace, owners={settings.namespace: settings.owner})


# The cluster autoscaler ignores pods below --expendable-pods-priority-cutoff (default -10) when deciding to
# scale up, so -10 is the lowest priority that still adds nodes.
PLACEHOLDER_PRIORITY = -10


def make_priority_class(name: str = "notebookos-placeholder", value: int = PLACEHOLDER_PRIORITY) -> dict[str, Any]:
    """The PriorityClass of placeholder pods: below everything, and never preempting."""
    check_dns1123_subdomain("priority class name", name)
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": APP_NAME}},
        "value": value,
        "globalDefault": False,
        "preemptionPolicy": "Never",
        "description": "NotebookOS placeholder pods: reserve GPU nodes; evicted first by any real workload.",
    }
