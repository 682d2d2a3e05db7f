"""Large buffers sent as the chunks that changed: a cell that writes k bytes of a 1 GB array publishes O(k).

Every replica holds each large, write-tracked buffer under a *lineage* id that all replicas share: the id the
executor gave the buffer when it first sent it whole. Later records send only the fixed-size chunks
(:data:`CHUNK_BYTES`) that the kernel saw written since the previous record (writetrack.py says which
pages), each stored content-addressed in the object store (``buffers/<digest>``, checked against its digest
when read), and the replicas patch those chunks into the memory they already hold for that lineage, in
place. The array object a record binds is rebuilt on that same memory (no copy of the unchanged bytes).

Why this is safe: a chunk is read for upload after its written pages were taken from the tracker, so a write
that lands later is either already in the upload or still recorded as written (in the kernel or the tracker)
and goes in a later record; records are applied strictly in order, so a replica's memory for a lineage is
always the executor's as of the previous record that carried it. A replica that does not hold the lineage
(it restored from a checkpoint written without it, or its memory was replaced) cannot apply the patch and
says so.

Checkpoints cost what changed too: every replica keeps, per lineage, its *layout*: the whole buffer that
started it and the latest chunk at each offset patched since. All replicas apply the same records in the
same order, so their layouts are the same, and a checkpoint names a lineage's layout (base and chunks, already
in the store) instead of hashing and uploading the buffer again. A replica restored from it loads the base,
patches the chunks in and holds the lineage, so it can apply the records after it. Garbage collection keeps
what the checkpoint and the log name, which is every object of every replica's layouts. A layout changes only
with what was uploaded and committed (:meth:`BufferLineage.commit`): a record whose upload failed leaves it
as the other replicas know it.

A buffer the kernel does not track (below the tracking size, read-only, a file mapping, or no write tracking
on this machine) is sent whole, as before.
"""

from __future__ import annotations

import contextlib
import secrets
import sys
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy

from jupyter_notebookos.replication.digest import as_bytes_view
from jupyter_notebookos.replication.objectstore import BufferRef, ObjectStore
from jupyter_notebookos.replication.writetrack import PageWriteTracker, buffer_address

#: Chunk size of patches: a 1 MiB change to an unaligned offset touches at most 5 chunks (1.25 MiB).
CHUNK_BYTES = 256 * 1024


class LineageMissingError(LookupError):
    """A record patches a buffer this replica does not hold (the message says what to do)."""


@dataclass(frozen=True)
class TrackedBuffer:
    """A buffer of a lineage, in a record: whole (``whole``), as the chunks that changed (``chunks``), or, in a
    checkpoint, both: the whole buffer the lineage started with and the chunks patched into it since."""

    lineage: str
    size: int
    whole: BufferRef | None = None
    chunks: tuple[tuple[int, BufferRef], ...] = ()  # (byte offset, chunk)

    @property
    def refs(self) -> list[BufferRef]:
        """The objects this entry needs from the store."""
        return ([self.whole] if self.whole is not None else []) + [ref for _, ref in self.chunks]

    @property
    def key(self) -> str:
        """The first object's key (for code that lists one key per buffer)."""
        refs = self.refs
        return refs[0].key if refs else f"lineage/{self.lineage}"

    def to_header(self) -> list[Any]:
        """The entry in a record header's buffer list."""
        if self.whole is not None and not self.chunks:
            return [self.size, self.whole.digest, self.lineage]
        entry: dict[str, Any] = {"l": self.lineage, "c": [[off, ref.digest, ref.size] for off, ref in self.chunks]}
        if self.whole is not None:
            entry["w"] = self.whole.digest
        return [self.size, entry]

    @classmethod
    def from_header(cls, entry: list[Any]) -> TrackedBuffer | BufferRef:
        """Parse a header entry: ``[size, digest]`` (untracked), ``[size, digest, lineage]`` (whole) or
        ``[size, {"l": lineage, "c": chunks}]`` (a patch; with ``"w": digest``, a checkpoint's layout)."""
        if not isinstance(entry, list) or len(entry) not in (2, 3) or not isinstance(entry[0], int):
            raise ValueError(f"bad buffer entry {entry!r}")
        size = entry[0]
        if isinstance(entry[1], dict):
            chunks = tuple(
                (int(off), BufferRef(ObjectStore.buffer_key(str(d)), int(n), str(d))) for off, d, n in entry[1]["c"]
            )
            for off, ref in chunks:
                if off < 0 or ref.size <= 0 or off + ref.size > size:
                    raise ValueError(f"chunk at {off} ({ref.size} bytes) outside a buffer of {size} bytes")
            base = entry[1].get("w")
            whole = BufferRef(ObjectStore.buffer_key(str(base)), size, str(base)) if base is not None else None
            return cls(lineage=str(entry[1]["l"]), size=size, whole=whole, chunks=chunks)
        whole = BufferRef(ObjectStore.buffer_key(str(entry[1])), size, str(entry[1]))
        return cls(lineage=str(entry[2]), size=size, whole=whole) if len(entry) == 3 else whole


