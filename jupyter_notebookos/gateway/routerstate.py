"""What the parts of a replica router share: its state, and how it runs its background tasks.

A :class:`~jupyter_notebookos.gateway.router.ReplicaRouter` is assembled from parts, one job each: the ZMQ
relay (:mod:`~jupyter_notebookos.gateway.relay`), the etcd view of the replica set
(:mod:`~jupyter_notebookos.gateway.replicaset`), the commit and fencing protocol
(:mod:`~jupyter_notebookos.gateway.commit`) and the cell lifecycle (:mod:`~jupyter_notebookos.gateway.router`).
:class:`RouterState` declares what they all read and write; ``ReplicaRouter.__init__`` sets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import zmq
import zmq.asyncio

from jupyter_notebookos.coordination.client import Coordinator
from jupyter_notebookos.coordination.keys import KeyLayout
from jupyter_notebookos.gateway.cells import CellPlanner, PendingCell, RouterSettings
from jupyter_notebookos.gateway.ledger import LedgerReleases
from jupyter_notebookos.gateway.replicas import KernelReplicas
from jupyter_notebookos.gateway.wire import Signer, WireMessage
from jupyter_notebookos.replication.protocol import ReplicaRegistration

if TYPE_CHECKING:
    from jupyter_notebookos.gateway.relay import ClientSocket, LocalClient, ReplicaLink
    from jupyter_notebookos.gateway.router import ReplicaRouter

log = logging.getLogger("jupyter_notebookos.gateway.router")


class RouterState:
    """The state of one kernel's router, shared by its parts (see the module docstring)."""

    kernel_id: str
    ip: str
    ports: dict[str, int]
    gpus: int
    coordinator: Coordinator
    keys: KeyLayout
    planner: CellPlanner
    ledger: LedgerReleases
    settings: RouterSettings
    signer: Signer
    on_replica_lost: Callable[[ReplicaRouter, ReplicaRegistration, str], None] | None
    ctx: zmq.asyncio.Context
    identity: bytes

    links: dict[str, ReplicaLink]
    # Links of replicas whose registration etcd dropped while they ran the cell (why it dropped, too): kept through
    # the rejoin grace, for the cell's output and reply (see ReplicaRouter._replica_gone).
    _held: dict[str, tuple[ReplicaLink, str]]
    replicas: KernelReplicas
    log_head: int
    published_seq: int
    executor: str | None
    last_executor: str | None
    fence: int
    _executor_key_absent: bool
    running: PendingCell | None
    waiting: PendingCell | None
    committing: PendingCell | None
    cells_run: int
    gpu_seconds: float
    started_at: float
    changed: asyncio.Event
    stopped: asyncio.Event
    shutting_down: bool
    exit_code: int | None

    _queue: asyncio.Queue[PendingCell]
    # Per client shell stream (ZMQ identity): the msg_id of the last message handled that came over ZMQ (see
    # RouterRelay.takes_shell_directly); and how many shell messages came each way.
    _zmq_shell_last: OrderedDict[bytes, str]
    client_messages: dict[str, int]
    adopted_cells: list[PendingCell]
    _changed: dict[int, list[str]]
    # Cells that replied but whose state record is not published yet: seq -> (msg_id, its cell record -> revision).
    # The cell record stays in etcd until then (see CellCommits._release_entries).
    unpublished: dict[int, tuple[str, dict[str, int]]]
    _closing: set[str]
    # Per replica: the requests of the cells it was sent whose "idle" has not come back yet, oldest first (a replica
    # sends a cell's reply before its idle, and the next cell may follow the reply; see _say_owed_idle).
    _idle_owed: dict[str, list[WireMessage]]
    _routes: OrderedDict[str, str]
    _answers: dict[str, asyncio.Future[dict[str, Any]]]  # the router's own control request msg_id -> the answer
    _stdin_owner: str | None
    _tasks: list[asyncio.Task[None]]
    _sockets: dict[str, ClientSocket]
    # The kernel's clients in this process (websocket connections): they get what the router sends to clients
    # in-process (see ClientSocket).
    local_clients: weakref.WeakSet[LocalClient]
    _watches: list[Any]

    if TYPE_CHECKING:
        # Each part calls a few methods of the others; ReplicaRouter has them all.

        @property
        def quorum(self) -> bool: ...

        def _remember_changed(self, seq: int, names: list[str]) -> None: ...

        def _published_through(self, seq: int) -> None: ...

        def _replica_registered(self, registration: ReplicaRegistration) -> None: ...

        def _replica_gone(self, rid: str, why: str) -> None: ...

        def _rejoined(self, registration: ReplicaRegistration) -> ReplicaLink | None: ...

        def _error_reply(self, cell: PendingCell, ename: str, evalue: str) -> None: ...

        async def _ask(
            self, replica_id: str, msg_type: str, content: dict[str, Any], timeout: float
        ) -> dict[str, Any]: ...

    def _spawn(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.append(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        with contextlib.suppress(ValueError):
            self._tasks.remove(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("kernel %s: router task failed: %r", self.kernel_id, task.exception())
