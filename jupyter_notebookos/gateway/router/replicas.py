"""One kernel's replicas: the single record the platform and the kernel's router keep of them.

Each :class:`Replica` is one replica process: its id, host, launcher handle, etcd registration, the highest
state-log sequence it has applied, and its :class:`Phase`. The ids are the scheduler's replica ids as
strings (the scheduler hands out a new id for every replica it places, replacements and migration targets
included), so etcd keys, registrations, the REST views and the scheduler's decisions all name a replica the
same way and nothing translates between them.

The router changes a replica's registration, applied sequence and phase as etcd reports them; the platform
records the process handle when it starts one and drops it when it is done with the process. An entry goes
away once it has neither (a failed launch stays, so a wait can tell it failed).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from jupyter_notebookos.launchers.base import LaunchError, ReplicaHandle
from jupyter_notebookos.replication.protocol import ReplicaRegistration


class Phase(enum.Enum):
    """Where a replica is in its life, as the gateway sees it."""

    STARTING = "starting"  # started (or being started), not registered yet
    REGISTERED = "registered"  # its registration is in etcd: it serves
    RETIRING = "retiring"  # being stopped on purpose (migrated away, host removed): its end is no loss
    FAILED = "failed"  # its process ended before it registered
    GONE = "gone"  # its registration vanished (lease ended); its process may still be held


#: Phases counted as the kernel's replicas (the quorum's size).
_LIVE = (Phase.STARTING, Phase.REGISTERED)


class ReplicaIdError(LaunchError, ValueError):
    """A replica id that is in use already (or is not a scheduler id): the replica cannot be started."""


def scheduler_id(replica_id: str) -> int | None:
    """The scheduler's (integer) id of replica ``replica_id``; None when it is not one (never placed by it)."""
    return int(replica_id) if replica_id.isdecimal() else None


@dataclass(slots=True, eq=False)
class Replica:
    """One replica process of a kernel (see the module docstring)."""

    replica_id: str
    host: str
    phase: Phase
    handle: ReplicaHandle | None = None
    registration: ReplicaRegistration | None = None
    applied_seq: int = -1  # the highest state-log sequence it holds the state of
    reason: str = ""  # why it failed or went away

    @property
    def registered(self) -> bool:
        """Whether its registration is in etcd (a retiring replica's too, until it ends)."""
        return self.registration is not None


