"""State records: a cell's delta (or a whole namespace) as compact bytes, and applying them on a replica.

A record is ``b"NBS1"``, a 4-byte little-endian header length, a JSON header and one pickle::

    header  {"k": "delta" | "checkpoint",
             "b": [bound names, in payload order], "d": [deleted names],
             "x": [[size, digest], ...]   out-of-band buffers, in the order the pickle consumes them; a
                                          write-tracked one is [size, digest, lineage] (whole) or
                                          [size, {"l": lineage, "c": [[offset, digest, size], ...]}]
                                          (the chunks that changed: chunks.py); in a checkpoint
                                          also "w": digest (the lineage's base, patched by "c")
             "u": {name: reason}}         names whose value could not be serialized
    payload cloudpickle (protocol 5) of the list of bound values, ALL IN ONE PICKLE (serialization.py)

One pickle for all values is what keeps aliases aliases. Which names must travel together is the delta's business
(state.py includes every name that shares an object with a changed one). Buffers of at least ``threshold`` bytes go
to the object store, addressed by content digest; the header keeps only their size and digest, so the record stays
small enough for etcd. The header is readable without unpickling, which is what garbage collection and the log use.

A replica kernel encodes a cell's delta in two steps, pickling after the reply and uploading after that
(``kernel/statelog.py``: ``serialize_delta``, then ``StateLog.finish``, which sends write-tracked buffers as the
chunks that changed); checkpoints go the same way. Both pickle through :func:`encode_values`.
"""

from __future__ import annotations

import json
import re
import struct
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from jupyter_notebookos.replication.chunks import BufferLineage, TrackedBuffer
from jupyter_notebookos.replication.config import DEFAULT_BUFFER_THRESHOLD
from jupyter_notebookos.replication.objectstore import BufferRef, ObjectStore
from jupyter_notebookos.replication.serialization import (
    SerializationAborted,
    UnreplicatedValue,
    failure_reason,
    pickle_values,
    unpicklable_reason,
    unpickle_values,
)

MAGIC = b"NBS1"
#: A record that names parts (a checkpoint in parts): a NotebookOS that predates parts refuses it as "written by a
#: newer version" instead of reading it as a record that binds nothing.
PARTS_MAGIC = b"NBS2"
_HEADER_LEN = struct.Struct("<I")


class RecordFormatError(ValueError):
    """Bytes that are not a state record of a format this version understands."""


class BufferSink(Protocol):
    """Where :func:`encode_values` puts the out-of-band buffers: the object store, or the stand-in with which a
    replica kernel keeps them as views until their upload (``kernel/statelog.py``)."""

    def put_buffer(self, data: Any, digest: str | None = None) -> BufferRef:
        """Keep ``data``; return its pointer."""
        ...


def unserializable_warning(reasons: Mapping[str, str]) -> str | None:
    """The one user-facing warning about the names in ``reasons`` (name -> why it could not be serialized), or
    None when there are none."""
    if not reasons:
        return None
    names = sorted(reasons)
    detail = "; ".join(f"{n}: {reasons[n]}" for n in names)
    return (
        f"NotebookOS: {len(names)} variable(s) could not be serialized and will not survive a failover "
        f"or migration of this kernel: {', '.join(names)}. The cell itself succeeded. ({detail})"
    )


