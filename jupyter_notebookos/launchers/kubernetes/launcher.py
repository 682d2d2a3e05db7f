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
import time
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

from jupyter_notebookos.launchers.base import (
    LaunchError,
    ReplicaHandle,
    ReplicaPhase,
    ReplicaSpec,
    ReplicaStatus,
)
from jupyter_notebookos.launchers.kubernetes import objects, ownership, status
from jupyter_notebookos.launchers.kubernetes.api import api_error, load_core_api
from jupyter_notebookos.launchers.kubernetes.podconfig import PodConfig
from jupyter_notebookos.launchers.kubernetes.reflector import Reflector, object_key
from jupyter_notebookos.launchers.kubernetes.request import PodSettings, resolve_replica_request
from jupyter_notebookos.waiting import wait_event

_EVENTS_KEPT_PER_POD = 20
_GONE_KEPT = 2000


class KubernetesLauncher(PodConfig):
    """Starts each replica as a pod on a GPU node, and follows the pods through one shared watch."""

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
        # Kernels this gateway runs (started or re-attached since it started); others' objects are orphans.
        self._known_kernels: set[str] = set()
        # Per (namespace, kernel): the creation of its credentials Secret (its replicas start concurrently).
        self._secrets: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._started: asyncio.Future[None] | None = None
        self._background: set[asyncio.Task[None]] = set()

    # --- the shared watch -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the shared watches, wait for the first listing and find the owner objects (idempotent; concurrent
        callers wait for the same start)."""
        if self._started is None or (self._started.done() and self._started.exception() is not None):
            self._started = asyncio.ensure_future(self._start())
        await asyncio.shield(self._started)

    async def _start(self) -> None:
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
        if self.owner_config_map:
            for namespace in self._pods:
                owner = await ownership.read_owner(core, self.owner_config_map, namespace)
                if owner is None:
                    self.log.warning(
                        "owner ConfigMap %s/%s does not exist: replica pods there get no ownerReferences, so "
                        "uninstalling the release will not delete them",
                        namespace,
                        self.owner_config_map,
                    )
                else:
                    self.owners[namespace] = owner
        if self.etcd_ca_file and not self.etcd_tls_secret:
            await self._write_etcd_ca(core)
        if self.orphan_sweep_interval > 0:
            self._sweeper = asyncio.ensure_future(self._sweep_loop())

    async def _write_etcd_ca(self, core: Any) -> None:
        """Copy etcd's CA into each kernel namespace, for replicas to verify etcd's certificates."""
        try:
            with open(self.etcd_ca_file) as handle:
                ca_pem = handle.read()
        except OSError as err:
            raise LaunchError(
                f"cannot read etcd's CA certificate {self.etcd_ca_file!r} ({err}); mount it in the gateway or fix "
                "KubernetesLauncher.etcd_ca_file (NOTEBOOKOS_ETCD_CA_CERT)"
            ) from None
        settings = self.pod_settings()
        for namespace in self._pods:
            secret = objects.make_etcd_ca_secret(self.etcd_ca_secret_name(), namespace, ca_pem, settings)
            await ownership.apply_secret(core, secret)
        self.etcd_ca_secret = self.etcd_ca_secret_name()

    async def stop(self) -> None:
        """Stop the watches (pods keep running: replicas outlive the gateway)."""
        self._started = None
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
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
        timeout = resolve_replica_request(spec, self.pod_settings()).launch_timeout  # bad values: no API call
        await self.start()  # finds the owner objects the pod refers to
        pod = self.build_pod(spec)
        settings = self.pod_settings()
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        key = f"{namespace}/{name}"
        self._known_kernels.add(spec.kernel_id)
        if objects.kernel_secret_values(spec):
            await self._ensure_secret(spec, settings, namespace)
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
            await wait_event(wakeup, remaining)

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
        self._known_kernels.add(kernel_id)
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

    # --- a kernel's Secret, and orphans -----------------------------------------------------------------------

    async def _ensure_secret(self, spec: ReplicaSpec, settings: PodSettings, namespace: str) -> None:
        """Create the kernel's credentials Secret once (its replicas start concurrently and share it)."""
        key = (namespace, spec.kernel_id)
        creating = self._secrets.get(key)
        if creating is None or (creating.done() and creating.exception() is not None):
            secret = objects.make_kernel_secret(spec, settings, namespace)
            creating = self._secrets[key] = asyncio.ensure_future(ownership.apply_secret(self.core_api, secret))
        await asyncio.shield(creating)

    async def forget_kernel(self, kernel_id: str) -> None:
        """The kernel is gone (the platform stopped it): delete its credentials Secret in the background."""
        self._known_kernels.discard(kernel_id)
        for namespace, kernel in [k for k in self._secrets if k[1] == kernel_id]:
            self._secrets.pop((namespace, kernel), None)
        if self.core_api is None:
            return
        for namespace in dict.fromkeys([self.namespace, *self.allowed_namespaces]):
            task = asyncio.ensure_future(self._delete_secret(kernel_id, namespace))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _delete_secret(self, kernel_id: str, namespace: str) -> None:
        try:
            await ownership.delete_secret(self.core_api, objects.kernel_secret_name(kernel_id), namespace)
        except LaunchError as err:
            self.log.warning("kernel %s: %s (the orphan sweep retries)", kernel_id, err)

    async def sweep_orphans(self) -> list[ownership.Orphan]:
        """Delete the replica pods and credentials Secrets of kernels this gateway does not run, once they are
        older than ``orphan_grace``; returns what was deleted."""
        await self.start()
        found: list[tuple[str, dict[str, Any]]] = []
        for namespace, reflector in self._pods.items():
            found.extend(("Pod", pod) for pod in reflector.snapshot())
            found.extend(("Secret", s) for s in await ownership.list_secrets(self.core_api, namespace))
        now = datetime.now(UTC)
        orphans = ownership.find_orphans(found, self._known_kernels, now=now, grace=self.orphan_grace)
        deleted = []
        for orphan in orphans:
            try:
                if orphan.kind == "Pod":
                    await self._delete(f"{orphan.namespace}/{orphan.name}", now=True)
                else:
                    await ownership.delete_secret(self.core_api, orphan.name, orphan.namespace)
            except LaunchError as err:
                self.log.warning("orphan sweep: could not delete %s: %s", orphan, err)
                continue
            deleted.append(orphan)
        if deleted:
            self.log.warning(
                "orphan sweep: deleted %d object(s) of kernels this gateway does not run: %s",
                len(deleted),
                ", ".join(map(str, deleted)),
            )
        return deleted

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.orphan_sweep_interval)
            try:
                await self.sweep_orphans()
            except Exception:
                self.log.exception("orphan sweep failed; retrying in %.0fs", self.orphan_sweep_interval)
