"""The router's view of its kernel's replicas in etcd: registrations, applied sequences, quorum.

:class:`ReplicaSetWatch` watches the kernel's ``replicas/`` and ``applied/`` keys and records what they say in the
kernel's :class:`~jupyter_notebookos.gateway.router.replicas.KernelReplicas` (the only thing it writes); a
registration that appears or vanishes (lease expired or revoked, process gone) goes to the router, what etcd says
of the log to the :class:`~jupyter_notebookos.gateway.router.commitlog.CommitLog`. The platform asks it, through
the router, to wait for replicas to register or to catch up with the state log.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from jupyter_notebookos.coordination.client import Coordinator
from jupyter_notebookos.coordination.errors import CoordinationError
from jupyter_notebookos.coordination.kv import EventType, WatchEvent
from jupyter_notebookos.gateway.router.cells import APPLIED_ASK_AFTER_S, MALFORMED
from jupyter_notebookos.gateway.router.commitlog import CommitLog
from jupyter_notebookos.gateway.router.replicas import KernelReplicas
from jupyter_notebookos.gateway.router.tasks import RouterTasks, log
from jupyter_notebookos.replication.protocol import ReplicaRegistration
from jupyter_notebookos.waiting import wait_event

#: Asks a replica something of the router's own on its control channel: (replica, msg_type, content, timeout).
Ask = Callable[[str, str, dict[str, Any], float], Awaitable[dict[str, Any]]]


class ReplicaSetWatch:
    """Follows the kernel's replicas through etcd (see the module docstring).

    ``on_registered(registration)`` and ``on_gone(replica_id, why)`` hear of registrations that appear and vanish;
    ``ask`` reaches a replica itself when etcd says less than it holds (:meth:`wait_caught_up`)."""

    def __init__(
        self,
        *,
        kernel_id: str,
        coordinator: Coordinator,
        replicas: KernelReplicas,
        commit: CommitLog,
        tasks: RouterTasks,
        ask: Ask,
        on_registered: Callable[[ReplicaRegistration], None],
        on_gone: Callable[[str, str], None],
    ) -> None:
        self.kernel_id = kernel_id
        self.coordinator = coordinator
        self.keys = coordinator.keys
        self.replicas = replicas
        self._commit = commit
        self._tasks = tasks
        self._ask = ask
        self._on_registered = on_registered
        self._on_gone = on_gone
        self._changed = asyncio.Event()  # set whenever something the waits below look at may have changed
        self._watches: list[Any] = []

    # -- what the replicas hold ---------------------------------------------------------------------

    @property
    def quorum(self) -> bool:
        """Whether a majority of the kernel's replicas is registered."""
        size = max(self.replicas.live_count(), 1)
        return self.replicas.registered_count() * 2 > size

    def caught_up(self, replica_id: str) -> bool:
        """``replica_id`` is registered and holds the state of every cell so far."""
        return self.replicas.applied(replica_id) >= self._commit.log_head and self.replicas.is_registered(replica_id)

    async def wait_caught_up(self, replica_id: str, timeout: float) -> bool:
        """Wait until ``replica_id`` holds the state of every cell so far (False on timeout or if it died).

        What the router knows comes from the replica's applied key in etcd, or from its reply to a cell. That key
        can say less than the replica holds: a report bound to a lease that etcd ended (an outage longer than the
        lease) is gone, and a new gateway reads what is left. A replica whose key stays behind for
        APPLIED_ASK_AFTER_S is asked itself, on its control channel, and again as often: before, the cell waited
        the whole ``timeout`` (the launch timeout, a minute) for a replica that had the state all along."""
        now = time.monotonic()
        deadline, ask_at = now + timeout, now + APPLIED_ASK_AFTER_S
        replicas = self.replicas
        while replicas.applied(replica_id) < self._commit.log_head:
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0 or not replicas.is_registered(replica_id):
                return False
            if now >= ask_at:
                answer = await self._ask(
                    replica_id, "notebookos_applied_request", {}, min(remaining, APPLIED_ASK_AFTER_S)
                )
                ask_at = time.monotonic() + APPLIED_ASK_AFTER_S
                said = answer.get("applied") if answer.get("status") == "ok" else None
                if isinstance(said, int) and not isinstance(said, bool):
                    if said >= self._commit.log_head > replicas.applied(replica_id):
                        log.info(
                            "kernel %s: replica %s holds the state through record %d, more than etcd says (%d)",
                            self.kernel_id,
                            replica_id,
                            said,
                            replicas.applied(replica_id),
                        )
                    replicas.note_applied(replica_id, said)
                    continue
            self._changed.clear()
            await wait_event(self._changed, max(0.0, min(remaining, ask_at - time.monotonic(), 1.0)))
        return replicas.is_registered(replica_id)

    async def wait_registered(self, replica_ids: set[str], timeout: float) -> set[str]:
        """Wait until these replicas registered; return those that did not within ``timeout`` (or died)."""
        deadline = time.monotonic() + timeout
        replicas = self.replicas
        while not replica_ids <= set(replicas.registrations()) | replicas.failed_ids():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._changed.clear()
            await wait_event(self._changed, remaining)
        return replica_ids - set(replicas.registrations())

    async def next_change(self) -> None:
        """Return at the next change of the replica set (or of what it holds)."""
        self._changed.clear()
        await self._changed.wait()

    def poke(self) -> None:
        """Something the waits look at changed outside etcd (the platform retired a replica, or its launch
        failed): they look again."""
        self._changed.set()

    # -- etcd -----------------------------------------------------------------------------------------

    def follow(self, start_revision: int) -> None:
        """Watch the kernel's registrations and applied sequences from ``start_revision`` on. Only what the router
        must react to: the log itself (large values, one per cell) is read on demand, when an executor dies."""
        for prefix in (self.keys.replicas_prefix(self.kernel_id), self.keys.applied_prefix(self.kernel_id)):
            watch = self.coordinator.watch_prefix(prefix, start_revision=start_revision)
            self._watches.append(watch)
            self._tasks.spawn(self._watch_loop(watch))

    async def close(self) -> None:
        """End the watches (the router cancels their loops)."""
        for watch in self._watches:
            await watch.aclose()

    async def _watch_loop(self, watch: Any) -> None:
        try:
            async for event in watch:
                self.apply(event)
        except asyncio.CancelledError:
            raise
        except CoordinationError as err:
            log.error("kernel %s: watch on etcd ended: %s", self.kernel_id, err)

    def apply(self, event: WatchEvent) -> bool:
        """Apply ``event`` (from the watch, or a key of the kernel's snapshot at start); a malformed value is logged
        and skipped (it must not end the watch). Returns whether it applied."""
        try:
            self._apply_event(event)
        except MALFORMED as err:
            log.error("kernel %s: ignoring a malformed value at %s in etcd: %r", self.kernel_id, event.key, err)
            return False
        return True

    def _apply_event(self, event: WatchEvent) -> None:
        rel = event.key[len(self.keys.kernel_prefix(self.kernel_id)) :]
        section, _, name = rel.partition("/")
        if section == "replicas" and name:
            if event.type is EventType.PUT:
                self._on_registered(ReplicaRegistration.from_json(event.value))
            else:
                self._on_gone(name, "its etcd lease ended (process exited or unreachable)")
        elif section == "applied" and name and event.type is EventType.PUT:
            # A replica reports only seqs whose records are in the log: the executor in the transaction that
            # publishes them, a follower once it applied them from the log.
            applied = int(event.value)
            self.replicas.note_applied(name, applied)
            self._commit.published_through(applied)
        elif section == "log" and name and event.type is EventType.PUT:
            self._commit.note_log(self.keys.seq_of(event.key))
        elif section == "checkpoint" and event.type is EventType.PUT:
            self._commit.note_log(int(json.loads(event.value).get("seq", 0)))
        elif section == "executor" and event.type is EventType.DELETE:
            self._commit.end_term()
        self._changed.set()
