"""Fingerprints: what a name's value looked like at one moment, cheap to compare after the next cell.

A fingerprint is the value's identity, type and a digest of its pickle (the same pickler the state records
use). Protocol-5 buffers (numpy arrays) are not copied into the pickle: a buffer that the kernel tracks
writes for (:mod:`writetrack`) contributes its version token, which costs nothing in its size; any other
buffer contributes a fast checksum of its bytes (:func:`digest.buffer_checksum`).

A fingerprint also keeps what the state tracker needs to leave the value alone while no cell can reach it
(state.py): the global names the notebook code reachable from it mentions (:mod:`reach`), the tracked
buffers it holds, and whether it holds a large buffer that only a checksum can check.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import hashlib
import itertools
import marshal
import operator
import sys
import threading
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jupyter_notebookos.replication import reach as _reach
from jupyter_notebookos.replication.digest import buffer_checksum
from jupyter_notebookos.replication.serialization import AbortableWriter, NamespacePickler, SerializationAborted
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
    # pickle order (done: bytes; left for later: the buffer) and the pickle stream's digest.
    pending: tuple[tuple[bytes | memoryview, ...], bytes] | None = field(default=None, compare=False)
    # The global names that the notebook code reachable from the value mentions (None: any name, see reach.py).
    reach: frozenset[str] | None = field(default=frozenset(), compare=False)
    # The (address, size) of the write-tracked buffers it holds.
    buffers: frozenset[tuple[int, int]] = field(default=frozenset(), compare=False)
    # Whether it holds a buffer of at least the tracking size that only a checksum can check.
    untracked: bool = field(default=False, compare=False)
    # The ids of the objects it shared with other names when it was fingerprinted (set by the state tracker).
    shared: frozenset[int] = field(default=frozenset(), compare=False)

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
        buffers, untracked = set(self.buffers), self.untracked
        for part in parts:
            if isinstance(part, bytes):
                digest.update(part)
                continue
            token = writes.token(part) if writes is not None and part.nbytes >= writes.min_bytes else None
            if token is not None:
                buffers.add((buffer_address(part) or 0, part.nbytes))
            else:
                untracked = True  # (only buffers of at least the record's threshold are left for later)
            digest.update(token if token is not None else buffer_checksum(part))
        digest.update(data)
        return dataclasses.replace(
            self, digest=digest.digest(), pending=None, buffers=frozenset(buffers), untracked=untracked
        )


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


#: :func:`fingerprint` was asked to stop (its ``abort`` event was set).
FingerprintAborted = SerializationAborted


_LRU_WRAPPER = type(functools.lru_cache(lambda: None))
_SUSPENDED = (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)


class _Pickler(NamespacePickler):
    """The records' pickler, noting the notebook code it meets (for the fingerprint's ``reach``)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.codes: list[types.CodeType] = []

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is _LRU_WRAPPER:  # pickled by reference: its function's code would go unnoticed
            wrapped = obj.__wrapped__
            if isinstance(wrapped, types.FunctionType) and wrapped.__globals__ is self.namespace:
                self.codes.append(wrapped.__code__)
        return super().reducer_override(obj)

    def _dynamic_function_reduce(self, func: types.FunctionType) -> Any:
        if func.__globals__ is self.namespace:
            self.codes.append(func.__code__)
        return super()._dynamic_function_reduce(func)


