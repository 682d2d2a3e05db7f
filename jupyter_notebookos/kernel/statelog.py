"""The replica's side of the state log: a cell's delta as a :class:`LogRecord`, and back.

Publishing goes in two steps once the cell has replied (DESIGN.md section 2, steps 5 and 6):

1. :func:`serialize_delta` pickles the delta with its large buffers out of band. The buffers are *views of the
   live objects* (no copy, no hashing), so this costs one pickling of the small values. It runs once the client
   has the reply (CellPublisher.publish): the capture before the reply fingerprinted each value, which
   is where we learn which names cannot be serialized, in time to warn in the cell's output.
2. :meth:`StateLog.finish` then uploads those buffers (content-addressed; a write-tracked buffer
   the other replicas already hold goes as the chunks written since the previous record, see
   replication/chunks.py) and, when the serialized delta is too large for etcd, the delta itself, and returns
   the :class:`LogRecord` to publish.

Between the two the namespace must not change: the replica kernel runs nothing else until the record is
published (``CellPublisher.quiesce``).

Checkpoints go the same two steps (:meth:`StateLog.serialize_checkpoint`, :meth:`StateLog.finish_checkpoint`); a
replacement replica reads one back with :meth:`StateLog.read_checkpoint`, and a replica that becomes the executor
learns the parts of the one in force from :meth:`StateLog.read_parts` (so that its next checkpoint pickles only
what changed since, like that of the replica that wrote it). Once a checkpoint is committed,
:func:`collect_unreferenced` deletes from the kernel's store what it superseded.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from jupyter_notebookos.kernel.settings import INLINE_PAYLOAD_LIMIT
from jupyter_notebookos.replication.chunks import BufferLineage, TrackedBuffer
from jupyter_notebookos.replication.digest import as_bytes_view, content_digest
from jupyter_notebookos.replication.objectstore import BufferCorruptError, BufferMissingError, BufferRef, ObjectStore
from jupyter_notebookos.replication.protocol import CheckpointPointer, LogRecord
from jupyter_notebookos.replication.records import RecordFormatError, StateRecord, encode_values
from jupyter_notebookos.replication.state import StateDelta

log = logging.getLogger(__name__)

#: A checkpoint's groups of names that pickle to less than this (and hold no out-of-band buffer) share one part.
SMALL_PART_BYTES = 64 * 1024
#: The most parts a checkpoint has (its pointer in etcd lists their keys).
MAX_CHECKPOINT_PARTS = 256


class _DeferredStore:
    """Takes the place of the object store while a delta is pickled (before its upload).

    It keeps each out-of-band buffer as a view of the user's object and hands out placeholder pointers;
    :meth:`StateLog.finish` uploads the views and puts the real pointers into the record.
    """

    def __init__(self) -> None:
        self.views: list[memoryview] = []

    def put_buffer(self, data: Any, digest: str | None = None) -> BufferRef:
        view = as_bytes_view(data)
        self.views.append(view)
        n = len(self.views) - 1
        return BufferRef(key=f"pending/{n}", size=len(view), digest=f"pending-{n}")


@dataclass
class PendingDelta:
    """A cell's delta, pickled; its large buffers are still views of the user's objects."""

    record: StateRecord
    views: list[memoryview]
    names: list[str]
    deleted: list[str]

    @property
    def unserializable(self) -> list[str]:
        """Names whose value could not be serialized (they will not survive a failover or migration)."""
        return sorted(self.record.unserializable)

    @property
    def empty(self) -> bool:
        """Whether the cell changed nothing a replica needs."""
        return not (self.record.bound or self.record.deleted or self.record.unserializable)


def serialize_delta(delta: StateDelta | None, threshold: int) -> PendingDelta:
    """Pickle ``delta`` (None: an empty delta) with buffers of at least ``threshold`` bytes out of band."""
    if delta is None or delta.is_empty():
        return PendingDelta(StateRecord(kind="delta"), [], [], [])
    store = _DeferredStore()
    record = encode_values(
        delta.values,
        namespace=delta.namespace,
        store=store,
        kind="delta",
        deleted=delta.deleted,
        threshold=threshold,
        unserializable=delta.unpicklable,
    )
    return PendingDelta(record, store.views, sorted(delta.bound), sorted(delta.deleted))


class StateLog:
    """Builds and reads the log records and checkpoints of one kernel, against its object store."""

    def __init__(
        self,
        store: ObjectStore,
        replica_id: str,
        *,
        inline_limit: int = INLINE_PAYLOAD_LIMIT,
        lineage: BufferLineage | None = None,
    ):
        self.store = store
        self.replica_id = replica_id
        self.inline_limit = inline_limit
        # The replica's buffer lineages (its state tracker's): with it, records carry changed chunks only.
        self.lineage = lineage

    def _upload(self, view: memoryview) -> BufferRef | TrackedBuffer:
        if self.lineage is None:
            return self.store.put_buffer(view)
        return self.lineage.encode(view, self.store)

    def finish(self, pending: PendingDelta, seq: int, msg_id: str) -> LogRecord:
        """Upload ``pending``'s buffers (and its payload when large); return the record to publish."""
        if pending.empty:
            return LogRecord(seq=seq, kind="delta", msg_id=msg_id, replica_id=self.replica_id)
        refs = tuple(self._upload(view) for view in pending.views)
        record = dataclasses.replace(pending.record, buffers=refs)
        data = record.to_bytes()
        objects = record.object_keys
        payload: str | None = None
        payload_ref: str | None = None
        if len(data) <= self.inline_limit:
            payload = base64.b64encode(data).decode()
        else:
            payload_ref = self.store.put_buffer(data).key
            objects.append(payload_ref)
        if self.lineage is not None:
            self.lineage.commit(refs)
        return LogRecord(
            seq=seq,
            kind="delta",
            msg_id=msg_id,
            replica_id=self.replica_id,
            payload=payload,
            payload_ref=payload_ref,
            objects=objects,
            names=list(pending.names),
            deleted=list(pending.deleted),
            unserializable=pending.unserializable,
        )

    def empty_record(self, seq: int, msg_id: str) -> LogRecord:
        """The record of a directed cell that changed nothing (or was aborted before it ran)."""
        return LogRecord(seq=seq, kind="delta", msg_id=msg_id, replica_id=self.replica_id)

    def load(self, record: LogRecord) -> StateRecord | None:
        """The state record a log record carries, or None when there is nothing to apply."""
        if record.kind != "delta":
            return None
        if record.payload is not None:
            return StateRecord.from_bytes(base64.b64decode(record.payload))
        if record.payload_ref is not None:
            return StateRecord.from_bytes(self._read_object(record.payload_ref))
        return None

    def _read_object(self, key: str) -> bytes:
        """A content-addressed object by key, checked against the digest its key names."""
        data = bytes(self.store.fs.cat_file(f"{self.store.root}/{key}"))
        if content_digest(data) != key.rsplit("/", 1)[-1]:
            raise BufferCorruptError(f"object {key} in {self.store.url} does not match its digest: it is damaged.")
        return data

    # -- checkpoints ----------------------------------------------------------------------------------

    @staticmethod
    def serialize_checkpoint(
        ns: dict[str, Any],
        groups: Iterable[Iterable[str]],
        threshold: int,
        abort: threading.Event | None = None,
        max_parts: int = MAX_CHECKPOINT_PARTS,
    ) -> list[PendingDelta]:
        """Pickle the namespace's names, each of ``groups`` on its own (names that share an object must be in
        one group), with large buffers as views; upload with :meth:`finish_checkpoint`. Groups that come out
        small (no out-of-band buffer, under SMALL_PART_BYTES) are pickled again together, as one part: a part
        per loop counter would be an object per name in the store. So are the groups beyond ``max_parts`` - 1
        (the checkpoint pointer in etcd lists every part). Setting ``abort`` (from another thread) stops it with
        SerializationAborted."""
        parts: list[PendingDelta] = []
        rest: list[str] = []
        for group in groups:
            if isinstance(group, str):
                raise TypeError(f"serialize_checkpoint takes groups of names, not a name ({group!r})")
            names = [n for n in group if n in ns]
            if len(parts) >= max_parts - 1:
                rest.extend(names)
                continue
            if not names:
                continue
            part = _serialize_part(ns, names, threshold, abort)
            if not part.views and len(part.record.payload) < SMALL_PART_BYTES:
                rest.extend(names)
            else:
                parts.append(part)
        if rest:
            parts.append(_serialize_part(ns, rest, threshold, abort))
        return parts

    def finish_checkpoint(
        self, pending: Iterable[PendingDelta], seq: int, kept: Iterable[CheckpointPart] = ()
    ) -> tuple[CheckpointPointer, list[CheckpointPart]]:
        """Upload the pickled parts and write the checkpoint for log record ``seq``: the ``pending`` parts and the
        ``kept`` ones (parts of the kernel's current checkpoint, named again, not uploaded again). Returns its
        pointer and its parts. A buffer the replicas hold under a lineage is named by its layout, not uploaded
        again (chunks.py)."""
        lineage = self.lineage
        parts = list(kept)
        for part in pending:
            refs = tuple(
                lineage.encode_whole(view, self.store) if lineage is not None else self.store.put_buffer(view)
                for view in part.views
            )
            record = dataclasses.replace(part.record, kind="part", buffers=refs)
            ref = self.store.put_buffer(record.to_bytes())
            if lineage is not None:
                lineage.commit(refs)
            parts.append(CheckpointPart.of(record, ref))
        data = StateRecord(
            kind="checkpoint",
            parts=tuple(part.ref for part in parts),
            contents=tuple(part.contents for part in parts),
        ).to_bytes()
        key = self.store.put_checkpoint(seq, data)
        objects = sorted({obj for part in parts for obj in part.objects})
        pointer = CheckpointPointer(
            seq=seq, ref=key, objects=objects, replica_id=self.replica_id, digest=content_digest(data)
        )
        return pointer, parts

    def read_checkpoint(self, pointer: CheckpointPointer) -> Checkpoint:
        """The checkpoint a pointer names: exactly its ``ref``, refused unless it matches its digest (never
        unpickled otherwise), and its parts, each refused unless it matches the digest its key names."""
        whole = self._checkpoint_object(pointer)
        if not whole.parts:  # one piece (an older NotebookOS): nothing the next checkpoint can name again
            return Checkpoint(pointer.seq, [whole], [])
        records: list[StateRecord] = []
        parts: list[CheckpointPart] = []
        for ref in whole.parts:
            try:
                record = StateRecord.from_bytes(self._read_object(ref.key))
            except FileNotFoundError as exc:
                raise BufferMissingError(
                    f"part {ref.key} of checkpoint {pointer.ref} is missing from the object store {self.store.url}"
                ) from exc
            if record.kind != "part":
                raise RecordFormatError(f"part {ref.key} of checkpoint {pointer.ref} is a {record.kind!r} record")
            records.append(record)
            parts.append(CheckpointPart.of(record, ref))
        return Checkpoint(pointer.seq, records, parts)

    def read_parts(self, pointer: CheckpointPointer) -> list[CheckpointPart] | None:
        """The parts of the checkpoint a pointer names, from the list in the checkpoint object (refused unless
        it matches its digest; the parts themselves are not read); None when it does not list what its parts
        hold (one piece, or written by an older NotebookOS)."""
        whole = self._checkpoint_object(pointer)
        if not whole.parts or not whole.contents:
            return None
        return [CheckpointPart.listed(ref, contents) for ref, contents in zip(whole.parts, whole.contents, strict=True)]

    def _checkpoint_object(self, pointer: CheckpointPointer) -> StateRecord:
        """The checkpoint object a pointer names, parsed (nothing unpickled), checked against its digest."""
        if not pointer.digest:
            raise BufferCorruptError(
                f"checkpoint {pointer.ref} has no digest in its pointer (written by an older NotebookOS): it cannot "
                "be verified, so it is not restored"
            )
        try:
            data = bytes(self.store.fs.cat_file(f"{self.store.root}/{pointer.ref}"))
        except FileNotFoundError as exc:
            raise BufferMissingError(
                f"checkpoint {pointer.ref} is missing from the object store {self.store.url}"
            ) from exc
        if content_digest(data) != pointer.digest:
            raise BufferCorruptError(
                f"checkpoint {pointer.ref} in {self.store.url} does not match its digest: it was changed or damaged "
                "in the store, and is refused"
            )
        return StateRecord.from_bytes(data)


