"""The gateway's platform: the scheduler, etcd, the launcher and the replica routers of NotebookOS kernels.

One instance lives in the gateway process (:meth:`GatewayPlatform.current`). EG's handlers reach it through
the NotebookOS process proxy; our REST handlers read it. It owns every long-lived resource and starts and
stops them in order. It also is the routers' :class:`~jupyter_notebookos.gateway.router.CellPlanner`: the
scheduler decides, the platform turns decisions into actions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from jupyter_notebookos.coordination.client import Coordinator, EtcdCredentials, EtcdTls
from jupyter_notebookos.coordination.errors import CoordinationError
from jupyter_notebookos.coordination.quarantine import quarantine
from jupyter_notebookos.gateway.access import KernelAccess, KernelAccessManager, ensure_etcd_auth, replica_env
from jupyter_notebookos.gateway.autoscaler import Autoscaler
from jupyter_notebookos.gateway.events import EventLog
from jupyter_notebookos.gateway.ledger import LedgerReleases
from jupyter_notebookos.gateway.metrics import PlatformMetrics
from jupyter_notebookos.gateway.migration import MigrationRunner
from jupyter_notebookos.gateway.reconcile import DEFAULT_RECONCILE_INTERVAL, LedgerReconciler
from jupyter_notebookos.gateway.rejoin import DEFAULT_REJOIN_GRACE, await_rejoin
from jupyter_notebookos.gateway.residency import GpuResidency
from jupyter_notebookos.gateway.router import (
    CellGrant,
    CellRejected,
    CellRequest,
    ReplicaRouter,
    RouterSettings,
)
from jupyter_notebookos.gateway.sessions import parse_session
from jupyter_notebookos.gpu.discovery import GpuDevice, host_devices, nvml_devices
from jupyter_notebookos.launchers.base import Launcher, LaunchError, ReplicaHandle, ReplicaPhase, ReplicaSpec
from jupyter_notebookos.launchers.provisioning import HostProvisioner
from jupyter_notebookos.replication import protocol
from jupyter_notebookos.replication.protocol import MalformedRecord, ReplicaRegistration
from jupyter_notebookos.scheduler import (
    CellFinished,
    Decision,
    HostSpec,
    KernelSpec,
    MigrateThenRun,
    MigrationCompleted,
    MigrationFailed,
    MigrationRefused,
    Placement,
    RejectCell,
    ReplicaLost,
    ReplicaSlot,
    RunCell,
    RunningCellSpec,
    Scheduler,
)

log = logging.getLogger(__name__)


class MigrationRequestError(Exception):
    """A migration request that was refused or failed: an HTTP status and a message for the user."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class KernelRequestError(ValueError):
    """A kernel start request that cannot be honoured (bad ``KERNEL_GPUS``, no room); the text is for users."""


@dataclass
class HostRecord:
    """A host as the gateway sees it (embedded mode: a simulated host on this machine)."""

    name: str
    devices: list[GpuDevice]

    @property
    def simulated(self) -> bool:
        return all(d.simulated for d in self.devices) if self.devices else True


@dataclass
class KernelRecord:
    """A NotebookOS kernel known to the platform."""

    kernel_id: str
    kernel_name: str
    gpus: int
    router: ReplicaRouter
    env: dict[str, str]
    handles: dict[str, ReplicaHandle] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)
    next_replica: int = 3
    # The scheduler's replica ids (a migrated replica keeps its id there) -> the replica processes' ids.
    router_ids: dict[int, str] = field(default_factory=dict)
    # The kernel's own etcd credentials (what its replicas get; never the gateway's).
    access: KernelAccess | None = None
    # The kernelspec's process_proxy config (image, resources...), given to the launcher with every replica.
    config: dict[str, Any] = field(default_factory=dict)

    def router_id(self, scheduler_id: int) -> str:
        """The replica process that stands for the scheduler's replica ``scheduler_id`` now."""
        return self.router_ids.get(scheduler_id, str(scheduler_id))

    def scheduler_id(self, router_id: str) -> int | None:
        """The scheduler's id of the replica process ``router_id`` (None if unknown)."""
        for sid, rid in self.router_ids.items():
            if rid == router_id:
                return sid
        return int(router_id) if router_id.isdigit() and int(router_id) not in self.router_ids else None

    def fresh_router_id(self, wanted: int) -> str:
        """A process id for a new replica: the scheduler's id when free, else the next unused number."""
        used = set(self.handles) | set(self.router_ids.values()) | set(self.router.registrations)
        if str(wanted) not in used:
            self.next_replica = max(self.next_replica, wanted + 1)
            return str(wanted)
        while str(self.next_replica) in used:
            self.next_replica += 1
        self.next_replica += 1
        return str(self.next_replica - 1)


