"""Pickling a namespace's values for the state log: the pickler, its reducers, and loading what it wrote.

This is the pickle half of a state record (the record format itself, its header and encode/apply, is
``records.py``). All the values of one record are pickled together, by :func:`pickle_values`, so that aliases stay
aliases: ``a = b = []`` pickles the list once and both names get the same object back. Buffers of at least a
threshold (numpy arrays, torch storages and other protocol-5 buffers) leave the pickle through ``buffer_callback``,
as views of the user's objects; the record format puts them in the object store.

Functions defined in the notebook (``__globals__`` is the user namespace) are pickled by value (code,
closure, defaults, attributes) but *without* the globals they read: on the replica they get the replica's
own namespace as ``__globals__``, so they see later rebinding of globals exactly as on the executor. Classes
defined in the notebook go by value through cloudpickle, whose class tracking makes instances sent in later
cells instances of the very class object the replica already has.

This module's path is part of the record format: a pickle names the functions that rebuild its values
(``_make_notebook_function``, ``_rebuild_numpy_view``, ``_rebuild_torch_tensor``, :class:`UnreplicatedValue`...) by
module and name, so they stay here, where the records and checkpoints already in the log and the object store (and
replicas of other versions) look them up.
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import importlib
import io
import logging
import pickle
import sys
import threading
import types
from collections.abc import Callable, Mapping
from typing import Any

import cloudpickle

from jupyter_notebookos.gpu.binding import host_copy
from jupyter_notebookos.replication.chunks import torch_storage_bytes
from jupyter_notebookos.replication.digest import device_checksum

log = logging.getLogger(__name__)

PROTOCOL = 5

# The namespace that functions and namespace references resolve to while a record is being loaded.
_LOAD_NAMESPACE: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "notebookos_load_namespace", default=None
)


class UnreplicatedValueError(AttributeError):
    """Raised when code touches a variable whose value never reached this replica."""


class UnreplicatedValue:
    """Stands in, on a replica, for a variable whose value could not be serialized on the executor.

    Its repr and any attribute access say which variable it is and why it is missing, instead of a stale
    older value or a bare ``NameError``.
    """

    __slots__ = ("name", "reason")

    def __init__(self, name: str, reason: str):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "reason", reason)

    def _message(self) -> str:
        return (
            f"variable {self.name!r} was not replicated to this replica: its value could not be serialized "
            f"({self.reason}). Re-run the cell that defines it."
        )

    def __getattr__(self, attr: str) -> Any:
        raise UnreplicatedValueError(self._message())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise UnreplicatedValueError(self._message())

    def __repr__(self) -> str:
        return f"<not replicated: {self.name!r} ({self.reason})>"

    def __reduce__(self) -> tuple[Any, ...]:
        return (UnreplicatedValue, (self.name, self.reason))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnreplicatedValue) and (self.name, self.reason) == (other.name, other.reason)

    def __hash__(self) -> int:
        return hash((self.name, self.reason))


# -- pickling --------------------------------------------------------------------------------------------


class _EmptyCell:
    """Marks an empty closure cell in a pickled function's state."""

    def __reduce__(self) -> str:
        return "EMPTY_CELL"


EMPTY_CELL = _EmptyCell()


