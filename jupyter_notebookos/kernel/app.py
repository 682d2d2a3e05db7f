"""``ReplicaApp``: the IPKernelApp of a replica, configured only by the protocol's environment variables.

Start-up follows :mod:`jupyter_notebookos.replication.protocol`: connect to etcd and take a lease (kept
alive on the coordination thread), bind the five sockets on free ports of ``NOTEBOOKOS_IP``, restore the
namespace from the checkpoint and the log, start watching the log, and only then register. The connection
file ipykernel insists on lives in a private temporary directory that is removed at exit; nobody reads it.
"""

from __future__ import annotations

import atexit
import io
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Any, cast

import psutil
import zmq
from ipykernel.kernelapp import IPKernelApp
from tornado import ioloop
from traitlets import Type
from traitlets.config import Config

from jupyter_notebookos.kernel.agent import ReplicaAgent
from jupyter_notebookos.kernel.replica import ReplicaKernel
from jupyter_notebookos.kernel.settings import ReplicaSettings
from jupyter_notebookos.replication.objectstore import ObjectStore
from jupyter_notebookos.replication.protocol import ReplicaRegistration

#: Exit status of a replica whose lease is gone or that lost etcd for longer than its TTL.
EXIT_LEASE_LOST = 4


class ReplicaLog:
    """Where the replica's own log lines go: the process's original stderr (the launcher's log file).

    ipykernel redirects file descriptors 1 and 2 into the cell output, so we keep a duplicate of the
    original stderr taken before that, and write there.
    """

    def __init__(self) -> None:
        self.fd = os.dup(2)
        self.stream = io.TextIOWrapper(io.FileIO(self.fd, "w", closefd=False), line_buffering=True)

    def install(self, settings: ReplicaSettings) -> None:
        """Send the ``jupyter_notebookos`` loggers to this stream, prefixed with the replica's name."""
        handler = logging.StreamHandler(self.stream)
        handler.setFormatter(
            logging.Formatter(
                f"[%(levelname)1.1s %(asctime)s replica {settings.replica_id} kernel {settings.kernel_id}] "
                "%(name)s: %(message)s"
            )
        )
        root = logging.getLogger("jupyter_notebookos")
        root.handlers[:] = [handler]
        root.setLevel(logging.INFO)
        root.propagate = False

    def fatal(self, message: str, status: int) -> None:
        """Write one line and end the process at once (from any thread)."""
        try:
            os.write(self.fd, (message.replace("\n", " ") + "\n").encode())
        finally:
            os._exit(status)


class ReplicaApp(IPKernelApp):
    """An IPython kernel application that is one NotebookOS replica."""

    name = "notebookos-replica"
    kernel_class = Type(  # type: ignore[assignment]
        ReplicaKernel, klass="ipykernel.kernelbase.Kernel", help="The replica kernel class."
    ).tag(config=True)

    replica_settings: ReplicaSettings
    agent: ReplicaAgent

    def initialize(self, argv: Any = None) -> None:
        """Read the environment, reach etcd, bind the sockets, and restore the namespace."""
        settings = self.replica_settings = ReplicaSettings.from_env()
        self.replica_log = ReplicaLog()
        self.replica_log.install(settings)
        runtime = tempfile.mkdtemp(prefix=f"notebookos-{settings.replica_id}-")
        atexit.register(shutil.rmtree, runtime, True)
        self.update_config(
            Config(
                {
                    "Session": {"key": settings.key.encode(), "signature_scheme": settings.signature_scheme},
                    "IPKernelApp": {"ip": settings.ip, "transport": "tcp"},
                }
            )
        )
        self.connection_dir = runtime
        self.connection_file = os.path.join(runtime, f"kernel-{settings.replica_id}.json")

        self.agent = ReplicaAgent(settings, on_fatal=lambda m: self.replica_log.fatal(m, EXIT_LEASE_LOST))
        # Raises EtcdUnavailable / QuorumLost: __main__ turns it into one line.
        self.agent.connect(timeout=3.0, within=settings.etcd_start_within)

        super().initialize([] if argv is None else argv)
        if isinstance(self.log, logging.Logger):
            # traitlets leaves the application's logger at DEBUG and filters in its handler, so ipykernel's
            # debug calls (several per message) each build a record that is then dropped.
            self.log.setLevel(cast(int, self.log_level))
        kernel: ReplicaKernel = self.kernel
        kernel.attach(
            settings,
            self.agent,
            ObjectStore(settings.object_store_url, storage_options=settings.object_store_options),
        )
        self._log_revision = kernel.follower.restore()
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def init_iopub(self, context: Any) -> None:
        """ipykernel's iopub channel, whose PUB socket has no high-water mark: ZMQ drops, silently, what a PUB socket
        holds beyond it (1000 messages) for a subscriber that does not keep up. The router is this socket's
        subscriber, and when the gateway stalls (a loaded machine, a pause) a cell printing fast lost lines and its
        idle, and its client waited for ever. Unbounded, the replica holds what the router has yet to read. (A
        bound socket's connections take the options it had when it was bound: so the context's default, for the
        socket ipykernel creates and binds here, and only for it.)"""
        context.setsockopt(zmq.SNDHWM, 0)
        try:
            super().init_iopub(context)
        finally:
            context.sockopts.pop(zmq.SNDHWM, None)

    def start(self) -> None:
        """Go live (watch the log, register) once the loop runs, then serve."""
        ioloop.IOLoop.current().add_callback(self._go_live)
        super().start()

    def _go_live(self) -> None:
        settings = self.replica_settings
        kernel: ReplicaKernel = self.kernel
        self.agent.follow(self._log_revision + 1, kernel.follower.on_record)
        assert self.agent.lease is not None
        registration = ReplicaRegistration(
            kernel_id=settings.kernel_id,
            replica_id=settings.replica_id,
            host=settings.host,
            ip=settings.advertise_ip,
            shell_port=self.shell_port,
            iopub_port=self.iopub_port,
            stdin_port=self.stdin_port,
            control_port=self.control_port,
            hb_port=self.hb_port,
            pid=os.getpid(),
            lease=self.agent.lease.id,
            applied_seq=kernel.follower.applied,
            transport="tcp",
            pod=settings.pod,
            change_detection=kernel.tracker.method,
        )
        self.agent.register(registration)
        kernel.verifier.prepare_baseline()
        logging.getLogger("jupyter_notebookos.kernel").info(
            "registered %.2f s after the process started: %s:%d (shell), applied seq %d, lease %x",
            time.time() - psutil.Process().create_time(),
            settings.advertise_ip,
            self.shell_port,
            kernel.follower.applied,
            self.agent.lease.id,
        )

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        """A launcher's stop: say goodbye in etcd (revoke the lease), then exit."""
        self.agent.revoke(timeout=1.0)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
