"""``python -m jupyter_notebookos.kernel``: run one replica, configured by the protocol's environment.

Problems a user or operator can fix end the process with one line on stderr and a distinct status:
2 (bad environment), 3 (etcd unreachable or without quorum at start), 5 (the object store or the state
cannot be read at start); 4 is a replica that lost its lease later (see :mod:`.app`).
"""

from __future__ import annotations

import json
import os
import sys

EXIT_CONFIG = 2
EXIT_ETCD_UNREACHABLE = 3
EXIT_RESTORE_FAILED = 5


def wait_for_assignment() -> bool:
    """Warm mode (``--warm``): do the expensive imports now, then wait for an assignment on stdin.

    The launcher writes one JSON line ``{"env", "log", "cwd"}``: this process then becomes that replica
    (its environment replaced, its output sent to the log). False when stdin closed first (pool shut down).
    """
    # ipykernel, IPython, grpc, numpy..., and what IPKernelApp.initialize imports later: its debugger support
    # alone pulls in debugpy and pdb (about 100 ms of a replica's start, more when several replicas start at
    # once on a small machine). (pydevd would warn about frozen modules at import, once per pool process, in the
    # pool's log; the kernelspec disables the debugger.)
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    import pydoc  # noqa: F401
    import sqlite3  # noqa: F401

    import ipykernel.debugger  # noqa: F401
    import IPython.extensions  # noqa: F401

    import jupyter_notebookos.kernel.app  # noqa: F401

    line = sys.stdin.readline()
    if not line.strip():
        return False
    assignment = json.loads(line)
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in assignment["env"].items()})
    if assignment.get("cwd"):
        os.chdir(assignment["cwd"])
    log = os.open(assignment["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return True


def take_kernel_user() -> None:
    """Become the kernel's own OS user, for good, before any of the kernel's code runs (when the launcher
    asks for it: see :mod:`.sandbox`)."""
    from jupyter_notebookos.kernel.sandbox import ENV_KERNEL_UID, become_kernel_user

    raw = os.environ.get(ENV_KERNEL_UID, "").strip()
    if raw:
        become_kernel_user(int(raw))


def main() -> int:
    """Run the replica until shutdown; returns the exit status."""
    if "--warm" in sys.argv[1:] and not wait_for_assignment():
        return 0
    try:
        take_kernel_user()
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"notebookos replica cannot take its kernel's OS user: {exc}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    from jupyter_notebookos.coordination.errors import CoordinationError
    from jupyter_notebookos.kernel.app import ReplicaApp
    from jupyter_notebookos.kernel.settings import ReplicaConfigError
    from jupyter_notebookos.replication.objectstore import ObjectStoreError

    app = ReplicaApp.instance()

    def fail(message: str, status: int) -> int:
        replica_log = getattr(app, "replica_log", None)
        if replica_log is not None:  # ipykernel may already own fd 2: write to the saved original
            replica_log.fatal(message, status)
        print(message.replace("\n", " "), file=sys.__stderr__, flush=True)
        return status

    try:
        app.initialize([])
    except ReplicaConfigError as exc:
        return fail(f"notebookos replica: {exc}", EXIT_CONFIG)
    except CoordinationError as exc:
        return fail(f"notebookos replica cannot start: {exc}", EXIT_ETCD_UNREACHABLE)
    except ObjectStoreError as exc:
        return fail(f"notebookos replica cannot restore the kernel's state: {exc}", EXIT_RESTORE_FAILED)
    app.start()
    return 0


if __name__ == "__main__":
    sys.exit(main())