@dataclass(frozen=True)
class StateRecord:
    """One entry of the state log (``kind="delta"``) or a checkpoint (``kind="checkpoint"``).

    ``bound`` names get the payload's values, in order; ``deleted`` names are removed; ``unserializable``
    maps names whose value could not be serialized to the reason (a replica binds an
    :class:`UnreplicatedValue` there); ``buffers`` point at the out-of-band buffers in the object store
    (whole, or as the changed chunks of a buffer the replicas hold: :class:`chunks.TrackedBuffer`).

    A checkpoint may come in ``parts``: objects in the store that each hold a record (``kind="part"``) of some
    of its names, so that the next checkpoint can name again the parts whose names no record changed since,
    instead of pickling them again (see ``kernel/statelog.py``). Its ``contents`` say, for each part in order,
    the names it holds and the digests of the objects it needs besides itself: a replica that did not write the
    checkpoint learns from them which parts it may name again without reading the parts (empty in a checkpoint
    of an older NotebookOS, which an older NotebookOS reads as before: it ignores the header entry).
    """

    kind: str
    bound: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    buffers: tuple[BufferRef | TrackedBuffer, ...] = ()
    unserializable: Mapping[str, str] = field(default_factory=dict)
    payload: bytes = b""
    parts: tuple[BufferRef, ...] = ()
    contents: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = ()

    def __post_init__(self) -> None:
        if self.contents and len(self.contents) != len(self.parts):
            raise RecordFormatError(
                f"state record header is damaged: {len(self.contents)} part contents for {len(self.parts)} parts"
            )

    @property
    def object_keys(self) -> list[str]:
        """The object-store keys this record needs (what garbage collection must keep)."""
        return [ref.key for ref in self.stored_refs]

    @property
    def stored_refs(self) -> list[BufferRef]:
        """Every object this record itself names in the store (whole buffers, chunks and parts; what a part
        names is in the part's own record)."""
        refs = [r for entry in self.buffers for r in (entry.refs if isinstance(entry, TrackedBuffer) else [entry])]
        return refs + list(self.parts)

    @property
    def buffer_bytes(self) -> int:
        """Bytes of state this record keeps in the object store (for a patch, its chunks only)."""
        return sum(ref.size for ref in self.stored_refs)

    def warning(self) -> str | None:
        """The one user-facing warning about unserializable names, or None when every value replicated."""
        return unserializable_warning(self.unserializable)

    def to_bytes(self) -> bytes:
        """The record as compact bytes (what goes into the state log / a checkpoint object)."""
        header: dict[str, Any] = {"k": self.kind}
        if self.bound:
            header["b"] = list(self.bound)
        if self.deleted:
            header["d"] = list(self.deleted)
        if self.buffers:
            header["x"] = [
                ref.to_header() if isinstance(ref, TrackedBuffer) else [ref.size, ref.digest] for ref in self.buffers
            ]
        if self.unserializable:
            header["u"] = dict(self.unserializable)
        if self.parts:
            header["p"] = [[ref.size, ref.digest] for ref in self.parts]
        if self.contents:
            header["m"] = [[list(names), list(digests)] for names, digests in self.contents]
        head = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        return (PARTS_MAGIC if self.parts else MAGIC) + _HEADER_LEN.pack(len(head)) + head + self.payload

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> StateRecord:
        """Parse a record (header and payload; nothing is unpickled)."""
        raw = bytes(data)
        if raw[:4] not in (MAGIC, PARTS_MAGIC) or len(raw) < 8:
            raise RecordFormatError(
                "not a NotebookOS state record (bad magic): the log or checkpoint was written by something "
                "else or a newer version of jupyter_notebookos."
            )
        (size,) = _HEADER_LEN.unpack_from(raw, 4)
        try:
            header = json.loads(raw[8 : 8 + size])
        except ValueError as exc:
            raise RecordFormatError(f"state record header is damaged: {exc}") from exc
        if (raw[:4] == PARTS_MAGIC) != bool(header.get("p")):
            raise RecordFormatError("state record header is damaged: its parts do not match its magic")
        if not isinstance(header.get("m", []), list):
            raise RecordFormatError("state record header is damaged: its part contents are not a list")
        return cls(
            kind=header["k"],
            bound=tuple(header.get("b", ())),
            deleted=tuple(header.get("d", ())),
            buffers=tuple(_buffer_entry(entry) for entry in header.get("x", ())),
            unserializable=header.get("u", {}),
            payload=raw[8 + size :],
            parts=tuple(_part_entry(entry) for entry in header.get("p", ())),
            contents=tuple(_contents_entry(entry) for entry in header.get("m", ())),
        )


_DIGEST = re.compile(r"^[0-9a-f]{64}$")


def _part_entry(entry: Any) -> BufferRef:
    sized = isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], int) and entry[0] >= 0
    if not (sized and isinstance(entry[1], str) and _DIGEST.match(entry[1])):
        raise RecordFormatError(f"state record header has a damaged part entry: {entry!r}")
    return BufferRef(ObjectStore.buffer_key(entry[1]), entry[0], entry[1])


