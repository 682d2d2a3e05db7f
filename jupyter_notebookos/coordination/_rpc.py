"""The RPC layer under :class:`~jupyter_notebookos.coordination.client.Coordinator`: one gRPC channel to etcd,
its service stubs, and the one way to call them (deadlines, retries, re-login, error mapping).

A coordinator, its :class:`~jupyter_notebookos.coordination.lease.Lease` objects and its
:class:`~jupyter_notebookos.coordination.watch.Watch` objects share one :class:`EtcdRpc`; closing it ends every
keepalive and watch, then the channel.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import grpc.aio

from jupyter_notebookos.coordination import _proto
from jupyter_notebookos.coordination.errors import (
    AuthenticationFailed,
    CoordinationError,
    EtcdFull,
    EtcdUnavailable,
    LeaderChanged,
    LeaseLost,
    PermissionDenied,
    QuorumLost,
    TransactionConflict,
)

if TYPE_CHECKING:
    from jupyter_notebookos.coordination.client import EtcdCredentials, EtcdTls
    from jupyter_notebookos.coordination.lease import Lease
    from jupyter_notebookos.coordination.watch import Watch

log = logging.getLogger("jupyter_notebookos.coordination.client")

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


class EtcdRpc:
    """One channel to etcd (balanced over every endpoint) and its stubs: ``kv``, ``lease``, ``watch``,
    ``maintenance``, ``auth``. :meth:`unary` is the one way to make a unary call."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        timeout: float,
        attempt_timeout: float,
        tls: EtcdTls | None = None,
        credentials: EtcdCredentials | None = None,
    ) -> None:
        self.endpoints = list(endpoints)
        self.timeout = timeout
        self.attempt_timeout = attempt_timeout
        target = _grpc_target(self.endpoints)
        if tls is None:
            self._channel = grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS)
        else:
            options = list(_CHANNEL_OPTIONS)
            name = tls.target_name(self.endpoints)
            if name:
                options.append(("grpc.ssl_target_name_override", name))
            self._channel = grpc.aio.secure_channel(target, tls.credentials(), options=options)
        self.kv = _proto.KVStub(self._channel)
        self.lease = _proto.LeaseStub(self._channel)
        self.watch = _proto.WatchStub(self._channel)
        self.maintenance = _proto.MaintenanceStub(self._channel)
        self.cluster = _proto.ClusterStub(self._channel)
        self.auth = _proto.AuthStub(self._channel)
        self.credentials = credentials
        # Sent with every call: etcd's hasleader flag, plus our auth token once authenticated.
        self.metadata: tuple[tuple[str, str], ...] = REQUIRE_LEADER
        self._auth_lock = asyncio.Lock()
        #: The leases kept alive and the watches open on this channel (they add and remove themselves).
        self.leases: set[Lease] = set()
        self.watches: set[Watch] = set()
        self.closed = False

    async def close(self) -> None:
        """Stop every watch and keepalive on this channel, then close it."""
        if self.closed:
            return
        self.closed = True
        for watch in list(self.watches):
            await watch.aclose()
        for lease in list(self.leases):
            await lease.stop_keepalive()
        await self._channel.close()

    @property
    def channel_ready(self) -> bool:
        return self._channel.get_state(try_to_connect=False) == grpc.ChannelConnectivity.READY

    def error(self, exc: grpc.aio.AioRpcError, operation: str) -> CoordinationError:
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
            # Logging in needs no token: the plain metadata, and no re-login loop inside unary.
            reply = await self.unary(
                self.auth.Authenticate, request, f"log in as etcd user {self.credentials.user}", timeout,
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
        return await self.unary(getattr(self.auth, method), request, operation, timeout, idempotent=True)

    async def _has_leader(self) -> bool:
        """Whether a member says the cluster has a leader now: asks each member in turn (the channel balances
        round-robin; a stopped member may be among them), 0.3 s each; no answer reads as no."""
        for _ in self.endpoints:
            try:
                reply = await self.maintenance.Status(_proto.StatusRequest(), timeout=0.3, metadata=self.metadata)
            except grpc.aio.AioRpcError:
                continue
            if reply.leader:
                return True
        return False

    async def unary(
        self,
        method: Callable[..., Awaitable[_T]],
        request: Any,
        operation: str,
        timeout: float | None,
        *,
        idempotent: bool,
        metadata: tuple[tuple[str, str], ...] | None = None,
    ) -> _T:
        if self.closed:
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
                error = self.error(exc, operation)
                remaining = deadline - loop.time()
                if not _retryable(exc, idempotent=idempotent) or remaining <= backoff:
                    if type(error) is QuorumLost and await self._has_leader():
                        error = LeaderChanged(self.endpoints, error.detail)
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
