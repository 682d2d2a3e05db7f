"""What a replica router works with: the cells it queues, what it asks the planner, and its settings.

:class:`CellPlanner` is the router's view of the scheduler (the gateway platform implements it);
:class:`PendingCell` is one ``execute_request`` from its arrival to its reply.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from jupyter_notebookos.gateway.router.wire import WireMessage

#: What parsing a value from etcd raises when it is malformed (bad JSON or UTF-8, a wrong shape or type).
MALFORMED = (ValueError, TypeError, KeyError, AttributeError)

#: How many recent cells' changed names the router keeps in case their executor dies before publishing.
CHANGED_MEMORY = 64

#: How often a cell adopted from a previous gateway checks whether its state record was published.
ADOPTED_POLL_S = 2.0
#: How long a re-attached gateway waits for an executor to say whether it took a cell (Relay.ask).
TAKEN_ASK_S = 10.0
#: A replica whose applied sequence in etcd stays behind the log's head this long while a cell waits for it is
#: asked itself (and again as often; ReplicaSetWatch.wait_caught_up): etcd can hold less than the replica has.
APPLIED_ASK_AFTER_S = 2.0
#: A cell that has no executor after this many seconds is announced busy by the router itself.
BUSY_AFTER_S = 0.02
#: A cell whose decision conflicts in etcd this many times in a row is answered with an error.
MAX_COMMIT_CONFLICTS = 40


class CellRejected(Exception):
    """The planner refuses a cell (e.g. it asks for more GPUs than any host has); the reason is for the user."""


@dataclass(frozen=True)
class CellRequest:
    """What the router asks the planner for one cell."""

    kernel_id: str
    cell_id: str
    gpus: int
    arrived: float  # time.monotonic() at arrival
    prefer: str | None = None  # a replica the client asked for (execute_request metadata.notebookos.replica)


@dataclass(frozen=True)
class CellGrant:
    """The planner's answer: run on ``replica_id`` at ``host`` with these GPU device ordinals."""

    replica_id: str
    host: str
    devices: tuple[int, ...]
    reason: str


class CellPlanner(Protocol):
    """The router's view of the scheduler (implemented by the gateway platform)."""

    def place(self, request: CellRequest) -> CellGrant | Coroutine[Any, Any, CellGrant]:
        """Where the cell runs (on a replica that holds every earlier cell's state): the grant when it can run
        now, else the coroutine that waits until it can (CellRejected: it cannot run at all)."""

    def release(self, kernel_id: str, cell_id: str) -> None:
        """The cell finished (or failed): its GPUs are idle again."""

    def queue_position(self, kernel_id: str, cell_id: str) -> int | None:
        """The cell's 1-based place in the queue for GPUs; ``None`` when it is not queued (e.g. a migration)."""

    def note_resident(self, kernel_id: str, replica_id: str, host: str, devices: list[int]) -> None:
        """A replica's reply said its GPU state stays on ``devices`` of ``host`` (sticky release)."""


@dataclass(frozen=True)
class RouterSettings:
    """Timeouts and limits of one router."""

    launch_timeout: float = 60.0
    max_message_bytes: int = 256 << 20


@dataclass
class PendingCell:
    """An ``execute_request`` waiting for, or running on, an executor."""

    request: WireMessage
    arrived: float
    attempt: int = 1
    seq: int = 0
    grant: CellGrant | None = None
    started: float = 0.0
    prefer: str | None = None
    waiter: asyncio.Future[CellGrant] | None = None  # the planner's answer, while the cell waits for it
    interrupted: bool = False
    began_executing: bool = False  # the executor said "busy" for it: from then on it is never re-sent
    retry: bool = False
    entries: dict[str, int] = field(default_factory=dict)  # its etcd cell record and GPU entries -> revision
    done: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class CellAborted(Exception):
    """The cell could not be committed and was answered with an error already."""


__all__ = [
    "ADOPTED_POLL_S",
    "BUSY_AFTER_S",
    "CHANGED_MEMORY",
    "MALFORMED",
    "MAX_COMMIT_CONFLICTS",
    "TAKEN_ASK_S",
    "CellAborted",
    "CellGrant",
    "CellPlanner",
    "CellRejected",
    "CellRequest",
    "PendingCell",
    "RouterSettings",
]
