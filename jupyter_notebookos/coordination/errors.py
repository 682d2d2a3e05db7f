"""What can go wrong talking to etcd, in the terms a NotebookOS user or operator acts on.

Every etcd call of the project goes through :mod:`jupyter_notebookos.coordination.client`, which maps
gRPC and etcd errors onto these classes in one place (:func:`classify`). Callers catch these, never
``grpc`` or ``etcd3aio`` exceptions.
"""

from __future__ import annotations

from collections.abc import Sequence


class CoordinationError(Exception):
    """Base class of every error raised by the coordination layer."""


class EtcdUnavailable(CoordinationError):
    """No etcd endpoint could be reached."""

    def __init__(self, endpoints: Sequence[str], detail: str = "") -> None:
        self.endpoints = list(endpoints)
        self.detail = detail
        suffix = f" ({detail})" if detail else ""
        super().__init__(
            f"Cannot reach etcd at {', '.join(self.endpoints) or '(no endpoints)'}{suffix}. "
            "Check that etcd is running and that these addresses are right "
            "(`notebookos up` starts an embedded etcd; see its log under the state directory)."
        )


class QuorumLost(CoordinationError):
    """etcd answers, but its cluster has no leader (a majority of members is down or partitioned)."""

    def __init__(self, endpoints: Sequence[str], detail: str = "") -> None:
        self.endpoints = list(endpoints)
        self.detail = detail
        suffix = f" ({detail})" if detail else ""
        super().__init__(
            f"etcd at {', '.join(self.endpoints)} has lost quorum{suffix}: writes are refused until a "
            "majority of its members is back. No data is lost; work resumes by itself when they return."
        )


class LeaderChanged(QuorumLost):
    """A call timed out waiting for a leader, but etcd has one again: an election outlasted the call (a majority
    of members was up all along). Callers that handle :class:`QuorumLost` handle this too."""

    def __init__(self, endpoints: Sequence[str], detail: str = "") -> None:
        super().__init__(endpoints, detail)
        suffix = f" ({detail})" if detail else ""
        self.args = (
            f"etcd at {', '.join(self.endpoints)} changed its leader while this call waited{suffix}; a majority of "
            "its members is up and it answers again.",
        )


class EtcdFull(CoordinationError):
    """etcd refuses writes: its database reached the backend quota (etcd's NOSPACE alarm is raised)."""

    def __init__(self, endpoints: Sequence[str], detail: str = "") -> None:
        self.endpoints = list(endpoints)
        suffix = f" ({detail})" if detail else ""
        super().__init__(
            f"etcd at {', '.join(self.endpoints)} is full{suffix}: it refuses writes until its database is "
            "compacted and defragmented and its NOSPACE alarm is cleared. The gateway's etcd maintenance does this "
            "by itself when enough of the database is free space; otherwise raise --quota-backend-bytes."
        )


class LeaseLost(CoordinationError):
    """Our lease expired or was revoked: everything bound to it (registrations, GPU entries) is gone."""

    def __init__(self, lease_id: int, detail: str = "") -> None:
        self.lease_id = lease_id
        suffix = f": {detail}" if detail else ""
        super().__init__(f"etcd lease {lease_id:x} is gone{suffix}")


class TransactionConflict(CoordinationError):
    """A transaction's compare failed (someone else wrote first, or a fencing token is stale)."""


class WatchCompacted(CoordinationError):
    """A watch asked for history that etcd has already compacted away."""

    def __init__(self, prefix: str, requested: int, compact_revision: int) -> None:
        self.prefix = prefix
        self.requested = requested
        self.compact_revision = compact_revision
        super().__init__(
            f"Cannot watch {prefix!r} from revision {requested}: etcd compacted its history up to revision "
            f"{compact_revision}. Re-read the current state with get_prefix() and watch from its "
            "revision + 1."
        )


class PermissionDenied(CoordinationError):
    """etcd refused a request because this process's etcd user may not touch that key.

    With auth on, each kernel's replicas hold an etcd user that reaches only that kernel's keys: this is what
    user code gets when it tries to read or write another kernel's.
    """


class AuthenticationFailed(CoordinationError):
    """etcd refused this process's user name or password (or auth is configured on one side only)."""
