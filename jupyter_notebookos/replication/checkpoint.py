"""Checkpoints, restoring a replacement replica, and garbage collection of the object store.

A checkpoint is a state record of kind ``"checkpoint"`` that binds every user name of a namespace, written
with the same serializer as the per-cell deltas (so aliases, notebook classes and large buffers behave the
same way). The log is compacted like this (the caller owns the log; see DESIGN.md section 3)::

    record = make_checkpoint(user_ns, store)              # on a replica that has applied record n
    store.put_checkpoint(n, record.to_bytes())
    ... delete log records <= n from etcd ...
    collect_garbage(store, later_records)                 # buffers only older records needed

and a replacement replica starts with::

    seq, data = store.latest_checkpoint()
    restore(data, records_after(seq), store, shell.user_ns)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jupyter_notebookos.replication.chunks import BufferLineage
from jupyter_notebookos.replication.config import DEFAULT_BUFFER_THRESHOLD
from jupyter_notebookos.replication.objectstore import ObjectStore
from jupyter_notebookos.replication.serialization import StateRecord, apply_record, encode_values
from jupyter_notebookos.replication.state import is_user_name


def make_checkpoint(
    user_ns: Mapping[str, Any],
    store: ObjectStore,
    *,
    hidden: Mapping[str, Any] | None = None,
    threshold: int = DEFAULT_BUFFER_THRESHOLD,
    lineage: BufferLineage | None = None,
) -> StateRecord:
    """Serialize every user variable of ``user_ns`` (one pickle) into a checkpoint record.

    Large buffers go to ``store``, whole; with ``lineage`` (the executor's) under their lineage ids, so that
    a replica restored from the checkpoint can apply later records that patch them.
    ``record.unserializable`` names the values that could not be saved.
    """
    values = {n: v for n, v in list(user_ns.items()) if is_user_name(n, v, hidden)}
    return encode_values(
        values, namespace=user_ns, store=store, kind="checkpoint", threshold=threshold, lineage=lineage
    )


def restore(
    checkpoint: bytes | StateRecord | None,
    records: Iterable[bytes | StateRecord],
    store: ObjectStore,
    user_ns: dict[str, Any] | None = None,
    lineage: BufferLineage | None = None,
) -> dict[str, Any]:
    """Rebuild a namespace from a checkpoint (or from nothing) and the log records written after it.

    Values are loaded into ``user_ns`` (a replica passes its shell's namespace, so that notebook functions
    get it as their globals) or into a new dict; returns that namespace.
    """
    ns: dict[str, Any] = user_ns if user_ns is not None else {"__builtins__": __builtins__}
    lineage = lineage if lineage is not None else BufferLineage(None)  # patches apply to what was loaded
    if checkpoint is not None:
        apply_record(checkpoint, ns, store, lineage)
    for record in records:
        apply_record(record, ns, store, lineage)
    return ns


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


def collect_garbage(
    store: ObjectStore,
    records_after_checkpoint: Iterable[bytes | StateRecord],
    *,
    grace_seconds: float = 600.0,
) -> GarbageReport:
    """Delete buffers that neither the latest checkpoint nor the given later log records refer to.

    Checkpoints older than the latest are deleted too. Unreferenced buffers younger than ``grace_seconds``
    are kept: an executor uploads a record's buffers *before* the record reaches the log, so a young
    unreferenced buffer may belong to a record that is about to be committed.
    """
    seqs = store.checkpoint_seqs()
    referenced: set[str] = set()
    if seqs:
        referenced.update(StateRecord.from_bytes(store.get_checkpoint(seqs[-1])).object_keys)
    for record in records_after_checkpoint:
        rec = record if isinstance(record, StateRecord) else StateRecord.from_bytes(record)
        referenced.update(rec.object_keys)
    return collect_unreferenced(store, seqs[-1] if seqs else None, referenced, grace_seconds=grace_seconds)


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
