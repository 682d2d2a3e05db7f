"""The replica router's view of its kernel's replicas in etcd: registrations, applied sequences, quorum.

The router watches the kernel's ``replicas/`` and ``applied/`` keys and records what they say in the
kernel's :class:`~jupyter_notebookos.gateway.replicas.KernelReplicas`; a registration that vanishes (lease
expired or revoked, process gone) is a replica gone. The platform asks this view to wait for replicas to
register or to catch up with the state log.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from jupyter_notebookos.coordination.errors import CoordinationError
from jupyter_notebookos.coordination.kv import EventType, WatchEvent
from jupyter_notebookos.gateway.cells import APPLIED_ASK_AFTER_S, MALFORMED
from jupyter_notebookos.gateway.replicas import Phase, Replica
from jupyter_notebookos.gateway.routerstate import RouterState, log
from jupyter_notebookos.replication.protocol import ReplicaRegistration
from jupyter_notebookos.waiting import wait_event


class ReplicaSetView(RouterState):
    """The router's part that follows the kernel's replicas through etcd."""

    def _replica_changed(self, replica: Replica) -> None:
        """The platform changed a replica (:attr:`replicas`' ``on_change``): retiring it, or its launch failed."""
        if replica.phase is Phase.RETIRING and self.executor == replica.replica_id:
            self.executor, self.fence = None, 0  # the next cell opens a new executor term
        self.changed.set()

    def caught_up(self, replica_id: str) -> bool:
        """``replica_id`` is registered and holds the state of every cell so far."""
        return self.replicas.applied(replica_id) >= self.log_head and self.replicas.is_registered(replica_id)

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
        while replicas.applied(replica_id) < self.log_head:
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
                    if said >= self.log_head > replicas.applied(replica_id):
                        log.info(
                            "kernel %s: replica %s holds the state through record %d, more than etcd says (%d)",
                            self.kernel_id,
                            replica_id,
                            said,
                            replicas.applied(replica_id),
                        )
                    replicas.note_applied(replica_id, said)
                    continue
            self.changed.clear()
            await wait_event(self.changed, max(0.0, min(remaining, ask_at - time.monotonic(), 1.0)))
        return replicas.is_registered(replica_id)

    async def wait_registered(self, replica_ids: set[str], timeout: float) -> set[str]:
        """Wait until these replicas registered; return those that did not within ``timeout`` (or died)."""
        deadline = time.monotonic() + timeout
        replicas = self.replicas
        while not replica_ids <= set(replicas.registrations()) | replicas.failed_ids():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self.changed.clear()
            await wait_event(self.changed, remaining)
        return replica_ids - set(replicas.registrations())

    @property
    def quorum(self) -> bool:
        """Whether a majority of the kernel's replicas is registered."""
        size = max(self.replicas.live_count(), 1)
        return self.replicas.registered_count() * 2 > size

    async def _watch_loop(self, watch: Any) -> None:
        try:
            async for event in watch:
                self._apply_checked(event)
        except asyncio.CancelledError:
            raise
        except CoordinationError as err:
            log.error("kernel %s: watch on etcd ended: %s", self.kernel_id, err)

    def _apply_checked(self, event: WatchEvent) -> bool:
        """Apply ``event``; a malformed value is logged and skipped (it must not end the watch). Returns
        whether it applied."""
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
                self._replica_registered(ReplicaRegistration.from_json(event.value))
            else:
                self._replica_gone(name, "its etcd lease ended (process exited or unreachable)")
        elif section == "applied" and name and event.type is EventType.PUT:
            # A replica reports only seqs whose records are in the log: the executor in the transaction that
            # publishes them, a follower once it applied them from the log.
            applied = int(event.value)
            self.replicas.note_applied(name, applied)
            self._published_through(applied)
        elif section == "log" and name and event.type is EventType.PUT:
            seq = self.keys.seq_of(event.key)
            self.log_head = max(self.log_head, seq)
            self._published_through(seq)
        elif section == "checkpoint" and event.type is EventType.PUT:
            seq = int(json.loads(event.value).get("seq", 0))
            self.log_head = max(self.log_head, seq)
            self._published_through(seq)
        elif section == "executor" and event.type is EventType.DELETE and self.executor is not None:
            self.executor, self.fence = None, 0
        self.changed.set()
