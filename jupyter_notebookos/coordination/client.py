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

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio

from jupyter_notebookos.coordination import _proto
from jupyter_notebookos.coordination.errors import (
    AuthenticationFailed,
    CoordinationError,
    EtcdFull,
    EtcdUnavailable,
    LeaseLost,
    PermissionDenied,
    QuorumLost,
    TransactionConflict,
)
from jupyter_notebookos.coordination.keys import DEFAULT_PREFIX, KeyLayout
from jupyter_notebookos.coordination.kv import KeyValue, RangeResult, Value, to_bytes
from jupyter_notebookos.coordination.lease import Lease
from jupyter_notebookos.coordination.txn import Compare, Op, OpResult, TxnResult, lease_id
from jupyter_notebookos.coordination.watch import Watch

log = logging.getLogger(__name__)

#: Seconds a call may take, retries included, unless the caller says otherwise.
DEFAULT_TIMEOUT = 3.0

#: Seconds one attempt of a retryable call may take. A request that reached a follower just as the
#: leader died waits in vain (the follower forwarded it to the dead leader); giving up on that attempt
#: after a second and retrying lets the call succeed on the new leader within the overall deadline.
DEFAULT_ATTEMPT_TIMEOUT = 1.0

#: etcd refuses requests at once on a member without a leader when this metadata is present
#: (rpctypes.MetadataRequireLeaderKey); without it requests queue until etcd's own 7 s timeout.
REQUIRE_LEADER: tuple[tuple[str, str], ...] = (("hasleader", "true"),)

_T = TypeVar("_T")

_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.lb_policy_name", "round_robin"),
    # etcd's default --grpc-keepalive-min-time is 5 s: pinging more often gets the connection closed.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 3_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # Reconnect to a restarted member within about a second, not gRPC's default of up to 2 minutes.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    ("grpc.enable_retries", 1),
]

# Details of UNAVAILABLE errors that mean "never reached a leader": safe to retry any request.
_NOT_SENT_MARKERS = ("no leader", "failed to connect", "connection refused", "connections to all backends")


def _details(exc: grpc.aio.AioRpcError) -> str:
    return (exc.details() or "").strip()


def classify(
    exc: grpc.aio.AioRpcError, endpoints: Sequence[str], *, channel_ready: bool, operation: str
) -> CoordinationError:
    """Map a gRPC error from etcd onto the coordination errors (the one place that does this)."""
    code = exc.code()
    detail = _details(exc)
    lowered = detail.lower()
    if _server_timeout(exc):
        return QuorumLost(endpoints, f"{operation}: etcd timed out waiting for its leader ({detail})")
    if code == grpc.StatusCode.UNAVAILABLE:
        if "no leader" in lowered or "request timed out" in lowered or "leader changed" in lowered:
            return QuorumLost(endpoints, f"{operation}: {detail}")
        return EtcdUnavailable(endpoints, f"{operation}: {detail}" if detail else operation)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        # An open connection that does not answer in time means the request is waiting for a leader.
        if channel_ready:
            return QuorumLost(endpoints, f"{operation}: no answer in time, the cluster has no leader")
        return EtcdUnavailable(endpoints, f"{operation}: no answer in time")
    if code == grpc.StatusCode.NOT_FOUND and "lease" in lowered:
        return LeaseLost(0, detail)
    if "database space exceeded" in lowered:
        return EtcdFull(endpoints, f"{operation}: {detail}")
    if code == grpc.StatusCode.FAILED_PRECONDITION and "compare" in lowered:
        return TransactionConflict(f"{operation}: {detail}")
    if code == grpc.StatusCode.PERMISSION_DENIED or "permission denied" in lowered:
        return PermissionDenied(
            f"etcd refused {operation}: permission denied. This etcd user may not touch that key (a kernel's "
            "replicas reach only their own kernel's keys)."
        )
    if "authentication failed" in lowered or "user name is empty" in lowered or "invalid auth token" in lowered:
        return AuthenticationFailed(
            f"etcd refused {operation}: {detail}. Check the etcd user and password (NOTEBOOKOS_ETCD_USER / "
            "NOTEBOOKOS_ETCD_PASSWORD) and that etcd auth is enabled on both sides."
        )
    return CoordinationError(f"etcd refused {operation}: {code.name} {detail}")


def _token_expired(exc: grpc.aio.AioRpcError) -> bool:
    """Whether etcd refused our auth token as too old: expired (simple tokens live ``--auth-token-ttl``
    seconds unused) or issued before a user or role changed ("revision of auth store is old"). Such a request
    was not applied, so it is retried once a new token is in hand."""
    lowered = _details(exc).lower()
    return "invalid auth token" in lowered or "auth store is old" in lowered or "user name is empty" in lowered