def _chunk_offsets(spans: list[tuple[int, int]], size: int) -> list[int]:
    offsets: set[int] = set()
    for start, end in spans:
        first, last = start // CHUNK_BYTES, (min(end, size) - 1) // CHUNK_BYTES
        offsets.update(i * CHUNK_BYTES for i in range(first, last + 1))
    return sorted(offsets)


@dataclass
class _Layout:
    """Where a lineage's bytes are in the store: the whole buffer it started with, patched by these chunks."""

    base: BufferRef
    patches: dict[int, BufferRef]  # byte offset -> the latest chunk written there

    def entry(self, lineage: str) -> TrackedBuffer:
        return TrackedBuffer(lineage, self.base.size, whole=self.base, chunks=tuple(sorted(self.patches.items())))


class BufferLineage:
    """One replica's lineages: which of its buffers the other replicas hold, and under what id.

    On the executor, :meth:`encode` turns a record's buffer into a whole upload (a new lineage) or a patch,
    and :meth:`encode_whole` a checkpoint's buffer into its lineage's layout; on a follower, :meth:`resolve`
    turns a record's entry into the buffer to unpickle (patched in place for a patch). A replica that becomes
    the executor patches (and checkpoints) the lineages it received: both sides share the index.
    """

    def __init__(self, writes: PageWriteTracker | None) -> None:
        self.writes = writes
        self._lock = threading.Lock()
        # (address, size) -> (lineage, registration): valid while the tracker keeps that registration.
        self._by_address: dict[tuple[int, int], tuple[str, int]] = {}
        self._memory: dict[str, numpy.ndarray] = {}  # lineage -> the memory this replica loaded for it
        # lineage -> the object whose buffer this replica sent whole (weakly: the user's array owns it)
        self._sent: dict[str, weakref.ref[Any]] = {}
        self._layouts: dict[str, _Layout] = {}  # lineage -> its bytes in the store, as of the last record

    # -- executor --------------------------------------------------------------------------------------

    def encode(self, view: memoryview, store: ObjectStore) -> BufferRef | TrackedBuffer:
        """Upload ``view`` as a patch of its lineage when the other replicas hold it, else whole."""
        view = as_bytes_view(view)
        writes, address = self.writes, buffer_address(view)
        if writes is None or address is None:
            return store.put_buffer(view)
        key = (address, view.nbytes)
        writes.token(view)  # registers it if it is not yet tracked
        registration = writes.registration(view)
        spans = writes.take_dirty(view)  # before reading: later writes stay recorded for the next record
        with self._lock:
            known = self._by_address.get(key)
        if registration is None or spans is None:
            return store.put_buffer(view)
        if known is not None and known[1] == registration:
            chunks = tuple(
                (off, store.put_buffer(view[off : off + CHUNK_BYTES])) for off in _chunk_offsets(spans, len(view))
            )
            return TrackedBuffer(lineage=known[0], size=len(view), chunks=chunks)
        lineage = secrets.token_hex(12)
        whole = store.put_buffer(view)
        with self._lock:
            self._by_address[key] = (lineage, registration)
            with contextlib.suppress(TypeError):  # an exporter without weak references: patches go whole
                self._sent[lineage] = weakref.ref(_owner(view.obj))
        return TrackedBuffer(lineage=lineage, size=len(view), whole=whole)

    def encode_whole(self, view: memoryview, store: ObjectStore) -> BufferRef | TrackedBuffer:
        """``view`` complete, for a checkpoint: its lineage's layout when it has one (nothing read or
        uploaded: the bytes are in the store already), else uploaded whole."""
        view = as_bytes_view(view)
        address, writes = buffer_address(view), self.writes
        if writes is None or address is None:
            return store.put_buffer(view)
        with self._lock:
            known = self._by_address.get((address, view.nbytes))
            layout = self._layouts.get(known[0]) if known is not None else None
        if known is None or known[1] != writes.registration(view):
            return store.put_buffer(view)
        if layout is not None and layout.base.size == view.nbytes:
            # As of the last record: writes since are still recorded as written and go in the next one.
            return layout.entry(known[0])
        return TrackedBuffer(lineage=known[0], size=len(view), whole=store.put_buffer(view))

    def commit(self, entries: Iterable[BufferRef | TrackedBuffer]) -> None:
        """Entries uploaded for a record or checkpoint that will be published: their lineages' layouts now
        include them (not before: a record lost on its way leaves the layouts as the other replicas have them)."""
        with self._lock:
            for entry in entries:
                if not isinstance(entry, TrackedBuffer):
                    continue
                if entry.whole is not None:
                    self._layouts[entry.lineage] = _Layout(entry.whole, dict(entry.chunks))
                elif (layout := self._layouts.get(entry.lineage)) is not None:
                    layout.patches.update(entry.chunks)

    # -- follower --------------------------------------------------------------------------------------

    def resolve(self, entry: BufferRef | TrackedBuffer, store: ObjectStore) -> Any:
        """The buffer to unpickle for ``entry`` (fetched, or this replica's memory patched in place)."""
        if isinstance(entry, BufferRef):
            return store.get_buffer(entry)
        if entry.whole is not None:
            # A uint8 array over the fetched bytes: arrays unpickled from it keep it as their base, which is
            # how prune() knows when nothing uses it any more.
            loaded = numpy.empty(entry.size, dtype=numpy.uint8)  # not zero-filled: see get_buffer_into
            view = memoryview(loaded)  # type: ignore[arg-type]
            store.get_buffer_into(entry.whole, view)
            for off, ref in entry.chunks:  # a checkpoint's layout: the chunks patched in since
                view[off : off + ref.size] = store.get_buffer(ref)
            self._adopt(entry.lineage, loaded)
            self.commit([entry])
            return loaded
        held = self._memory_of(entry.lineage)
        if held is None or len(held) != entry.size:
            raise LineageMissingError(
                f"the record patches buffer {entry.lineage} ({entry.size} bytes), which this replica does not "
                "hold; it needs a checkpoint taken after that buffer was sent whole (restart this replica)."
            )
        data = [(off, store.get_buffer(ref)) for off, ref in entry.chunks]  # all fetched before any write
        view = memoryview(held)  # type: ignore[arg-type]
        for off, chunk in data:
            view[off : off + len(chunk)] = chunk
        self.commit([entry])
        return held

    def _memory_of(self, lineage: str) -> numpy.ndarray | None:
        """This replica's memory of ``lineage``: loaded here, or the user's object it sent as executor."""
        with self._lock:
            held = self._memory.get(lineage)
            if held is not None:
                return held
            ref = self._sent.get(lineage)
        obj = ref() if ref is not None else None
        if obj is None:
            return None
        if _is_torch_storage(obj):
            # Followed through the weak reference for as long as the storage lives (its refcount says nothing
            # of the tensors on it, so it cannot move to _memory, which prune() empties by refcount).
            return torch_storage_bytes(obj)
        try:
            held = numpy.frombuffer(obj, dtype=numpy.uint8) if not isinstance(obj, numpy.ndarray) else obj
            held = held.reshape(-1).view(numpy.uint8) if held.flags.c_contiguous else None
        except (TypeError, ValueError):
            return None
        if held is None or not held.flags.writeable:
            return None
        with self._lock:
            self._sent.pop(lineage, None)
            self._memory[lineage] = held  # from now on it is followed like memory loaded here
        return held

    def _adopt(self, lineage: str, loaded: numpy.ndarray) -> None:
        """Keep ``loaded`` as this replica's memory of ``lineage`` (and register it, for when it executes)."""
        with self._lock:
            self._memory[lineage] = loaded
        writes, view = self.writes, memoryview(loaded)  # type: ignore[arg-type]
        if writes is not None and writes.token(view) is not None:
            address, registration = buffer_address(view), writes.registration(view)
            if address is not None and registration is not None:
                with self._lock:
                    self._by_address[(address, view.nbytes)] = (lineage, registration)

    def prune(self) -> None:
        """Forget memory nothing else uses any more (its arrays were deleted or rebound to new buffers)."""
        with self._lock:
            for lineage in list(self._memory):
                if sys.getrefcount(self._memory[lineage]) <= 2:  # this dict and getrefcount's argument
                    del self._memory[lineage]
            for lineage in [k for k, ref in self._sent.items() if ref() is None]:
                del self._sent[lineage]
            writes = self.writes
            if writes is not None:
                for key, (_, registration) in list(self._by_address.items()):
                    if writes.registration_at(key) != registration:
                        del self._by_address[key]
            live = {lineage for lineage, _ in self._by_address.values()} | set(self._memory) | set(self._sent)
            for lineage in [k for k in self._layouts if k not in live]:
                del self._layouts[lineage]

    def clear(self) -> None:
        """Forget every lineage (the namespace was replaced: everything goes whole again)."""
        with self._lock:
            self._memory.clear()
            self._sent.clear()
            self._by_address.clear()
            self._layouts.clear()

    @property
    def lineages(self) -> int:
        """How many lineages this replica knows (held here or sent from here)."""
        with self._lock:
            return len({lineage for lineage, _ in self._by_address.values()} | set(self._memory))


def _owner(exporter: Any) -> Any:
    """What to hold (weakly) for a buffer sent whole: its exporter, except for a torch storage's bytes.

    Those are exported through a uint8 array over a temporary tensor (``serialization._reduce_torch``), both gone
    once the record is written; the storage's Python object lives exactly as long as the storage."""
    torch = sys.modules.get("torch")
    base = exporter.base if isinstance(exporter, numpy.ndarray) else None
    if torch is None or not isinstance(base, torch.Tensor) or base.device.type != "cpu":
        return exporter
    storage = base.untyped_storage()
    if storage.data_ptr() != base.data_ptr() or storage.nbytes() != exporter.nbytes:
        return exporter
    return storage


def _is_torch_storage(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.UntypedStorage)


def torch_storage_bytes(storage: Any) -> numpy.ndarray:
    """A CPU torch storage's memory as a flat uint8 array (which keeps the storage alive)."""
    torch = sys.modules["torch"]
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,)).numpy()


__all__ = ["CHUNK_BYTES", "BufferLineage", "LineageMissingError", "TrackedBuffer"]
