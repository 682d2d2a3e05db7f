"""``KubernetesLauncher``: one pod per replica, behind the same interface as the local launcher.

The launcher creates and deletes pods; it does not talk Jupyter (a started replica registers its own
connection info in etcd). One shared watch of the replica pods and one of pod events (per namespace) keep a
local cache, so status and re-attach after a gateway restart never poll the API per kernel, and a launch
waits on the cache: it returns once the pod runs, and fails fast with the blocking reason when the pod is
unschedulable or its image cannot be pulled.

All calls go through the official ``kubernetes`` client, in worker threads (the client is synchronous).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import time
from collections import OrderedDict
from typing import Any

from traitlets import Any as AnyTrait
from traitlets import Bool, Dict, Enum, Float, Integer, List, Unicode, default

from jupyter_notebookos.launchers.base import (
    Launcher,
    LaunchError,
    ReplicaHandle,
    ReplicaPhase,
    ReplicaSpec,
    ReplicaStatus,
)
from jupyter_notebookos.launchers.kubernetes import objects, status
from jupyter_notebookos.launchers.kubernetes.reflector import Reflector, object_key
from jupyter_notebookos.launchers.kubernetes.request import PodSettings, resolve_replica_request

_SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
_EVENTS_KEPT_PER_POD = 20
_GONE_KEPT = 2000


def load_core_api() -> Any:
    """A ``CoreV1Api`` from the in-cluster service account, else from ``~/.kube/config``."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as err:
            raise LaunchError(
                f"no Kubernetes credentials: not running in a pod and no usable kubeconfig ({err}); run the "
                "gateway in the cluster (helm chart) or point KUBECONFIG at a cluster"
            ) from None
    return client.CoreV1Api()


def api_error(err: Exception, action: str, namespace: str) -> LaunchError:
    """A kubernetes-client error as a :class:`LaunchError` that says what happened and what to do."""
    code = getattr(err, "status", None)
    message = str(err)
    body = getattr(err, "body", None)
    if body:
        try:
            message = json.loads(body).get("message") or message
        except (ValueError, AttributeError, TypeError):
            message = str(body)
    hints = {
        401: "the gateway's Kubernetes credentials were rejected; check its service account token",
        403: f"the gateway's service account may not do this in namespace {namespace!r}; check the chart's "
        "RBAC (Role notebookos-kernels) and KubernetesLauncher.namespace",
        404: f"namespace {namespace!r} (or the object) does not exist; create it or fix KERNEL_NAMESPACE",
        409: "an object with that name exists already; retry the launch",
        422: "the API server rejected the pod; fix the kernelspec or KERNEL_* value it names",
    }
    hint = hints.get(code or 0, "check that the API server is reachable from the gateway")
    return LaunchError(f"could not {action}: {message} (HTTP {code}); {hint}")


