"""Request resolution: the deployer's settings, the kernelspec's ``process_proxy.config`` and the kernel's
``KERNEL_*`` variables merged (in that order of precedence, lowest first, as Enterprise Gateway does) into one
validated :class:`ReplicaPodRequest`, so a bad or disallowed request fails with a clear message before any API call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jupyter_notebookos.launchers.base import ReplicaSpec
from jupyter_notebookos.launchers.kubernetes.validation import (
    MAX_ID,
    check_dns1123_label,
    check_dns1123_subdomain,
    check_image,
    check_int,
    check_quantity,
    check_volumes,
    fail,
    parse_structured,
    quantity_value,
)

OBJECT_STORE_VOLUME = "notebookos-object-store"
ETCD_TLS_VOLUME = "notebookos-etcd-tls"
ETCD_TLS_MOUNT_PATH = "/etc/notebookos/etcd-tls"


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
        raise fail(
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
    gpus = check_int("KERNEL_GPUS", pick("KERNEL_GPUS", "gpus", 1), 0, 1024)

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
        if (
            quantities[request]
            and quantities[limit]
            and quantity_value(quantities[request]) > quantity_value(quantities[limit])
        ):
            raise fail(
                f"KERNEL_{request.upper()}",
                quantities[request],
                f"is more than KERNEL_{limit.upper()} {quantities[limit]!r}",
                "a request must not exceed its limit; raise the limit or lower the request",
            )

    uid = gid = None
    if pick("KERNEL_UID", "uid") != "":
        uid = check_int("KERNEL_UID", pick("KERNEL_UID", "uid"), 0, MAX_ID)
        if uid in settings.prohibited_uids:
            raise fail("KERNEL_UID", uid, "is prohibited by this gateway", "run the kernel as an unprivileged user")
    if pick("KERNEL_GID", "gid") != "":
        gid = check_int("KERNEL_GID", pick("KERNEL_GID", "gid"), 0, MAX_ID)
        if gid in settings.prohibited_gids:
            raise fail(
                "KERNEL_GID",
                gid,
                "is prohibited by this gateway",
                "run the kernel with an unprivileged group",
            )
    working_dir = str(pick("KERNEL_WORKING_DIR", "working_dir"))
    if working_dir and not working_dir.startswith("/"):
        raise fail("KERNEL_WORKING_DIR", working_dir, "is not an absolute path", "give e.g. '/home/jovyan/work'")

    volumes = parse_structured("kernelspec volumes", config.get("volumes")) + parse_structured(
        "KERNEL_VOLUMES", env.get("KERNEL_VOLUMES")
    )
    mounts = parse_structured("kernelspec volume_mounts", config.get("volume_mounts")) + parse_structured(
        "KERNEL_VOLUME_MOUNTS", env.get("KERNEL_VOLUME_MOUNTS")
    )
    check_volumes(volumes, mounts, _builtin_volume_names(settings))

    node_selector = dict(settings.node_selector)
    extra_selector = config.get("node_selector") or {}
    if not isinstance(extra_selector, Mapping):
        raise fail("kernelspec node_selector", extra_selector, "is not a mapping", 'give e.g. {"gpu-type": "a100"}')
    node_selector.update({str(k): str(v) for k, v in extra_selector.items()})
    tolerations = tuple(settings.tolerations) + tuple(
        parse_structured("kernelspec tolerations", config.get("tolerations"))
    )

    launch_timeout = pick("KERNEL_LAUNCH_TIMEOUT", "launch_timeout", settings.launch_timeout)
    try:
        timeout = float(launch_timeout)
    except (TypeError, ValueError):
        raise fail("KERNEL_LAUNCH_TIMEOUT", launch_timeout, "is not a number", "give seconds, e.g. 300") from None
    if timeout <= 0:
        raise fail("KERNEL_LAUNCH_TIMEOUT", launch_timeout, "must be positive", "give seconds, e.g. 300")

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