def _contents_entry(entry: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if isinstance(entry, list) and len(entry) == 2 and all(isinstance(side, list) for side in entry):
        names, digests = entry
        if all(isinstance(n, str) for n in names) and all(isinstance(d, str) and _DIGEST.match(d) for d in digests):
            return tuple(names), tuple(digests)
    raise RecordFormatError(f"state record header has a damaged part contents entry: {entry!r}")


def _buffer_entry(entry: Any) -> BufferRef | TrackedBuffer:
    try:
        return TrackedBuffer.from_header(entry)
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordFormatError(f"state record header has a damaged buffer entry: {exc}") from exc


def encode_values(
    values: Mapping[str, Any],
    *,
    namespace: Mapping[str, Any],
    store: BufferSink,
    kind: str = "delta",
    deleted: Iterable[str] = (),
    threshold: int = DEFAULT_BUFFER_THRESHOLD,
    unserializable: Mapping[str, str] | None = None,
    abort: threading.Event | None = None,
) -> StateRecord:
    """Serialize ``values`` together into a record; large buffers go to ``store``.

    ``namespace`` is the namespace the values live in (for notebook functions). A value that cannot be
    pickled does not stop the others: it is left out and named in ``StateRecord.unserializable``.
    Setting ``abort`` (from another thread) makes it raise :class:`SerializationAborted` soon after.
    """
    remaining = dict(values)
    failed: dict[str, str] = dict(unserializable or {})
    while True:
        try:
            payload, buffers = pickle_values(list(remaining.values()), namespace, threshold, abort)
            break
        except SerializationAborted:
            raise
        except Exception as exc:
            culprits = {n: r for n, v in remaining.items() if (r := unpicklable_reason(v, namespace)) is not None}
            if not culprits:
                # Every value pickles alone but not together (rare): none can be trusted to replicate.
                culprits = dict.fromkeys(remaining, failure_reason(exc))
            failed.update(culprits)
            for name in culprits:
                del remaining[name]
    refs = tuple(store.put_buffer(buf.raw()) for buf in buffers)
    return StateRecord(
        kind=kind,
        bound=tuple(remaining),
        deleted=tuple(n for n in deleted if n not in remaining),
        buffers=refs,
        unserializable=failed,
        payload=payload if remaining else b"",
    )


def load_values(
    record: StateRecord, store: ObjectStore, namespace: dict[str, Any], lineage: BufferLineage | None = None
) -> dict[str, Any]:
    """Unpickle a record's bound values (fetching its buffers); notebook functions get ``namespace``.

    With ``lineage``, patched buffers are applied to this replica's memory of them, in place."""
    if not record.bound:
        return {}
    resolver = lineage if lineage is not None else BufferLineage(None)
    buffers = [resolver.resolve(ref, store) for ref in record.buffers]
    values = unpickle_values(record.payload, buffers, namespace)
    return dict(zip(record.bound, values, strict=True))


def apply_record(
    record: bytes | bytearray | memoryview | StateRecord,
    user_ns: dict[str, Any],
    store: ObjectStore,
    lineage: BufferLineage | None = None,
) -> StateRecord:
    """Apply one record to ``user_ns``: delete its deleted names, bind its bound names.

    Everything is loaded before the namespace is touched, so a failure (a missing buffer, a class that does
    not import here) leaves ``user_ns`` exactly as it was. Names the executor could not serialize are bound
    to an :class:`UnreplicatedValue` that explains itself. Returns the parsed record. (A patched buffer is
    written in place once all its chunks are fetched, before the values are unpickled: see chunks.py.)
    """
    rec = record if isinstance(record, StateRecord) else StateRecord.from_bytes(record)
    values = load_values(rec, store, user_ns, lineage)
    for name in rec.deleted:
        user_ns.pop(name, None)
    user_ns.update(values)
    for name, reason in rec.unserializable.items():
        user_ns[name] = UnreplicatedValue(name, reason)
    return rec
