"""A replica's etcd lease, renewed by a helper process for as long as the replica process lives.

The replica renews its lease from a Python thread, and a Python thread needs the GIL. A cell that holds the GIL
for longer than the lease's TTL stopped the renewals: a long ``sorted()``, a regular expression, a C extension that
does not release the GIL. etcd then ended the lease, the gateway took the replica for dead, and the user was told
that the cell failed while it went on running. This helper renews the same lease from its own process, so the
lease follows the replica process's life, not its GIL.

The replica starts it when it first runs a cell (its start pays nothing for it), with a pipe as its stdin, and
writes the id of the lease to keep alive (hex, one line), and a new id when it registers again with a new lease.
When the replica ends, or stops the helper before it revokes its lease, the pipe closes and the helper exits at once
without touching the lease: the lease then ends as before, after its TTL or by the revoke. A host cut off from etcd
stops both renewals alike. The replica keeps renewing too, and it is the replica that learns from etcd when the
lease is gone.

    python -m jupyter_notebookos.kernel.keepalive REPLICA_PID    (environment: the replica's own, see ReplicaSettings)

It dies with the replica process (``PR_SET_PDEATHSIG``), and also stops when its stdin closes or it is orphaned.
It runs in a process group of its own and ignores SIGINT: interrupting a cell (ipykernel signals the replica's
process group) must not stop it. A helper that exited anyway is started again at the replica's next cell.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
from typing import IO

from jupyter_notebookos.coordination.client import Coordinator
from jupyter_notebookos.coordination.errors import CoordinationError
from jupyter_notebookos.coordination.lease import Lease
from jupyter_notebookos.kernel.settings import ReplicaConfigError, ReplicaSettings

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>: the signal comes when the thread that started the helper ends


class LeaseKeeper:
    """The replica's side: the helper process and the pipe to it."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc

    @classmethod
    def start(cls, lease_id: int) -> LeaseKeeper | None:
        """Start the helper on lease ``lease_id`` (None, and a warning, if it cannot start)."""
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", __name__, str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                close_fds=True,
                # Not in the replica's process group: an interrupt (ipykernel signals the whole group) is the
                # cell's, not the helper's. It killed the helper, and a cell holding the GIL then ended the lease.
                process_group=0,
            )
        except OSError as exc:
            log.warning("the lease keeper did not start (%s): a cell holding the GIL past the lease's TTL ends it", exc)
            return None
        keeper = cls(proc)
        keeper.follow(lease_id)
        return keeper

    def alive(self) -> bool:
        """Whether the helper still runs."""
        return self._proc.poll() is None

    def follow(self, lease_id: int) -> None:
        """Renew lease ``lease_id`` from now on (the replica registered again with it)."""
        stdin = self._proc.stdin
        assert stdin is not None
        try:
            stdin.write(f"{lease_id:x}\n".encode())
            stdin.flush()
        except OSError as exc:  # it exited: the replica's own renewals remain
            log.warning("the lease keeper is gone (%s)", exc)

    def stop(self) -> None:
        """Close the pipe (the helper exits without touching the lease) and reap it."""
        stdin = self._proc.stdin
        if stdin is not None:
            with contextlib.suppress(OSError):
                stdin.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


async def keep(settings: ReplicaSettings, lines: IO[bytes]) -> None:
    """Renew the lease named by the last line read from ``lines`` until they end."""
    coordinator = await Coordinator.connect(
        settings.etcd_endpoints,
        prefix=settings.etcd_prefix,
        tls=settings.etcd_tls,
        credentials=settings.etcd_credentials,
    )
    loop = asyncio.get_running_loop()
    lease: Lease | None = None
    parent = os.getppid()

    async def orphaned() -> None:
        # A child the replica forked (multiprocessing) holds the pipe open too: the replica's end is its death.
        while os.getppid() == parent:
            await asyncio.sleep(0.5)

    received: asyncio.Queue[bytes] = asyncio.Queue()

    def read() -> None:  # a daemon thread: a blocked read must not hold up the exit
        with contextlib.suppress(RuntimeError):  # (the loop closed first)
            for line in iter(lines.readline, b""):
                loop.call_soon_threadsafe(received.put_nowait, line)
            loop.call_soon_threadsafe(received.put_nowait, b"")

    threading.Thread(target=read, name="lease ids", daemon=True).start()
    watch = loop.create_task(orphaned())
    try:
        while True:
            reading = loop.create_task(received.get())
            await asyncio.wait({reading, watch}, return_when=asyncio.FIRST_COMPLETED)
            if watch.done() or not (line := reading.result()):
                reading.cancel()
                return
            if lease is not None:
                await lease.stop_keepalive()
            try:
                lease = Lease(coordinator.rpc, int(line, 16), settings.lease_ttl)
            except ValueError:
                log.error("lease keeper: not a lease id: %r", line)
                continue
            lease.start_keepalive()  # until etcd says the lease is gone; the replica then sends a new one
    finally:
        watch.cancel()
        with contextlib.suppress(CoordinationError):
            await coordinator.close()


def _die_with(parent: int) -> bool:
    """Have the kernel kill this process when its parent (the replica) dies; False if it already has."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    return os.getppid() == parent


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the replica stops it by closing the pipe, or it dies with it
    logging.basicConfig(level=logging.WARNING, format="[keepalive %(levelname)s] %(message)s")
    if len(sys.argv) != 2 or not _die_with(int(sys.argv[1])):
        return 0  # started by hand, or the replica is gone already
    try:
        settings = ReplicaSettings.from_env(os.environ)
        asyncio.run(keep(settings, sys.stdin.buffer))
    except (ReplicaConfigError, CoordinationError) as exc:
        log.error("the lease keeper stops: %s (the replica's own renewals remain)", exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
