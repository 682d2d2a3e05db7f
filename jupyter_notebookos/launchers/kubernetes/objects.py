"""Kubernetes manifests for NotebookOS, built by pure functions (no API calls, no clock, no randomness).

- :func:`resolve_replica_request` merges the deployer's settings, the kernelspec's ``process_proxy.config``
  and the kernel's ``KERNEL_*`` variables (in that order of precedence, lowest first, as Enterprise Gateway
  does) and validates every value, so a bad request fails with a clear message before any API call.
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
from decimal import Decimal
from typing import Any

import yaml
from kubernetes.utils import parse_quantity

from jupyter_notebookos.launchers.base import LaunchError, ReplicaSpec
from jupyter_notebookos.replication import protocol

# Labels every NotebookOS pod carries; the launcher's watch selects on them.
COMPONENT_LABEL = "component"
REPLICA_COMPONENT = "notebookos-replica"
PLACEHOLDER_COMPONENT = "notebookos-placeholder"
KERNEL_ID_LABEL = "kernel_id"
REPLICA_ID_LABEL = "replica_id"
APP_NAME = "notebookos"
HOST_ANNOTATION = "notebookos.io/host"
GPUS_ANNOTATION = "notebookos.io/gpus-per-cell"
HOSTNAME_TOPOLOGY_KEY = "kubernetes.io/hostname"
GPU_RESOURCE = "nvidia.com/gpu"
REPLICA_CONTAINER = "replica"
REPLICA_COMMAND = ("python", "-m", "jupyter_notebookos.kernel")
OBJECT_STORE_VOLUME = "notebookos-object-store"
ETCD_TLS_VOLUME = "notebookos-etcd-tls"
ETCD_TLS_MOUNT_PATH = "/etc/notebookos/etcd-tls"

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

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_QUANTITY = re.compile(r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
# Image references, following the grammar of github.com/distribution/reference.
_IMAGE_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_PATH = re.compile(rf"^{_IMAGE_PATH_COMPONENT}(?:/{_IMAGE_PATH_COMPONENT})*$")
_IMAGE_DOMAIN = re.compile(
    r"^(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*"
    r"(?::[0-9]+)?$|^\[[0-9a-fA-F:]+\](?::[0-9]+)?$"
)
_IMAGE_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_IMAGE_DIGEST = re.compile(r"^[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}$")
_PULL_POLICIES = ("Always", "IfNotPresent", "Never")
_MAX_ID = 4294967295  # uid_t / gid_t


class InvalidKernelRequest(LaunchError, ValueError):
    """A kernelspec or ``KERNEL_*`` value cannot make a valid pod; raised before any API call."""


@dataclass(frozen=True)
class PodSettings:
    """What the deployer configured for every replica pod (the launcher's traitlets, in one value)."""

    namespace: str
    image: str = ""
    service_account: str = ""
    runtime_class_name: str = "nvidia"
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, Any]] = ()
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: Sequence[str] = ()
    priority_class_name: str = ""
    etcd_endpoints: str = ""
    etcd_tls_secret: str = ""
    object_store_url: str = ""
    object_store_claim: str = ""
    object_store_mount_path: str = "/mnt/notebookos-store"
    object_store_secret: str = ""
    termination_grace_period: int = 30
    allowed_namespaces: Sequence[str] = ()
    prohibited_uids: Sequence[int] = (0,)
    prohibited_gids: Sequence[int] = (0,)
    instance: str = "notebookos"
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    extra_annotations: Mapping[str, str] = field(default_factory=dict)
    launch_timeout: float = 300.0
    # The nodes' GPUs are real (the NVIDIA runtime exposes them): replicas bind them per cell. False for
    # clusters whose nodes only advertise nvidia.com/gpu (a fake device plugin in a test cluster).
    real_gpus: bool = True