def fingerprint(
    value: Any,
    namespace: Mapping[str, Any],
    shared_ids: list[int] | None = None,
    keep: list[Any] | None = None,
    *,
    defer_buffers: int | None = None,
    writes: PageWriteTracker | None = None,
    clear_dirty: bool = False,
    untracked_min: int | None = None,
    abort: threading.Event | None = None,
) -> Fingerprint:
    """Fingerprint ``value``; append the ids of the mutable objects it reaches to ``shared_ids``.

    ``keep`` receives the pickler's memo, which must stay alive while ids of several values are compared
    (temporaries made while pickling one value could otherwise reuse ids seen in another).
    ``defer_buffers`` leaves the checksums of buffers of at least that many bytes, and the registration of
    those that ``writes`` does not track yet, for :meth:`Fingerprint.settled` (the digest is then the same as
    without it, once settled).
    ``writes`` (when given) supplies version tokens for buffers of at least ``writes.min_bytes`` that it can
    track (their ``(address, size)`` go into the fingerprint's ``buffers``). ``clear_dirty`` forgets the written
    spans the tracker holds for those buffers (after a record wrote them from outside a cell: the replicas
    already have them). A buffer of at least ``untracked_min`` bytes that is checksummed instead marks the
    fingerprint ``untracked``. Setting ``abort`` (from another thread) makes it raise :class:`FingerprintAborted`.
    """
    t = type(value)
    if t in ATOMIC_TYPES or isinstance(value, types.ModuleType):
        return Fingerprint(id(value), t, None)
    if value is namespace:
        return Fingerprint(id(value), t, b"namespace")
    if t in _PLAIN_CONTAINERS:
        plain = _plain_fingerprint(value, abort)
        if plain is not None:
            if shared_ids is not None:
                shared_ids.extend(plain[1])
            return Fingerprint(id(value), t, plain[0])
    parts: list[bytes | memoryview] = []  # each buffer's part of the digest (a buffer: left for later)
    buffers: set[tuple[int, int]] = set()
    deferring = untracked = False

    def on_buffer(buf: Any) -> bool:
        nonlocal deferring, untracked
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
                buffers.add((buffer_address(raw) or 0, raw.nbytes))
                if clear_dirty:
                    writes.take_dirty(raw)
                return False
        if defer:
            parts.append(raw)
            deferring = True
        else:
            parts.append(buffer_checksum(raw))
            untracked = untracked or (untracked_min is not None and raw.nbytes >= untracked_min)
        return False

    stream = hashlib.blake2b(digest_size=16)  # the pickle stream's digest, taken a frame at a time
    file = AbortableWriter(abort, stream.update)
    pickler = _Pickler(
        file, namespace=namespace, buffer_callback=on_buffer, device_to_host=False, numpy_views=False, abort=abort
    )
    try:
        pickler.dump(value)
    except FingerprintAborted as exc:
        # Freeing the memo of a large value takes milliseconds (a reference per object), with the GIL held, while
        # whoever aborted waits: the exception carries it out, for the caller to drop later.
        exc.memo = pickler
        raise
    except Exception as exc:
        if shared_ids is not None:
            shared_ids.append(id(value))
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        # The pickler stopped part way: what it reaches is found by following references.
        return Fingerprint(id(value), t, None, error=reason.rstrip(": "), reach=referents_reach(value, namespace))
    reach = _reach.union(_reach.code_reach(code) for code in pickler.codes)
    if shared_ids is not None:
        # A million-object value's memo makes two million tuples here: with the cyclic GC on, its collections
        # over the growing heap took 3 of the 3.8 s the copy took.
        collecting = gc.isenabled()
        gc.disable()
        try:
            memo = pickler.memo.copy()
            _shared_ids(memo, namespace, shared_ids, id(value))
        finally:
            if collecting:
                gc.enable()
        if keep is not None:
            keep.append(memo)
    kept = {"reach": reach, "buffers": frozenset(buffers), "untracked": untracked}
    if deferring:
        return Fingerprint(id(value), t, None, pending=(tuple(parts), stream.digest()), **kept)  # type: ignore[arg-type]
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        digest.update(part)
    digest.update(stream.digest())
    return Fingerprint(id(value), t, digest.digest(), **kept)  # type: ignore[arg-type]


#: How many objects :func:`referents_reach` looks at before it gives up (and answers "any name").
REFERENTS_LIMIT = 20_000


def referents_reach(value: Any, namespace: Mapping[str, Any], limit: int = REFERENTS_LIMIT) -> frozenset[str] | None:
    """The global names the notebook code reachable from ``value`` mentions, found by following references
    (for a value that cannot be pickled, whose pickler stopped part way); None after ``limit`` objects.

    It does not go into modules, the namespace itself, library classes, or library functions (whose globals
    are their modules)."""
    main = namespace.get("__name__", "__main__")
    codes: list[types.CodeType] = []
    seen: set[int] = set()
    stack = [value]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or obj is namespace or type(obj) in ATOMIC_TYPES or isinstance(obj, types.ModuleType):
            continue
        seen.add(id(obj))
        if len(seen) > limit:
            return None
        if isinstance(obj, types.FunctionType):
            if obj.__globals__ is not namespace:
                continue
            codes.append(obj.__code__)
        elif isinstance(obj, _SUSPENDED):  # a generator or coroutine of the notebook's: its code goes on later
            frame = getattr(obj, "gi_frame", None) or getattr(obj, "cr_frame", None) or getattr(obj, "ag_frame", None)
            if frame is not None and frame.f_globals is namespace:
                codes.append(frame.f_code)
        elif isinstance(obj, type) and obj.__module__ != main:
            continue
        elif isinstance(obj, _LRU_WRAPPER):
            stack.append(obj.__wrapped__)
        stack.extend(gc.get_referents(obj))
    return _reach.union(_reach.code_reach(code) for code in codes)