class GatewayPlatform:
    """Everything NotebookOS adds to the gateway process."""

    _current: ClassVar[GatewayPlatform | None] = None

    def __init__(
        self,
        *,
        etcd_endpoints: list[str],
        etcd_prefix: str,
        etcd_timeout: float,
        simulated_hosts: int,
        gpus_per_host: int,
        state_dir: str,
        object_store_url: str,
        scheduler: Scheduler | None = None,
        launcher: Launcher,
        provisioner: HostProvisioner | None = None,
        autoscale_interval: float = 0.0,
        router_settings: RouterSettings | None = None,
        replica_lease_ttl: int = protocol.DEFAULT_LEASE_TTL,
        log: logging.Logger | Any = log,
    ) -> None:
        self.etcd_endpoints = etcd_endpoints
        self.etcd_prefix = etcd_prefix
        self.etcd_timeout = etcd_timeout
        self.state_dir = state_dir
        self.object_store_url = object_store_url
        self.launcher = launcher
        self.router_settings = router_settings or RouterSettings(etcd_timeout=etcd_timeout)
        self.replica_lease_ttl = replica_lease_ttl
        # Seconds a live replica whose etcd lease ended may take to register again (the app sets it).
        self.rejoin_grace = DEFAULT_REJOIN_GRACE
        # Seconds between two reconciliations of the GPU ledger with the scheduler (the app sets it; 0: off).
        self.reconcile_interval = DEFAULT_RECONCILE_INTERVAL
        self.reconciler: LedgerReconciler | None = None
        # Replicas keep GPU state on the device between cells, evicted when the GPU changes hands (the app sets it).
        self.gpu_sticky = False
        self.residency = GpuResidency()
        self.log = log
        self.metrics = PlatformMetrics()
        self.events = EventLog()  # migrations, scaling, hosts: the dashboard's timeline
        real = nvml_devices()
        self.hosts = {
            name: HostRecord(name, host_devices(name, gpus_per_host, real=real))
            for name in (f"host-{i}" for i in range(simulated_hosts))
        }
        self.scheduler = scheduler or Scheduler()
        for host in self.hosts.values():
            self.scheduler.add_host(
                HostSpec(host.name, len(host.devices), tuple(d.index for d in host.devices), host.simulated),
                now=self.now(),
            )
        self.kernels: dict[str, KernelRecord] = {}
        self.adopted: list[dict[str, Any]] = []
        self.coordinator: Coordinator | None = None
        self.ledger: LedgerReleases | None = None  # the GPU ledger's deferred releases in etcd
        # etcd client TLS (the gateway app sets it from its traitlets); None: plain gRPC.
        self.etcd_tls: EtcdTls | None = None
        # The gateway's etcd admin identity (etcd auth on; the app sets it); None: auth off.
        self.etcd_credentials: EtcdCredentials | None = None
        self.access: KernelAccessManager | None = None
        # Set once start() is done: the HTTP server listens while start() runs (EG binds it first), so a kernel
        # start that arrives meanwhile waits for it instead of failing.
        self.ready = asyncio.Event()
        self._waiting: dict[tuple[str, str], asyncio.Future[RunCell | MigrateThenRun]] = {}
        # Kernels being stopped: a restart (EG stops, then starts the same id) waits for the stop to finish.
        self._stopping: dict[str, asyncio.Future[None]] = {}
        self._monitor: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.migrations = MigrationRunner(self)
        self.autoscaler = (
            Autoscaler(self, provisioner, autoscale_interval)
            if provisioner is not None and autoscale_interval > 0
            else None
        )
        GatewayPlatform._current = self

    @classmethod
    def current(cls) -> GatewayPlatform:
        """The platform of this gateway process."""
        if cls._current is None:
            raise RuntimeError("the NotebookOS kernelspec needs the NotebookOS gateway (notebookos up)")
        return cls._current

    @staticmethod
    def now() -> float:
        """The scheduler's clock (monotonic seconds)."""
        return time.monotonic()

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect to etcd (turning its auth on if it is off and we have the admin identity) and publish the
        hosts; re-attach to running kernels and remove what is left of kernels that are gone."""
        if self.etcd_credentials is not None:
            await ensure_etcd_auth(
                self.etcd_endpoints,
                self.etcd_credentials,
                prefix=self.etcd_prefix,
                timeout=self.etcd_timeout,
                tls=self.etcd_tls,
            )
        self.coordinator = await Coordinator.connect(
            self.etcd_endpoints,
            timeout=self.etcd_timeout,
            prefix=self.etcd_prefix,
            tls=self.etcd_tls,
            credentials=self.etcd_credentials,
        )
        self.access = KernelAccessManager(
            self.coordinator, self.object_store_url, etcd_auth=self.etcd_credentials is not None
        )
        self.ledger = LedgerReleases(self.coordinator)
        for host in self.hosts.values():
            record = {
                "name": host.name,
                "gpus": len(host.devices),
                "simulated": host.simulated,
                "devices": [{"index": d.index, "uuid": d.uuid, "name": d.name} for d in host.devices],
            }
            await self.coordinator.put(self.coordinator.keys.host(host.name), json.dumps(record))
        self.adopted = await self._reattach()
        await self.access.sweep(self.kernels)
        warm = getattr(self.launcher, "warm", None)
        if warm is not None:
            warm()
        self._monitor = asyncio.ensure_future(self._monitor_replicas())
        self.reconciler = LedgerReconciler(self, self.reconcile_interval)
        self.reconciler.start()
        if self.autoscaler is not None:
            self.autoscaler.start()
        self.ready.set()
        self.log.info(
            "NotebookOS platform up: %d hosts, %d GPUs, etcd at %s",
            len(self.hosts),
            sum(len(h.devices) for h in self.hosts.values()),
            ",".join(self.etcd_endpoints),
        )

    async def _reattach(self) -> list[dict[str, Any]]:
        """Re-attach to the kernels a previous gateway left running (their replicas are detached processes).

        Returns their session records, for EG's kernel manager to adopt. Kernels none of whose replicas is
        registered any more are cleaned up instead.
        """
        assert self.coordinator is not None
        keys = self.coordinator.keys
        sessions = [
            kv for kv in await self.coordinator.get_prefix(keys.kernels_prefix()) if keys.is_kernel_record(kv.key)
        ]
        adopted = []
        for kv in sessions:
            try:
                session = parse_session(kv.value)
                kernel_id = session["kernel_id"]
                if keys.kernel(kernel_id) != kv.key:
                    raise MalformedRecord(f"kernel session record names kernel {kernel_id!r}")
            except (MalformedRecord, ValueError) as err:
                await quarantine(self.coordinator, kv, str(err))
                continue
            registrations = []
            for r in await self.coordinator.get_prefix(keys.replicas_prefix(kernel_id)):
                try:
                    registrations.append(ReplicaRegistration.from_json(r.value))
                except MalformedRecord as err:
                    self.log.error("kernel %s: ignoring %s: %s", kernel_id, r.key, err)
            handles = {h.replica_id: h for h in await self.launcher.find_replicas(kernel_id)}
            if not registrations:
                self.log.warning("kernel %s: no live replica left; forgetting it", kernel_id)
                for handle in handles.values():
                    await self.launcher.stop_replica(handle, now=True)
                await self.coordinator.delete_prefix(keys.kernel_prefix(kernel_id))
                await self.coordinator.delete(keys.kernel(kernel_id))
                continue
            try:
                await self._adopt(session, registrations, handles)
            except (ValueError, OSError, CoordinationError) as err:
                self.log.error("kernel %s: could not re-attach: %s", kernel_id, err)
                continue
            adopted.append(session)
        return adopted

    async def _adopt(
        self, session: dict[str, Any], registrations: list[ReplicaRegistration], handles: dict[str, ReplicaHandle]
    ) -> None:
        assert self.coordinator is not None and self.ledger is not None
        kernel_id, gpus = session["kernel_id"], int(session["gpus"])
        running = []
        for c in await self.coordinator.get_prefix(self.coordinator.keys.cells_prefix(kernel_id)):
            try:
                cell = json.loads(c.value)
                running.append(
                    RunningCellSpec(
                        kernel_id, str(cell["msg_id"]), int(cell["executor"]), tuple(cell.get("gpus", ())), self.now()
                    )
                )
            except (ValueError, TypeError, KeyError, AttributeError) as err:
                self.log.error("kernel %s: ignoring a malformed cell record at %s: %r", kernel_id, c.key, err)
        decision = self.scheduler.adopt(
            [KernelSpec(kernel_id, gpus)],
            [ReplicaSlot(kernel_id, int(r.replica_id), r.host) for r in registrations],
            running,
            now=self.now(),
        )
        self._log_decision(decision)
        router = ReplicaRouter(
            kernel_id=kernel_id,
            ip=session["ip"],
            ports=session["ports"],
            key=session["key"].encode(),
            signature_scheme=session["signature_scheme"],
            gpus=gpus,
            coordinator=self.coordinator,
            planner=self,
            ledger=self.ledger,
            settings=self.router_settings,
            on_replica_lost=self._on_replica_lost,
        )
        record = KernelRecord(kernel_id, session["kernel_name"], gpus, router, dict(session.get("env") or {}))
        record.config = dict(session.get("config") or {})
        assert self.access is not None
        record.access = await self.access.restore(kernel_id, str(session.get("etcd_password") or ""))
        record.started_at = float(session.get("started_at", record.started_at))
        for registration in registrations:
            rid = registration.replica_id
            record.handles[rid] = handles.get(rid) or ReplicaHandle(
                kernel_id, rid, registration.host, pid=registration.pid, pod=registration.pod
            )
            record.next_replica = max(record.next_replica, int(rid) + 1)
            router.expect(rid)
        self.kernels[kernel_id] = record
        await router.bind()
        await router.start(fresh=False)
        self.log.info(
            "kernel %s: re-attached to replicas %s",
            kernel_id,
            ", ".join(f"{r.replica_id}@{r.host}" for r in registrations),
        )

    async def stop(self, *, stop_kernels: bool = True) -> None:
        """Release etcd; stop every kernel's replicas too, unless they are to outlive this gateway (their
        sessions stay in etcd and the next gateway re-attaches)."""
        self.ready.clear()
        if self._monitor is not None:
            self._monitor.cancel()
        if self.reconciler is not None:
            await self.reconciler.stop()
        if self.autoscaler is not None:
            await self.autoscaler.stop()
        for kernel_id in list(self.kernels):
            if stop_kernels:
                await self.stop_kernel(kernel_id, now=True)
            else:
                record = self.kernels.pop(kernel_id)
                record.router.shutting_down = True  # its replicas' leases are theirs: nothing is lost
                await record.router.close()
        if self.ledger is not None:
            with contextlib.suppress(CoordinationError):
                await self.ledger.flush()
        if self.coordinator is not None:
            await self.coordinator.close()
            self.coordinator = None

    # -- kernels ------------------------------------------------------------------------------------

    async def start_kernel(
        self,
        *,
        kernel_id: str,
        kernel_name: str,
        ip: str,
        ports: dict[str, int],
        key: bytes,
        signature_scheme: str,
        env: dict[str, str],
        launch_timeout: float | None = None,
        config: dict[str, Any] | None = None,
    ) -> ReplicaRouter:
        """Place the kernel's replicas, bind its router, start the replicas and wait until they registered.

        ``config`` is the kernelspec's ``process_proxy.config``: every replica's launcher gets it."""
        if not self.ready.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.ready.wait(), self.etcd_timeout * 4)
        if self.coordinator is None or self.ledger is None or self.access is None:
            raise LaunchError("the NotebookOS platform is not connected to etcd yet")
        # A restart: the old incarnation's replicas, keys, objects and GPUs must be gone before the new one's arrive.
        await self.kernel_stopped(kernel_id)
        gpus = parse_kernel_gpus(env.get("KERNEL_GPUS"))
        placement = self.scheduler.start_kernel(kernel_id, gpus, now=self.now())
        self._log_decision(placement)
        if not isinstance(placement, Placement):
            raise KernelRequestError(f"cannot start kernel {kernel_id}: {placement}")
        router = ReplicaRouter(
            kernel_id=kernel_id,
            ip=ip,
            ports=ports,
            key=key,
            signature_scheme=signature_scheme,
            gpus=gpus,
            coordinator=self.coordinator,
            planner=self,
            ledger=self.ledger,
            settings=self.router_settings,
            on_replica_lost=self._on_replica_lost,
        )
        record = KernelRecord(kernel_id, kernel_name, gpus, router, env, next_replica=len(placement.replicas))
        record.config = dict(config or {})
        self.kernels[kernel_id] = record
        try:
            record.access = await self.access.create(kernel_id)
            await router.bind()
            await router.start(fresh=True)
            # All at once: a launcher may wait for its pod to run, and the kernel waits for the slowest anyway.
            starts = [
                asyncio.ensure_future(self._start_replica(record, s.replica_id, s.host)) for s in placement.replicas
            ]
            try:
                await asyncio.gather(*starts)
            except BaseException:
                for pending in starts:
                    pending.cancel()
                await asyncio.gather(*starts, return_exceptions=True)
                raise
            timeout = launch_timeout or self.router_settings.launch_timeout
            missing = await router.wait_registered(set(record.handles), timeout)
            if missing:
                raise LaunchError(self._launch_failure(record, missing, timeout))
            await self.coordinator.put(
                self.coordinator.keys.kernel(kernel_id),
                json.dumps(
                    {
                        "kernel_id": kernel_id,
                        "kernel_name": kernel_name,
                        "gpus": gpus,
                        "ip": ip,
                        "ports": ports,
                        "key": key.decode(),
                        "signature_scheme": signature_scheme,
                        "started_at": record.started_at,
                        "env": {k: v for k, v in env.items() if k.startswith("KERNEL_")},
                        "config": record.config,
                        # Only the gateway's admin user can read this record (the kernel's role covers its
                        # sub-keys, not the record): a restarted gateway restores the kernel's etcd identity.
                        "etcd_password": record.access.etcd_password,
                    }
                ),
            )
        except BaseException:
            await self.stop_kernel(kernel_id, now=True)
            raise
        return router

    async def kernel_stopped(self, kernel_id: str) -> None:
        """Return once no stop of ``kernel_id`` is in progress (at once when none is)."""
        stopping = self._stopping.get(kernel_id)
        if stopping is not None:
            with contextlib.suppress(Exception):  # the stop logged its own failure
                await asyncio.shield(stopping)

    def stop_kernel_soon(self, kernel_id: str, *, now: bool = False) -> asyncio.Future[None]:
        """Begin stopping the kernel at once (EG's process-proxy calls are synchronous); returns the stop.

        Registered before this returns, so a restart's :meth:`start_kernel` of the same id, however soon it
        comes, waits for the old incarnation to be gone. A second call while one is in progress joins it."""
        stopping = self._stopping.get(kernel_id)
        if stopping is None:
            stopping = self._stopping[kernel_id] = asyncio.ensure_future(self._stop_kernel(kernel_id, now=now))

            def forget(done: asyncio.Future[None]) -> None:
                if self._stopping.get(kernel_id) is done:
                    del self._stopping[kernel_id]
                if not done.cancelled() and done.exception() is not None:
                    self.log.error("kernel %s: stopping it failed: %r", kernel_id, done.exception())

            stopping.add_done_callback(forget)
        return stopping

    async def stop_kernel(self, kernel_id: str, *, now: bool = False) -> None:
        """Stop the kernel's replicas and router; forget it in the scheduler, etcd and the object store."""
        await asyncio.shield(self.stop_kernel_soon(kernel_id, now=now))

    async def _stop_kernel(self, kernel_id: str, *, now: bool) -> None:
        record = self.kernels.pop(kernel_id, None)
        self.residency.forget(kernel_id)
        if record is None:
            return
        record.router.shutting_down = True
        handles = dict(record.handles)
        with contextlib.suppress(Exception):  # also those whose start was cut short (no handle recorded)
            handles.update(
                {h.replica_id: h for h in await self.launcher.find_replicas(kernel_id) if h.replica_id not in handles}
            )
        await asyncio.gather(
            *(self.launcher.stop_replica(h, now=now) for h in handles.values()), return_exceptions=True
        )
        await record.router.answer_running_cell(
            "the kernel was shut down or restarted while this cell ran; it did not finish"
        )
        await record.router.close()
        for key in [k for k in self._waiting if k[0] == kernel_id]:
            future = self._waiting.pop(key)
            if not future.done():
                future.set_exception(CellRejected("the kernel is shutting down"))
        self._log_decision(self.scheduler.stop_kernel(kernel_id, now=self.now()))
        self.dispatch()
        if self.coordinator is not None:
            with contextlib.suppress(CoordinationError):
                await self.coordinator.delete_prefix(self.coordinator.keys.kernel_prefix(kernel_id))
                await self.coordinator.delete(self.coordinator.keys.kernel(kernel_id))
        if self.access is not None:
            await self.access.remove(kernel_id)
        forget = getattr(self.launcher, "forget_kernel", None)
        if forget is not None:
            forget(kernel_id)

    async def _start_replica(self, record: KernelRecord, scheduler_id: int, host: str) -> str:
        """Start a process for the scheduler's replica ``scheduler_id`` on ``host``; returns its id."""
        replica_id = record.fresh_router_id(scheduler_id)
        record.router_ids[scheduler_id] = replica_id
        await self.start_replica_process(record, replica_id, host)
        return replica_id

    async def start_replica_process(self, record: KernelRecord, replica_id: str, host: str) -> None:
        """Start replica process ``replica_id`` of the kernel on ``host`` (the router expects it)."""
        spec = ReplicaSpec(
            kernel_id=record.kernel_id,
            replica_id=replica_id,
            host=host,
            kernel_name=record.kernel_name,
            env=self._replica_env(record, host),
            secret_env=record.access.secret_env() if record.access is not None else {},
            config=dict(record.config),
        )
        record.router.expect(replica_id)
        record.handles[replica_id] = await self.launcher.start_replica(spec)

    def _replica_env(self, record: KernelRecord, host: str) -> dict[str, str]:
        env = replica_env(record.env)
        router = record.router
        assert self.access is not None
        env.update(
            {
                protocol.ENV_ETCD_ENDPOINTS: ",".join(self.etcd_endpoints),
                protocol.ENV_ETCD_PREFIX: self.etcd_prefix,
                protocol.ENV_OBJECT_STORE_URL: self.access.store_url(record.kernel_id),
                protocol.ENV_KEY: router.signer.session.key.decode(),
                protocol.ENV_SIGNATURE_SCHEME: router.signer.session.signature_scheme,
                protocol.ENV_IP: "127.0.0.1",
                "NOTEBOOKOS_STATE_DIR": self.state_dir,
                protocol.ENV_LEASE_TTL: str(self.replica_lease_ttl),
                protocol.ENV_GPU_DEVICES: json.dumps(
                    [{"index": d.index, "uuid": d.uuid, "simulated": d.simulated} for d in self.hosts[host].devices]
                ),
                "KERNEL_GPUS": str(record.gpus),
            }
        )
        if self.gpu_sticky:
            env[protocol.ENV_GPU_STICKY] = "1"
        return env

    def _launch_failure(self, record: KernelRecord, missing: set[str], timeout: float) -> str:
        parts = []
        for rid in sorted(missing):
            handle = record.handles.get(rid)
            where = f"replica {rid} on {handle.host if handle else '?'}"
            log_path = getattr(self.launcher, "log_path", None)
            tail = ""
            if log_path is not None:
                with contextlib.suppress(OSError):
                    lines = log_path(record.kernel_id, rid).read_text(errors="replace").strip().splitlines()
                    tail = f" (last log line: {lines[-1]})" if lines else ""
            failed = record.router.failed.get(rid)
            parts.append(f"{where} failed ({failed})" if failed else f"{where} did not register{tail}")
        return (
            f"kernel {record.kernel_id}: {', '.join(parts)} within {timeout:.0f} s; "
            "its processes were stopped. Check etcd and the replica logs."
        )

    def _on_replica_lost(self, router: ReplicaRouter, registration: ReplicaRegistration, why: str) -> None:
        """A replica's registration is gone. A live process whose lease etcd ended (an etcd outage) gets
        ``rejoin_grace`` seconds to register again (see :mod:`jupyter_notebookos.gateway.rejoin`); else the
        scheduler hears of it now."""
        record = self.kernels.get(router.kernel_id)
        handle = record.handles.get(registration.replica_id) if record is not None else None
        if handle is None or self.rejoin_grace <= 0 or router.shutting_down:
            self._replica_lost(router, registration, why)
            return

        async def lost_unless_rejoined() -> None:
            assert handle is not None
            if await await_rejoin(router, self.launcher, handle, self.rejoin_grace):
                self.log.info("kernel %s: replica %s registered again", router.kernel_id, registration.replica_id)
            elif router.kernel_id in self.kernels and registration.replica_id not in router.registrations:
                self._replica_lost(router, registration, why)

        task = asyncio.ensure_future(lost_unless_rejoined())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _replica_lost(self, router: ReplicaRouter, registration: ReplicaRegistration, why: str) -> None:
        """A replica is gone: tell the scheduler now, and start the replacement it places."""
        self.residency.forget(router.kernel_id, registration.replica_id)  # its device memory went with it
        record = self.kernels.get(router.kernel_id)
        if record is None:
            return
        handle = record.handles.pop(registration.replica_id, None)
        scheduler_id = record.scheduler_id(registration.replica_id)
        if scheduler_id is None:
            return
        decision = self.scheduler.replica_lost(router.kernel_id, scheduler_id, now=self.now())
        record.router_ids.pop(scheduler_id, None)
        self._log_decision(decision)
        self.dispatch()
        placed = decision.replacement if isinstance(decision, ReplicaLost) else None
        if not isinstance(placed, Placement):
            # No host could take it now (the decision says why); try again whenever capacity changes.
            retry = self.scheduler.place_missing_replicas(router.kernel_id, now=self.now())
            self._log_decision(retry)
            placed = retry if isinstance(retry, Placement) else None
        task = asyncio.ensure_future(self._replace(record, handle, placed))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _replace(self, record: KernelRecord, dead: ReplicaHandle | None, placed: Placement | None) -> None:
        if dead is not None:
            with contextlib.suppress(Exception):
                await self.launcher.stop_replica(dead, now=True)
        if placed is None or record.kernel_id not in self.kernels:
            return
        for slot in placed.replicas:
            try:
                await self._start_replica(record, slot.replica_id, slot.host)
            except LaunchError as err:
                self.log.error(
                    "kernel %s: could not start replacement replica %s on %s: %s",
                    record.kernel_id,
                    slot.replica_id,
                    slot.host,
                    err,
                )

    async def _monitor_replicas(self) -> None:
        """Notice dead replica processes quickly: revoke their lease instead of waiting for it to expire."""
        while True:
            await asyncio.sleep(0.5)
            try:
                await self._check_replicas()
            except Exception:  # the monitor must outlive any one failure
                self.log.exception("checking replica processes failed")

    async def _check_replicas(self) -> None:
        for record in list(self.kernels.values()):
            for rid, handle in list(record.handles.items()):
                status = await self.launcher.status(handle)
                if status.phase not in (ReplicaPhase.EXITED, ReplicaPhase.FAILED):
                    continue
                registration = record.router.registrations.get(rid)
                if registration is not None and self.coordinator is not None:
                    with contextlib.suppress(CoordinationError):
                        await self.coordinator.revoke(registration.lease)
                elif registration is None and rid in record.router.expected:
                    record.router.launch_failed(rid, status.reason or status.phase.value)
                elif registration is None:
                    record.handles.pop(rid, None)

    async def add_host(self, name: str, gpus: int, *, simulated: bool = True) -> None:
        """A new host is ready (autoscaling, a GPU node): the scheduler may place replicas and run cells there.

        ``simulated=False``: a real machine whose GPUs its replicas bind (a Kubernetes GPU node)."""
        host = HostRecord(name, host_devices(name, gpus, real=[]))
        self.hosts[name] = host
        self.events.record("host", "added", f"host {name} joined with {gpus} GPU(s)", host=name, gpus=gpus)
        self._log_decision(
            self.scheduler.add_host(
                HostSpec(name, gpus, tuple(d.index for d in host.devices), simulated), now=self.now()
            )
        )
        if self.coordinator is not None:
            await self.coordinator.put(
                self.coordinator.keys.host(name), json.dumps({"name": name, "gpus": gpus, "simulated": simulated})
            )
        self.dispatch()
        self._place_missing()

    async def remove_host(self, name: str) -> None:
        """A host leaves the cluster: drained and empty (scale-in), or lost (a node gone). Replicas that were
        still on it are lost; their replacements, placed by the scheduler, are started elsewhere."""
        decision = self.scheduler.remove_host(name, now=self.now())
        self._log_decision(decision)
        self.hosts.pop(name, None)
        self.events.record("host", "removed", f"host {name} left: {decision}", host=name)
        for lost in getattr(decision, "lost", ()):
            record = self.kernels.get(lost.replica.kernel_id)
            if record is None:
                continue
            rid = record.router_ids.pop(lost.replica.replica_id, str(lost.replica.replica_id))
            record.router.retire(rid)  # the scheduler already knows; its end is not a second loss
            placed = lost.replacement if isinstance(lost.replacement, Placement) else None
            task = asyncio.ensure_future(self._replace(record, record.handles.pop(rid, None), placed))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self.dispatch()
        if self.coordinator is not None:
            with contextlib.suppress(CoordinationError):
                await self.coordinator.delete(self.coordinator.keys.host(name))

    def _place_missing(self) -> None:
        """Kernels short of replicas (no host could take a replacement before) get them now."""
        for record in list(self.kernels.values()):
            placed = self.scheduler.place_missing_replicas(record.kernel_id, now=self.now())
            if isinstance(placed, Placement):
                self._log_decision(placed)
                task = asyncio.ensure_future(self._replace(record, None, placed))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def migrate(self, kernel_id: str, replica_id: str, target: str | None) -> dict[str, Any]:
        """Move one replica on demand (REST). Raises :class:`MigrationRequestError` when refused or failed."""
        record = self.kernels.get(kernel_id)
        if record is None:
            raise MigrationRequestError(404, f"no NotebookOS kernel {kernel_id}")
        scheduler_id = record.scheduler_id(replica_id)
        if replica_id not in record.router.registrations or scheduler_id is None:
            known = ", ".join(sorted(record.router.registrations)) or "none"
            raise MigrationRequestError(404, f"kernel {kernel_id} has no replica {replica_id} (replicas: {known})")
        if target is not None and target not in {h.name for h in self.scheduler.hosts()}:
            raise MigrationRequestError(404, f"no host {target!r} (hosts: {', '.join(sorted(self.hosts))})")
        plan = self.scheduler.request_migration(kernel_id, scheduler_id, now=self.now(), target=target)
        if isinstance(plan, MigrationRefused):
            self._log_decision(plan)
            raise MigrationRequestError(409, f"migration refused: {plan.reason}")
        began = time.monotonic()
        outcome = await self.migrations.run(plan)
        if isinstance(outcome, MigrationFailed):
            raise MigrationRequestError(
                500, f"migration failed: {outcome.reason}; replica {replica_id} on {plan.source} keeps serving"
            )
        return {
            "kernel_id": kernel_id,
            "migration_id": plan.migration_id,
            "replica_id": record.router_id(scheduler_id),
            "previous_replica_id": replica_id,
            "from": plan.source,
            "to": plan.target,
            "seconds": round(time.monotonic() - began, 3),
        }

    # -- the routers' planner -------------------------------------------------------------------------

    async def acquire(self, request: CellRequest, changed: asyncio.Event) -> CellGrant:
        """Ask the scheduler where the cell runs; wait in its queue, or for a migration, when it must."""
        record = self.kernels.get(request.kernel_id)
        if record is None:
            raise CellRejected(f"kernel {request.kernel_id} is shutting down")
        prefer = record.scheduler_id(request.prefer) if request.prefer is not None else None
        decision: Decision = self.scheduler.request_cell(
            request.kernel_id, request.cell_id, now=self.now(), gpus=request.gpus, prefer=prefer
        )
        self._log_decision(decision)
        while not isinstance(decision, RunCell):
            if isinstance(decision, RejectCell):
                raise CellRejected(decision.reason)
            if isinstance(decision, MigrateThenRun):
                outcome = await self._migrate_for(request, decision)
                if isinstance(outcome, MigrationCompleted) and outcome.run is not None:
                    decision = outcome.run
                    continue
                # The move failed: the scheduler put the cell back at the queue's front.
            decision = await self._wait_in_queue(request)
        grant = CellGrant(
            record.router_id(decision.replica_id), decision.host, tuple(decision.device_ids), decision.detail
        )
        if self.autoscaler is not None:  # kernels this cell stranded move now, off its critical path
            self.autoscaler.start_moves(self.scheduler.prepare_moves(self.now()))
        await self._make_room(request.kernel_id, grant)
        await self._wait_up_to_date(request, grant, changed)
        self.metrics.queued_seconds.observe(time.monotonic() - request.arrived)
        return grant

    async def _make_room(self, kernel_id: str, grant: CellGrant) -> None:
        """Another replica's state still on the granted GPUs (sticky release) moves to host memory first."""

        async def evict(owner: str, replica_id: str) -> dict[str, Any]:
            record = self.kernels.get(owner)
            if record is None:
                return {"status": "error", "evalue": f"kernel {owner} is gone"}
            return await record.router.evict(replica_id)

        for eviction in await self.residency.make_room(kernel_id, grant.replica_id, grant.host, grant.devices, evict):
            self.metrics.gpu_evictions.labels("ok" if eviction.status == "ok" else "failed").inc()
            self.metrics.gpu_eviction_seconds.observe(eviction.seconds)

    def note_resident(self, kernel_id: str, replica_id: str, host: str, devices: list[int]) -> None:
        """A replica's reply said which devices still hold its GPU state (see :mod:`.residency`)."""
        self.residency.note(kernel_id, replica_id, host, devices)

    async def _migrate_for(
        self, request: CellRequest, decision: MigrateThenRun
    ) -> MigrationCompleted | MigrationFailed:
        """Run the migration a cell waits for; an interrupted cell lets it finish and gives the GPUs back."""
        move = asyncio.ensure_future(self.migrations.run(decision.migration))
        try:
            return await asyncio.shield(move)
        except asyncio.CancelledError:
            move.add_done_callback(lambda _: self.release(request.kernel_id, request.cell_id))
            raise

    async def _wait_in_queue(self, request: CellRequest) -> RunCell | MigrateThenRun:
        """Wait until the scheduler's queue dispatches this cell."""
        key = (request.kernel_id, request.cell_id)
        future: asyncio.Future[RunCell | MigrateThenRun] = asyncio.get_running_loop().create_future()
        self._waiting[key] = future
        self.metrics.queued_cells.set(len(self._waiting))
        try:
            self.dispatch()  # it may run right away (e.g. a failed migration freed its reservation)
            return await future
        finally:
            self._waiting.pop(key, None)
            self.metrics.queued_cells.set(len(self._waiting))

    async def _wait_up_to_date(self, request: CellRequest, grant: CellGrant, changed: asyncio.Event) -> None:
        """The chosen replica must hold the state of every earlier cell before it runs this one."""
        record = self.kernels.get(request.kernel_id)
        if record is None:
            return
        router = record.router
        deadline = time.monotonic() + self.router_settings.launch_timeout
        while router.state_seq.get(grant.replica_id, -1) < router.log_head:
            if grant.replica_id not in router.registrations or time.monotonic() > deadline:
                return  # the router notices and asks again
            changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(changed.wait(), 1.0)

    def release(self, kernel_id: str, cell_id: str) -> None:
        """A cell finished: release its GPUs in the scheduler and start queued cells that now fit."""
        decision = self.scheduler.cell_finished(kernel_id, cell_id, now=self.now())
        self._log_decision(decision)
        if isinstance(decision, CellFinished) and not decision.was_queued:
            self.metrics.cells.labels("finished").inc()
            self.metrics.gpu_seconds_used.inc(decision.ran_s * len(decision.released_devices))
        self.dispatch()

    def queue_position(self, kernel_id: str, cell_id: str) -> int | None:
        """The cell's 1-based place in the scheduler's queue; ``None`` when it is not queued (a migration)."""
        for position, queued in enumerate(self.scheduler.queued_cells(), start=1):
            if queued.kernel_id == kernel_id and queued.cell_id == cell_id:
                return position
        return None

    def dispatch(self) -> None:
        """Start the queued cells that can run now (after GPUs were released or capacity added)."""
        dispatch = self.scheduler.dispatch_queued(now=self.now())
        for started in dispatch.started:
            self._log_decision(started)
            future = self._waiting.get((started.kernel_id, started.cell_id))
            if isinstance(started, MigrateThenRun):
                self.scheduler.migration_finished(started.migration.migration_id, now=self.now(), ok=False)
                continue
            if future is not None and not future.done():
                future.set_result(started)
            else:
                self.scheduler.cell_finished(started.kernel_id, started.cell_id, now=self.now())

    def _log_decision(self, decision: Decision) -> None:
        # Routine per-cell decisions at DEBUG (two per cell); everything else is worth an INFO line.
        routine = isinstance(decision, RunCell | CellFinished) and getattr(decision, "reason", "") != "migrated"
        self.log.log(logging.DEBUG if routine else logging.INFO, "scheduler: %s", decision)

    # -- views ----------------------------------------------------------------------------------------

    def cluster_snapshot(self) -> dict[str, Any]:
        """The body of ``GET /api/notebookos/cluster``."""
        hosts = [
            {
                "name": h.name,
                "gpus": h.gpus,
                "gpus_idle": h.idle,
                "gpus_committed": h.committed,
                "gpus_pending": h.pending,
                "replicas": h.replicas,
                "simulated": h.simulated,
                "cordoned": h.cordoned,
                "draining": h.draining,
                "subscription_ratio": round(h.subscription_ratio, 4),
            }
            for h in self.scheduler.hosts()
        ]
        kernels = [self.kernel_summary(kid) for kid in self.kernels]
        now = self.now()
        queue = [
            {
                "position": position,
                "kernel_id": q.kernel_id,
                "cell_id": q.cell_id,
                "gpus": q.gpus,
                "waiting_ms": round(max(0.0, now - q.requested_at) * 1000.0, 1),
            }
            for position, q in enumerate(self.scheduler.queued_cells(), start=1)
        ]
        return {
            "hosts": hosts,
            "subscription_ratio": round(self.scheduler.subscription_limit, 4),
            "kernels": kernels,
            "queue": queue,
            "migrations": self.migrations.snapshot(),
            "scaling": self.autoscaler.snapshot() if self.autoscaler is not None else {"enabled": False},
        }

    def kernel_summary(self, kernel_id: str) -> dict[str, Any]:
        """The body of ``GET /api/notebookos/kernels/{kernel_id}``."""
        record = self.kernels[kernel_id]
        router = record.router
        replicas = []
        for rid, handle in sorted(record.handles.items()):
            registration = router.registrations.get(rid)
            replicas.append(
                {
                    "replica_id": rid,
                    "host": handle.host,
                    "state": "ready" if registration else "starting",
                    "applied_seq": router.state_seq.get(rid, -1),
                    "pid": registration.pid if registration else handle.pid,
                    "pod": registration.pod if registration else handle.pod,
                    "change_detection": registration.change_detection if registration else None,
                    "gpus_resident": self.residency.resident_on(kernel_id, rid),
                }
            )
        summary = router.summary()
        held = record.gpus * (time.time() - record.started_at)
        scheduled = self.scheduler.kernel(kernel_id)
        waiting = list(scheduled.queued) if scheduled is not None else []
        cell = scheduled.running if scheduled is not None else None
        # The scheduler knows first: a dispatched cell holds its GPUs before the router has forwarded it.
        if summary["running"] or (cell is not None and cell.started_at is not None):
            state = "running"
        elif cell is not None:
            state = "waiting for a migration"
        else:
            state = "waiting for GPUs" if waiting else "idle"
        return {
            "kernel_id": kernel_id,
            "kernel_name": record.kernel_name,
            "gpus": record.gpus,
            "replicas": replicas,
            "executor": summary["executor"],
            "state": state,
            "waiting_for_gpus": waiting,
            "cells": summary["cells"],
            "queued": summary["queued"],
            "running": summary["running"],
            "gpu_seconds_used": summary["gpu_seconds_used"],
            "gpu_seconds_held_if_reserved": round(held, 3),
        }

    def refresh_metrics(self) -> None:
        """Bring the cluster gauges up to date before a scrape."""
        snapshot = self.cluster_snapshot()
        self.metrics.hosts.set(len(snapshot["hosts"]))
        for host in snapshot["hosts"]:
            committed, pending = host["gpus_committed"], host["gpus_pending"]
            self.metrics.gpus.labels(host["name"], "committed").set(committed)
            self.metrics.gpus.labels(host["name"], "pending").set(pending)
            self.metrics.gpus.labels(host["name"], "idle").set(host["gpus_idle"])
            self.metrics.replicas.labels(host["name"]).set(host["replicas"])
            self.metrics.host_subscription_ratio.labels(host["name"]).set(host["subscription_ratio"])
        self.metrics.subscription_ratio.set(snapshot["subscription_ratio"])
        self.metrics.kernels.set(len(snapshot["kernels"]))
        self.metrics.queued_cells.set(len(snapshot["queue"]))
        self.metrics.gpu_seconds_reserved.set(sum(k["gpu_seconds_held_if_reserved"] for k in snapshot["kernels"]))


def parse_kernel_gpus(raw: str | None) -> int:
    """``KERNEL_GPUS`` (EG's convention): GPUs per cell, default 1, 0 for CPU-only kernels."""
    if raw is None or raw.strip() == "":
        return 1
    try:
        gpus = int(raw)
    except ValueError:
        raise KernelRequestError(f"KERNEL_GPUS={raw!r} is not a whole number of GPUs per cell") from None
    if gpus < 0:
        raise KernelRequestError(f"KERNEL_GPUS={gpus}: a kernel cannot ask for fewer than 0 GPUs")
    return gpus