class _NamespaceRef:
    """Pickled in place of a value that *is* the user namespace (``g = globals()``)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_current_namespace, ())


def _current_namespace() -> dict[str, Any]:
    ns = _LOAD_NAMESPACE.get()
    if ns is None:
        # Loaded outside apply_record (a debugging session): a fresh namespace, not someone else's.
        ns = {"__builtins__": __builtins__}
        _LOAD_NAMESPACE.set(ns)
    return ns


def _make_notebook_function(code: types.CodeType, name: str, nfree: int) -> types.FunctionType:
    closure = tuple(types.CellType() for _ in range(nfree)) if nfree else None
    return types.FunctionType(code, _current_namespace(), name, None, closure)


def _notebook_function_setstate(func: types.FunctionType, state: tuple[dict[str, Any], dict[str, Any]]) -> None:
    attrs, slots = state
    func.__dict__.update(attrs)
    cells = slots.pop("closure_values", ())
    for cell, value in zip(func.__closure__ or (), cells, strict=False):
        if value is not EMPTY_CELL:
            cell.cell_contents = value
    for key, value in slots.items():
        setattr(func, key, value)


def _import_module(name: str, submodules: list[str]) -> types.ModuleType:
    module = importlib.import_module(name)
    for sub in submodules:
        # A submodule the executor had loaded that this replica cannot import: the parent still works.
        with contextlib.suppress(Exception):
            importlib.import_module(sub)
    return module


class SerializationAborted(Exception):
    """Pickling stopped because its ``abort`` event was set (from another thread)."""

    memo: Any = None  # what the pickler had gathered: freeing it can wait (see fingerprint.fingerprint)


class AbortableWriter:
    """A pickler's file that raises :class:`SerializationAborted` once ``abort`` is set. The C pickler writes a
    frame (64 KiB) at a time, every few milliseconds also where nothing of its own reduces (a list of a million
    dicts pickles in one C call): there an abort is seen, and another thread can take the GIL. ``sink`` receives
    the bytes (a file's ``write``, or a digest's ``update``)."""

    __slots__ = ("abort", "sink")

    def __init__(self, abort: threading.Event | None, sink: Callable[[Any], Any]):
        self.abort = abort
        self.sink = sink

    def write(self, data: Any) -> int:
        """Hand ``data`` to the sink, unless ``abort`` is set."""
        if self.abort is not None and self.abort.is_set():
            raise SerializationAborted()
        self.sink(data)
        return len(data)


class NamespacePickler(cloudpickle.Pickler):
    """cloudpickle's pickler, with notebook functions bound to the loading replica's own namespace.

    ``namespace`` is the executor's user namespace; functions whose ``__globals__`` is that dict are pickled
    without their globals' values. Importable modules are pickled by name, together with the submodules
    loaded under them (``import xml.etree.ElementTree`` binds ``xml``; the replica needs the submodule too).
    ``device_to_host`` (records): torch tensors on a CUDA device are pickled as host tensors, which any replica
    can load (torch would restore them onto a CUDA device, and a follower has none visible between cells).
    Fingerprints turn it off: they only compare, so a storage on a device stands in their pickle as its
    :func:`~jupyter_notebookos.replication.digest.device_checksum`, computed where it lies (torch's own pickling
    would copy it to the host: 3.4 s per GiB on an H200).
    ``numpy_views`` (records; fingerprints turn it off too): a numpy view of an array that a name holds is pickled
    as that array and where the view lies in it (:func:`_reduce_numpy_view`), a view of the same array once loaded.
    """

    def __init__(
        self,
        file: Any,
        *,
        namespace: Mapping[str, Any],
        buffer_callback: Any = None,
        device_to_host: bool = True,
        numpy_views: bool = True,
        numpy_bases: _NumpyBases | None = None,
        abort: threading.Event | None = None,
    ):
        # cloudpickle's dispatch table is a ChainMap (its reducers, then copyreg's), and the C pickler looks the type
        # of every object it cannot save itself up in it: through ChainMap.__getitem__, in Python, about a
        # microsecond per object (a third of a second for 300,000 instances). One dict with the same precedence,
        # merged map by map (dict() of the ChainMap reads it key by key in Python: 14 us per pickler, against 1.5).
        chained = getattr(type(self), "dispatch_table")  # noqa: B009 (an instance-only attribute to mypy)
        table: dict[Any, Any] = {}
        for reducers in reversed(getattr(chained, "maps", [chained])):
            table.update(reducers)
        self.dispatch_table = table
        super().__init__(file, protocol=PROTOCOL, buffer_callback=buffer_callback)
        self.namespace = namespace
        self.numpy_views = numpy_views
        # The arrays views are rebuilt over (_reduce_numpy_view): those names hold (taken at the first view met), or
        # as given (a second pickling); the views pickled as copies for want of one, and the arrays pickled whole.
        self.numpy_bases = numpy_bases
        self.copied_views: list[tuple[Any, int]] = []  # (view, the id of the array owning its memory)
        self.whole: list[Any] = []
        self.abort = abort  # set from another thread: SerializationAborted at the next object (see AbortableWriter)
        # Host copies of the device storages pickled so far: (data pointer, size, device) -> (storage, copy).
        self._host_copies: dict[tuple[int, int, str], tuple[Any, Any]] | None = {} if device_to_host else None
        self._device_checksums = not device_to_host

    def reducer_override(self, obj: Any) -> Any:
        """Modules by name with their loaded submodules; torch CPU tensors with their storage out of band (see
        :func:`_reduce_torch`); everything else as cloudpickle does it."""
        if self.abort is not None and self.abort.is_set():
            raise SerializationAborted()
        if isinstance(obj, types.ModuleType) and sys.modules.get(obj.__name__) is obj:
            prefix = obj.__name__ + "."
            subs = sorted(k for k, m in list(sys.modules.items()) if k.startswith(prefix) and m is not None)
            return (_import_module, (obj.__name__, subs))
        numpy = sys.modules.get("numpy")
        if self.numpy_views and numpy is not None and type(obj) is numpy.ndarray:
            if obj.base is not None:
                if self.numpy_bases is None:
                    self.numpy_bases = _NumpyBases.named(numpy, self.namespace)
                owner = _numpy_owner(numpy, obj)
                if self.numpy_bases.holds(owner):
                    reduced = _reduce_numpy_view(obj, _numpy_memory(numpy, obj), self.numpy_bases)
                    if reduced is not NotImplemented:
                        return reduced
                self.copied_views.append((obj, owner))
            self.whole.append(obj)  # (see views_copied_in_vain)
        torch = sys.modules.get("torch")
        if torch is not None and type(obj) in (torch.Tensor, torch.UntypedStorage):
            reduced = _reduce_torch(torch, obj, self._host_copies, device_checksums=self._device_checksums)
            if reduced is not NotImplemented:
                return reduced
        reduced = super().reducer_override(obj)
        if isinstance(obj, type) and isinstance(reduced, tuple) and len(reduced) > 2:
            state = reduced[2]
            if isinstance(state, tuple) and state and isinstance(state[0], dict) and "__slotnames__" in state[0]:
                # copyreg caches __slotnames__ on a class the first time one of its instances is pickled:
                # a side effect of pickling, not a change the user made, and recomputed on demand anyway.
                clsdict = {k: v for k, v in state[0].items() if k != "__slotnames__"}
                reduced = (*reduced[:2], (clsdict, *state[1:]), *reduced[3:])
        return reduced

    def views_copied_in_vain(self) -> _NumpyBases | None:
        """The bases to pickle again with, when a view went as a copy although an array this pickled whole spans it
        (a view in one container, its array in another); else None. Only the arrays over the memory of such views
        are looked at, and a sort tells whether one spans a view: a list of many small arrays costs a list append
        each, and one of many rows of an unnamed array a sort."""
        numpy = sys.modules.get("numpy")
        if not self.copied_views or numpy is None or self.numpy_bases is None:
            return None
        copied = {id(view) for view, _ in self.copied_views}
        over: dict[int, list[Any]] = {owner: [] for _, owner in self.copied_views}
        for array in self.whole:
            same = over.get(_numpy_owner(numpy, array))
            if same is not None:
                same.append(array)
        bases, in_vain = self.numpy_bases, False
        for arrays in over.values():
            memories = [_numpy_memory(numpy, array) for array in arrays]
            reach = -1  # the farthest end of the arrays that start before this one (or where it does, and end later)
            spanned = False
            for low, negative_high, i in sorted((m[1], -m[2], i) for i, m in enumerate(memories)):
                high = -negative_high
                spanned = spanned or (reach >= high > low and id(arrays[i]) in copied)
                reach = max(reach, high)
            if spanned:
                in_vain = True
                for array, memory in zip(arrays, memories, strict=True):
                    bases.add(array, memory)
        return bases if in_vain else None

    def _dynamic_function_reduce(self, func: types.FunctionType) -> Any:
        if func.__globals__ is not self.namespace:
            return super()._dynamic_function_reduce(func)
        closure_values = [_cell_value(cell) for cell in (func.__closure__ or ())]
        slots = {
            "__name__": func.__name__,
            "__qualname__": func.__qualname__,
            "__annotations__": func.__annotations__,
            "__kwdefaults__": func.__kwdefaults__,
            "__defaults__": func.__defaults__,
            "__module__": func.__module__,
            "__doc__": func.__doc__,
            "closure_values": closure_values,
        }
        nfree = len(func.__code__.co_freevars)
        return (
            _make_notebook_function,
            (func.__code__, func.__name__, nfree),
            (dict(func.__dict__), slots),
            None,
            None,
            _notebook_function_setstate,
        )


def _reduce_torch(
    torch: Any,
    obj: Any,
    host_copies: dict[tuple[int, int, str], tuple[Any, Any]] | None,
    *,
    device_checksums: bool = False,
) -> Any:
    """A CPU tensor as its storage, shape and strides; a CPU storage as a protocol-5 buffer over its bytes.

    torch's own pickling writes a tensor's bytes into the pickle stream (``torch.save``), so every fingerprint
    would serialize and hash every tensor whole, after every cell. As a buffer, a large storage gets what numpy
    arrays get: write tracking instead of hashing, chunked deltas, and patching in place on the followers. A
    storage is one object however many tensors view it, so views stay views of one storage after loading.
    With ``host_copies``, a CUDA tensor goes the same way on a host copy of its storage (one copy per storage).
    With ``device_checksums`` (fingerprints, which are never loaded), a tensor on another device keeps its
    storage, and a storage on another device is reduced to its size and a checksum of its bytes computed there
    (:func:`_device_storage`). Anything else (other devices, subclasses, sparse, quantized, conjugate views,
    non-leaf tensors that require grad, tensors with attributes) goes through torch's own pickling
    (NotImplemented), as does a device storage whose checksum fails."""
    if isinstance(obj, torch.UntypedStorage):
        if obj.device.type != "cpu":
            if not device_checksums or obj.device.type == "meta":
                return NotImplemented
            try:
                checksum = device_checksum(torch, obj)
            except RuntimeError as exc:  # e.g. no device memory left for its 128 MiB temporary
                log.debug("checksumming a storage on %s failed (%s): torch pickles it", obj.device, exc)
                return NotImplemented
            return (_device_storage, (str(obj.device), checksum))
        if obj.nbytes() == 0:
            return (_rebuild_torch_storage, (b"",))
        # Its numpy view keeps the storage alive as long as the buffer is used.
        return (_rebuild_torch_storage, (pickle.PickleBuffer(torch_storage_bytes(obj)),))  # type: ignore[arg-type]
    if (
        obj.layout != torch.strided
        or obj.is_quantized
        or obj.is_conj()
        or obj.is_neg()
        or (obj.requires_grad and not obj.is_leaf)
        or getattr(obj, "__dict__", None)
    ):
        return NotImplemented
    storage = obj.untyped_storage()
    if obj.device.type != "cpu":
        if obj.device.type == "cuda" and host_copies is not None:
            storage = _host_copy(torch, storage, host_copies)
        elif not device_checksums or obj.device.type == "meta":
            return NotImplemented
    return (
        _rebuild_torch_tensor,
        (
            storage,
            obj.dtype,
            tuple(obj.shape),
            tuple(obj.stride()),
            obj.storage_offset(),
            obj.requires_grad,
        ),
    )


def _host_copy(torch: Any, storage: Any, copies: dict[tuple[int, int, str], tuple[Any, Any]]) -> Any:
    """A host copy of a CUDA storage, made once per pickling however many tensors view it."""
    nbytes = storage.nbytes()
    key = (storage.data_ptr(), nbytes, str(storage.device))
    held = copies.get(key)
    if held is None:
        device_bytes = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, 0, (nbytes,), (1,))
        held = copies[key] = (storage, host_copy(torch, device_bytes).untyped_storage())
    return held[1]


def _device_storage(device: str, checksum: bytes) -> Any:
    """What a device storage stands for in a fingerprint's pickle, which is hashed and never loaded."""
    raise pickle.UnpicklingError(f"a fingerprint's stand-in for a storage on {device} cannot be loaded")


