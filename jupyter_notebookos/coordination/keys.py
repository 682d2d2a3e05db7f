"""The etcd key layout of NotebookOS, in one place.

Every key lives under a configurable prefix (default ``/notebookos``), so several installations can
share one etcd. Values are UTF-8 JSON unless said otherwise; their schemas belong to the modules that
write them (named below). Keys marked *lease* are bound to the named lease, so they vanish with it.

=================================  =================================================  ============
Key (below the prefix)             Value (writer)                                     Bound to
=================================  =================================================  ============
``/hosts/{host}``                  host record: name, GPUs, address (launcher)        host lease
``/kernels/{kernel_id}``           kernel session record: spec, replica ids, GPUs     --
                                   per cell (gateway)
``/kernels/{kid}/replicas/{rid}``  replica registration: connection info, pid, host   replica lease
``/kernels/{kid}/executor``        current executor's replica id; its create_revision  executor lease
                                   is the fencing token (election)
``/kernels/{kid}/cells/{msg_id}``  cell decision: executor, GPU device ids, attempt   --
                                   (router, one txn with the GPU entries)
``/kernels/{kid}/log/{seq:020d}``  one state-delta record (executor)                  --
``/kernels/{kid}/applied/{rid}``   highest log seq replica rid applied (replica)      replica lease
``/kernels/{kid}/checkpoint``      latest checkpoint pointer + log seq it covers      --
``/gpus/{host}/{device}``          GPU ledger entry: kernel, replica, msg_id of the   executor lease
                                   cell holding the device (router)
``/quarantine/{key}``              a malformed value moved out of ``{key}`` (below    --
                                   the prefix), with why and when (gateway)
``/usage/kernels/{kernel_id}``     GPU-seconds the kernel used, over gateway          --
                                   restarts (gateway's history)
``/usage/days/{day}/{user}``       GPU-seconds a user's kernels used on that UTC day  --
                                   (gateway's history; user percent-encoded)
=================================  =================================================  ============

Note: ``/kernels/{kernel_id}`` and its sub-keys share the ``/kernels/`` prefix; list sessions with
``get_prefix(keys.kernels_prefix(), keys_only=True)`` and :meth:`KeyLayout.is_kernel_record`, or read
one kernel's sub-keys with ``keys.kernel_prefix(kid)``.

Sequence numbers are zero-padded to 20 digits so that etcd's byte order is numeric order and a prefix
read returns the log in order. Path segments must not contain ``/``; :class:`KeyLayout` checks that.

Use :class:`KeyLayout` (one per installation prefix) rather than formatting strings by hand::

    keys = KeyLayout("/notebookos")
    keys.cell("k1", "msg-7")          # "/notebookos/kernels/k1/cells/msg-7"
    keys.kernel_prefix("k1")          # "/notebookos/kernels/k1/" (everything of one kernel)
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIX = "/notebookos"

#: Width of zero-padded log sequence numbers.
SEQ_WIDTH = 20


def _segment(name: str, what: str) -> str:
    if not name or "/" in name:
        raise ValueError(f"{what} {name!r} cannot be used in an etcd key: it must be non-empty, without '/'")
    return name


@dataclass(frozen=True)
class KeyLayout:
    """Builds every etcd key of NotebookOS under one ``prefix``."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        cleaned = "/" + self.prefix.strip("/")
        object.__setattr__(self, "prefix", cleaned if cleaned != "/" else "")

    # -- hosts --------------------------------------------------------------------------------------
    def hosts_prefix(self) -> str:
        """All host records."""
        return f"{self.prefix}/hosts/"

    def host(self, host: str) -> str:
        return f"{self.hosts_prefix()}{_segment(host, 'host name')}"

    # -- kernels ------------------------------------------------------------------------------------
    def kernels_prefix(self) -> str:
        """Every key of every kernel (sessions and their sub-keys)."""
        return f"{self.prefix}/kernels/"

    def kernel(self, kernel_id: str) -> str:
        """The kernel's session record."""
        return f"{self.kernels_prefix()}{_segment(kernel_id, 'kernel id')}"

    def kernel_prefix(self, kernel_id: str) -> str:
        """Every sub-key of one kernel (not the session record itself)."""
        return f"{self.kernel(kernel_id)}/"

    def replicas_prefix(self, kernel_id: str) -> str:
        return f"{self.kernel_prefix(kernel_id)}replicas/"

    def replica(self, kernel_id: str, replica_id: str) -> str:
        return f"{self.replicas_prefix(kernel_id)}{_segment(replica_id, 'replica id')}"

    def executor(self, kernel_id: str) -> str:
        """The executor election key; its create_revision is the fencing token."""
        return f"{self.kernel_prefix(kernel_id)}executor"

    def cells_prefix(self, kernel_id: str) -> str:
        return f"{self.kernel_prefix(kernel_id)}cells/"

    def cell(self, kernel_id: str, msg_id: str) -> str:
        return f"{self.cells_prefix(kernel_id)}{_segment(msg_id, 'msg_id')}"

    def log_prefix(self, kernel_id: str) -> str:
        return f"{self.kernel_prefix(kernel_id)}log/"

    def log_record(self, kernel_id: str, seq: int) -> str:
        if seq < 0:
            raise ValueError(f"log sequence numbers start at 0, not {seq}")
        return f"{self.log_prefix(kernel_id)}{seq:0{SEQ_WIDTH}d}"

    def applied_prefix(self, kernel_id: str) -> str:
        return f"{self.kernel_prefix(kernel_id)}applied/"

    def applied(self, kernel_id: str, replica_id: str) -> str:
        return f"{self.applied_prefix(kernel_id)}{_segment(replica_id, 'replica id')}"

    def checkpoint(self, kernel_id: str) -> str:
        return f"{self.kernel_prefix(kernel_id)}checkpoint"

    # -- GPU ledger ---------------------------------------------------------------------------------
    def gpus_prefix(self) -> str:
        """The whole GPU ledger."""
        return f"{self.prefix}/gpus/"

    def host_gpus_prefix(self, host: str) -> str:
        return f"{self.gpus_prefix()}{_segment(host, 'host name')}/"

    def gpu(self, host: str, device: int | str) -> str:
        return f"{self.host_gpus_prefix(host)}{_segment(str(device), 'GPU device')}"

    # -- GPU usage, kept over gateway restarts (the dashboard's history) -------------------------------
    def usage_kernels_prefix(self) -> str:
        """Every kernel's GPU-seconds."""
        return f"{self.prefix}/usage/kernels/"

    def usage_kernel(self, kernel_id: str) -> str:
        return f"{self.usage_kernels_prefix()}{_segment(kernel_id, 'kernel id')}"

    def usage_days_prefix(self) -> str:
        """Every user's GPU-seconds per day."""
        return f"{self.prefix}/usage/days/"

    def usage_day(self, day: str, user: str) -> str:
        """GPU-seconds of ``user`` (a key segment: percent-encoded by its writer) on UTC ``day`` (YYYY-MM-DD)."""
        return f"{self.usage_days_prefix()}{_segment(day, 'day')}/{_segment(user, 'user')}"

    # -- malformed values -----------------------------------------------------------------------------
    def quarantine(self, key: str) -> str:
        """Where a malformed value of ``key`` (a full key) is kept for an operator to look at."""
        return f"{self.prefix}/quarantine{self.relative(key)}"

    # -- parsing ------------------------------------------------------------------------------------
    def relative(self, key: str) -> str:
        """``key`` without the installation prefix (for logs and parsing)."""
        if not key.startswith(self.prefix + "/"):
            raise ValueError(f"{key!r} is not under {self.prefix!r}")
        return key[len(self.prefix) :]

    def is_kernel_record(self, key: str) -> bool:
        """Whether ``key`` is a kernel session record (not one of its sub-keys)."""
        rest = key[len(self.kernels_prefix()) :] if key.startswith(self.kernels_prefix()) else ""
        return bool(rest) and "/" not in rest

    @staticmethod
    def last_segment(key: str) -> str:
        """The final path segment: a host, replica id, msg_id or device."""
        return key.rsplit("/", 1)[-1]

    @staticmethod
    def seq_of(key: str) -> int:
        """The sequence number of a log-record key."""
        return int(key.rsplit("/", 1)[-1])


#: The layout under the default prefix.
DEFAULT_KEYS = KeyLayout()
