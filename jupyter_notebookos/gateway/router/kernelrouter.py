"""The replica router: one per NotebookOS kernel, the one place that sees every request of that kernel.

To Enterprise Gateway (and so to every client, every tab) the router *is* the kernel: it binds the five
Jupyter sockets at the connection info EG chose. Behind it run the kernel's replicas (see
:mod:`jupyter_notebookos.replication.protocol` for the router <-> replica contract):

- ``execute_request``: queued per kernel (FIFO). For the cell at the head, the planner (the scheduler)
  chooses the executor among the replicas that applied every earlier state record and the GPU devices;
  the router commits that decision in **one** etcd transaction (cell record + GPU-ledger entries bound to
  the executor's lease, fenced on the executor key), forwards the request to the executor only, and on
  ``execute_reply`` adds ``metadata.notebookos`` and releases the GPUs (in the scheduler at once; in etcd
  with the next decision, see :mod:`jupyter_notebookos.gateway.router.ledger`).
- Other shell and control requests go to the current executor (or the most up-to-date replica);
  ``shutdown_request`` goes to all replicas; stdin replies go to the replica that asked.
- iopub: a replica's messages reach clients only when their parent request was routed to that replica,
  so every output arrives exactly once.
- Heartbeats are answered while a quorum of replicas is registered.
- A replica whose registration vanishes (lease expired or revoked, process gone) is replaced on another
  host; if it was running a cell, the client gets an error reply for that cell saying the state of the
  previous cell is intact. A cell is never re-run silently. A live replica whose lease etcd ended (an outage
  longer than the lease) keeps its connections to the router through the rejoin grace: its cell finishes, and
  the error comes only if it does not register again.

:class:`ReplicaRouter` is a small facade over four parts, each the only writer of its own state: the
:class:`~.relay.Relay` (sockets, links, routes), the :class:`~.cellqueue.CellQueue` (the cells), the
:class:`~.commitlog.CommitLog` (log head, executor term, fence) and the :class:`~.replicaset.ReplicaSetWatch`
(what etcd says of the replicas, recorded in :class:`~.replicas.KernelReplicas`). The parts do not know each other's
insides; the router wires them and holds the kernel's lifecycle (start, replicas registering and going, shutdown).
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from collections.abc import Callable
from typing import Any

from jupyter_notebookos.coordination.client import Coordinator
from jupyter_notebookos.coordination.kv import EventType, WatchEvent
from jupyter_notebookos.gateway.router.cellqueue import CellQueue
from jupyter_notebookos.gateway.router.cells import MALFORMED, CellPlanner, RouterSettings
from jupyter_notebookos.gateway.router.commitlog import CommitLog
from jupyter_notebookos.gateway.router.ledger import LedgerReleases
from jupyter_notebookos.gateway.router.relay import Relay
from jupyter_notebookos.gateway.router.replicas import KernelReplicas, Phase, Replica, process_of
from jupyter_notebookos.gateway.router.replicaset import ReplicaSetWatch
from jupyter_notebookos.gateway.router.sockets import LocalClient, ReplicaLink
from jupyter_notebookos.gateway.router.tasks import RouterTasks, log
from jupyter_notebookos.gateway.router.wire import Signer, WireMessage
from jupyter_notebookos.replication.protocol import ReplicaRegistration


class ReplicaRouter:
    """Presents one Jupyter kernel to EG and its clients, backed by replicas on distinct hosts."""

    def __init__(
        self,
        *,
        kernel_id: str,
        ip: str,
        ports: dict[str, int],
        key: bytes,
        signature_scheme: str,
        gpus: int,
        coordinator: Coordinator,
        planner: CellPlanner,
        ledger: LedgerReleases,
        settings: RouterSettings | None = None,
        on_replica_lost: Callable[[ReplicaRouter, ReplicaRegistration, str], None] | None = None,
    ) -> None:
        self.kernel_id = kernel_id
        self.gpus = gpus
        self.coordinator = coordinator
        self.settings = settings or RouterSettings()
        self.signer = Signer(key, signature_scheme)
        self.on_replica_lost = on_replica_lost
        self.started_at = time.time()
        self.stopped = asyncio.Event()
        self._shutting_down = False
        self._exit_code: int | None = None
        self._tasks = RouterTasks(kernel_id)
        # The kernel's replicas: the one record of them, shared with the platform (its KernelRecord).
        self.replicas = KernelReplicas(kernel_id, on_change=self._replica_changed)
        self._commit = CommitLog(
            kernel_id=kernel_id,
            coordinator=coordinator,
            ledger=ledger,
            tasks=self._tasks,
            on_published=self._published_through,
        )
        self._relay = Relay(
            kernel_id=kernel_id,
            ip=ip,
            ports=ports,
            signer=self.signer,
            max_message_bytes=self.settings.max_message_bytes,
            tasks=self._tasks,
            events=self,
        )
        self._watch = ReplicaSetWatch(
            kernel_id=kernel_id,
            coordinator=coordinator,
            replicas=self.replicas,
            commit=self._commit,
            tasks=self._tasks,
            ask=self._relay.ask,
            on_registered=self._replica_registered,
            on_gone=self._replica_gone,
        )
        self._cells = CellQueue(
            kernel_id=kernel_id,
            gpus=gpus,
            signer=self.signer,
            keys=coordinator.keys,
            planner=planner,
            commit=self._commit,
            relay=self._relay,
            replicas=self.replicas,
            wait_registered=self._watch.wait_registered,
        )

    # -- what others read ---------------------------------------------------------------------------

    @property
    def ports(self) -> dict[str, int]:
        """The kernel's ports (the router's client-facing sockets)."""
        return self._relay.ports

    @property
    def local_clients(self) -> weakref.WeakSet[LocalClient]:
        """The kernel's clients in this process that take its messages in-process (websocket connections)."""
        return self._relay.local_clients

    @property
    def shutting_down(self) -> bool:
        """Whether the kernel is being shut down (its replicas' ends are no loss)."""
        return self._shutting_down

    @property
    def quorum(self) -> bool:
        """Whether a majority of the kernel's replicas is registered."""
        return self._watch.quorum

    def poll(self) -> int | None:
        """``None`` while the kernel lives (EG's process-proxy convention), else an exit code."""
        return self._exit_code

    def caught_up(self, replica_id: str) -> bool:
        """``replica_id`` is registered and holds the state of every cell so far."""
        return self._watch.caught_up(replica_id)

    async def wait_caught_up(self, replica_id: str, timeout: float) -> bool:
        """Wait until ``replica_id`` holds the state of every cell so far (False on timeout or if it died)."""
        return await self._watch.wait_caught_up(replica_id, timeout)

    async def wait_registered(self, replica_ids: set[str], timeout: float) -> set[str]:
        """Wait until these replicas registered; return those that did not within ``timeout`` (or died)."""
        return await self._watch.wait_registered(replica_ids, timeout)

    def live_cells(self) -> set[str]:
        """The msg_ids of the kernel's cells the router holds: running, waiting for GPUs, adopted, or replied but
        with their state record not published yet (their cell record holds their seq until then)."""
        return {*self._cells.live_cells(), *self._commit.unpublished_cells()}

    def summary(self) -> dict[str, Any]:
        """The router's state for ``GET /api/notebookos/kernels/{id}``."""
        return {
            "executor": self._commit.executor,
            "log_head": self._commit.log_head,
            **self._cells.summary(),
            "client_shell_messages": self._relay.client_messages(),
            "messages_to_clients_in_process": self._relay.delivered_in_process(),
        }

    # -- lifecycle ----------------------------------------------------------------------------------

    async def bind(self, *, port_range: tuple[int, int] | None = None) -> None:
        """Bind the client-facing sockets at the kernel's connection info (see :meth:`Relay.bind`)."""
        await self._relay.bind(port_range=port_range)

    async def start(self, *, fresh: bool = True) -> None:
        """Start watching etcd and serving clients. ``fresh`` clears what a previous kernel left in etcd."""
        keys = self.coordinator.keys
        prefix = keys.kernel_prefix(self.kernel_id)
        if fresh:
            await self.coordinator.delete_prefix(prefix)
            self._commit.cleared()
        snapshot = await self.coordinator.get_prefix(prefix)
        running: list[tuple[int, str, dict[str, Any], int]] = []
        for kv in snapshot:
            event = WatchEvent(EventType.PUT, kv.key, kv.value, kv.mod_revision, kv.create_revision)
            if not self._watch.apply(event):
                continue
            section = kv.key[len(prefix) :].partition("/")[0]
            if section == "executor":
                self._commit.resume_term(kv.value.decode(errors="replace"), kv.create_revision)
            elif section == "cells":
                try:
                    record = json.loads(kv.value)
                    running.append((int(record.get("seq", 0)), kv.key, record, kv.mod_revision))
                except MALFORMED as err:
                    log.error("kernel %s: ignoring a malformed cell record at %s: %r", self.kernel_id, kv.key, err)
        # In seq order: all but the last had replied, and their state records are awaited in turn.
        running.sort(key=lambda cell: cell[0])
        for i, (_, key, record, revision) in enumerate(running):
            try:
                self._cells.adopt(record, revision, replied=i < len(running) - 1)
            except MALFORMED as err:
                log.error("kernel %s: ignoring a malformed cell record at %s: %r", self.kernel_id, key, err)
        self._watch.follow(snapshot.revision + 1)
        self._relay.start()
        self._tasks.spawn(self._cells.run())

    def begin_shutdown(self, *, exited: bool = False) -> None:
        """The kernel is being stopped: its replicas' ends are no loss from now on. ``exited``: EG may see it as
        ended at once (:meth:`poll` says 0)."""
        self._shutting_down = True
        if exited and self._exit_code is None:
            self._exit_code = 0

    async def close(self) -> None:
        """Stop every loop, close every socket. Replicas are stopped by the caller (it owns the launcher)."""
        self.begin_shutdown(exited=True)
        await self._watch.close()
        self._tasks.cancel_all()
        self._relay.close()  # (connections still open keep the kernel's local clients for its next router)
        self.stopped.set()

    # -- this process's websocket connections -------------------------------------------------------

    def takes_shell_directly(self, identity: bytes, last_sent: str | None) -> bool:
        """Whether this process's websocket connection with shell identity ``identity`` may hand its next shell
        message over in-process (see :meth:`Relay.takes_shell_directly`)."""
        return self._relay.takes_shell_directly(identity, last_sent)

    async def from_client_shell(self, frames: list[bytes]) -> None:
        """A shell message handed over in-process by this process's websocket connection."""
        await self._relay.from_client_shell(frames)

    # -- requests of the platform -------------------------------------------------------------------

    async def interrupt(self) -> None:
        """Interrupt the running cell (a message on the executor's control channel), or the waiting one."""
        if self._cells.interrupt_unsent():
            return
        running = self._cells.running_replica()
        target = running if running is not None and self._relay.holds(running) else self.target_replica()
        if target is not None:
            await self._relay.interrupt(target)

    async def evict(self, replica_id: str, timeout: float = 60.0) -> dict[str, Any]:
        """Ask a replica to move the GPU state it keeps between cells to host memory; returns its answer."""
        return await self._relay.ask(replica_id, "notebookos_evict_request", {}, timeout)

    async def answer_running_cell(self, why: str) -> None:
        """Answer the running cell with an error if its executor has not (the kernel is stopped under it, e.g.
        by a restart), and wait until the answer is sent: every execute_request gets its reply."""
        await self._cells.answer_running(why)

    def replica_lost(self, rid: str) -> None:
        """Replica ``rid`` is gone for good. If it replied to the last cells but did not publish their records,
        those cells' state changes are lost: close their sequence numbers so the other replicas do not wait.
        A cell it still ran fails now."""
        held = self._relay.take_held(rid)
        if held is not None:
            link, why = held
            link.close()
            self._fail_held_cell(link.registration, why)
        self._say_owed_idle(rid)
        self._commit.executor_lost(rid)

    # -- the relay's events (RelayEvents) ---------------------------------------------------------------

    async def on_execute_request(self, msg: WireMessage) -> None:
        """A client's cell: queued."""
        await self._cells.submit(msg)

    async def on_execute_reply(self, link: ReplicaLink, msg: WireMessage) -> bool:
        """A replica's ``execute_reply``: the running cell's is answered by the queue."""
        return await self._cells.reply_came(link, msg)

    def on_cell_output(self, parent_msg_id: str) -> None:
        """Output of a request routed to its replica."""
        self._cells.output_came(parent_msg_id)

    def interrupt_unsent(self) -> bool:
        """Interrupt the cell not sent to a replica yet (False: none)."""
        return self._cells.interrupt_unsent()

    async def shutdown_requested(self, msg: WireMessage) -> None:
        """A client's ``shutdown_request``: every replica gets it; with none registered, the kernel has ended."""
        self._shutting_down = True
        await self._relay.forward_shutdown(msg)
        if not self._relay.connected():
            self._exit_code = 0

    def target_replica(self, *, prefer_running: bool = False) -> str | None:
        """Where a non-execute request goes: the running cell's replica, the executor, or the freshest."""
        if prefer_running:
            running = self._cells.running_replica()
            if running is not None and self._relay.is_connected(running):
                return running
        executor = self._commit.executor
        if executor is not None and self._relay.is_connected(executor):
            return executor
        connected = self._relay.connected()
        if not connected:
            return None
        return max(connected, key=lambda r: (self.replicas.applied(r), r))

    async def until_serving(self) -> None:
        """Return once a majority of replicas is registered (or the kernel is stopping)."""
        while not self._watch.quorum and not self._shutting_down:
            await self._watch.next_change()

    # -- replicas registering and going ---------------------------------------------------------------

    def _replica_changed(self, replica: Replica) -> None:
        """The platform changed a replica (:attr:`replicas`' ``on_change``): retiring it, or its launch failed."""
        if replica.phase is Phase.RETIRING:
            self._commit.end_term(replica.replica_id)  # the next cell opens a new executor term
        self._watch.poke()

    def _published_through(self, seq: int) -> None:
        self._cells.published_through(seq)

    def _replica_registered(self, registration: ReplicaRegistration) -> None:
        rid = registration.replica_id
        held = self._relay.take_held(rid)
        if held is not None:
            link, why = held
            before = link.registration
            if process_of(before) == process_of(registration):
                # It ran a cell while etcd dropped it (its connections never dropped): they serve on.
                self._relay.reconnect(link, registration)
                self.replicas.register(registration)
                log.info("kernel %s: replica %s registered again while it ran a cell", self.kernel_id, rid)
                return
            # Another process under that id: the held one's cell fails.
            link.close()
            self._fail_held_cell(before, why)
        self._relay.connect(registration)
        self.replicas.register(registration)
        log.info(
            "kernel %s: replica %s ready on %s (state seq %d)",
            self.kernel_id,
            rid,
            registration.host,
            registration.applied_seq,
        )

    def _replica_gone(self, rid: str, why: str) -> None:
        registration, retiring = self.replicas.gone(rid, why)
        cell = self._cells.running_on(rid)
        if (
            self._relay.is_connected(rid)
            and registration is not None
            and cell
            and not retiring
            and not self._shutting_down
        ):
            # etcd ended its lease; the process may live on (an etcd outage longer than the lease), running the
            # cell. Its connections need no etcd: the cell's output and reply still come, and the platform says
            # whether it registers again within the rejoin grace (then the link serves on) or is lost.
            self._relay.hold(rid, why)
        elif self._relay.disconnect(rid):
            self._say_owed_idle(rid)
        if registration is None:
            return
        self._commit.end_term(rid)
        if self._shutting_down:
            if not self.replicas.registered_count():
                self._exit_code = 0
            return
        if retiring:
            log.info("kernel %s: replica %s on %s retired", self.kernel_id, rid, registration.host)
        else:
            log.warning("kernel %s: replica %s on %s is gone: %s", self.kernel_id, rid, registration.host, why)
            # The scheduler hears of it before the running cell is failed or retried, so it is not picked again.
            if self.on_replica_lost is not None:
                self.on_replica_lost(self, registration, why)
        cell = self._cells.running_on(rid)  # (again: the platform may have given it up at once)
        if cell is not None and not self._relay.holds(rid):
            self.replica_lost(rid)
            self._cells.fail_running(cell, registration, why)
        elif cell is not None:
            log.warning(
                "kernel %s: replica %s still runs cell %s; its reply is awaited while it may register again",
                self.kernel_id,
                rid,
                cell.request.msg_id,
            )
        elif retiring or self.on_replica_lost is None:
            self.replica_lost(rid)
        # Else the platform calls replica_lost() once the replica is lost for good: a live process whose lease
        # etcd ended in an outage registers again and publishes its records itself.

    def _say_owed_idle(self, rid: str) -> None:
        running = self._cells.running_on(rid)
        self._relay.say_owed_idle(
            rid, running=running.request.msg_id if running is not None else None, quiet=self._shutting_down
        )

    def _fail_held_cell(self, registration: ReplicaRegistration, why: str) -> None:
        cell = self._cells.running_on(registration.replica_id)
        if cell is not None:
            self.replica_lost(registration.replica_id)
            self._cells.fail_running(cell, registration, why)