def _rebuild_torch_storage(data: Any) -> Any:
    """A CPU storage on ``data``'s memory (copied first when ``data`` is read-only: a torch tensor writes)."""
    torch = importlib.import_module("torch")
    view = memoryview(data)
    if view.nbytes == 0:
        return torch.UntypedStorage(0)
    if view.readonly:
        data = bytearray(view)
    return torch.frombuffer(data, dtype=torch.uint8).untyped_storage()


def _numpy_owner(numpy: Any, array: Any) -> int:
    """The id of the array that owns the array's memory (the last of its bases)."""
    while isinstance(array.base, numpy.ndarray):
        array = array.base
    return id(array)


def _numpy_memory(numpy: Any, array: Any) -> tuple[int, int, int]:
    """The array's memory: the id of the array that owns it (_numpy_owner), and the bytes it spans."""
    start = end = array.__array_interface__["data"][0]
    for n, stride in zip(array.shape, array.strides, strict=True):
        if n == 0:
            return _numpy_owner(numpy, array), start, start
        if stride < 0:
            start += (n - 1) * stride
        else:
            end += (n - 1) * stride
    return _numpy_owner(numpy, array), start, end + array.itemsize


class _NumpyBases:
    """The arrays views can be rebuilt over (:func:`_reduce_numpy_view`): contiguous, not of objects, held by a name
    or pickled whole by this pickler.

    Ranked by the bytes they span, then whether they own their memory, then id (a strict order, so no two arrays are
    rebuilt from each other). Per memory (the id of the array owning it) only the arrays that no higher-ranked one
    spans are kept, sorted by address: then none spans another, their ends are sorted too, and those that span a
    given view are found by bisection. (A view is rebuilt over the highest-ranked array spanning it, which is never
    one that another spans. A list of a million rows of an unnamed array costs a bisection per row.)"""

    def __init__(self) -> None:
        # owner id -> (starts, ends, [(rank, array)]), in address order.
        self._memory: dict[int, tuple[list[int], list[int], list[tuple[tuple[int, bool, int], Any]]]] = {}

    @classmethod
    def named(cls, numpy: Any, namespace: Mapping[str, Any]) -> _NumpyBases:
        """The arrays names hold."""
        bases = cls()
        for value in list(namespace.values()):
            if type(value) is numpy.ndarray:
                bases.add(value, _numpy_memory(numpy, value))
        return bases

    def add(self, array: Any, memory: tuple[int, int, int]) -> None:
        """Count ``array`` (its ``memory``: _numpy_memory) in, if views can be rebuilt over it."""
        if array.dtype.hasobject or not (array.flags.c_contiguous or array.flags.f_contiguous):
            return
        owner, low, high = memory
        if low == high:
            return
        rank = (high - low, array.base is None, -id(array))
        starts, ends, entries = self._memory.setdefault(owner, ([], [], []))
        first, last = self._spanning(starts, ends, low, high)
        if any(entries[i][0] > rank for i in range(first, last)):
            return  # a higher-ranked one spans it
        # The ones it spans (those spanning it are the same span, ranked lower) go.
        inner = bisect.bisect_left(starts, low)
        beyond = bisect.bisect_right(ends, high, inner)
        del starts[inner:beyond], ends[inner:beyond], entries[inner:beyond]
        starts.insert(inner, low)
        ends.insert(inner, high)
        entries.insert(inner, (rank, array))

    def holds(self, owner: int) -> bool:
        """Whether an array over the memory of owner ``owner`` is among them."""
        return owner in self._memory

    def best(self, view: Any, memory: tuple[int, int, int]) -> Any:
        """The highest-ranked array that spans ``view`` (its ``memory``), not ``view`` itself, not a read-only one
        for a writeable view; or None."""
        owner, low, high = memory
        held = self._memory.get(owner)
        if held is None or low == high:
            return None
        starts, ends, entries = held
        first, last = self._spanning(starts, ends, low, high)
        usable = [
            (rank, array)
            for rank, array in entries[first:last]
            if array is not view and not (view.flags.writeable and not array.flags.writeable)
        ]
        return max(usable, key=lambda entry: entry[0])[1] if usable else None

    @staticmethod
    def _spanning(starts: list[int], ends: list[int], low: int, high: int) -> tuple[int, int]:
        """The slice of entries that span [low, high): they start at or before ``low`` and end at or after ``high``."""
        last = bisect.bisect_right(starts, low)
        return bisect.bisect_left(ends, high, 0, last), last