class KubernetesLauncher(Launcher):
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
        "", config=True, help="Secret whose keys become env vars of replicas (e.g. AWS_ACCESS_KEY_ID for S3)."
    )
    termination_grace_period = Integer(30, config=True, help="Seconds a replica gets to stop after SIGTERM.")
    launch_timeout = Float(
        300.0,
        config=True,
        help="Seconds a replica pod may take to run (scheduling + image pull); KERNEL_LAUNCH_TIMEOUT overrides.",
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
    watch_timeout = Integer(300, config=True, help="Seconds before the shared watch is renewed.")
    cache_sync_timeout = Float(30.0, config=True, help="Seconds to wait for the first listing of pods.")

    core_api = AnyTrait(None, allow_none=True, help="A kubernetes CoreV1Api (tests pass a fake).")
    watch_factory = AnyTrait(None, allow_none=True, help="Makes kubernetes.watch.Watch objects (tests: fake).")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._pods: dict[str, Reflector] = {}
        self._events: dict[str, Reflector] = {}
        self._pod_events: dict[str, list[dict[str, Any]]] = {}
        self._gone: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._wakeups: dict[str, asyncio.Event] = {}
        # Launches that returned before the pod ran: followed in the background until it runs or fails.
        self._starting: dict[str, asyncio.Task[None]] = {}
        self._failures: OrderedDict[str, str] = OrderedDict()
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- settings -------------------------------------------------------------------------------------------

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
        )

    def build_pod(self, spec: ReplicaSpec, *, suffix: str | None = None) -> dict[str, Any]:
        """Validate ``spec`` and build its pod (no API call); raises ``InvalidKernelRequest`` on bad input."""
        settings = self.pod_settings()
        request = resolve_replica_request(spec, settings)
        name = objects.replica_pod_name(spec.kernel_id, spec.replica_id, suffix or secrets.token_hex(3))
        node = spec.host if self.pin_to_host and spec.host else None
        return objects.make_replica_pod(spec, request, settings, name=name, node=node)

    # --- the shared watch -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the shared watches and wait for the first listing (idempotent)."""
        if self._pods:
            return
        self._loop = asyncio.get_running_loop()
        if self.core_api is None:
            self.core_api = await asyncio.to_thread(load_core_api)
        core: Any = self.core_api
        extra: dict[str, Any] = {"watch_factory": self.watch_factory} if self.watch_factory else {}
        for namespace in dict.fromkeys([self.namespace, *self.allowed_namespaces]):
            self._pods[namespace] = Reflector(
                core.list_namespaced_pod,
                name=f"pods-{namespace}",
                namespace=namespace,
                label_selector=objects.replica_selector(),
                on_change=self._on_pod_change,
                watch_timeout=self.watch_timeout,
                log=self.log,
                **extra,
            )
            self._events[namespace] = Reflector(
                core.list_namespaced_event,
                name=f"events-{namespace}",
                namespace=namespace,
                field_selector="involvedObject.kind=Pod",
                on_change=self._on_event_change,
                watch_timeout=self.watch_timeout,
                log=self.log,
                **extra,
            )
        for reflector in [*self._pods.values(), *self._events.values()]:
            reflector.start()
        for reflector in self._pods.values():
            synced = await asyncio.to_thread(reflector.synced.wait, self.cache_sync_timeout)
            if not synced:
                raise LaunchError(
                    f"could not list replica pods in namespace {reflector.list_kwargs['namespace']!r} within "
                    f"{self.cache_sync_timeout:.0f}s ({reflector.error}); check the API server and RBAC"
                )

    async def stop(self) -> None:
        """Stop the watches (pods keep running: replicas outlive the gateway)."""
        for task in self._starting.values():
            task.cancel()
        self._starting.clear()
        reflectors = [*self._pods.values(), *self._events.values()]
        self._pods, self._events = {}, {}
        await asyncio.gather(*(asyncio.to_thread(r.stop) for r in reflectors))

    def _wake(self, key: str) -> None:
        event = self._wakeups.get(key)
        if event is not None:
            event.set()

    def _notify(self, key: str) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake, key)

    def _on_pod_change(self, kind: str, pod: dict[str, Any]) -> None:
        key = object_key(pod)
        if kind == "DELETED":
            self._gone[key] = pod
            while len(self._gone) > _GONE_KEPT:
                self._gone.popitem(last=False)
            self._pod_events.pop(key, None)
        else:
            self._gone.pop(key, None)
        self._notify(key)

    def _on_event_change(self, kind: str, event: dict[str, Any]) -> None:
        involved = event.get("involvedObject") or {}
        namespace = involved.get("namespace") or (event.get("metadata") or {}).get("namespace")
        key = f"{namespace}/{involved.get('name')}"
        if kind == "DELETED" or (key not in self._wakeups and self._find_cached(key) is None):
            return  # not one of ours, or expired
        kept = self._pod_events.setdefault(key, [])
        kept.append(event)
        del kept[:-_EVENTS_KEPT_PER_POD]
        self._notify(key)

    def _find_cached(self, key: str) -> dict[str, Any] | None:
        namespace = key.split("/", 1)[0]
        reflector = self._pods.get(namespace)
        return reflector.get(key) if reflector else None

    def _key_of(self, handle: ReplicaHandle) -> str | None:
        for namespace, reflector in self._pods.items():
            key = f"{namespace}/{handle.pod}"
            if reflector.get(key) is not None or key in self._gone or key in self._failures or key in self._starting:
                return key
        return None

    # --- the Launcher interface -----------------------------------------------------------------------------

    async def start_replica(self, spec: ReplicaSpec) -> ReplicaHandle:
        """Create the replica's pod and, by default, wait until it runs; fail fast when it cannot start.

        Raises ``InvalidKernelRequest`` (before any API call) for bad kernelspec / ``KERNEL_*`` values, and
        :class:`LaunchError` when the API refuses the pod. A pod that cannot start (Unschedulable,
        ErrImagePull..., or not running within the launch timeout) is deleted and :meth:`status` reports it
        FAILED with that reason, which the platform's monitor turns into a failed launch within a second.
        With ``wait_until_running`` (the default) the call itself waits and raises :class:`LaunchError` with
        the reason; without, it returns once the pod exists and the reason comes through :meth:`status`.
        """
        pod = self.build_pod(spec)
        settings = self.pod_settings()
        timeout = resolve_replica_request(spec, settings).launch_timeout
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        key = f"{namespace}/{name}"
        await self.start()
        self._wakeups[key] = asyncio.Event()
        create = asyncio.ensure_future(asyncio.to_thread(self.core_api.create_namespaced_pod, namespace, pod))
        try:
            try:
                await asyncio.shield(create)
            except asyncio.CancelledError:
                # The caller gave up (a sibling replica failed): the pod must not outlive the launch.
                with contextlib.suppress(Exception):
                    await create
                    await self._delete(key, now=True)
                raise
            except Exception as err:
                raise api_error(err, f"create replica pod {name}", namespace) from None
            self.log.info(
                "replica %s/%s: created pod %s (host %s)",
                spec.kernel_id,
                spec.replica_id,
                key,
                spec.host or "any",
            )
            if not self.wait_until_running:
                self._starting[key] = asyncio.ensure_future(self._follow_start(key, timeout, spec))
                return ReplicaHandle(kernel_id=spec.kernel_id, replica_id=spec.replica_id, host=spec.host, pod=name)
            try:
                node = await self._wait_running(key, timeout, spec)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._delete(key, now=True))
                raise
        finally:
            if key not in self._starting:
                self._wakeups.pop(key, None)
        return ReplicaHandle(kernel_id=spec.kernel_id, replica_id=spec.replica_id, host=node, pod=name)

    async def _follow_start(self, key: str, timeout: float, spec: ReplicaSpec) -> None:
        """Background half of a launch that returned at once: note why the pod could not start, if it could not."""
        try:
            await self._wait_running(key, timeout, spec)
        except LaunchError as err:
            self.log.warning("%s", err)
            self._failures[key] = str(err)
            while len(self._failures) > _GONE_KEPT:
                self._failures.popitem(last=False)
        except Exception:
            self.log.exception("following the start of pod %s failed", key)
        finally:
            self._starting.pop(key, None)
            self._wakeups.pop(key, None)

    async def _wait_running(self, key: str, timeout: float, spec: ReplicaSpec) -> str:
        wakeup = self._wakeups[key]
        deadline = time.monotonic() + timeout
        what = f"replica {spec.replica_id} of kernel {spec.kernel_id} (pod {key})"
        while True:
            wakeup.clear()
            pod = self._find_cached(key)
            if pod is None and key in self._gone:
                reason = status.termination_reason(self._gone[key])
                raise LaunchError(f"{what} was deleted before it started ({reason}); the scheduler may retry elsewhere")
            if pod is not None:
                if status.is_running(pod):
                    return str((pod.get("spec") or {}).get("nodeName") or spec.host)
                if status.is_gone(pod):
                    await self._delete(key, now=True)
                    raise LaunchError(f"{what} stopped before it ran: {status.termination_reason(pod)}")
                blocking = status.blocking_reason(pod, self._pod_events.get(key, ()))
                if blocking:
                    await self._delete(key, now=True)
                    raise LaunchError(f"{what} cannot start: {blocking}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                await self._delete(key, now=True)
                raise LaunchError(
                    f"{what} did not start within {timeout:.0f}s; raise KubernetesLauncher.launch_timeout "
                    "(or KERNEL_LAUNCH_TIMEOUT) if the image is large, and check the pod's events"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wakeup.wait(), remaining)

    async def _delete(self, key: str, *, now: bool) -> None:
        namespace, name = key.split("/", 1)
        try:
            await asyncio.to_thread(
                self.core_api.delete_namespaced_pod, name, namespace, grace_period_seconds=0 if now else None
            )
        except Exception as err:
            if getattr(err, "status", None) != 404:  # gone already is what we wanted
                raise api_error(err, f"delete replica pod {name}", namespace) from None

    async def stop_replica(self, handle: ReplicaHandle, *, now: bool = False) -> None:
        """Delete the replica's pod, with its grace period (SIGTERM first) unless ``now``."""
        await self.start()
        key = self._key_of(handle) or f"{self.namespace}/{handle.pod}"
        starting = self._starting.pop(key, None)
        if starting is not None:
            starting.cancel()
            self._wakeups.pop(key, None)
        self.log.info(
            "replica %s/%s: deleting pod %s%s",
            handle.kernel_id,
            handle.replica_id,
            key,
            " now" if now else "",
        )
        await self._delete(key, now=now)

    async def status(self, handle: ReplicaHandle) -> ReplicaStatus:
        """The replica's phase from the shared cache (a finished or deleted pod says why)."""
        await self.start()
        if not handle.pod:
            return ReplicaStatus(ReplicaPhase.UNKNOWN, "handle has no pod name")
        key = self._key_of(handle)
        if key is not None and key in self._failures:
            return ReplicaStatus(ReplicaPhase.FAILED, self._failures[key])
        if key is None:
            return status.replica_status(None)
        pod = self._find_cached(key)
        if pod is None and key not in self._gone:
            return ReplicaStatus(ReplicaPhase.STARTING, "pod created, not yet seen by the watch")
        if pod is None:
            return status.replica_status(self._gone[key], deleted=True)
        return status.replica_status(pod, self._pod_events.get(key, ()))

    async def find_replicas(self, kernel_id: str) -> list[ReplicaHandle]:
        """The kernel's replica pods that still run or may still start (re-attach after a gateway restart)."""
        await self.start()
        return sorted(
            (h for h in self._live_handles() if h.kernel_id == kernel_id),
            key=lambda h: (h.replica_id, h.pod or ""),
        )

    # --- beyond the interface -------------------------------------------------------------------------------

    def _live_handles(self) -> list[ReplicaHandle]:
        handles = []
        for reflector in self._pods.values():
            for pod in reflector.snapshot():
                if status.is_gone(pod):
                    continue
                meta = pod.get("metadata") or {}
                labels = meta.get("labels") or {}
                host = (pod.get("spec") or {}).get("nodeName") or (meta.get("annotations") or {}).get(
                    objects.HOST_ANNOTATION, ""
                )
                handles.append(
                    ReplicaHandle(
                        kernel_id=labels.get(objects.KERNEL_ID_LABEL, ""),
                        replica_id=labels.get(objects.REPLICA_ID_LABEL, ""),
                        host=host,
                        pod=meta.get("name"),
                    )
                )
        return handles

    async def all_replicas(self) -> list[ReplicaHandle]:
        """Every live replica pod of every kernel (the gateway re-attaches to these after a restart)."""
        await self.start()
        return sorted(self._live_handles(), key=lambda h: (h.kernel_id, h.replica_id, h.pod or ""))

    async def replicas_on_host(self, host: str) -> list[ReplicaHandle]:
        """The live replicas on one node: what a lost or drained node takes with it."""
        await self.start()
        return [h for h in self._live_handles() if h.host == host]
