"""The gateway's platform: the scheduler, etcd, the launcher and the replica routers of NotebookOS kernels.

One instance lives in the gateway process (:meth:`GatewayPlatform.current`). EG's handlers reach it through
the NotebookOS process proxy; our REST handlers read it. It owns every long-lived resource and starts and
stops them in order.

:class:`GatewayPlatform` is built fully configured from :class:`~.platformsettings.PlatformSettings` and holds parts
that own their state: the routers' planner (:class:`~.planner.Planner`), the REST and metrics views
(:class:`~.views.PlatformViews`), the replacement of lost replicas (:class:`~.replacement.ReplicaReplacer`),
migrations and autoscaling; re-attaching after a gateway restart (:class:`~.reattachment.Reattacher`) runs once at
start. This module holds the lifecycle, the kernels (:class:`~.records.KernelRegistry`, which only it changes) and
their replica processes, and the hosts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any, ClassVar

from jupyter_notebookos.coordination.client import Coordinator
from jupyter_notebookos.coordination.errors import CoordinationError
from jupyter_notebookos.gateway.control.access import KernelAccessManager, ensure_etcd_auth, replica_env
from jupyter_notebookos.gateway.control.autoscaler import Autoscaler
from jupyter_notebookos.gateway.control.decisionlog import log, log_decision
from jupyter_notebookos.gateway.control.decisionlog import now as clock
from jupyter_notebookos.gateway.control.events import EventLog
from jupyter_notebookos.gateway.control.migrator import MigrationRunner
from jupyter_notebookos.gateway.control.objectbroker import LocalObjectBroker, ObjectBroker, make_broker, wants_broker
from jupyter_notebookos.gateway.control.planner import Planner
from jupyter_notebookos.gateway.control.platformmetrics import PlatformMetrics
from jupyter_notebookos.gateway.control.platformsettings import PlatformSettings
from jupyter_notebookos.gateway.control.reattachment import Reattacher
from jupyter_notebookos.gateway.control.records import HostRecord, KernelRecord, KernelRegistry
from jupyter_notebookos.gateway.control.replacement import ReplicaReplacer
from jupyter_notebookos.gateway.control.residency import GpuResidency
from jupyter_notebookos.gateway.control.views import PlatformViews
from jupyter_notebookos.gateway.router import ReplicaRouter
from jupyter_notebookos.gateway.router.ledger import LedgerReleases
from jupyter_notebookos.gateway.router.replicas import Phase, scheduler_id
from jupyter_notebookos.gateway.upkeep.reconcile import LedgerReconciler
from jupyter_notebookos.gpu.discovery import host_devices, nvml_devices
from jupyter_notebookos.launchers.base import Launcher, LaunchError, ReplicaSpec
from jupyter_notebookos.launchers.provisioning import HostProvisioner
from jupyter_notebookos.replication import protocol
from jupyter_notebookos.replication.brokerfs import PROTOCOL as BROKER_PROTOCOL
from jupyter_notebookos.scheduler import HostSpec, MigrationFailed, MigrationRefused, Placement, Scheduler
from jupyter_notebookos.waiting import wait_event


class MigrationRequestError(Exception):
    """A migration request that was refused or failed: an HTTP status and a message for the user."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class KernelRequestError(ValueError):
    """A kernel start request that cannot be honoured (bad ``KERNEL_GPUS``, no room); the text is for users."""


