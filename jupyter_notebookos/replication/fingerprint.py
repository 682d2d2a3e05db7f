"""Fingerprints: what a name's value looked like at one moment, cheap to compare after the next cell.

A fingerprint is the value's identity, type and a digest of its pickle (the same pickler the state records
use). Protocol-5 buffers (numpy arrays) are not copied into the pickle: a buffer that the kernel tracks
writes for (:mod:`writetrack`) contributes its version token, which costs nothing in its size; any other
buffer contributes a fast checksum of its bytes (:func:`digest.buffer_checksum`).
"""

from __future__ import annotations

import hashlib
import io
import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jupyter_notebookos.replication.digest import buffer_checksum
from jupyter_notebookos.replication.serialization import NamespacePickler
from jupyter_notebookos.replication.writetrack import PageWriteTracker, buffer_address

# Values of these types never change in place: comparing id() and type is enough.
ATOMIC_TYPES: frozenset[type] = frozenset(
    {type(None), bool, int, float, complex, str, bytes, range, type(Ellipsis), type(NotImplemented)}
)
# Objects of these types never count as shared state between two names (immutable, or named globally).
_UNSHARED_TYPES: frozenset[type] = ATOMIC_TYPES | frozenset(
    {tuple, frozenset, types.CodeType, types.BuiltinFunctionType, types.ModuleType, types.MethodType}
)


@dataclass(frozen=True)
class Fingerprint:
    """What a name's value looked like at one moment: identity, type and a digest of its content.

    ``digest`` is None for immutable atoms (identity says everything) and for values that cannot be
    pickled (``error`` says why; their in-place changes are invisible).
    """

    oid: int
    type: type
    digest: bytes | None
    error: str | None = None
    # Checksums left for later (see fingerprint(defer_buffers=...)): each buffer's part of the digest in
    # pickle order (done: bytes; left for later: the buffer) and the pickle stream.
    pending: tuple[tuple[bytes | memoryview, ...], bytes] | None = field(default=None, compare=False)

    def same_as(self, other: Fingerprint) -> bool:
        """Whether the value is unchanged (same object, same type, same content)."""
        if self.pending is not None or other.pending is not None:
            raise ValueError("compare settled fingerprints only")
        return (self.oid, self.type, self.digest) == (other.oid, other.type, other.digest)

    def settled(self, writes: PageWriteTracker | None = None) -> Fingerprint:
        """This fingerprint with the checksums it left for later done (itself if none were left).

        A buffer left for later is registered with ``writes`` now (its version token), or checksummed where
        it cannot be tracked: the digest is the one :func:`fingerprint` would have given without deferring."""
        if self.pending is None:
            return self
        parts, data = self.pending
        digest = hashlib.blake2b(digest_size=16)
        for part in parts:
            if isinstance(part, bytes):
                digest.update(part)
                continue
            token = writes.token(part) if writes is not None and part.nbytes >= writes.min_bytes else None
            digest.update(token if token is not None else buffer_checksum(part))
        digest.update(data)
        return Fingerprint(self.oid, self.type, digest.digest(), self.error)


def _shareable(obj: Any, namespace: Mapping[str, Any]) -> bool:
    t = type(obj)
    if t in _UNSHARED_TYPES or isinstance(obj, type):
        return False
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(obj, numpy.dtype):
        # Immutable, and one object for every array of that dtype: counting it would make every float64
        # array in the notebook one group, re-sent whole whenever one of them changes.
        return False
    if isinstance(obj, types.FunctionType):
        # Every instance reaches its class's methods: counting them would tie all instances of a notebook
        # class into one group that is re-sent whenever one of them changes.
        return False
    if isinstance(obj, types.CellType):
        try:
            return not isinstance(obj.cell_contents, type)  # the __class__ cell of methods using super()
        except ValueError:
            return True
    return True


def fingerprint(
    value: Any,
    namespace: Mapping[str, Any],
    shared_ids: list[int] | None = None,
    keep: list[Any] | None = None,
    *,
    defer_buffers: int | None = None,
    writes: PageWriteTracker | None = None,
    live: set[tuple[int, int]] | None = None,
    clear_dirty: bool = False,
) -> Fingerprint:
    """Fingerprint ``value``; append the ids of the mutable objects it reaches to ``shared_ids``.

    ``keep`` receives the pickler's memo, which must stay alive while ids of several values are compared
    (temporaries made while pickling one value could otherwise reuse ids seen in another).
    ``defer_buffers`` leaves the checksums of buffers of at least that many bytes, and the registration of
    those that ``writes`` does not track yet, for :meth:`Fingerprint.settled` (the digest is then the same as
    without it, once settled).
    ``writes`` (when given) supplies version tokens for buffers of at least ``writes.min_bytes`` that it can
    track; the ``(address, size)`` of those it tracks go into ``live``. ``clear_dirty`` forgets the written
    spans the tracker holds for those buffers (after a record wrote them from outside a cell: the replicas
    already have them).
    """
    t = type(value)
    if t in ATOMIC_TYPES or isinstance(value, types.ModuleType):
        return Fingerprint(id(value), t, None)
    if value is namespace:
        return Fingerprint(id(value), t, b"namespace")
    parts: list[bytes | memoryview] = []  # each buffer's part of the digest (a buffer: left for later)
    deferring = False

    def on_buffer(buf: Any) -> bool:
        nonlocal deferring
        try:
            raw = buf.raw()
        except BufferError:
            return True
        defer = defer_buffers is not None and raw.nbytes >= defer_buffers
        if writes is not None and raw.nbytes >= writes.min_bytes:
            # Registering a buffer write-protects its pages (0.2 ms per 100 MB): a new one's is left for later.
            token = writes.token(raw, register=not defer)
            if token is not None:
                parts.append(token)
                if live is not None:
                    live.add((buffer_address(raw) or 0, raw.nbytes))
                if clear_dirty:
                    writes.take_dirty(raw)
                return False
        if defer:
            parts.append(raw)
            deferring = True
        else:
            parts.append(buffer_checksum(raw))
        return False

    stream = io.BytesIO()
    pickler = NamespacePickler(stream, namespace=namespace, buffer_callback=on_buffer, device_to_host=False)
    try:
        pickler.dump(value)
    except Exception as exc:
        if shared_ids is not None:
            shared_ids.append(id(value))
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        return Fingerprint(id(value), t, None, error=reason.rstrip(": "))
    if shared_ids is not None:
        memo = pickler.memo.copy()
        shared_ids.extend(k for k, (_, obj) in memo.items() if _shareable(obj, namespace))
        if keep is not None:
            keep.append(memo)
    if deferring:
        return Fingerprint(id(value), t, None, pending=(tuple(parts), stream.getvalue()))
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        digest.update(part)
    digest.update(stream.getbuffer())
    return Fingerprint(id(value), t, digest.digest())


__all__ = ["ATOMIC_TYPES", "Fingerprint", "fingerprint"]
