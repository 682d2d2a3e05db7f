"""Re-attaching a restarted gateway to the kernels the previous one left running.

Replicas are detached processes (or pods) and kernel sessions live in etcd, so a new gateway rebuilds each
kernel's router from its session record and the live registrations, tells the scheduler what runs where,
and restores the kernel's etcd identity. Kernels with no live replica left are cleaned up instead.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from jupyter_notebookos.coordination.client import Coordinator
from jupyter_notebookos.coordination.errors import CoordinationError
from jupyter_notebookos.coordination.quarantine import quarantine
from jupyter_notebookos.gateway.control.access import KernelAccessManager
from jupyter_notebookos.gateway.control.decisionlog import log, log_decision, now
from jupyter_notebookos.gateway.control.records import KernelRecord
from jupyter_notebookos.gateway.control.sessions import parse_session
from jupyter_notebookos.gateway.router import ReplicaRouter
from jupyter_notebookos.gateway.upkeep.reconcile import entry_cell
from jupyter_notebookos.launchers.base import Launcher, LaunchError, ReplicaHandle
from jupyter_notebookos.replication.protocol import MalformedRecord, ReplicaRegistration
from jupyter_notebookos.scheduler import KernelSpec, ReplicaSlot, RunningCellSpec, Scheduler

#: Makes a kernel's router: (kernel id, ip, ports, key, signature scheme, GPUs per cell).
NewRouter = Callable[[str, str, dict[str, int], bytes, str, int], ReplicaRouter]


class Reattacher:
    """Reads what a previous gateway left in etcd and hands each kernel with live replicas to ``attach`` (the
    platform records it, binds its router at the kernel's ports and starts it); the scheduler learns what runs
    where. ``new_router`` makes a kernel's router."""

    def __init__(
        self,
        *,
        coordinator: Coordinator,
        launcher: Launcher,
        scheduler: Scheduler,
        access: KernelAccessManager,
        new_router: NewRouter,
        attach: Callable[[KernelRecord], Awaitable[None]],
        logger: logging.Logger | Any = log,
    ) -> None:
        self.coordinator = coordinator
        self.launcher = launcher
        self.scheduler = scheduler
        self.access = access
        self._new_router = new_router
        self._attach = attach
        self.log = logger

    async def reattach(self) -> list[dict[str, Any]]:
        """Re-attach to the kernels a previous gateway left running (their replicas are detached processes).

        Returns their session records, for EG's kernel manager to adopt. Kernels none of whose replicas is
        registered any more are cleaned up instead.
        """
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
            except (ValueError, OSError, CoordinationError, LaunchError) as err:
                self.log.error("kernel %s: could not re-attach: %s", kernel_id, err)
                continue
            adopted.append(session)
        return adopted

    async def _adopt(
        self, session: dict[str, Any], registrations: list[ReplicaRegistration], handles: dict[str, ReplicaHandle]
    ) -> None:
        kernel_id, gpus = session["kernel_id"], int(session["gpus"])
        running = await self._running_cell(kernel_id)
        decision = self.scheduler.adopt(
            [KernelSpec(kernel_id, gpus)],
            [ReplicaSlot(kernel_id, int(r.replica_id), r.host) for r in registrations],
            running,
            now=now(),
        )
        log_decision(self.log, decision)
        router = self._new_router(
            kernel_id, session["ip"], session["ports"], session["key"].encode(), session["signature_scheme"], gpus
        )
        timeout = session.get("launch_timeout")  # absent in records of older gateways: the defaults
        access = await self.access.restore(
            kernel_id, str(session.get("etcd_password") or ""), str(session.get("object_token") or "")
        )
        record = KernelRecord(
            kernel_id,
            session["kernel_name"],
            gpus,
            router,
            dict(session.get("env") or {}),
            access=access,
            config=dict(session.get("config") or {}),
            launch_timeout=float(timeout) if isinstance(timeout, int | float) and timeout > 0 else None,
            started_at=float(session.get("started_at", time.time())),
        )
        for registration in registrations:  # the kernel's replicas as etcd has them (the router reads the rest)
            rid = registration.replica_id
            record.replicas.expect(rid, registration.host)
            record.replicas.started(
                rid,
                handles.get(rid)
                or ReplicaHandle(kernel_id, rid, registration.host, pid=registration.pid, pod=registration.pod),
            )
        await self._attach(record)
        self.log.info(
            "kernel %s: re-attached to replicas %s",
            kernel_id,
            ", ".join(f"{r.replica_id}@{r.host}" for r in registrations),
        )

    async def _running_cell(self, kernel_id: str) -> list[RunningCellSpec]:
        """The kernel's cell that may still run, for the scheduler, with the GPUs it still holds.

        A kernel runs one cell at a time, so only the cell record with the highest seq can be running; the
        others are of cells that replied but whose state record was not published yet (the router keeps
        their records until then). A cell holds the GPUs whose ledger entries still name it: entries of a
        cell that replied may be deleted, and their GPUs taken by another kernel's cell since.
        """
        keys = self.coordinator.keys
        latest: tuple[int, RunningCellSpec, str] | None = None
        for c in await self.coordinator.get_prefix(keys.cells_prefix(kernel_id)):
            try:
                cell = json.loads(c.value)
                devices = tuple(int(d) for d in cell.get("gpus", ()))
                spec = RunningCellSpec(kernel_id, str(cell["msg_id"]), int(cell["executor"]), devices, now())
                seq, host = int(cell.get("seq", 0)), str(cell.get("host"))
            except (ValueError, TypeError, KeyError, AttributeError) as err:
                self.log.error("kernel %s: ignoring a malformed cell record at %s: %r", kernel_id, c.key, err)
                continue
            if latest is None or seq > latest[0]:
                latest = (seq, spec, host)
        if latest is None:
            return []
        _, spec, host = latest
        held = []
        for device in spec.device_ids:
            entry = await self.coordinator.get(keys.gpu(host, device))
            if entry is not None and entry_cell(entry) == (kernel_id, spec.cell_id):
                held.append(device)
        return [dataclasses.replace(spec, device_ids=tuple(held))]
