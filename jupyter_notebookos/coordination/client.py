"""``Coordinator``: the project's one door to etcd.

One :class:`Coordinator` per process holds one gRPC channel that balances over every endpoint and
fails over between them. Every call has a deadline (``timeout``, default
:data:`DEFAULT_TIMEOUT` seconds, also per call) that covers its retries, so a call fails fast with
:class:`EtcdUnavailable` or :class:`QuorumLost` instead of hanging. Calls carry etcd's ``hasleader``
metadata, so a member that lost its leader refuses at once instead of queueing the request.

Retries inside the deadline: reads, puts and deletes are retried on any transient error (the
round-robin channel moves on to a live member). A transaction is retried only when etcd cannot have
applied it (no leader, no connection); on an ambiguous failure it raises, and the caller reads the key
to learn the outcome (a transaction is never silently re-run: cell decisions are not idempotent).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from jupyter_notebookos.coordination import _proto
from jupyter_notebookos.coordination._rpc import REQUIRE_LEADER, EtcdRpc
from jupyter_notebookos.coordination.errors import (
    CoordinationError,
    QuorumLost,
    TransactionConflict,
)
from jupyter_notebookos.coordination.keys import DEFAULT_PREFIX, KeyLayout
from jupyter_notebookos.coordination.kv import KeyValue, RangeResult, Value, to_bytes
from jupyter_notebookos.coordination.lease import Lease, revoke_lease
from jupyter_notebookos.coordination.txn import Compare, Op, OpResult, TxnResult, lease_id
from jupyter_notebookos.coordination.watch import Watch

log = logging.getLogger(__name__)

#: Seconds a call may take, retries included, unless the caller says otherwise.
DEFAULT_TIMEOUT = 3.0

#: Seconds one attempt of a retryable call may take. A request that reached a follower just as the
#: leader died waits in vain (the follower forwarded it to the dead leader); giving up on that attempt
#: after a second and retrying lets the call succeed on the new leader within the overall deadline.
DEFAULT_ATTEMPT_TIMEOUT = 1.0


@dataclass(frozen=True)
class EtcdCredentials:
    """An etcd user name and password (etcd's ``--auth`` users). The gateway holds the admin user's; each
    kernel's replicas hold only their own kernel's (see :mod:`jupyter_notebookos.coordination.auth`)."""

    user: str
    password: str = field(repr=False)

    def __post_init__(self) -> None:
        if not self.user or not self.password:
            raise ValueError("etcd credentials need both a user name and a password")

    @classmethod
    def from_env(cls, env: Mapping[str, str], user_var: str, password_var: str) -> EtcdCredentials | None:
        """The credentials named by these environment variables, or ``None`` when neither is set."""
        user, password = env.get(user_var, "").strip(), env.get(password_var, "").strip()
        if not user and not password:
            return None
        try:
            return cls(user, password)
        except ValueError as err:
            raise ValueError(f"{err} ({user_var} and {password_var})") from None


@dataclass(frozen=True)
class EtcdMemberInfo:
    """One member of the etcd cluster, as its member list says."""

    member_id: int
    name: str
    client_urls: list[str]


@dataclass(frozen=True)
class EtcdTls:
    """Client TLS for etcd: PEM file paths of the CA that signed etcd's serving certificates, and of this
    client's certificate and key (both or neither: etcd's ``--client-cert-auth``).

    ``server_name`` is the name checked against etcd's certificate. Endpoints given by host name are
    resolved to addresses (one balanced channel over every member), so by default the first endpoint's host
    name is checked; set it when members' certificates share another name (e.g. the etcd Service's).
    """

    ca_cert: str = ""
    cert: str = ""
    key: str = ""
    server_name: str = ""

    def __post_init__(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise ValueError(
                "etcd TLS needs both a client certificate and its key (or neither): "
                f"cert={self.cert or '(none)'}, key={self.key or '(none)'}"
            )
        if not (self.ca_cert or self.cert):
            raise ValueError("etcd TLS needs a CA certificate, a client certificate and key, or both")

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], ca_var: str, cert_var: str, key_var: str, server_name_var: str = ""
    ) -> EtcdTls | None:
        """The TLS settings named by these environment variables, or ``None`` when none is set."""
        values = [env.get(name, "").strip() if name else "" for name in (ca_var, cert_var, key_var, server_name_var)]
        if not any(values[:3]):
            return None
        try:
            return cls(*values)
        except ValueError as err:
            raise ValueError(f"{err} (from {cert_var} and {key_var})") from None

    def _read(self, path: str, what: str) -> bytes | None:
        if not path:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as err:
            raise CoordinationError(
                f"cannot read the etcd TLS {what} {path}: {err.strerror or err}; check the TLS settings "
                "(NOTEBOOKOS_ETCD_CA_CERT / _CERT / _KEY) and that the secret is mounted there"
            ) from None

    def credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials from the PEM files (read now; a missing file fails with its path)."""
        return grpc.ssl_channel_credentials(
            root_certificates=self._read(self.ca_cert, "CA certificate"),
            private_key=self._read(self.key, "client key"),
            certificate_chain=self._read(self.cert, "client certificate"),
        )

    def target_name(self, endpoints: Sequence[str]) -> str:
        """The name to check etcd's certificate against: ``server_name``, else the first endpoint's host name."""
        if self.server_name:
            return self.server_name
        host = endpoints[0].split("://", 1)[-1].rstrip("/").rpartition(":")[0].strip("[]")
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return host
        return ""  # an address: gRPC checks it against the certificate's IP SANs


