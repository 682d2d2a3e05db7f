"""``Lease``: an etcd lease that keeps itself alive and says when it is gone.

A replica's registration, an executor's election key and its GPU-ledger entries are bound to a lease:
when the process dies the keepalive stops, the lease expires after its TTL, and etcd deletes those
keys. While the process lives, a background task renews the lease every third of its TTL.

Losing contact with etcd does not by itself mean the lease is gone: while a cluster has no quorum
nobody can expire leases, and a new leader extends them. ``lost`` is therefore set only when etcd
says so (a renewal answered with TTL 0, or a revoke). Writers that must not act on a stale lease put
a fencing compare in their transaction (see :mod:`jupyter_notebookos.coordination.election`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc
import grpc.aio

from jupyter_notebookos.coordination import _proto
from jupyter_notebookos.coordination.errors import CoordinationError, LeaseLost

if TYPE_CHECKING:
    from jupyter_notebookos.coordination._rpc import EtcdRpc

log = logging.getLogger(__name__)


class Lease:
    """A granted etcd lease. Get one from :meth:`Coordinator.grant_lease`.

    Attributes:
        id: etcd's lease id (pass the Lease itself to ``put``/``Op.put``).
        ttl: the TTL etcd granted, in seconds.
        lost: set once etcd reports the lease gone (expired or revoked).
    """

    def __init__(
        self,
        rpc: EtcdRpc,
        lease_id: int,
        ttl: int,
        *,
        on_lost: Callable[[Lease], object] | None = None,
    ) -> None:
        self.id = lease_id
        self.ttl = ttl
        self.lost = asyncio.Event()
        self.lost_reason = ""
        self._rpc = rpc
        self._callbacks: list[Callable[[Lease], object]] = [on_lost] if on_lost else []
        self._task: asyncio.Task[None] | None = None
        loop = asyncio.get_running_loop()
        #: loop.time() until which etcd has confirmed the lease (its last renewal + TTL).
        self.confirmed_until = loop.time() + ttl
        rpc.leases.add(self)

    def __repr__(self) -> str:
        state = f"lost ({self.lost_reason})" if self.lost.is_set() else "alive"
        return f"<Lease {self.id:x} ttl={self.ttl}s {state}>"

    @property
    def alive(self) -> bool:
        """False once etcd has reported the lease gone."""
        return not self.lost.is_set()

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease is gone."""
        if self.lost.is_set():
            raise LeaseLost(self.id, self.lost_reason)

    def on_lost(self, callback: Callable[[Lease], object]) -> None:
        """Call ``callback(lease)`` when the lease is lost (at once if it already is)."""
        if self.lost.is_set():
            callback(self)
        else:
            self._callbacks.append(callback)

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.revoke()

    # -- keepalive ----------------------------------------------------------------------------------

    def start_keepalive(self) -> None:
        """Renew the lease in the background until it is revoked, lost, or the coordinator closes."""
        if self._task is None and self.alive:
            self._task = asyncio.get_running_loop().create_task(self._keepalive_loop(), name=f"lease-{self.id:x}")

    async def stop_keepalive(self) -> None:
        """Stop renewing; the lease then expires after its TTL unless revoked first."""
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def refresh(self, *, timeout: float | None = None) -> int:
        """Renew the lease once now. Returns the TTL etcd granted.

        Raises:
            LeaseLost: etcd says the lease no longer exists.
            QuorumLost, EtcdUnavailable: the renewal did not get through.
        """
        rpc = self._rpc
        budget = max(0.5, self.ttl / 3) if timeout is None else timeout
        loop = asyncio.get_running_loop()
        sent_at = loop.time()
        sent = rpc.metadata
        call = rpc.lease.LeaseKeepAlive(timeout=budget, metadata=sent)
        try:
            await call.write(_proto.LeaseKeepAliveRequest(ID=self.id))
            reply = await call.read()
        except grpc.aio.AioRpcError as exc:
            error = rpc.error(exc, f"renew lease {self.id:x}")
            with contextlib.suppress(CoordinationError):
                await rpc.relogin_if_expired(exc, sent)  # the next renewal carries the new token
            raise error from exc
        finally:
            call.cancel()
        if reply is grpc.aio.EOF:
            raise CoordinationError(f"renew lease {self.id:x}: etcd closed the stream")
        if reply.TTL <= 0:
            self._mark_lost("expired")
            raise LeaseLost(self.id, "expired")
        self.confirmed_until = sent_at + reply.TTL
        return int(reply.TTL)

    async def time_to_live(self, *, timeout: float | None = None) -> int:
        """Seconds the lease has left according to etcd (-1 if it is gone)."""
        rpc = self._rpc
        reply = await rpc.unary(
            rpc.lease.LeaseTimeToLive,
            _proto.LeaseTimeToLiveRequest(ID=self.id),
            f"lease {self.id:x} ttl",
            timeout,
            idempotent=True,
        )
        return int(reply.TTL)

    async def revoke(self, *, timeout: float | None = None) -> None:
        """Revoke the lease: every key bound to it is deleted now."""
        await self.stop_keepalive()
        if self.alive:
            await revoke_lease(self._rpc, self.id, timeout)
            self._mark_lost("revoked")

    async def _keepalive_loop(self) -> None:
        interval = max(0.2, self.ttl / 3)
        failing_since: float | None = None
        loop = asyncio.get_running_loop()
        while self.alive:
            try:
                await self.refresh()
                if failing_since is not None:
                    log.info("lease %x renewed again after %.1f s", self.id, loop.time() - failing_since)
                failing_since = None
                await asyncio.sleep(interval)
            except LeaseLost:
                return
            except CoordinationError as exc:
                if failing_since is None:
                    failing_since = loop.time()
                    log.warning("lease %x: renewal failed, retrying: %s", self.id, exc)
                await asyncio.sleep(min(0.25, interval))

    def _mark_lost(self, reason: str) -> None:
        if self.lost.is_set():
            return
        self.lost_reason = reason
        self.lost.set()
        self._rpc.leases.discard(self)
        log.info("lease %x %s", self.id, reason)
        for callback in self._callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("lease %x: on_lost callback failed", self.id)


async def revoke_lease(rpc: EtcdRpc, lease: int, timeout: float | None) -> None:
    """Revoke lease ``lease`` now: every key bound to it is deleted at once (already gone is fine)."""
    with contextlib.suppress(LeaseLost):  # already gone: what revoking wanted
        await rpc.unary(
            rpc.lease.LeaseRevoke,
            _proto.LeaseRevokeRequest(ID=lease),
            "revoke lease",
            timeout,
            idempotent=True,
        )