def _server_timeout(exc: grpc.aio.AioRpcError) -> bool:
    """etcd gave up on a request inside the server (status UNKNOWN, "context deadline exceeded"): a linearizable
    read or a proposal that waited for a leader during an election."""
    return exc.code() == grpc.StatusCode.UNKNOWN and "deadline exceeded" in _details(exc).lower()


def _retryable(exc: grpc.aio.AioRpcError, *, idempotent: bool) -> bool:
    code = exc.code()
    if idempotent and _server_timeout(exc):
        return True
    if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return False
    if idempotent:
        return True
    lowered = _details(exc).lower()
    return code == grpc.StatusCode.UNAVAILABLE and any(m in lowered for m in _NOT_SENT_MARKERS)


def _grpc_target(endpoints: Sequence[str]) -> str:
    """A gRPC target balancing over every endpoint (``host:port``, optional ``http://``)."""
    addresses = []
    for endpoint in endpoints:
        hostport = endpoint.split("://", 1)[-1].rstrip("/")
        host, _, port = hostport.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"etcd endpoint {endpoint!r} is not host:port")
        try:
            ip = ipaddress.ip_address(host.strip("[]"))
            addresses.append(f"{ip}:{port}" if ip.version == 4 else f"[{ip}]:{port}")
        except ValueError:
            # A host name: resolve it now (gRPC's static-list target takes addresses only).
            infos = socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)
            addresses.extend(sorted({f"{info[4][0]}:{port}" for info in infos}))
    return "ipv4:" + ",".join(addresses) if all("[" not in a for a in addresses) else "ipv6:" + ",".join(addresses)


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
        self.timeout = timeout
        self.attempt_timeout = attempt_timeout
        self.keys = KeyLayout(prefix)
        self.tls = tls
        target = _grpc_target(self.endpoints)
        if tls is None:
            self._channel = grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS)
        else:
            options = list(_CHANNEL_OPTIONS)
            name = tls.target_name(self.endpoints)
            if name:
                options.append(("grpc.ssl_target_name_override", name))
            self._channel = grpc.aio.secure_channel(target, tls.credentials(), options=options)
        self._kv = _proto.KVStub(self._channel)
        self._lease = _proto.LeaseStub(self._channel)
        self._watch = _proto.WatchStub(self._channel)
        self._maintenance = _proto.MaintenanceStub(self._channel)
        self._cluster = _proto.ClusterStub(self._channel)
        self._auth = _proto.AuthStub(self._channel)
        self.credentials = credentials
        # Sent with every call: etcd's hasleader flag, plus our auth token once authenticated.
        self.metadata: tuple[tuple[str, str], ...] = REQUIRE_LEADER
        self._auth_lock = asyncio.Lock()
        self._leases: set[Lease] = set()
        self._watches: set[Watch] = set()
        self._closed = False

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
            await coordinator._unary(
                coordinator._maintenance.Status, _proto.StatusRequest(), "connect", timeout, idempotent=True
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
        if self._closed:
            return
        self._closed = True
        for watch in list(self._watches):
            await watch.aclose()
        for lease in list(self._leases):
            await lease.stop_keepalive()
        await self._channel.close()

    # -- the RPC layer: deadlines, retries, error mapping -------------------------------------------

    @property
    def channel_ready(self) -> bool:
        return self._channel.get_state(try_to_connect=False) == grpc.ChannelConnectivity.READY

    def _error(self, exc: grpc.aio.AioRpcError, operation: str) -> CoordinationError:
        return classify(exc, self.endpoints, channel_ready=self.channel_ready, operation=operation)

    async def authenticate(self, *, timeout: float | None = None, stale: tuple[tuple[str, str], ...] = ()) -> None:
        """Log in with :attr:`credentials` and use the new token from now on.

        ``stale``: the metadata a refused call carried; when another task already replaced that token, this
        returns at once (many calls refused together log in once).
        """
        if self.credentials is None:
            raise AuthenticationFailed(
                "etcd requires a user name and password, and this process has none: set NOTEBOOKOS_ETCD_USER "
                "and NOTEBOOKOS_ETCD_PASSWORD (the gateway gives each replica its kernel's own)"
            )
        async with self._auth_lock:
            if stale and self.metadata != stale:
                return
            request = _proto.AuthenticateRequest(name=self.credentials.user, password=self.credentials.password)
            # Logging in needs no token: the plain metadata, and no re-login loop inside _unary.
            reply = await self._unary(
                self._auth.Authenticate, request, f"log in as etcd user {self.credentials.user}", timeout,
                idempotent=True, metadata=REQUIRE_LEADER,
            )  # fmt: skip
            self.metadata = (*REQUIRE_LEADER, ("token", reply.token))

    async def relogin_if_expired(self, exc: grpc.aio.AioRpcError, sent: tuple[tuple[str, str], ...]) -> bool:
        """For streams (lease keepalives, watches): log in again when ``exc`` says our token is too old.
        Returns whether it did, so the caller resends."""
        if self.credentials is None or not _token_expired(exc):
            return False
        await self.authenticate(stale=sent)
        return True

    async def auth_call(self, method: str, request: Any, operation: str, *, timeout: float | None = None) -> Any:
        """Call one RPC of etcd's Auth service (users, roles, enabling auth): for the admin helpers of
        :mod:`jupyter_notebookos.coordination.auth`."""
        return await self._unary(getattr(self._auth, method), request, operation, timeout, idempotent=True)

    async def _unary(
        self,
        method: Callable[..., Awaitable[_T]],
        request: Any,
        operation: str,
        timeout: float | None,
        *,
        idempotent: bool,
        metadata: tuple[tuple[str, str], ...] | None = None,
    ) -> _T:
        if self._closed:
            raise CoordinationError(f"{operation}: the coordinator is closed")
        loop = asyncio.get_running_loop()
        budget = self.timeout if timeout is None else timeout
        deadline = loop.time() + budget
        backoff = 0.05
        while True:
            remaining = deadline - loop.time()
            attempt = min(remaining, self.attempt_timeout) if idempotent else remaining
            sent = self.metadata if metadata is None else metadata
            try:
                return await method(request, timeout=max(attempt, 0.001), metadata=sent)
            except grpc.aio.AioRpcError as exc:
                if metadata is None and self.credentials is not None and _token_expired(exc):
                    # Not applied: log in again (once for every call refused with this token) and resend.
                    await self.authenticate(timeout=max(deadline - loop.time(), 0.001), stale=sent)
                    continue
                error = self._error(exc, operation)
                remaining = deadline - loop.time()
                if not _retryable(exc, idempotent=idempotent) or remaining <= backoff:
                    ambiguous = not idempotent and not _retryable(exc, idempotent=False)
                    if ambiguous and isinstance(error, QuorumLost | EtcdUnavailable):
                        error.args = (
                            f"{error.args[0]} The outcome of this {operation} is unknown: "
                            "read the keys it writes to find out.",
                        )
                    raise error from exc
                log.debug("%s: %s; retrying in %.2f s", operation, _details(exc), backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 0.5)

    # -- key-value ----------------------------------------------------------------------------------

    async def get(self, key: str, *, timeout: float | None = None) -> KeyValue | None:
        """The key's current value and revisions, or ``None`` if it does not exist (linearizable)."""
        reply = await self._unary(
            self._kv.Range, _proto.RangeRequest(key=key.encode()), f"get {key}", timeout, idempotent=True
        )
        return KeyValue.from_proto(reply.kvs[0]) if reply.kvs else None

    async def get_prefix(self, prefix: str, *, keys_only: bool = False, timeout: float | None = None) -> RangeResult:
        """Every key starting with ``prefix``, in key order, with the revision of the read."""
        raw = prefix.encode()
        request = _proto.RangeRequest(key=raw, range_end=_proto.prefix_range_end(raw), keys_only=keys_only)
        reply = await self._unary(self._kv.Range, request, f"get prefix {prefix}", timeout, idempotent=True)
        return RangeResult([KeyValue.from_proto(kv) for kv in reply.kvs], reply.header.revision)

    async def put(
        self, key: str, value: Value, *, lease: Lease | int | None = None, timeout: float | None = None
    ) -> int:
        """Write ``key`` (bound to ``lease`` if given). Returns the revision of the write."""
        request = _proto.PutRequest(key=key.encode(), value=to_bytes(value), lease=lease_id(lease))
        reply = await self._unary(self._kv.Put, request, f"put {key}", timeout, idempotent=True)
        return int(reply.header.revision)

    async def delete(self, key: str, *, timeout: float | None = None) -> bool:
        """Delete ``key``. Returns whether it existed."""
        request = _proto.DeleteRangeRequest(key=key.encode())
        reply = await self._unary(self._kv.DeleteRange, request, f"delete {key}", timeout, idempotent=True)
        return bool(reply.deleted)

    async def delete_prefix(self, prefix: str, *, timeout: float | None = None) -> int:
        """Delete every key starting with ``prefix``. Returns how many there were."""
        raw = prefix.encode()
        request = _proto.DeleteRangeRequest(key=raw, range_end=_proto.prefix_range_end(raw))
        reply = await self._unary(self._kv.DeleteRange, request, f"delete prefix {prefix}", timeout, idempotent=True)
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
        reply = await self._unary(self._kv.Txn, request, "txn", timeout, idempotent=False)
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
        await self._unary(self._kv.Compact, request, "compact", timeout, idempotent=True)

    async def status(self, *, timeout: float | None = None) -> dict[str, Any]:
        """One member's view: version, leader id, Raft term, revision and database size."""
        reply = await self._unary(self._maintenance.Status, _proto.StatusRequest(), "status", timeout, idempotent=True)
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
        reply = await self._unary(
            self._cluster.MemberList, _proto.MemberListRequest(), "member list", timeout, idempotent=True
        )
        return [EtcdMemberInfo(m.ID, m.name, list(m.clientURLs)) for m in reply.members]

    async def defragment(self, *, timeout: float | None = None) -> None:
        """Defragment the database of the member this coordinator talks to (connect it to that one endpoint).

        The member answers nothing else meanwhile: defragment one member at a time, the leader last.
        """
        await self._unary(
            self._maintenance.Defragment, _proto.DefragmentRequest(), "defragment", timeout, idempotent=True
        )

    async def alarms(self, *, timeout: float | None = None) -> list[tuple[int, str]]:
        """The cluster's raised alarms: (member id, ``"NOSPACE"`` or ``"CORRUPT"``)."""
        request = _proto.AlarmRequest(action=_proto.AlarmRequest.GET)
        reply = await self._unary(self._maintenance.Alarm, request, "alarm list", timeout, idempotent=True)
        kinds = _proto.AlarmRequest.DESCRIPTOR.fields_by_name["alarm"].enum_type.values_by_number
        return [(a.memberID, kinds[a.alarm].name) for a in reply.alarms]

    async def disarm(self, member_id: int, alarm: str, *, timeout: float | None = None) -> None:
        """Clear one raised alarm (etcd accepts writes again once no NOSPACE alarm is left)."""
        kinds = _proto.AlarmRequest.DESCRIPTOR.fields_by_name["alarm"].enum_type.values_by_name
        request = _proto.AlarmRequest(
            action=_proto.AlarmRequest.DEACTIVATE, memberID=member_id, alarm=kinds[alarm].number
        )
        await self._unary(self._maintenance.Alarm, request, "alarm disarm", timeout, idempotent=True)

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
        reply = await self._unary(
            self._lease.LeaseGrant, _proto.LeaseGrantRequest(TTL=ttl), "grant lease", timeout, idempotent=True
        )
        if reply.error:
            raise CoordinationError(f"etcd refused a lease of {ttl} s: {reply.error}")
        lease = Lease(self, int(reply.ID), int(reply.TTL), on_lost=on_lost)
        if keepalive:
            lease.start_keepalive()
        return lease

    async def revoke(self, lease: Lease | int, *, timeout: float | None = None) -> None:
        """Revoke a lease now: every key bound to it is deleted at once."""
        if isinstance(lease, Lease):
            await lease.revoke(timeout=timeout)
            return
        await self._revoke_id(lease, timeout)

    async def _revoke_id(self, lease: int, timeout: float | None) -> None:
        with contextlib.suppress(LeaseLost):  # already gone: what revoking wanted
            await self._unary(
                self._lease.LeaseRevoke,
                _proto.LeaseRevokeRequest(ID=lease),
                "revoke lease",
                timeout,
                idempotent=True,
            )

    # -- watches ------------------------------------------------------------------------------------

    def watch_prefix(self, prefix: str, start_revision: int | None = None) -> Watch:
        """Watch every key starting with ``prefix``: ``async for event in coordinator.watch_prefix(p)``.

        With ``start_revision`` the watch replays every change from that revision on (use a
        :meth:`get_prefix` result's ``revision + 1``); without, it starts after the current revision.
        It resumes by itself after a disconnect or a member failure, from the revision after the
        last event it delivered, so no event is lost or repeated. Raises :class:`WatchCompacted` if
        the history it needs was compacted.
        """
        return Watch(self, prefix, start_revision)

    def watch_key(self, key: str, start_revision: int | None = None) -> Watch:
        """Watch one key (same guarantees as :meth:`watch_prefix`)."""
        return Watch(self, key, start_revision, exact=True)