#: Plain data: builtin containers of builtin atoms (exact types), fingerprinted without the pickler.
_PLAIN_ATOMS = frozenset({type(None), bool, int, float, complex, str, bytes})
_PLAIN_CONTAINERS = frozenset({list, dict, tuple, set, frozenset})
_PLAIN_MUTABLE = frozenset({list, dict, set})
_ONLY_DICTS = {dict}
_is_plain_atom = _PLAIN_ATOMS.__contains__
_is_mutable = _PLAIN_MUTABLE.__contains__


def _one_parent_refs() -> int:
    """What ``sys.getrefcount`` says, the way _plain_fingerprint's walk asks it, of a container that only its parent
    holds (the parent's reference, the walk's list's and the call's: 3 on CPython 3.11)."""
    parent: list[list[Any]] = [[]]
    level = list(parent)
    counts = list(map(sys.getrefcount, level))  # (as the walk asks)
    return counts[0]


_ONE_PARENT_REFS = _one_parent_refs()
#: marshal refuses values nested deeper than this (CPython's MAX_MARSHAL_STACK_DEPTH).
_MARSHAL_DEPTH = 2000


def _plain_fingerprint(value: Any, abort: threading.Event | None = None) -> tuple[bytes, list[int]] | None:
    """The digest of a value made of builtin containers and atoms only, and the ids of the mutable containers in
    it that can be shared with other names (the value itself and those held more than once); None for any other
    value (it takes the pickler's way), or one nested deeper than marshal goes.

    A notebook's plain data (a list of a million small dicts, say) is the pickler's slowest case: its memo, copied to
    find what the value shares with other names, was most of the 1.8 s a cell that only read such a list paid. Here
    ``marshal`` serializes it (all of its content, exact types, and which containers it holds twice; a bytearray,
    which marshal writes as bytes, is not plain), and the containers are found level by level with C-speed
    iteration. Equal content may marshal differently (a set's order, a container referenced from elsewhere), which
    only makes the value look changed; changed content never marshals the same.

    ``abort`` (set from another thread) is checked before each level and before marshalling: marshal is one C call
    (0.14 s for a million small dicts), so a request stops a verification of such a value later than the pickler's
    64 KiB frames would (see state.py, verify)."""
    mutable: list[int] = []
    seen: set[int] = set()
    level: list[Any] = [value]
    top = True
    for _ in range(_MARSHAL_DEPTH):
        if not level:
            break
        if abort is not None and abort.is_set():
            raise FingerprintAborted()
        kinds = set(map(type, level))
        if not kinds <= _PLAIN_CONTAINERS:
            return None  # an object of another type, bytearray and subclasses of the builtins included
        # Only a container that more than its one parent refers to can be shared with another name or met twice in
        # this value (a cycle included): the first object two names share, or two paths in one value meet at, is a
        # root or has two referrers. So the million dicts of a list that alone holds them cost a getrefcount each,
        # not an id in the sets the state tracker intersects across names.
        if top:
            held, top = level, False
        else:
            counts = list(map(sys.getrefcount, level))
            held = list(itertools.compress(level, map(_ONE_PARENT_REFS.__lt__, counts)))
        ids = list(map(id, held))
        if not seen.isdisjoint(ids):  # some met before (held twice, or a cycle): once is enough
            again = seen.intersection(ids)
            level = [obj for obj in level if id(obj) not in again]
            held = [obj for obj in held if id(obj) not in again]
            ids = list(map(id, held))
        seen.update(ids)
        if kinds <= _PLAIN_MUTABLE:
            mutable.extend(ids)
        else:
            mutable.extend(itertools.compress(ids, map(_is_mutable, map(type, held))))
        if kinds == _ONLY_DICTS:
            members = list(itertools.chain.from_iterable(map(dict.values, level)))
        elif dict not in kinds:
            members = list(itertools.chain.from_iterable(level))
        else:
            members = list(itertools.chain.from_iterable(c.values() if type(c) is dict else c for c in level))
        level = list(itertools.compress(members, map(operator.not_, map(_is_plain_atom, map(type, members)))))
        del members, held  # (their references would count as more parents)
    else:
        return None  # nested deeper than marshal goes (a cycle the walk did not see would end here too)
    if abort is not None and abort.is_set():
        raise FingerprintAborted()
    try:
        data = marshal.dumps(value)
    except (ValueError, RecursionError):
        return None
    digest = hashlib.blake2b(b"marshal", digest_size=16)
    digest.update(data)
    return digest.digest(), mutable


