"""The contract between the replica router (gateway side) and the replica kernels.

Both sides import this module, so the names below are the whole protocol; etcd keys are in
:mod:`jupyter_notebookos.coordination.keys`.

Start-up
    A launcher starts ``python -m jupyter_notebookos.kernel`` with the environment variables ``ENV_*`` below.
    The replica grants itself an etcd lease (``ENV_LEASE_TTL`` seconds, kept alive), restores the kernel's
    state (checkpoint + log records after it), binds its five ZMQ sockets on free ports of ``ENV_IP``, and
    only then puts its :class:`ReplicaRegistration` (JSON) at ``keys.replica(kid, rid)`` bound to its lease.
    The router watches that prefix: a registration appearing = replica ready; vanishing = replica gone.

Messages
    The router and the replicas share the kernel's HMAC key (``ENV_KEY``), so requests are forwarded
    unchanged where nothing is added. Frames before the ``<IDS|MSG>`` delimiter are routing identities and
    come back on the reply (standard ZMQ proxying). The router gives its shell and stdin DEALER sockets to a
    replica the same ZMQ identity, so a replica's ``input_request`` reaches the client that ran the cell.

A cell (``execute_request``)
    The router commits the decision (one etcd transaction), then forwards the request to the executor only,
    with ``metadata["notebookos"]`` = :class:`CellDirective` (re-signed). The executor binds the directive's
    GPUs for the user's code, runs it, replies, releases the GPUs, and then publishes the cell's state delta as
    log record ``directive.seq`` (every cell publishes exactly one record, possibly empty, so the router knows
    the log head without waiting). The publication is one transaction that succeeds only if
    ``keys.executor(kid)`` still has ``create_revision == directive.fence`` and the record does not exist yet:
    a replaced or stale executor can never write the log.
    The executor's ``execute_reply`` carries ``metadata["notebookos"]`` with at least ``replica``, ``host``,
    ``gpus`` and ``seq``; the router adds ``queued_ms`` and ``attempt``.

Followers
    Every replica watches ``keys.log_prefix(kid)``, applies records in ``seq`` order and puts the highest
    applied seq at ``keys.applied(kid, rid)`` (bound to its lease). The router runs a cell on a replica only
    when that replica has applied every earlier record.

Log records
    A record (JSON in etcd, :class:`LogRecord`) holds the serialized delta inline when small, else a pointer
    into the object store; large buffers always live in the object store. ``kind`` is ``"delta"`` for a cell,
    or ``"lost"`` when the router closes a sequence number whose executor died before publishing (the state
    of that cell is lost; followers apply nothing and move on).

Checkpoints
    When every live replica has applied record ``n`` and the log holds more than a threshold of records, a
    replica writes a checkpoint of its namespace to the object store, points ``keys.checkpoint(kid)`` at it
    (:class:`CheckpointPointer`) and deletes records ``<= n`` in the same transaction. The checkpoint's
    own ``seq`` may be later than ``n`` (the executor checkpoints its namespace as of the record it just
    published, while a follower may still need the records before it); a restoring replica applies the
    records after ``seq``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

# -- environment of a replica process ------------------------------------------------------------------
ENV_KERNEL_ID = "NOTEBOOKOS_KERNEL_ID"
ENV_REPLICA_ID = "NOTEBOOKOS_REPLICA_ID"
ENV_HOST = "NOTEBOOKOS_HOST"
ENV_ETCD_ENDPOINTS = "NOTEBOOKOS_ETCD_ENDPOINTS"  # comma-separated host:port
ENV_ETCD_PREFIX = "NOTEBOOKOS_ETCD_PREFIX"
ENV_OBJECT_STORE_URL = "NOTEBOOKOS_OBJECT_STORE_URL"
# S3-compatible stores: the gateway's object broker (its URL for kernels: .../api/notebookos/kernels) and the
# kernel's object token for it (replication/brokerfs.py); the replica then holds no store credentials.
ENV_OBJECT_BROKER_URL = "NOTEBOOKOS_OBJECT_BROKER_URL"
ENV_OBJECT_BROKER_TOKEN = "NOTEBOOKOS_OBJECT_BROKER_TOKEN"
ENV_KEY = "NOTEBOOKOS_KERNEL_KEY"  # the kernel's HMAC key (hex string as in a connection file)
ENV_SIGNATURE_SCHEME = "NOTEBOOKOS_SIGNATURE_SCHEME"  # default hmac-sha256
ENV_IP = "NOTEBOOKOS_IP"  # where the replica binds its sockets (embedded: 127.0.0.1; pods: 0.0.0.0)
ENV_ADVERTISE_IP = "NOTEBOOKOS_ADVERTISE_IP"  # the address the router connects to (pods: the pod IP)
ENV_LEASE_TTL = "NOTEBOOKOS_LEASE_TTL"  # seconds; default DEFAULT_LEASE_TTL
ENV_ETCD_START_WITHIN = "NOTEBOOKOS_ETCD_START_WITHIN"  # seconds a starting replica tries to reach etcd (0: once)
ENV_GPU_DEVICES = "NOTEBOOKOS_GPU_DEVICES"  # JSON list of the host's devices: [{"index", "uuid", "simulated"}]
ENV_GPU_STICKY = "NOTEBOOKOS_GPU_STICKY"  # "1": GPU state stays on the device between cells until evicted
ENV_BUFFER_THRESHOLD = "NOTEBOOKOS_BUFFER_THRESHOLD"  # bytes above which buffers go to the object store
ENV_CHECKPOINT_EVERY = "NOTEBOOKOS_CHECKPOINT_EVERY"  # records in the log before a checkpoint is taken
# ms the record of a cell that bound no name may wait to go out in one transaction with later records
ENV_HOLD_EMPTY_RECORDS_MS = "NOTEBOOKOS_HOLD_EMPTY_RECORDS_MS"
ENV_POD_NAME = "NOTEBOOKOS_POD_NAME"  # Kubernetes: the pod's name (downward API), for the registration
# etcd client TLS (PEM file paths; unset: plain gRPC). Kubernetes: the mounted etcd TLS secret.
ENV_ETCD_CA_CERT = "NOTEBOOKOS_ETCD_CA_CERT"
ENV_ETCD_CERT = "NOTEBOOKOS_ETCD_CERT"
ENV_ETCD_KEY = "NOTEBOOKOS_ETCD_KEY"
ENV_ETCD_SERVER_NAME = "NOTEBOOKOS_ETCD_SERVER_NAME"  # name checked against etcd's certificate (optional)
# etcd auth: the kernel's own etcd user and password (the gateway creates them per kernel; never the admin's).
ENV_ETCD_USER = "NOTEBOOKOS_ETCD_USER"
ENV_ETCD_PASSWORD = "NOTEBOOKOS_ETCD_PASSWORD"
# The OS user a replica takes before running the kernel's code (local launcher as root; see kernel.sandbox).
ENV_KERNEL_UID = "NOTEBOOKOS_KERNEL_UID"

DEFAULT_LEASE_TTL = 5
DEFAULT_ETCD_START_WITHIN = 20  # within the gateway's 60 s start timeout, with room to spare
#: The seq of a kernel's first log record. ``applied_seq == FIRST_SEQ - 1`` means nothing applied yet (a new
#: kernel); the router's first cell gets ``CellDirective.seq == FIRST_SEQ``.
FIRST_SEQ = 1
DEFAULT_BUFFER_THRESHOLD = 1 << 20
DEFAULT_CHECKPOINT_EVERY = 32
DEFAULT_HOLD_EMPTY_RECORDS_MS = 100

#: The key of our entry in request and reply metadata.
METADATA_KEY = "notebookos"


def stops_on_error(content: dict[str, Any]) -> bool:
    """Whether an ``execute_request`` with this content, if it fails, aborts the requests queued behind it
    (ipykernel's rule: "Run All" stops at the first error). The router and the replica both apply it."""
    return not content.get("silent", False) and bool(content.get("stop_on_error", True))


def _dumps(obj: Any) -> str:
    return json.dumps(asdict(obj), separators=(",", ":"))


class MalformedRecord(ValueError):
    """A value read from etcd that is not what its key must hold (the message says what is wrong)."""


def _checked_object(
    raw: str | bytes, what: str, types: dict[str, tuple[type, ...]], required: set[str]
) -> dict[str, Any]:
    """``raw`` parsed as a JSON object whose fields have ``types`` (bool never counts as int)."""
    try:
        data = json.loads(raw)
    except ValueError as err:
        raise MalformedRecord(f"{what} is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise MalformedRecord(f"{what} must be a JSON object, not {type(data).__name__}")
    missing, unknown = required - data.keys(), data.keys() - types.keys()
    if missing or unknown:
        raise MalformedRecord(f"{what}: missing fields {sorted(missing)}, unknown fields {sorted(unknown)}")
    for name, value in data.items():
        if not isinstance(value, types[name]) or (isinstance(value, bool) and bool not in types[name]):
            raise MalformedRecord(
                f"{what}: field {name!r} is {value!r}, not {' or '.join(t.__name__ for t in types[name])}"
            )
    return data


@dataclass(frozen=True)
class ReplicaRegistration:
    """What a ready replica puts at ``keys.replica(kid, rid)`` (bound to its lease)."""

    kernel_id: str
    replica_id: str
    host: str
    ip: str
    shell_port: int
    iopub_port: int
    stdin_port: int
    control_port: int
    hb_port: int
    pid: int
    lease: int
    applied_seq: int  # the log seq it had restored to when it registered
    transport: str = "tcp"
    pod: str | None = None
    # How the replica finds the in-place changes a cell made (StateTracker.method), shown by the REST API.
    change_detection: str = ""

    def to_json(self) -> str:
        return _dumps(self)

    @classmethod
    def from_json(cls, raw: str | bytes) -> ReplicaRegistration:
        """Parse a registration read from etcd; :class:`MalformedRecord` says what is wrong with a bad one."""
        text, number = (str,), (int,)
        types: dict[str, tuple[type, ...]] = {
            **dict.fromkeys(("kernel_id", "replica_id", "host", "ip", "transport"), text),
            **dict.fromkeys(("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"), number),
            **dict.fromkeys(("pid", "lease", "applied_seq"), number),
            "pod": (str, type(None)),
            "change_detection": text,
        }
        optional = {"transport", "pod", "change_detection"}
        return cls(**_checked_object(raw, "replica registration", types, set(types) - optional))


@dataclass(frozen=True)
class CellDirective:
    """What the router tells the executor in ``execute_request.metadata["notebookos"]``."""

    seq: int  # the log seq this cell's state delta must be published at
    fence: int  # create_revision of keys.executor(kid) when the decision was committed
    gpus: list[int] = field(default_factory=list)  # device ordinals on the executor's host
    attempt: int = 1
    # The client interrupted the cell while the router committed it: answer it as interrupted, run nothing (its
    # seq is taken, so its empty record still goes out).
    interrupted: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> CellDirective:
        return cls(
            seq=int(raw["seq"]),
            fence=int(raw["fence"]),
            gpus=[int(g) for g in raw.get("gpus", [])],
            attempt=int(raw.get("attempt", 1)),
            interrupted=raw.get("interrupted", False) is True,
        )


@dataclass(frozen=True)
class LogRecord:
    """One state-delta record at ``keys.log(kid, seq)``."""

    seq: int
    kind: str  # "delta" or "lost"; a replica reads a record it cannot parse as "malformed" (never written)
    msg_id: str
    replica_id: str
    # The serialized delta: base64 inline (``payload``) when small, else an object-store key (``payload_ref``).
    payload: str | None = None
    payload_ref: str | None = None
    objects: list[str] = field(default_factory=list)  # object-store keys of out-of-band buffers
    names: list[str] = field(default_factory=list)  # names bound or mutated (for humans and the REST API)
    deleted: list[str] = field(default_factory=list)
    unserializable: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return _dumps(self)

    @classmethod
    def from_json(cls, raw: str | bytes) -> LogRecord:
        return cls(**json.loads(raw))


@dataclass(frozen=True)
class CheckpointPointer:
    """The value of ``keys.checkpoint(kid)``: the namespace as of log record ``seq``."""

    seq: int
    ref: str  # object-store key of the serialized namespace
    objects: list[str] = field(default_factory=list)
    replica_id: str = ""
    # Content digest of the serialized namespace: a restore reads exactly ``ref`` and refuses other bytes.
    digest: str = ""

    def to_json(self) -> str:
        return _dumps(self)

    @classmethod
    def from_json(cls, raw: str | bytes) -> CheckpointPointer:
        return cls(**json.loads(raw))
