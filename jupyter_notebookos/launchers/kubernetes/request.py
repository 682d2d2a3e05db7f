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
    check_mount_allowed,
    check_quantity,
    check_volume_allowed,
    check_volumes,
    fail,
    matches_any,
    parse_structured,
    quantity_value,
    refuse,
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
    # A Secret with only the CA of etcd's certificates (key ca.crt): replicas verify etcd and log in with their
    # kernel's user and password (etcd_tls_secret, when set, wins: it carries a client certificate too).
    etcd_ca_secret: str = ""
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
    launch_timeout: float = 600.0
    # The nodes' GPUs are real (the NVIDIA runtime exposes them): replicas bind them per cell. False for
    # clusters whose nodes only advertise nvidia.com/gpu (a fake device plugin in a test cluster).
    real_gpus: bool = True
    # What a kernel's own KERNEL_* request may ask for beyond the deployer's defaults (the kernelspec, written by
    # the deployer, is trusted): image patterns, service accounts, volume source types and named sources.
    allowed_images: Sequence[str] = ()
    allowed_service_accounts: Sequence[str] = ()
    allowed_volume_types: Sequence[str] = ("persistentVolumeClaim", "configMap", "emptyDir")
    allowed_volume_sources: Mapping[str, Sequence[str]] = field(default_factory=dict)
    # The uid and gid replicas run as unless KERNEL_UID / KERNEL_GID say otherwise (never root: runAsNonRoot).
    run_as_user: int = 1000
    run_as_group: int = 100
    # The object store's endpoint (AWS_ENDPOINT_URL of an S3-compatible store), as replicas reach it.
    object_store_endpoint_url: str = ""
    # Per namespace, the object replica pods and their Secrets are owned by (the chart's owner ConfigMap), so
    # deleting the release deletes them: {"namespace": {"apiVersion", "kind", "name", "uid"}}.
    owners: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


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
    uid: int = 1000
    gid: int = 100
    working_dir: str = ""
    volumes: tuple[dict[str, Any], ...] = ()
    volume_mounts: tuple[dict[str, Any], ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    launch_timeout: float = 300.0


#: The kernelspec ``process_proxy.config`` keys this launcher reads, and those Enterprise Gateway or the process
#: proxy read themselves; any other key is a typo that would silently do nothing, so it is refused.
CONFIG_KEYS = frozenset(
    {
        "namespace",
        "image_name",
        "service_account_name",
        "runtime_class_name",
        "gpus",
        "cpus",
        "memory",
        "cpus_limit",
        "memory_limit",
        "uid",
        "gid",
        "working_dir",
        "volumes",
        "volume_mounts",
        "node_selector",
        "tolerations",
        "launch_timeout",
    }
)
PROXY_CONFIG_KEYS = frozenset({"replicas", "authorized_users", "unauthorized_users", "port_range"})


def resolve_replica_request(spec: ReplicaSpec, settings: PodSettings) -> ReplicaPodRequest:
    """Merge settings < kernelspec config < ``KERNEL_*`` variables and validate every value.

    Every key of the kernelspec's config is used (an unknown one is refused). What the kernel's own ``KERNEL_*``
    variables ask for beyond the deployer's choices (its image, service account, volumes) must be on the deployer's
    allowlists. GPUs and the launch timeout come resolved in ``spec`` (by the process proxy, from ``KERNEL_GPUS``
    and ``KERNEL_LAUNCH_TIMEOUT``). Raises :class:`InvalidKernelRequest` naming the offending field, the rule and
    how to fix it.
    """
    config, env = spec.config, spec.env
    unknown = sorted(set(config) - CONFIG_KEYS - PROXY_CONFIG_KEYS)
    if unknown:
        raise fail(
            f"kernelspec {spec.kernel_name!r} process_proxy.config key",
            unknown[0],
            "is not one this launcher knows",
            f"use one of {sorted(CONFIG_KEYS | PROXY_CONFIG_KEYS)}",
        )

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
    trusted_image = str(config.get("image_name") or settings.image)
    if image != trusted_image and not matches_any(image, settings.allowed_images):
        raise refuse(
            "KERNEL_IMAGE",
            image,
            f"it is not the kernelspec's image {trusted_image!r} and matches none of "
            f"KubernetesLauncher.allowed_images {list(settings.allowed_images)}",
            "leave KERNEL_IMAGE unset, or ask the deployer to allow the image",
        )
    service_account = str(pick("KERNEL_SERVICE_ACCOUNT_NAME", "service_account_name", settings.service_account))
    if service_account:
        check_dns1123_subdomain("KERNEL_SERVICE_ACCOUNT_NAME", service_account)
    trusted_account = str(config.get("service_account_name") or settings.service_account)
    if service_account != trusted_account and service_account not in settings.allowed_service_accounts:
        raise refuse(
            "KERNEL_SERVICE_ACCOUNT_NAME",
            service_account,
            f"it is not the kernelspec's service account {trusted_account!r} and not one of "
            f"KubernetesLauncher.allowed_service_accounts {list(settings.allowed_service_accounts)}",
            "leave KERNEL_SERVICE_ACCOUNT_NAME unset, or ask the deployer to allow the account",
        )
    runtime_class = str(config.get("runtime_class_name") or settings.runtime_class_name)
    if runtime_class:
        check_dns1123_subdomain("runtime class name", runtime_class)
    gpus = spec.gpus

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

    uid, gid = settings.run_as_user, settings.run_as_group
    if pick("KERNEL_UID", "uid") != "":
        uid = check_int("KERNEL_UID", pick("KERNEL_UID", "uid"), 0, MAX_ID)
        if uid in settings.prohibited_uids:
            raise fail("KERNEL_UID", uid, "is prohibited by this gateway", "run the kernel as an unprivileged user")
        if uid == 0:
            raise refuse(
                "KERNEL_UID",
                uid,
                "replica pods run as non-root (Pod Security Standard 'restricted': runAsNonRoot)",
                "give an unprivileged uid, e.g. 1000",
            )
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
    # The kernel's own volumes must be on the deployer's lists (the kernelspec's are the deployer's choice).
    for volume in parse_structured("KERNEL_VOLUMES", env.get("KERNEL_VOLUMES")):
        check_volume_allowed(volume, settings.allowed_volume_types, settings.allowed_volume_sources)
    for mount in parse_structured("KERNEL_VOLUME_MOUNTS", env.get("KERNEL_VOLUME_MOUNTS")):
        check_mount_allowed(mount)

    node_selector = dict(settings.node_selector)
    extra_selector = config.get("node_selector") or {}
    if not isinstance(extra_selector, Mapping):
        raise fail("kernelspec node_selector", extra_selector, "is not a mapping", 'give e.g. {"gpu-type": "a100"}')
    node_selector.update({str(k): str(v) for k, v in extra_selector.items()})
    tolerations = tuple(settings.tolerations) + tuple(
        parse_structured("kernelspec tolerations", config.get("tolerations"))
    )

    timeout = spec.launch_timeout if spec.launch_timeout is not None else settings.launch_timeout

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
    if settings.etcd_tls_secret or settings.etcd_ca_secret:
        names.add(ETCD_TLS_VOLUME)
    return names