class Coordinator:
    """A connection to an etcd cluster, shared by everything in one process.

    Create with :meth:`connect`; close with :meth:`close` (or ``async with``). ``keys`` is the
    project's key layout under this coordinator's prefix.
    """

    REQUIRE_LEADER = REQUIRE_LEADER

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        prefix: str = DEFAULT_PREFIX,
        attempt_timeout: float = DEFAULT_ATTEMPT_TIMEOUT,
        tls: EtcdTls | None = None,
        credentials: EtcdCredentials | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        self.endpoints = list(endpoints)
        self.keys = KeyLayout(prefix)
        self.tls = tls
        self.rpc = EtcdRpc(
            self.endpoints, timeout=timeout, attempt_timeout=attempt_timeout, tls=tls, credentials=credentials
        )

    @classmethod
    async def connect(
        cls,
        endpoints: Sequence[str],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        prefix: str = DEFAULT_PREFIX,
        attempt_timeout: float = DEFAULT_ATTEMPT_TIMEOUT,
        tls: EtcdTls | None = None,
        credentials: EtcdCredentials | None = None,
    ) -> Coordinator:
        """Connect to etcd at ``endpoints`` (``"host:port"``; any member will do).

        ``timeout`` bounds every call (retries included) unless the call passes its own;
        ``attempt_timeout`` bounds one attempt of a call that may be retried (not transactions);
        ``tls`` makes the channel a TLS one (etcd's ``https://`` client URLs); ``credentials`` log in as that
        etcd user (etcd auth), and every later call carries the token.

        Raises:
            EtcdUnavailable: no endpoint answered within ``timeout`` seconds.
            AuthenticationFailed: etcd refused the credentials.
        """
        coordinator = cls(
            endpoints,
            timeout=timeout,
            prefix=prefix,
            attempt_timeout=attempt_timeout,
            tls=tls,
            credentials=credentials,
        )
        try:
            # Status is answered by any live member, leader or not: connecting needs no quorum.
            await coordinator.rpc.unary(
                coordinator.rpc.maintenance.Status, _proto.StatusRequest(), "connect", timeout, idempotent=True
            )
        except QuorumLost:
            pass
        except BaseException:
            await coordinator.close()
            raise
        try:
            if credentials is not None:
                await coordinator.authenticate(timeout=timeout)
        except BaseException:
            await coordinator.close()
            raise
        return coordinator

    async def __aenter__(self) -> Coordinator:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop every watch and keepalive of this coordinator and close the connection.

        Leases are not revoked: keys bound to them live until their TTL runs out, as after a crash.
        Revoke a lease explicitly for a clean goodbye.
        """
        await self.rpc.close()

    # -- the RPC layer (jupyter_notebookos.coordination._rpc) ---------------------------------------

    @property
    def timeout(self) -> float:
        """Seconds a call may take, retries included, unless the call says otherwise."""
        return self.rpc.timeout

    @property
    def attempt_timeout(self) -> float:
        """Seconds one attempt of a retryable call may take."""
        return self.rpc.attempt_timeout

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """What every call carries: etcd's hasleader flag, and the auth token once logged in."""
        return self.rpc.metadata

    @property
    def credentials(self) -> EtcdCredentials | None:
        """The etcd user this coordinator logs in as (None: auth off)."""
        return self.rpc.credentials

    @property
    def channel_ready(self) -> bool:
        return self.rpc.channel_ready

    async def authenticate(self, *, timeout: float | None = None, stale: tuple[tuple[str, str], ...] = ()) -> None:
        """Log in with :attr:`credentials` and use the new token from now on (see :meth:`EtcdRpc.authenticate`)."""
        await self.rpc.authenticate(timeout=timeout, stale=stale)

    async def auth_call(self, method: str, request: Any, operation: str, *, timeout: float | None = None) -> Any:
        """Call one RPC of etcd's Auth service (users, roles, enabling auth): for the admin helpers of
        :mod:`jupyter_notebookos.coordination.auth`."""
        return await self.rpc.auth_call(method, request, operation, timeout=timeout)

    # -- key-value ----------------------------------------------------------------------------------

    async def get(self, key: str, *, timeout: float | None = None) -> KeyValue | None:
        """The key's current value and revisions, or ``None`` if it does not exist (linearizable)."""
        reply = await self.rpc.unary(
            self.rpc.kv.Range, _proto.RangeRequest(key=key.encode()), f"get {key}", timeout, idempotent=True
        )
        return KeyValue.from_proto(reply.kvs[0]) if reply.kvs else None

    async def get_prefix(self, prefix: str, *, keys_only: bool = False, timeout: float | None = None) -> RangeResult:
        """Every key starting with ``prefix``, in key order, with the revision of the read."""
        raw = prefix.encode()
        request = _proto.RangeRequest(key=raw, range_end=_proto.prefix_range_end(raw), keys_only=keys_only)
        reply = await self.rpc.unary(self.rpc.kv.Range, request, f"get prefix {prefix}", timeout, idempotent=True)
        return RangeResult([KeyValue.from_proto(kv) for kv in reply.kvs], reply.header.revision)

    async def put(
        self, key: str, value: Value, *, lease: Lease | int | None = None, timeout: float | None = None
    ) -> int:
        """Write ``key`` (bound to ``lease`` if given). Returns the revision of the write."""
        request = _proto.PutRequest(key=key.encode(), value=to_bytes(value), lease=lease_id(lease))
        reply = await self.rpc.unary(self.rpc.kv.Put, request, f"put {key}", timeout, idempotent=True)
        return int(reply.header.revision)

    async def delete(self, key: str, *, timeout: float | None = None) -> bool:
        """Delete ``key``. Returns whether it existed."""
        request = _proto.DeleteRangeRequest(key=key.encode())
        reply = await self.rpc.unary(self.rpc.kv.DeleteRange, request, f"delete {key}", timeout, idempotent=True)
        return bool(reply.deleted)

    async def delete_prefix(self, prefix: str, *, timeout: float | None = None) -> int:
        """Delete every key starting with ``prefix``. Returns how many there were."""
        raw = prefix.encode()
        request = _proto.DeleteRangeRequest(key=raw, range_end=_proto.prefix_range_end(raw))
        reply = await self.rpc.unary(
            self.rpc.kv.DeleteRange, request, f"delete prefix {prefix}", timeout, idempotent=True
        )
        return int(reply.deleted)

    async def txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[Op],
        failure: Sequence[Op] = (),
        *,
        raise_on_failure: bool = False,
        timeout: float | None = None,
    ) -> TxnResult:
        """Run one transaction in one round trip: ``success`` if every compare holds, else ``failure``.

        Raises:
            TransactionConflict: the compares failed and ``raise_on_failure`` is set.
            QuorumLost, EtcdUnavailable: as for every call; on an ambiguous failure the message says
                the outcome is unknown.
        """
        request = _proto.TxnRequest(
            compare=[c.to_proto() for c in compare],
            success=[op.to_proto() for op in success],
            failure=[op.to_proto() for op in failure],
        )
        reply = await self.rpc.unary(self.rpc.kv.Txn, request, "txn", timeout, idempotent=False)
        result = TxnResult(
            succeeded=bool(reply.succeeded),
            revision=int(reply.header.revision),
            results=[OpResult.from_proto(r) for r in reply.responses],
        )
        if raise_on_failure and not result.succeeded:
            keys = ", ".join(sorted({c.key for c in compare}))
            raise TransactionConflict(f"transaction refused: a compare on {keys} did not hold")
        return result

    async def compact(self, revision: int, *, physical: bool = False, timeout: float | None = None) -> None:
        """Discard the history of changes before ``revision`` (watches cannot start earlier after this).

        ``physical``: answer only once the members freed that history's space in their database files (what a
        defragmentation right after needs), not as soon as the compaction is agreed on.
        """
        request = _proto.CompactionRequest(revision=revision, physical=physical)
        await self.rpc.unary(self.rpc.kv.Compact, request, "compact", timeout, idempotent=True)

    async def status(self, *, timeout: float | None = None) -> dict[str, Any]:
        """One member's view: version, leader id, Raft term, revision and database size."""
        reply = await self.rpc.unary(
            self.rpc.maintenance.Status, _proto.StatusRequest(), "status", timeout, idempotent=True
        )
        return {
            "version": reply.version,
            "member": reply.header.member_id,
            "leader": reply.leader,
            "raft_term": reply.raftTerm,
            "revision": reply.header.revision,
            "db_size": reply.dbSize,
            "db_size_in_use": reply.dbSizeInUse,
        }

    # -- maintenance (root only when auth is on) ------------------------------------------------------

    async def members(self, *, timeout: float | None = None) -> list[EtcdMemberInfo]:
        """The cluster's members and the client URLs each one serves."""
        reply = await self.rpc.unary(
            self.rpc.cluster.MemberList, _proto.MemberListRequest(), "member list", timeout, idempotent=True
        )
        return [EtcdMemberInfo(m.ID, m.name, list(m.clientURLs)) for m in reply.members]

    async def defragment(self, *, timeout: float | None = None) -> None:
        """Defragment the database of the member this coordinator talks to (connect it to that one endpoint).

        The member answers nothing else meanwhile: defragment one member at a time, the leader last.
        """
        await self.rpc.unary(
            self.rpc.maintenance.Defragment, _proto.DefragmentRequest(), "defragment", timeout, idempotent=True
        )

    async def alarms(self, *, timeout: float | None = None) -> list[tuple[int, str]]:
        """The cluster's raised alarms: (member id, ``"NOSPACE"`` or ``"CORRUPT"``)."""
        request = _proto.AlarmRequest(action=_proto.AlarmRequest.GET)
        reply = await self.rpc.unary(self.rpc.maintenance.Alarm, request, "alarm list", timeout, idempotent=True)
        kinds = _proto.AlarmRequest.DESCRIPTOR.fields_by_name["alarm"].enum_type.values_by_number
        return [(a.memberID, kinds[a.alarm].name) for a in reply.alarms]

    async def disarm(self, member_id: int, alarm: str, *, timeout: float | None = None) -> None:
        """Clear one raised alarm (etcd accepts writes again once no NOSPACE alarm is left)."""
        kinds = _proto.AlarmRequest.DESCRIPTOR.fields_by_name["alarm"].enum_type.values_by_name
        request = _proto.AlarmRequest(
            action=_proto.AlarmRequest.DEACTIVATE, memberID=member_id, alarm=kinds[alarm].number
        )
        await self.rpc.unary(self.rpc.maintenance.Alarm, request, "alarm disarm", timeout, idempotent=True)

    # -- leases -------------------------------------------------------------------------------------

    async def grant_lease(
        self,
        ttl: int,
        *,
        keepalive: bool = True,
        on_lost: Callable[[Lease], object] | None = None,
        timeout: float | None = None,
    ) -> Lease:
        """Grant a lease of ``ttl`` seconds, kept alive in the background unless ``keepalive=False``.

        etcd rounds very short TTLs up (to 2 s with the embedded cluster's timing).
        ``lease.lost`` is set, and ``on_lost(lease)`` called, when etcd reports the lease gone.
        """
        reply = await self.rpc.unary(
            self.rpc.lease.LeaseGrant, _proto.LeaseGrantRequest(TTL=ttl), "grant lease", timeout, idempotent=True
        )
        if reply.error:
            raise CoordinationError(f"etcd refused a lease of {ttl} s: {reply.error}")
        lease = Lease(self.rpc, int(reply.ID), int(reply.TTL), on_lost=on_lost)
        if keepalive:
            lease.start_keepalive()
        return lease

    async def revoke(self, lease: Lease | int, *, timeout: float | None = None) -> None:
        """Revoke a lease now: every key bound to it is deleted at once."""
        if isinstance(lease, Lease):
            await lease.revoke(timeout=timeout)
            return
        await revoke_lease(self.rpc, lease, timeout)

    # -- watches ------------------------------------------------------------------------------------

    def watch_prefix(self, prefix: str, start_revision: int | None = None) -> Watch:
        """Watch every key starting with ``prefix``: ``async for event in coordinator.watch_prefix(p)``.

        With ``start_revision`` the watch replays every change from that revision on (use a
        :meth:`get_prefix` result's ``revision + 1``); without, it starts after the current revision.
        It resumes by itself after a disconnect or a member failure, from the revision after the
        last event it delivered, so no event is lost or repeated. Raises :class:`WatchCompacted` if
        the history it needs was compacted.
        """
        return Watch(self.rpc, prefix, start_revision)

    def watch_key(self, key: str, start_revision: int | None = None) -> Watch:
        """Watch one key (same guarantees as :meth:`watch_prefix`)."""
        return Watch(self.rpc, key, start_revision, exact=True)