class GatewayPlatform:
    """Everything NotebookOS adds to the gateway process."""

    _current: ClassVar[GatewayPlatform | None] = None

    def __init__(
        self,
        settings: PlatformSettings,
        *,
        launcher: Launcher,
        scheduler: Scheduler | None = None,
        provisioner: HostProvisioner | None = None,
        log: logging.Logger | Any = log,
    ) -> None:
        self.settings = settings
        self.launcher = launcher
        self.log = log
        self.metrics = PlatformMetrics()
        self.events = EventLog()  # migrations, scaling, hosts: the dashboard's timeline
        self.residency = GpuResidency()
        real = nvml_devices()
        self.hosts = {
            name: HostRecord(name, host_devices(name, settings.gpus_per_host, real=real))
            for name in (f"host-{i}" for i in range(settings.simulated_hosts))
        }
        self.scheduler = scheduler or Scheduler()
        for host in self.hosts.values():
            self.scheduler.add_host(
                HostSpec(host.name, len(host.devices), tuple(d.index for d in host.devices), host.simulated),
                now=self.now(),
            )
        self.kernels = KernelRegistry()
        self.migrations = MigrationRunner(self, launch_timeout=settings.router.launch_timeout)
        self.autoscaler = (
            Autoscaler(self, provisioner, settings.autoscale_interval)
            if provisioner is not None and settings.autoscale_interval > 0
            else None
        )
        self.planner = Planner(
            scheduler=self.scheduler,
            kernels=self.kernels,
            residency=self.residency,
            metrics=self.metrics,
            migrations=self.migrations,
            autoscaler=self.autoscaler,
            launch_timeout=settings.router.launch_timeout,
            logger=log,
        )
        self.views = PlatformViews(
            scheduler=self.scheduler,
            kernels=self.kernels,
            residency=self.residency,
            metrics=self.metrics,
            migrations=self.migrations,
            autoscaler=self.autoscaler,
        )
        self.replacer = ReplicaReplacer(
            kernels=self.kernels,
            scheduler=self.scheduler,
            launcher=launcher,
            residency=self.residency,
            rejoin_grace=settings.rejoin_grace,
            start_replica=self.start_replica_process,
            dispatch=self.planner.dispatch,
            logger=log,
        )
        # What start() connects: etcd, the GPU ledger's deferred releases, the kernels' identities, the object
        # broker (S3 stores: the gateway signs its kernels' object operations; None: replicas open the store).
        self.coordinator: Coordinator | None = None
        self.ledger: LedgerReleases | None = None
        self.access: KernelAccessManager | None = None
        self.object_broker: ObjectBroker | LocalObjectBroker | None = None
        self.reconciler: LedgerReconciler | None = None
        self.adopted: list[dict[str, Any]] = []  # the session records of the kernels re-attached at start
        # Set once start() is done: the HTTP server listens while start() runs (EG binds it first), so a kernel
        # start that arrives meanwhile waits for it instead of failing.
        self.ready = asyncio.Event()
        # Kernels being stopped: a restart (EG stops, then starts the same id) waits for the stop to finish.
        self._stopping: dict[str, asyncio.Future[None]] = {}
        GatewayPlatform._current = self

    @classmethod
    def current(cls) -> GatewayPlatform:
        """The platform of this gateway process."""
        if cls._current is None:
            raise RuntimeError("the NotebookOS kernelspec needs the NotebookOS gateway (notebookos up)")
        return cls._current

    # -- lifecycle ----------------------------------------------------------------------------------

    @staticmethod
    def now() -> float:
        """The scheduler's clock (monotonic seconds)."""
        return clock()

    def dispatch(self) -> None:
        """Start the queued cells that can run now (after GPUs were released or capacity added)."""
        self.planner.dispatch()

    async def start(self) -> None:
        """Connect to etcd (turning its auth on if it is off and we have the admin identity) and publish the
        hosts; re-attach to running kernels and remove what is left of kernels that are gone."""
        settings = self.settings
        if settings.etcd_credentials is not None:
            await ensure_etcd_auth(
                settings.etcd_endpoints,
                settings.etcd_credentials,
                prefix=settings.etcd_prefix,
                timeout=settings.etcd_timeout,
                tls=settings.etcd_tls,
            )
        coordinator = self.coordinator = await Coordinator.connect(
            settings.etcd_endpoints,
            timeout=settings.etcd_timeout,
            prefix=settings.etcd_prefix,
            tls=settings.etcd_tls,
            credentials=settings.etcd_credentials,
        )
        access = self.access = KernelAccessManager(
            coordinator, settings.object_store_url, etcd_auth=settings.etcd_credentials is not None
        )
        if wants_broker(settings.object_store_access, settings.object_store_url):
            self.object_broker = make_broker(
                settings.object_store_url, settings.object_broker_url, settings.object_url_expires
            )
        self.ledger = LedgerReleases(coordinator)
        for host in self.hosts.values():
            record = {
                "name": host.name,
                "gpus": len(host.devices),
                "simulated": host.simulated,
                "devices": [{"index": d.index, "uuid": d.uuid, "name": d.name} for d in host.devices],
            }
            await coordinator.put(coordinator.keys.host(host.name), json.dumps(record))
        reattacher = Reattacher(
            coordinator=coordinator,
            launcher=self.launcher,
            scheduler=self.scheduler,
            access=access,
            new_router=self._new_router,
            attach=self._attach_kernel,
            logger=self.log,
        )
        self.adopted = await reattacher.reattach()
        await access.sweep(self.kernels)
        warm = getattr(self.launcher, "warm", None)
        if warm is not None:
            warm()
        self.replacer.start(coordinator)
        self.reconciler = LedgerReconciler(
            coordinator=coordinator,
            ledger=self.ledger,
            scheduler=self.scheduler,
            routers=lambda: {kernel_id: record.router for kernel_id, record in self.kernels.items()},
            release=self.planner.release,
            interval=settings.reconcile_interval,
        )
        self.reconciler.start()
        if self.autoscaler is not None:
            self.autoscaler.start()
        self.ready.set()
        self.log.info(
            "NotebookOS platform up: %d hosts, %d GPUs, etcd at %s",
            len(self.hosts),
            sum(len(h.devices) for h in self.hosts.values()),
            ",".join(settings.etcd_endpoints),
        )

    async def stop(self, *, stop_kernels: bool = True) -> None:
        """Release etcd; stop every kernel's replicas too, unless they are to outlive this gateway (their
        sessions stay in etcd and the next gateway re-attaches)."""
        self.ready.clear()
        self.replacer.stop()
        if self.reconciler is not None:
            await self.reconciler.stop()
        if self.autoscaler is not None:
            await self.autoscaler.stop()
        for kernel_id in list(self.kernels):
            if stop_kernels:
                await self.stop_kernel(kernel_id, now=True)
            else:
                record = self.kernels.remove(kernel_id)
                if record is not None:
                    record.router.begin_shutdown()  # its replicas' leases are theirs: nothing is lost
                    await record.router.close()
        if self.ledger is not None:
            with contextlib.suppress(CoordinationError):
                await self.ledger.flush()
        if self.coordinator is not None:
            await self.coordinator.close()
            self.coordinator = None

    def _new_router(
        self, kernel_id: str, ip: str, ports: dict[str, int], key: bytes, signature_scheme: str, gpus: int
    ) -> ReplicaRouter:
        """A router for a kernel at this connection info, planned by this platform (a new or a re-attached one)."""
        assert self.coordinator is not None and self.ledger is not None
        return ReplicaRouter(
            kernel_id=kernel_id,
            ip=ip,
            ports=ports,
            key=key,
            signature_scheme=signature_scheme,
            gpus=gpus,
            coordinator=self.coordinator,
            planner=self.planner,
            ledger=self.ledger,
            settings=self.settings.router,
            on_replica_lost=self.replacer.on_replica_lost,
        )

    async def _attach_kernel(self, record: KernelRecord) -> None:
        """A kernel a previous gateway left running: its router serves at the kernel's ports again (those its
        clients' kernel manager has: taken by another process, no kernel here)."""
        self.kernels.add(record)
        try:
            await record.router.bind()
        except LaunchError:
            self.kernels.remove(record.kernel_id)
            await record.router.close()
            raise
        await record.router.start(fresh=False)

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
        gpus: int,
        launch_timeout: float | None = None,
        config: dict[str, Any] | None = None,
        port_range: tuple[int, int] = (0, 0),
    ) -> ReplicaRouter:
        """Place the kernel's replicas, bind its router, start the replicas and wait until they registered.

        ``gpus`` and ``launch_timeout`` are the kernel's request as the process proxy resolved it (None: the
        defaults, ``RouterSettings.launch_timeout`` here and the launcher's own for its replicas);
        ``config`` is the kernelspec's ``process_proxy.config``: every replica's launcher gets it. A port of
        ``ports`` taken meanwhile is replaced by a free one in ``port_range`` (EG's, (0, 0): any): the router's
        ``ports`` are the kernel's."""
        if not self.ready.is_set():
            await wait_event(self.ready, self.settings.etcd_timeout * 4)
        if self.coordinator is None or self.ledger is None or self.access is None:
            raise LaunchError("the NotebookOS platform is not connected to etcd yet")
        # A restart: the old incarnation's replicas, keys, objects and GPUs must be gone before the new one's arrive.
        await self.kernel_stopped(kernel_id)
        placement = self.scheduler.start_kernel(kernel_id, gpus, now=self.now())
        log_decision(self.log, placement)
        if not isinstance(placement, Placement):
            raise KernelRequestError(f"cannot start kernel {kernel_id}: {placement}")
        router = self._new_router(kernel_id, ip, ports, key, signature_scheme, gpus)
        record = KernelRecord(
            kernel_id, kernel_name, gpus, router, env, config=dict(config or {}), launch_timeout=launch_timeout
        )
        self.kernels.add(record)
        try:
            record.access = await self.access.create(kernel_id)
            await router.bind(port_range=port_range)
            await router.start(fresh=True)
            # All at once: a launcher may wait for its pod to run, and the kernel waits for the slowest anyway.
            starts = [
                asyncio.ensure_future(self.start_replica_process(record, str(s.replica_id), s.host))
                for s in placement.replicas
            ]
            try:
                await asyncio.gather(*starts)
            except BaseException:
                for pending in starts:
                    pending.cancel()
                await asyncio.gather(*starts, return_exceptions=True)
                raise
            timeout = launch_timeout or self.settings.router.launch_timeout
            missing = await router.wait_registered({str(s.replica_id) for s in placement.replicas}, timeout)
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
                        "ports": router.ports,
                        "key": key.decode(),
                        "signature_scheme": signature_scheme,
                        "started_at": record.started_at,
                        # KERNEL_* and the notebook's path (JPY_SESSION_NAME), for the dashboard after a restart.
                        "env": {k: v for k, v in env.items() if k.startswith("KERNEL_") or k == "JPY_SESSION_NAME"},
                        "config": record.config,
                        "launch_timeout": launch_timeout,
                        # Only the gateway's admin user can read this record (the kernel's role covers its
                        # sub-keys, not the record): a restarted gateway restores the kernel's etcd identity.
                        "etcd_password": record.access.etcd_password,
                        "object_token": record.access.object_token,
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
        record = self.kernels.remove(kernel_id)
        self.residency.forget(kernel_id)
        if record is None:
            return
        record.router.begin_shutdown()
        handles = record.replicas.handles()
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
        self.planner.kernel_stopped(kernel_id)
        log_decision(self.log, self.scheduler.stop_kernel(kernel_id, now=self.now()))
        self.dispatch()
        if self.coordinator is not None:
            with contextlib.suppress(CoordinationError):
                await self.coordinator.delete_prefix(self.coordinator.keys.kernel_prefix(kernel_id))
                await self.coordinator.delete(self.coordinator.keys.kernel(kernel_id))
        if self.access is not None:
            await self.access.remove(kernel_id)
        await self.launcher.forget_kernel(kernel_id)

    async def start_replica_process(self, record: KernelRecord, replica_id: str, host: str) -> None:
        """Start replica ``replica_id`` (the id the scheduler handed out) of the kernel on ``host``; the kernel's
        replicas count it from now on. Raises ``LaunchError`` (also when the id is in use already)."""
        spec = ReplicaSpec(
            kernel_id=record.kernel_id,
            replica_id=replica_id,
            host=host,
            kernel_name=record.kernel_name,
            env=self._replica_env(record, host),
            secret_env=record.access.secret_env(brokered=self.object_broker is not None)
            if record.access is not None
            else {},
            config=dict(record.config),
            gpus=record.gpus,
            launch_timeout=record.launch_timeout,
        )
        record.replicas.expect(replica_id, host)
        record.replicas.started(replica_id, await self.launcher.start_replica(spec))

    def _replica_env(self, record: KernelRecord, host: str) -> dict[str, str]:
        settings = self.settings
        env = replica_env(record.env, settings.inherited_envs)
        router = record.router
        assert self.access is not None
        env.update(
            {
                protocol.ENV_ETCD_ENDPOINTS: ",".join(settings.etcd_endpoints),
                protocol.ENV_ETCD_PREFIX: settings.etcd_prefix,
                protocol.ENV_OBJECT_STORE_URL: self.access.store_url(record.kernel_id)
                if self.object_broker is None
                else f"{BROKER_PROTOCOL}://{record.kernel_id}",
                protocol.ENV_KEY: router.signer.session.key.decode(),
                protocol.ENV_SIGNATURE_SCHEME: router.signer.session.signature_scheme,
                protocol.ENV_IP: "127.0.0.1",
                "NOTEBOOKOS_STATE_DIR": settings.state_dir,
                protocol.ENV_LEASE_TTL: str(settings.replica_lease_ttl),
                protocol.ENV_GPU_DEVICES: json.dumps(
                    [{"index": d.index, "uuid": d.uuid, "simulated": d.simulated} for d in self.hosts[host].devices]
                ),
                "KERNEL_GPUS": str(record.gpus),
            }
        )
        if settings.gpu_sticky:
            env[protocol.ENV_GPU_STICKY] = "1"
        if self.object_broker is not None:
            env[protocol.ENV_OBJECT_BROKER_URL] = settings.object_broker_url
        return env

    def _launch_failure(self, record: KernelRecord, missing: set[str], timeout: float) -> str:
        parts = []
        for rid in sorted(missing):
            handle = record.replicas.handle(rid)
            where = f"replica {rid} on {handle.host if handle else '?'}"
            log_path = getattr(self.launcher, "log_path", None)
            tail = ""
            if log_path is not None:
                with contextlib.suppress(OSError):
                    lines = log_path(record.kernel_id, rid).read_text(errors="replace").strip().splitlines()
                    tail = f" (last log line: {lines[-1]})" if lines else ""
            failed = record.replicas.failure(rid)
            parts.append(f"{where} failed ({failed})" if failed else f"{where} did not register{tail}")
        return (
            f"kernel {record.kernel_id}: {', '.join(parts)} within {timeout:.0f} s; "
            "its processes were stopped. Check etcd and the replica logs."
        )

    async def add_host(self, name: str, gpus: int, *, simulated: bool = True) -> None:
        """A new host is ready (autoscaling, a GPU node): the scheduler may place replicas and run cells there.

        ``simulated=False``: a real machine whose GPUs its replicas bind (a Kubernetes GPU node)."""
        host = HostRecord(name, host_devices(name, gpus, real=[]))
        self.hosts[name] = host
        self.events.record("host", "added", f"host {name} joined with {gpus} GPU(s)", host=name, gpus=gpus)
        log_decision(
            self.log,
            self.scheduler.add_host(
                HostSpec(name, gpus, tuple(d.index for d in host.devices), simulated), now=self.now()
            ),
        )
        if self.coordinator is not None:
            await self.coordinator.put(
                self.coordinator.keys.host(name), json.dumps({"name": name, "gpus": gpus, "simulated": simulated})
            )
        self.dispatch()
        self.replacer.place_missing()

    async def remove_host(self, name: str) -> None:
        """A host leaves the cluster: drained and empty (scale-in), or lost (a node gone). Replicas that were
        still on it are lost; their replacements, placed by the scheduler, are started elsewhere."""
        decision = self.scheduler.remove_host(name, now=self.now())
        log_decision(self.log, decision)
        self.hosts.pop(name, None)
        self.events.record("host", "removed", f"host {name} left: {decision}", host=name)
        for lost in getattr(decision, "lost", ()):
            record = self.kernels.get(lost.replica.kernel_id)
            if record is None:
                continue
            rid = str(lost.replica.replica_id)
            record.replicas.retire(rid)  # the scheduler already knows; its end is not a second loss
            placed = lost.replacement if isinstance(lost.replacement, Placement) else None
            self.replacer.replace(record, record.replicas.release(rid), placed)
        self.dispatch()
        if self.coordinator is not None:
            with contextlib.suppress(CoordinationError):
                await self.coordinator.delete(self.coordinator.keys.host(name))

    async def migrate(self, kernel_id: str, replica_id: str, target: str | None) -> dict[str, Any]:
        """Move one replica on demand (REST). Raises :class:`MigrationRequestError` when refused or failed."""
        record = self.kernels.get(kernel_id)
        if record is None:
            raise MigrationRequestError(404, f"no NotebookOS kernel {kernel_id}")
        sid, replica = scheduler_id(replica_id), record.replicas.get(replica_id)
        if replica is None or not replica.registered or replica.phase is Phase.RETIRING or sid is None:
            known = ", ".join(sorted(record.replicas.registrations())) or "none"
            raise MigrationRequestError(404, f"kernel {kernel_id} has no replica {replica_id} (replicas: {known})")
        if target is not None and target not in {h.name for h in self.scheduler.hosts()}:
            raise MigrationRequestError(404, f"no host {target!r} (hosts: {', '.join(sorted(self.hosts))})")
        plan = self.scheduler.request_migration(kernel_id, sid, now=self.now(), target=target)
        if isinstance(plan, MigrationRefused):
            log_decision(self.log, plan)
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
            "replica_id": str(plan.new_replica_id),
            "previous_replica_id": replica_id,
            "from": plan.source,
            "to": plan.target,
            "seconds": round(time.monotonic() - began, 3),
        }