class KernelReplicas:
    """The replicas of one kernel, by id (in the order they were first recorded)."""

    def __init__(self, kernel_id: str, on_change: Callable[[Replica], None] | None = None) -> None:
        self.kernel_id = kernel_id
        # Told of the platform's changes (retiring, a failed launch): the kernel's router reacts to them.
        self.on_change = on_change
        self._replicas: dict[str, Replica] = {}
        # Applied sequences etcd reported for replicas not (or no longer) recorded: kept for when they register.
        self._unknown_applied: dict[str, int] = {}
        # What a replica whose registration vanished had applied, and which process it was: the same process,
        # registering again (its lease ended in an etcd outage), still holds that state (see register()).
        self._gone_applied: dict[str, tuple[tuple[object, ...], int]] = {}

    # -- reading ------------------------------------------------------------------------------------------

    def __contains__(self, replica_id: object) -> bool:
        return replica_id in self._replicas

    def __iter__(self) -> Iterator[Replica]:
        return iter(list(self._replicas.values()))

    def __len__(self) -> int:
        return len(self._replicas)

    def get(self, replica_id: str) -> Replica | None:
        """The replica ``replica_id``, or None."""
        return self._replicas.get(replica_id)

    def registration(self, replica_id: str) -> ReplicaRegistration | None:
        """Replica ``replica_id``'s registration, or None when it is not registered."""
        replica = self._replicas.get(replica_id)
        return replica.registration if replica is not None else None

    def is_registered(self, replica_id: str) -> bool:
        """Whether replica ``replica_id`` is registered."""
        replica = self._replicas.get(replica_id)
        return replica is not None and replica.registration is not None

    def registrations(self) -> dict[str, ReplicaRegistration]:
        """The registered replicas' registrations, by id."""
        return {r.replica_id: r.registration for r in self._replicas.values() if r.registration is not None}

    def registered_count(self) -> int:
        """How many replicas are registered."""
        return sum(1 for r in self._replicas.values() if r.registration is not None)

    def live_count(self) -> int:
        """How many replicas the kernel counts: started or registered, not retiring, failed or gone."""
        return sum(1 for r in self._replicas.values() if r.phase in _LIVE)

    def is_live(self, replica_id: str) -> bool:
        """Whether replica ``replica_id`` is starting or registered (counted, see :meth:`live_count`)."""
        replica = self._replicas.get(replica_id)
        return replica is not None and replica.phase in _LIVE

    def applied(self, replica_id: str) -> int:
        """The highest log sequence replica ``replica_id`` holds the state of (-1: none known)."""
        replica = self._replicas.get(replica_id)
        if replica is None:
            return self._unknown_applied.get(replica_id, -1)
        return replica.applied_seq

    def failure(self, replica_id: str) -> str | None:
        """Why replica ``replica_id``'s process ended before it registered; None if it did not."""
        replica = self._replicas.get(replica_id)
        return replica.reason if replica is not None and replica.phase is Phase.FAILED else None

    def failed_ids(self) -> set[str]:
        """The replicas whose process ended before they registered."""
        return {r.replica_id for r in self._replicas.values() if r.phase is Phase.FAILED}

    def handle(self, replica_id: str) -> ReplicaHandle | None:
        """The launcher's handle of replica ``replica_id``'s process, or None."""
        replica = self._replicas.get(replica_id)
        return replica.handle if replica is not None else None

    def handles(self) -> dict[str, ReplicaHandle]:
        """The handles of the replica processes the platform holds, by id."""
        return {r.replica_id: r.handle for r in self._replicas.values() if r.handle is not None}

    # -- the platform's changes ---------------------------------------------------------------------------

    def expect(self, replica_id: str, host: str) -> Replica:
        """A replica is being started (or, re-attaching, was started) on ``host``: count it until it
        registers or is declared gone. Raises :class:`ReplicaIdError` if the id names a replica in use."""
        if scheduler_id(replica_id) is None:
            raise ReplicaIdError(f"kernel {self.kernel_id}: replica id {replica_id!r} is not a scheduler id")
        current = self._replicas.get(replica_id)
        if current is not None and (current.handle is not None or current.registration is not None):
            raise ReplicaIdError(
                f"kernel {self.kernel_id}: replica {replica_id} is in use already ({current.phase.value} "
                f"on {current.host})"
            )
        replica = Replica(replica_id, host, Phase.STARTING, applied_seq=self._unknown_applied.pop(replica_id, -1))
        self._replicas[replica_id] = replica
        self._gone_applied.pop(replica_id, None)  # another process under that id
        return replica

    def started(self, replica_id: str, handle: ReplicaHandle) -> None:
        """The launcher started replica ``replica_id``'s process (or found it, re-attaching)."""
        replica = self._replicas.get(replica_id)
        if replica is None:  # gone while its launch was under way: recorded, so that it is stopped
            replica = self._replicas[replica_id] = Replica(replica_id, handle.host, Phase.GONE)
        replica.handle = handle

    def release(self, replica_id: str) -> ReplicaHandle | None:
        """The platform is done with replica ``replica_id``'s process (stopping it, or it is dead): returns its
        handle, if it held one. The entry goes once nothing else is known of it."""
        replica = self._replicas.get(replica_id)
        if replica is None:
            return None
        handle, replica.handle = replica.handle, None
        self._prune(replica)
        return handle

    def retire(self, replica_id: str) -> None:
        """Replica ``replica_id`` is being stopped on purpose (its replacement holds the state)."""
        replica = self._replicas.get(replica_id)
        if replica is None:
            return
        if replica.phase is not Phase.FAILED:
            replica.phase = Phase.RETIRING
        self._changed(replica)

    def launch_failed(self, replica_id: str, reason: str) -> None:
        """Replica ``replica_id``'s process ended before it registered."""
        replica = self._replicas.get(replica_id)
        if replica is None:
            replica = self._replicas[replica_id] = Replica(replica_id, "?", Phase.FAILED)
        replica.phase, replica.reason = Phase.FAILED, reason
        self._changed(replica)

    # -- the router's changes (what etcd reports) ---------------------------------------------------------

    def register(self, registration: ReplicaRegistration) -> Replica:
        """A replica's registration appeared (or was written again) in etcd."""
        rid = registration.replica_id
        replica = self._replicas.get(rid)
        if replica is None:
            replica = self._replicas[rid] = Replica(
                rid, registration.host, Phase.REGISTERED, applied_seq=self._unknown_applied.pop(rid, -1)
            )
        elif replica.phase is not Phase.RETIRING:
            replica.phase = Phase.REGISTERED
        replica.host = registration.host
        replica.registration = registration
        replica.reason = ""
        replica.applied_seq = max(replica.applied_seq, registration.applied_seq)
        before = self._gone_applied.pop(rid, None)
        if before is not None and before[0] == process_of(registration):
            # The registration says what the replica had reported to etcd, which can be less than it holds: the
            # state of a cell it ran, whose applied seq went with the lease that etcd ended. The router knew.
            replica.applied_seq = max(replica.applied_seq, before[1])
        return replica

    def note_applied(self, replica_id: str, seq: int) -> None:
        """Replica ``replica_id`` holds the state of every cell up to ``seq`` (never goes back)."""
        replica = self._replicas.get(replica_id)
        if replica is None:
            if seq > self._unknown_applied.get(replica_id, -1):
                self._unknown_applied[replica_id] = seq
        elif seq > replica.applied_seq:
            replica.applied_seq = seq

    def gone(self, replica_id: str, why: str) -> tuple[ReplicaRegistration | None, bool]:
        """Replica ``replica_id``'s registration vanished. Returns the registration it had (None if it was not
        registered) and whether it was retiring (its end is then no loss)."""
        replica = self._replicas.get(replica_id)
        self._unknown_applied.pop(replica_id, None)
        if replica is None:
            return None, False
        registration, retiring = replica.registration, replica.phase is Phase.RETIRING
        if registration is not None and not retiring:
            self._gone_applied[replica_id] = (process_of(registration), replica.applied_seq)
        replica.registration, replica.applied_seq = None, -1
        if registration is not None or replica.phase is not Phase.FAILED:
            replica.phase, replica.reason = Phase.GONE, why
        self._prune(replica)
        return registration, retiring

    def _changed(self, replica: Replica) -> None:
        if self.on_change is not None:
            self.on_change(replica)

    def _prune(self, replica: Replica) -> None:
        if replica.handle is None and replica.registration is None and replica.phase in (Phase.GONE, Phase.RETIRING):
            del self._replicas[replica.replica_id]


def process_of(registration: ReplicaRegistration) -> tuple[object, ...]:
    """What tells one replica process from another under the same id: a registration put again by the same process
    (its lease ended in an etcd outage) has the same pid, address and ports."""
    return (registration.pid, registration.ip, registration.shell_port, registration.iopub_port)