#: Mutable builtin containers, always shareable (the common case, checked first) when more than their parent holds
#: them; a bytearray always (its memory can be viewed from elsewhere).
_REFERENCED_CONTAINERS = frozenset({dict, list, set})


def _memo_one_parent_refs() -> int:
    """What ``sys.getrefcount`` says, the way _shared_ids' loop asks it, of an object in a pickler's memo that only
    its parent holds (the parent's reference, the pickler's memo's, the memo copy's, the loop's and the call's)."""
    value: list[list[Any]] = [[]]
    pickler = _Pickler(AbortableWriter(None, lambda _: None), namespace={}, device_to_host=False, numpy_views=False)
    pickler.dump(value)
    memo = pickler.memo.copy()
    for key, (_, obj) in memo.items():  # (as the loop asks)
        if key != id(value) and type(obj) is list:
            return sys.getrefcount(obj)
    raise AssertionError("the pickler memoized no inner list")


_MEMO_ONE_PARENT_REFS = _memo_one_parent_refs()


def _notebook_class(kind: type, module: object) -> bool:
    """Whether every class ``kind`` derives from, but ``object``, is defined in the notebook: what its instances hold
    they hold through Python references (a torch tensor's storage, held in C++, is not one)."""
    return all(c is object or c.__module__ == module for c in kind.__mro__)


def _shared_ids(memo: dict[int, tuple[int, Any]], namespace: Mapping[str, Any], out: list[int], value_id: int) -> None:
    """Append the ids of the shareable objects in a pickler's memo, and of the objects whose memory the numpy
    arrays in it view: a view and its base count as one object shared by their names (a write through one
    changes the other, whose pickle alone does not say so).

    A dict, list or set, or an instance of a notebook class, that only its parent holds is left out (but the value
    itself, ``value_id``, never is), as :func:`_plain_fingerprint` does for plain data: it can be neither shared
    with another name nor met twice in the value (the first object two names share, or two paths meet at, is
    a name's value or has two referrers). 300,000 instances of a notebook class are 600,000 objects here (each
    with its ``__dict__``). Objects whose memory may be shared without a Python reference (arrays, tensors,
    storages, bytearrays, instances of library classes) are counted whatever their references."""
    numpy = sys.modules.get("numpy")
    ndarray = numpy.ndarray if numpy is not None else None
    append = out.append
    refcount, one_parent = sys.getrefcount, _MEMO_ONE_PARENT_REFS
    module = namespace.get("__name__", "__main__")
    notebook_class: dict[type, bool] = {}  # (per call: a class redefined in a later cell is another type)
    for key, (_, obj) in memo.items():
        kind = type(obj)
        if kind in _REFERENCED_CONTAINERS:
            if key == value_id or refcount(obj) > one_parent:
                append(key)
            continue
        if kind is bytearray:
            append(key)
            continue
        if kind in _UNSHARED_TYPES:
            continue
        ours = notebook_class.get(kind)
        if ours is None:
            ours = notebook_class[kind] = _notebook_class(kind, module)
        if ours and key != value_id and refcount(obj) <= one_parent:
            continue
        if not _shareable(obj, namespace):
            continue
        append(key)
        if ndarray is not None and isinstance(obj, ndarray) and obj.base is not None:
            base = obj
            while isinstance(base, ndarray) and base.base is not None:
                base = base.base
            append(id(base))


__all__ = ["ATOMIC_TYPES", "Fingerprint", "FingerprintAborted", "fingerprint", "referents_reach"]