@dataclass(frozen=True)
class ReplicaPodRequest:
    """One kernel's validated pod parameters: settings, kernelspec config and ``KERNEL_*`` merged."""

    namespace: str
    image: str
    service_account: str
    runtime_class_name: str
    gpus: int
    cpus: str = ""
    memory: str = ""
    cpus_limit: str = ""
    memory_limit: str = ""
    uid: int | None = None
    gid: int | None = None
    working_dir: str = ""
    volumes: tuple[dict[str, Any], ...] = ()
    volume_mounts: tuple[dict[str, Any], ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    launch_timeout: float = 300.0


# --- validation ---------------------------------------------------------------------------------------------


def _fail(what: str, value: object, why: str, fix: str) -> InvalidKernelRequest:
    return InvalidKernelRequest(f"{what} {value!r} {why}; {fix}")


def check_dns1123_label(what: str, value: str) -> str:
    """Return ``value`` if it is a DNS-1123 label (namespaces, volume names), else raise."""
    if not value or len(value) > 63 or not _DNS1123_LABEL.match(value):
        raise _fail(
            what,
            value,
            "is not a valid DNS-1123 label",
            "use at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit",
        )
    return value


def check_dns1123_subdomain(what: str, value: str) -> str:
    """Return ``value`` if it is a DNS-1123 subdomain (pod, service account names), else raise."""
    if not value or len(value) > 253 or not _DNS1123_SUBDOMAIN.match(value):
        raise _fail(
            what,
            value,
            "is not a valid DNS-1123 name",
            "use lowercase letters, digits, '-' and '.', starting and ending with a letter or digit",
        )
    return value


def check_label_value(what: str, value: str) -> str:
    """Return ``value`` if Kubernetes accepts it as a label value, else raise."""
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        raise _fail(
            what,
            value,
            "cannot be a Kubernetes label value",
            "use at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
        )
    return value


def check_image(what: str, value: str) -> str:
    """Return ``value`` if it is a valid container image reference (``[registry/]path[:tag][@digest]``)."""
    fix = "give an image like 'registry.example.com/team/notebookos-kernel:0.1.0'"
    if not value:
        raise InvalidKernelRequest(
            f"{what} is empty: no kernel image is configured; set the kernelspec's process_proxy "
            "config 'image_name', KERNEL_IMAGE, or KubernetesLauncher.image"
        )
    if len(value) > 4096 or value != value.strip():
        raise _fail(what, value, "is not a valid image reference", fix)
    rest, _, digest = value.partition("@")
    if digest and not _IMAGE_DIGEST.match(digest):
        raise _fail(what, value, f"has an invalid digest {digest!r}", fix)
    name, tag = rest, ""
    slash, colon = rest.rfind("/"), rest.rfind(":")
    if colon > slash:
        name, tag = rest[:colon], rest[colon + 1 :]
        if not _IMAGE_TAG.match(tag):
            raise _fail(what, value, f"has an invalid tag {tag!r}", fix)
    first, sep, remainder = name.partition("/")
    if sep and (any(c in first for c in ".:") or first == "localhost" or first.lower() != first):
        if not _IMAGE_DOMAIN.match(first):
            raise _fail(what, value, f"has an invalid registry {first!r}", fix)
        path = remainder
    else:
        path = name
    if not path or len(path) > 255 or not _IMAGE_PATH.match(path):
        raise _fail(what, value, "is not a valid image name (lowercase letters, digits, '.', '_', '-', '/')", fix)
    return value


def check_quantity(what: str, value: object) -> str:
    """Return ``value`` as a canonical-form string if it is a positive Kubernetes quantity, else raise."""
    text = str(value).strip()
    if isinstance(value, bool) or not _QUANTITY.match(text):
        raise _fail(
            what,
            value,
            "is not a Kubernetes resource quantity",
            "use a positive number with an optional suffix, e.g. cpu '500m' or '2', memory '512Mi' or '4Gi'",
        )
    if parse_quantity(text) <= 0:
        raise _fail(what, value, "must be greater than zero", "remove it to use the default, or give a size")
    return text


def _quantity(text: str) -> Decimal:
    return Decimal(parse_quantity(text))


def _check_int(what: str, value: object, low: int, high: int) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise _fail(what, value, "is not an integer", f"give a whole number from {low} to {high}") from None
    if not low <= number <= high:
        raise _fail(what, value, f"is out of range {low}..{high}", f"give a whole number from {low} to {high}")
    return number


def _structured(what: str, value: object) -> list[dict[str, Any]]:
    """Parse KERNEL_VOLUMES-style values: a list of mappings, or its JSON/YAML text (as EG accepts)."""
    parsed: object = value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            try:
                parsed = yaml.safe_load(value)
            except yaml.YAMLError as err:
                raise _fail(what, value, f"is neither JSON nor YAML ({err})", "give a JSON list of objects") from None
    if parsed is None:
        return []
    if isinstance(parsed, Mapping):
        parsed = [parsed]
    if not isinstance(parsed, list) or not all(isinstance(item, Mapping) for item in parsed):
        raise _fail(
            what,
            value,
            "is not a list of objects",
            'give e.g. [{"name": "data", "persistentVolumeClaim": {...}}]',
        )
    return [dict(item) for item in parsed]


def _check_volumes(volumes: list[dict[str, Any]], mounts: list[dict[str, Any]], builtin: set[str]) -> None:
    names: set[str] = set()
    for volume in volumes:
        name = str(volume.get("name", ""))
        check_dns1123_label("KERNEL_VOLUMES entry name", name)
        if name in names or name in builtin:
            raise _fail("KERNEL_VOLUMES entry name", name, "is used twice", "give every volume its own name")
        if len(volume) < 2:
            raise _fail(
                "KERNEL_VOLUMES entry",
                volume,
                "has no volume source",
                "add one source, e.g. persistentVolumeClaim, nfs, configMap or emptyDir",
            )
        names.add(name)
    for mount in mounts:
        name, path = str(mount.get("name", "")), str(mount.get("mountPath", ""))
        if name not in names and name not in builtin:
            raise _fail(
                "KERNEL_VOLUME_MOUNTS entry",
                mount,
                "names a volume that is not defined",
                f"define it in KERNEL_VOLUMES (defined: {sorted(names) or 'none'})",
            )
        if not path.startswith("/"):
            raise _fail(
                "KERNEL_VOLUME_MOUNTS entry",
                mount,
                "has no absolute mountPath",
                "give e.g. '/home/jovyan/data'",
            )


def resolve_replica_request(spec: ReplicaSpec, settings: PodSettings) -> ReplicaPodRequest:
    """Merge settings < kernelspec config < ``KERNEL_*`` variables and validate every value.

    Raises :class:`InvalidKernelRequest` naming the offending value and how to fix it.
    """
    config, env = spec.config, spec.env

    def pick(env_name: str, config_key: str, fallback: object = "") -> Any:
        if env.get(env_name, "") != "":
            return env[env_name]
        if config.get(config_key) not in (None, ""):
            return config[config_key]
        return fallback

    namespace = str(pick("KERNEL_NAMESPACE", "namespace", settings.namespace))
    check_dns1123_label("KERNEL_NAMESPACE", namespace)
    allowed = {settings.namespace, *settings.allowed_namespaces}
    if namespace not in allowed:
        raise _fail(
            "KERNEL_NAMESPACE",
            namespace,
            "is not a namespace this gateway launches replicas into",
            f"use one of {sorted(allowed)}, or add it to KubernetesLauncher.allowed_namespaces and to the chart's RBAC",
        )
    image = check_image("kernel image", str(pick("KERNEL_IMAGE", "image_name", settings.image)))
    service_account = str(pick("KERNEL_SERVICE_ACCOUNT_NAME", "service_account_name", settings.service_account))
    if service_account:
        check_dns1123_subdomain("KERNEL_SERVICE_ACCOUNT_NAME", service_account)
    runtime_class = str(config.get("runtime_class_name") or settings.runtime_class_name)
    if runtime_class:
        check_dns1123_subdomain("runtime class name", runtime_class)
    gpus = _check_int("KERNEL_GPUS", pick("KERNEL_GPUS", "gpus", 1), 0, 1024)

    quantities: dict[str, str] = {}
    for env_name, key in (
        ("KERNEL_CPUS", "cpus"),
        ("KERNEL_MEMORY", "memory"),
        ("KERNEL_CPUS_LIMIT", "cpus_limit"),
        ("KERNEL_MEMORY_LIMIT", "memory_limit"),
    ):
        raw = pick(env_name, key)
        quantities[key] = check_quantity(env_name, raw) if raw != "" else ""
    for request, limit in (("cpus", "cpus_limit"), ("memory", "memory_limit")):
        if quantities[request] and quantities[limit] and _quantity(quantities[request]) > _quantity(quantities[limit]):
            raise _fail(
                f"KERNEL_{request.upper()}",
                quantities[request],
                f"is more than KERNEL_{limit.upper()} {quantities[limit]!r}",
                "a request must not exceed its limit; raise the limit or lower the request",
            )

    uid = gid = None
    if pick("KERNEL_UID", "uid") != "":
        uid = _check_int("KERNEL_UID", pick("KERNEL_UID", "uid"), 0, _MAX_ID)
        if uid in settings.prohibited_uids:
            raise _fail("KERNEL_UID", uid, "is prohibited by this gateway", "run the kernel as an unprivileged user")
    if pick("KERNEL_GID", "gid") != "":
        gid = _check_int("KERNEL_GID", pick("KERNEL_GID", "gid"), 0, _MAX_ID)
        if gid in settings.prohibited_gids:
            raise _fail(
                "KERNEL_GID",
                gid,
                "is prohibited by this gateway",
                "run the kernel with an unprivileged group",
            )
    working_dir = str(pick("KERNEL_WORKING_DIR", "working_dir"))
    if working_dir and not working_dir.startswith("/"):
        raise _fail("KERNEL_WORKING_DIR", working_dir, "is not an absolute path", "give e.g. '/home/jovyan/work'")

    volumes = _structured("kernelspec volumes", config.get("volumes")) + _structured(
        "KERNEL_VOLUMES", env.get("KERNEL_VOLUMES")
    )
    mounts = _structured("kernelspec volume_mounts", config.get("volume_mounts")) + _structured(
        "KERNEL_VOLUME_MOUNTS", env.get("KERNEL_VOLUME_MOUNTS")
    )
    _check_volumes(volumes, mounts, _builtin_volume_names(settings))

    node_selector = dict(settings.node_selector)
    extra_selector = config.get("node_selector") or {}
    if not isinstance(extra_selector, Mapping):
        raise _fail("kernelspec node_selector", extra_selector, "is not a mapping", 'give e.g. {"gpu-type": "a100"}')
    node_selector.update({str(k): str(v) for k, v in extra_selector.items()})
    tolerations = tuple(settings.tolerations) + tuple(_structured("kernelspec tolerations", config.get("tolerations")))

    launch_timeout = pick("KERNEL_LAUNCH_TIMEOUT", "launch_timeout", settings.launch_timeout)
    try:
        timeout = float(launch_timeout)
    except (TypeError, ValueError):
        raise _fail("KERNEL_LAUNCH_TIMEOUT", launch_timeout, "is not a number", "give seconds, e.g. 300") from None
    if timeout <= 0:
        raise _fail("KERNEL_LAUNCH_TIMEOUT", launch_timeout, "must be positive", "give seconds, e.g. 300")

    return ReplicaPodRequest(
        namespace=namespace,
        image=image,
        service_account=service_account,
        runtime_class_name=runtime_class,
        gpus=gpus,
        cpus=quantities["cpus"],
        memory=quantities["memory"],
        cpus_limit=quantities["cpus_limit"],
        memory_limit=quantities["memory_limit"],
        uid=uid,
        gid=gid,
        working_dir=working_dir,
        volumes=tuple(volumes),
        volume_mounts=tuple(mounts),
        node_selector=node_selector,
        tolerations=tolerations,
        launch_timeout=timeout,
    )


def _builtin_volume_names(settings: PodSettings) -> set[str]:
    names = set()
    if settings.object_store_claim:
        names.add(OBJECT_STORE_VOLUME)
    if settings.etcd_tls_secret:
        names.add(ETCD_TLS_VOLUME)
    return names


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
    for name, value in (
        (protocol.ENV_ETCD_ENDPOINTS, settings.etcd_endpoints),
        (protocol.ENV_OBJECT_STORE_URL, settings.object_store_url),
    ):
        if value:
            ours[name] = value
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
    downward = {protocol.ENV_HOST, protocol.ENV_POD_NAME, "NOTEBOOKOS_POD_NAMESPACE", protocol.ENV_ADVERTISE_IP}
    passed = {
        name: str(value)
        for name, value in spec.env.items()
        if name not in _PROCESS_ONLY_ENV
        and name not in _STRUCTURED_ENV
        and name not in _GATEWAY_ONLY_ENV
        and name not in downward
        and _ENV_NAME.match(name)
    }
    env: list[dict[str, Any]] = [{"name": n, "value": v} for n, v in sorted({**passed, **ours}.items())]
    # The node and pod are known only once scheduled: take them from the downward API.
    for name, path in (
        (protocol.ENV_HOST, "spec.nodeName"),
        (protocol.ENV_POD_NAME, "metadata.name"),
        ("NOTEBOOKOS_POD_NAMESPACE", "metadata.namespace"),
        (protocol.ENV_ADVERTISE_IP, "status.podIP"),
    ):
        env.append({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}})
    return env


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
    if settings.object_store_claim:
        volumes.append(
            {"name": OBJECT_STORE_VOLUME, "persistentVolumeClaim": {"claimName": settings.object_store_claim}}
        )
        mounts.append({"name": OBJECT_STORE_VOLUME, "mountPath": settings.object_store_mount_path})
    if settings.etcd_tls_secret:
        volumes.append({"name": ETCD_TLS_VOLUME, "secret": {"secretName": settings.etcd_tls_secret}})
        mounts.append({"name": ETCD_TLS_VOLUME, "mountPath": ETCD_TLS_MOUNT_PATH, "readOnly": True})

    container: dict[str, Any] = {
        "name": REPLICA_CONTAINER,
        "image": request.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": list(REPLICA_COMMAND),
        "env": _replica_env(spec, request, settings),
    }
    if settings.object_store_secret:
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
    if request.uid is not None or request.gid is not None:
        # EG's convention: fsGroup 100 ('users') keeps /home/jovyan writable whatever the uid.
        security: dict[str, int] = {"fsGroup": 100}
        if request.uid is not None:
            security["runAsUser"] = request.uid
        if request.gid is not None:
            security["runAsGroup"] = request.gid
        pod_spec["securityContext"] = security

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": request.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": pod_spec,
    }


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
            }
        ],
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
        "metadata": {"name": name, "namespace": settings.namespace, "labels": labels},
        "spec": spec,
    }


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
