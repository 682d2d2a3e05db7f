"""Waiting for a replica that etcd dropped while its process lived (an etcd outage outlived its lease).

A replica's registration vanishes when etcd ends its lease. Usually the process died; but after an etcd outage
longer than the lease's TTL (etcd stopped, restarted, out of quorum) every replica's lease may end while every
process is fine and holds the kernel's state in memory (GPU memory, threads, open files, values that cannot be
pickled). Such a replica takes a new lease and registers again under the same id
(:meth:`jupyter_notebookos.kernel.agent.ReplicaAgent._rejoin`). The platform gives it this long before it
replaces it; a process that exits meanwhile is replaced at once. A cell it runs meanwhile goes on: the router
keeps its connections to it (``Relay.hold``) and fails the cell only if it is lost.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from jupyter_notebookos.launchers.base import Launcher, LaunchError, ReplicaHandle, ReplicaPhase

if TYPE_CHECKING:
    from jupyter_notebookos.gateway.router import ReplicaRouter

#: Seconds a live replica whose lease ended may take to register again before it is replaced (the default of
#: ``NotebookOSGatewayApp.replica_rejoin_grace``). A replica notices within a third of its lease's TTL after
#: etcd is back, and registering again takes one transaction.
DEFAULT_REJOIN_GRACE = 10.0

_POLL_S = 0.25


async def await_rejoin(router: ReplicaRouter, launcher: Launcher, handle: ReplicaHandle, grace: float) -> bool:
    """True once replica ``handle.replica_id`` is registered again; False when its process ended, the kernel
    is stopping, or ``grace`` seconds passed."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if router.replicas.is_registered(handle.replica_id):
            return True
        if router.shutting_down:
            return False
        try:
            status = await launcher.status(handle)
        except LaunchError:
            return False
        if status.phase in (ReplicaPhase.EXITED, ReplicaPhase.FAILED):
            return False
        await asyncio.sleep(_POLL_S)
    return router.replicas.is_registered(handle.replica_id)