def _serialize_part(
    ns: dict[str, Any], names: list[str], threshold: int, abort: threading.Event | None
) -> PendingDelta:
    store = _DeferredStore()
    record = encode_values(
        {n: ns[n] for n in names},
        namespace=ns,
        store=store,
        kind="checkpoint",
        threshold=threshold,
        abort=abort,
    )
    return PendingDelta(record, store.views, sorted(record.bound), [])


@dataclass(frozen=True)
class CheckpointPart:
    """One part of a checkpoint in the object store: the names it holds and every object it needs (its own
    included), so that a later checkpoint can name it again when no record changed those names."""

    names: frozenset[str]
    ref: BufferRef
    objects: tuple[str, ...]

    @classmethod
    def of(cls, record: StateRecord, ref: BufferRef) -> CheckpointPart:
        """The part ``record`` is, stored at ``ref``."""
        return cls(frozenset(record.bound) | frozenset(record.unserializable), ref, (ref.key, *record.object_keys))

    @classmethod
    def listed(cls, ref: BufferRef, contents: tuple[tuple[str, ...], tuple[str, ...]]) -> CheckpointPart:
        """The part as its checkpoint lists it (:attr:`contents`)."""
        names, digests = contents
        return cls(frozenset(names), ref, (ref.key, *(ObjectStore.buffer_key(d) for d in digests)))

    @property
    def contents(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """What the checkpoint object lists of this part: its names, and the digests of the other objects it
        needs (every object in the store is named by its digest, ObjectStore.buffer_key)."""
        return tuple(sorted(self.names)), tuple(key.rsplit("/", 1)[-1] for key in self.objects[1:])


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint read back: the records to apply (its parts, or the whole namespace in one piece, as written
    by an older NotebookOS) and its parts."""

    seq: int
    records: list[StateRecord]
    parts: list[CheckpointPart]


# -- garbage collection ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GarbageReport:
    """What one garbage collection did: the buffers and checkpoints it removed, and what it kept."""

    deleted_buffers: tuple[str, ...] = ()
    deleted_checkpoints: tuple[int, ...] = ()
    kept_buffers: int = 0
    kept_too_young: tuple[str, ...] = field(default_factory=tuple)

    def __str__(self) -> str:
        return (
            f"object store GC: deleted {len(self.deleted_buffers)} buffer(s) and "
            f"{len(self.deleted_checkpoints)} old checkpoint(s); kept {self.kept_buffers} referenced "
            f"buffer(s) and {len(self.kept_too_young)} unreferenced buffer(s) younger than the grace period"
        )


def collect_unreferenced(
    store: ObjectStore, checkpoint_seq: int | None, referenced: Iterable[str], *, grace_seconds: float = 600.0
) -> GarbageReport:
    """Delete the buffers not in ``referenced`` (older than ``grace_seconds``) and the checkpoints older than
    ``checkpoint_seq`` (the one the kernel's checkpoint pointer names; newer ones are kept: one may be on its
    way to being committed). This is what the executor runs after it committed a checkpoint, with the keys the
    pointer and the log records after it name (:class:`~jupyter_notebookos.replication.protocol.LogRecord`
    ``objects``), so it never has to read a record's payload."""
    keep = set(referenced)
    deleted: list[str] = []
    young: list[str] = []
    kept = 0
    for key in list(store.buffer_keys()):
        if key in keep:
            kept += 1
            continue
        age = store.age_seconds(key)
        if grace_seconds > 0 and (age is None or age < grace_seconds):
            young.append(key)
            continue
        store.delete(key)
        deleted.append(key)
    old = [seq for seq in store.checkpoint_seqs() if checkpoint_seq is not None and seq < checkpoint_seq]
    for seq in old:
        store.delete(store.checkpoint_key(seq))
    return GarbageReport(tuple(deleted), tuple(old), kept, tuple(young))
