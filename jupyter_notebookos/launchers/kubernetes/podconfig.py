"""The deployer's settings of replica pods: every ``KubernetesLauncher`` traitlet, and the pod they make.

``c.KubernetesLauncher.<name>`` configures them (the launcher inherits this class); :meth:`pod_settings` turns
them into the pure builders' :class:`~.request.PodSettings`.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from traitlets import Any as AnyTrait
from traitlets import Bool, Dict, Enum, Float, Integer, List, Unicode, default

from jupyter_notebookos.launchers.base import Launcher, ReplicaSpec
from jupyter_notebookos.launchers.kubernetes import objects
from jupyter_notebookos.launchers.kubernetes.request import PodSettings, resolve_replica_request

_SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class PodConfig(Launcher):
    """The traitlets of replica pods (a base of :class:`~.launcher.KubernetesLauncher`)."""

    """Starts each replica as a pod on a GPU node, and follows the pods through one shared watch."""

    namespace = Unicode(
        config=True,
        help="Namespace of replica pods (and placeholders). Default: NOTEBOOKOS_KERNEL_NAMESPACE, else the "
        "gateway pod's own namespace, else 'default'. KERNEL_NAMESPACE may pick one of allowed_namespaces.",
    )

    @default("namespace")
    def _namespace_default(self) -> str:
        if os.environ.get("NOTEBOOKOS_KERNEL_NAMESPACE"):
            return os.environ["NOTEBOOKOS_KERNEL_NAMESPACE"]
        try:
            with open(_SERVICE_ACCOUNT_NAMESPACE) as handle:
                return handle.read().strip() or "default"
        except OSError:
            return "default"

    allowed_namespaces = List(
        Unicode(), config=True, help="Further namespaces a kernel may ask for with KERNEL_NAMESPACE."
    )
    image = Unicode(
        config=True,
        help="Default replica image, when neither the kernelspec (image_name) nor KERNEL_IMAGE gives one. "
        "Env: NOTEBOOKOS_KERNEL_IMAGE.",
    )

    @default("image")
    def _image_default(self) -> str:
        return os.environ.get("NOTEBOOKOS_KERNEL_IMAGE", os.environ.get("EG_KERNEL_IMAGE", ""))

    service_account = Unicode(
        "", config=True, help="Service account of replica pods (KERNEL_SERVICE_ACCOUNT_NAME overrides)."
    )
    runtime_class_name = Unicode(
        "nvidia",
        config=True,
        help="RuntimeClass giving replicas the NVIDIA container runtime (pods request no nvidia.com/gpu: "
        "GPUs are bound per cell). Empty: the node's default runtime.",
    )
    gpu_node_selector = Dict(
        {"nvidia.com/gpu.present": "true"},
        config=True,
        help="Node selector of GPU nodes (the label GPU feature discovery / the GPU operator sets).",
    )
    gpu_tolerations = List(
        Dict(),
        [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        config=True,
        help="Tolerations that let replica pods onto tainted GPU nodes.",
    )
    image_pull_policy = Enum(["Always", "IfNotPresent", "Never"], "IfNotPresent", config=True, help="imagePullPolicy.")
    image_pull_secrets = List(Unicode(), config=True, help="Names of image pull secrets for replica pods.")
    priority_class_name = Unicode("", config=True, help="PriorityClass of replica pods (empty: cluster default).")
    etcd_endpoints = Unicode(
        config=True, help="etcd endpoints the replicas use (comma-separated). Env: NOTEBOOKOS_ETCD_ENDPOINTS."
    )

    @default("etcd_endpoints")
    def _etcd_endpoints_default(self) -> str:
        return os.environ.get("NOTEBOOKOS_ETCD_ENDPOINTS", "")

    etcd_ca_file = Unicode(
        config=True,
        help="PEM file (in the gateway) of the CA of etcd's certificates. Unless etcd_tls_secret is set, the launcher "
        "copies it into a Secret '<instance>-etcd-ca' in each kernel namespace, which replicas mount to verify etcd "
        "(they log in with their kernel's own user and password). Default: NOTEBOOKOS_ETCD_CA_CERT.",
    )

    @default("etcd_ca_file")
    def _etcd_ca_file_default(self) -> str:
        return os.environ.get("NOTEBOOKOS_ETCD_CA_CERT", "")

    etcd_tls_secret = Unicode(
        "",
        config=True,
        help="Secret with ca.crt, tls.crt, tls.key for etcd client TLS, mounted into replicas.",
    )
    object_store_url = Unicode(config=True, help="Object store URL for replicas. Env: NOTEBOOKOS_OBJECT_STORE_URL.")

    @default("object_store_url")
    def _object_store_url_default(self) -> str:
        return os.environ.get("NOTEBOOKOS_OBJECT_STORE_URL", "")

    object_store_claim = Unicode("", config=True, help="RWX PersistentVolumeClaim holding a file:// object store.")
    object_store_mount_path = Unicode(
        "/mnt/notebookos-store", config=True, help="Where object_store_claim is mounted in replicas."
    )
    object_store_secret = Unicode(
        "",
        config=True,
        help="Secret whose keys become env vars of replicas, for a store the gateway does not broker. Never the "
        "store's admin keys: every user's code could read them (S3 stores are brokered: replicas need no keys).",
    )
    termination_grace_period = Integer(30, config=True, help="Seconds a replica gets to stop after SIGTERM.")
    launch_timeout = Float(
        600.0,
        config=True,
        help="Seconds a replica pod may take to run (scheduling + image pull: GPU images are large); "
        "KERNEL_LAUNCH_TIMEOUT overrides.",
    )
    pin_to_host = Bool(
        True,
        config=True,
        help="Pin each pod to the node the NotebookOS scheduler chose (spec.host); False lets Kubernetes "
        "place it among GPU nodes, still one replica per node.",
    )
    real_gpus = Bool(
        True,
        config=True,
        help="The nodes' GPUs are real (exposed by the NVIDIA runtime): replicas bind them per cell with "
        "CUDA_VISIBLE_DEVICES. False where nodes only advertise nvidia.com/gpu (a fake device plugin).",
    )
    wait_until_running = Bool(
        True,
        config=True,
        help="start_replica returns only once the pod runs, and fails fast with the blocking reason "
        "(Unschedulable, ErrImagePull...), which fails the kernel start at once. False: it returns once the "
        "pod is created and a blocked pod is deleted in the background and reported FAILED with its reason "
        "by status(); the platform then fails the start only when its launch timeout ends.",
    )
    instance = Unicode("notebookos", config=True, help="app.kubernetes.io/instance label (the helm release).")
    extra_labels = Dict(config=True, help="Extra labels of replica pods.")
    extra_annotations = Dict(config=True, help="Extra annotations of replica pods.")
    prohibited_uids = List(Integer(), [0], config=True, help="KERNEL_UID values refused (EG's EG_PROHIBITED_UIDS).")
    prohibited_gids = List(Integer(), [0], config=True, help="KERNEL_GID values refused (EG's EG_PROHIBITED_GIDS).")
    allowed_images = List(
        Unicode(),
        config=True,
        help="Shell-style patterns of images a kernel may ask for with KERNEL_IMAGE besides the kernelspec's own "
        "(e.g. 'registry.example.com/notebookos/kernel:*'). Empty: only the kernelspec's (or the default) image.",
    )
    allowed_service_accounts = List(
        Unicode(),
        config=True,
        help="Service accounts a kernel may ask for with KERNEL_SERVICE_ACCOUNT_NAME besides the kernelspec's (or "
        "service_account). Empty: none.",
    )
    allowed_volume_types = List(
        Unicode(),
        ["persistentVolumeClaim", "configMap", "emptyDir"],
        config=True,
        help="Volume source types a kernel may use in KERNEL_VOLUMES. Pod Security Standard 'restricted' (the "
        "kernel namespace's level) admits only configMap, csi, downwardAPI, emptyDir, ephemeral, "
        "persistentVolumeClaim, projected and secret; never add hostPath.",
    )
    allowed_volume_sources = Dict(
        config=True,
        help="Per volume source type, shell-style patterns of the sources a kernel may use in KERNEL_VOLUMES: "
        "the claimName of persistentVolumeClaim, the name of configMap, 'server:path' of nfs, e.g. "
        "{'persistentVolumeClaim': ['claim-*', 'datasets']}. A type not listed: any source of an allowed type.",
    )
    run_as_user = Integer(
        1000, config=True, help="uid of replica containers unless KERNEL_UID says otherwise (never 0: runAsNonRoot)."
    )
    run_as_group = Integer(100, config=True, help="gid of replica containers unless KERNEL_GID says otherwise.")
    object_store_endpoint_url = Unicode(
        config=True,
        help="Endpoint of an S3-compatible object store as replicas reach it (their AWS_ENDPOINT_URL). "
        "Default: the gateway's AWS_ENDPOINT_URL.",
    )

    @default("object_store_endpoint_url")
    def _object_store_endpoint_url_default(self) -> str:
        return os.environ.get("AWS_ENDPOINT_URL", "")

    owner_config_map = Unicode(
        "",
        config=True,
        help="Name of a ConfigMap in each kernel namespace that owns replica pods and kernels' Secrets (the chart "
        "creates it), so uninstalling the release deletes them. Empty: no ownerReferences.",
    )
    orphan_sweep_interval = Float(
        300.0,
        config=True,
        help="Seconds between sweeps for replica pods and kernel Secrets of kernels this gateway does not run "
        "(left by a gateway that crashed while starting a kernel). 0: no sweep.",
    )
    orphan_grace = Float(
        900.0,
        config=True,
        help="Seconds an object of an unknown kernel must exist before a sweep deletes it (covers a kernel being "
        "started or re-attached at that moment).",
    )
    watch_timeout = Integer(300, config=True, help="Seconds before the shared watch is renewed.")
    cache_sync_timeout = Float(30.0, config=True, help="Seconds to wait for the first listing of pods.")

    core_api = AnyTrait(None, allow_none=True, help="A kubernetes CoreV1Api (tests pass a fake).")
    watch_factory = AnyTrait(None, allow_none=True, help="Makes kubernetes.watch.Watch objects (tests: fake).")

    # --- settings -------------------------------------------------------------------------------------------

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # The release's owner object per namespace (ownerReferences); the launcher finds them when it starts.
        self.owners: dict[str, dict[str, str]] = {}
        # The Secret with etcd's CA in every kernel namespace, once the launcher has written it.
        self.etcd_ca_secret = ""

    def etcd_ca_secret_name(self) -> str:
        """The name of the CA Secret the launcher writes into kernel namespaces."""
        return f"{self.instance}-etcd-ca"

    def pod_settings(self) -> PodSettings:
        """The traitlets as the pure builders' settings."""
        return PodSettings(
            namespace=self.namespace,
            image=self.image,
            service_account=self.service_account,
            runtime_class_name=self.runtime_class_name,
            node_selector=dict(self.gpu_node_selector),
            tolerations=tuple(self.gpu_tolerations),
            image_pull_policy=self.image_pull_policy,
            image_pull_secrets=tuple(self.image_pull_secrets),
            priority_class_name=self.priority_class_name,
            etcd_endpoints=self.etcd_endpoints,
            etcd_tls_secret=self.etcd_tls_secret,
            etcd_ca_secret=self.etcd_ca_secret,
            object_store_url=self.object_store_url,
            object_store_claim=self.object_store_claim,
            object_store_mount_path=self.object_store_mount_path,
            object_store_secret=self.object_store_secret,
            termination_grace_period=self.termination_grace_period,
            allowed_namespaces=tuple(self.allowed_namespaces),
            prohibited_uids=tuple(self.prohibited_uids),
            prohibited_gids=tuple(self.prohibited_gids),
            instance=self.instance,
            extra_labels=dict(self.extra_labels),
            extra_annotations=dict(self.extra_annotations),
            launch_timeout=self.launch_timeout,
            real_gpus=self.real_gpus,
            allowed_images=tuple(self.allowed_images),
            allowed_service_accounts=tuple(self.allowed_service_accounts),
            allowed_volume_types=tuple(self.allowed_volume_types),
            allowed_volume_sources={str(k): tuple(v) for k, v in self.allowed_volume_sources.items()},
            run_as_user=self.run_as_user,
            run_as_group=self.run_as_group,
            object_store_endpoint_url=self.object_store_endpoint_url,
            owners=dict(self.owners),
        )

    def build_pod(self, spec: ReplicaSpec, *, suffix: str | None = None) -> dict[str, Any]:
        """Validate ``spec`` and build its pod (no API call); raises ``InvalidKernelRequest`` on bad input."""
        settings = self.pod_settings()
        request = resolve_replica_request(spec, settings)
        name = objects.replica_pod_name(spec.kernel_id, spec.replica_id, suffix or secrets.token_hex(3))
        node = spec.host if self.pin_to_host and spec.host else None
        return objects.make_replica_pod(spec, request, settings, name=name, node=node)