def _reduce_numpy_view(view: Any, memory: tuple[int, int, int], bases: _NumpyBases) -> Any:
    """A view of an array that a name holds, as that array (pickled once, with the name's value) and where the view
    lies in it. numpy pickles a view as a copy of what it shows: a follower held two arrays where the executor held
    one, and once it became the executor, a write through the view no longer reached the array.

    The array is the best of ``bases`` (see _NumpyBases): the state tracker groups the names of values over one
    memory, so a record or a checkpoint part that holds the view holds that array too. A view of no such array
    goes as numpy pickles it, a copy (else a few elements of an unnamed 1 GB array would send all of it); so do
    object arrays, whose elements are references, and empty views."""
    if view.dtype.hasobject or view.size == 0:
        return NotImplemented
    best = bases.best(view, memory)
    if best is None:
        return NotImplemented
    offset = view.__array_interface__["data"][0] - best.__array_interface__["data"][0]
    args = (best, view.dtype, tuple(view.shape), tuple(view.strides), offset, bool(view.flags.writeable))
    return (_rebuild_numpy_view, args)


def _rebuild_numpy_view(
    root: Any, dtype: Any, shape: tuple[int, ...], strides: tuple[int, ...], offset: int, writeable: bool
) -> Any:
    numpy = importlib.import_module("numpy")
    view = numpy.ndarray(shape, dtype, buffer=root, offset=offset, strides=strides)
    if not writeable:
        view.flags.writeable = False
    return view


def _rebuild_torch_tensor(
    storage: Any, dtype: Any, shape: tuple[int, ...], stride: tuple[int, ...], offset: int, requires_grad: bool
) -> Any:
    torch = importlib.import_module("torch")
    tensor = torch.empty(0, dtype=dtype).set_(storage, offset, shape, stride)
    return tensor.requires_grad_(requires_grad)


def _cell_value(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return EMPTY_CELL


def failure_reason(exc: BaseException) -> str:
    """``exc`` in one line: its type, and the first line of its message."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def unpicklable_reason(value: Any, namespace: Mapping[str, Any]) -> str | None:
    """Why ``value`` cannot be pickled on its own, or None when it can."""
    try:
        NamespacePickler(io.BytesIO(), namespace=namespace, buffer_callback=lambda _b: False).dump(
            _NamespaceRef() if value is namespace else value
        )
    except Exception as exc:
        return failure_reason(exc)
    return None


def pickle_values(
    values: list[Any], namespace: Mapping[str, Any], threshold: int, abort: threading.Event | None = None
) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """Pickle ``values`` (of ``namespace``) together, in one pickle; returns it and the buffers of at least
    ``threshold`` bytes, which left it out of band (views of the user's objects). Setting ``abort`` (from another
    thread) makes it raise :class:`SerializationAborted` soon after."""
    out_of_band: list[pickle.PickleBuffer] = []

    def buffer_callback(buf: pickle.PickleBuffer) -> bool:
        try:
            size = buf.raw().nbytes
        except BufferError:  # not contiguous: keep it in the stream
            return True
        if size >= threshold:
            out_of_band.append(buf)
            return False
        return True

    bases = None
    while True:
        out_of_band.clear()
        stream = io.BytesIO()
        file = stream if abort is None else AbortableWriter(abort, stream.write)
        pickler = NamespacePickler(
            file, namespace=namespace, buffer_callback=buffer_callback, numpy_bases=bases, abort=abort
        )
        pickler.dump([_NamespaceRef() if v is namespace else v for v in values])
        if bases is not None or (bases := pickler.views_copied_in_vain()) is None:
            return stream.getvalue(), out_of_band
        # Once more, knowing them (rare: a view whose array is not a name's value).


def unpickle_values(payload: bytes, buffers: list[Any], namespace: dict[str, Any]) -> Any:
    """Load what :func:`pickle_values` wrote, with its out-of-band ``buffers``; notebook functions (and references
    to the namespace) get ``namespace``."""
    token = _LOAD_NAMESPACE.set(namespace)
    try:
        return pickle.loads(payload, buffers=buffers)
    finally:
        _LOAD_NAMESPACE.reset(token)
