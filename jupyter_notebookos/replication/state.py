"""Delta capture: which global names a cell bound, rebound, mutated or deleted.

The rule. After a cell, the delta is every user name ``n`` such that

1. the cell's code binds, deletes or assigns into ``n`` syntactically: module-level assignment targets
   (plain, tuple/star unpacking, augmented, annotated), ``for``/``with``/``except ... as`` targets, walrus
   (also inside comprehensions), ``import``/``from ... import``, ``def``, ``class``, ``match`` captures,
   ``del``, names declared ``global`` and bound in a function or class body of the cell, and the root
   name of a module-level attribute/item target (``a.x = 1``, ``d[k] = v``, ``del d[k]``) (bindings.py); or
2. ``n`` is new, gone, bound to a different object (``id``), or its value's fingerprint changed. The
   fingerprint is the digest of the value's pickle (the same pickler the records use) in which every
   protocol-5 buffer (numpy arrays) is not copied but stands as its write-tracking version token (large
   buffers, see below) or a fast checksum of its bytes (fingerprint.py).
   This is what sees mutation through called functions (``lst.append`` inside a helper, ``optimizer.step()``),
   ``exec``, magics and star imports, which syntax cannot. Which values are fingerprinted again is below
   ("Cost"); or
3. ``n`` shares a mutable object with a name selected by 1 or 2 (``a is b``, or ``c = a[0]``, or an
   optimizer holding a model's parameters, or a numpy view and its base): all of these are serialized in one
   pickle, so the replica ends up with the same sharing as the executor. Sharing is read from the pickler's
   memo while fingerprinting, and kept, for names not fingerprinted again, from when they last were.

Names that belong to IPython (``In``, ``Out``, ``_``, ``__``, ``___``, ``_i``, ``_i<N>``, ``_<N>``, ``_oh``,
``_dh``, ``_ih``, ``exit``, ``quit``, ``get_ipython``, dunder names, and whatever the shell lists in
``user_ns_hidden`` while it still holds the shell's own object) are never part of a delta.

Cost. ``after_cell`` compares every name's identity and type with the baseline (nanoseconds a name), and
fingerprints again only: the names the cell can reach (its code's names and, through the notebook functions and
methods reachable from their values, theirs: reach.py), new and rebound names, names the syntax assigns into,
names holding a tracked buffer the kernel saw written or a large buffer only a checksum can check, names a
record changed, and names :meth:`StateTracker.verify` found changed. Where code can reach names without
spelling them (``globals()``, ``eval``...: reach.py), it fingerprints every name. The others keep their
fingerprint; together they become the next cell's baseline. What changed a value no cell reached (a library's
own reference to it, a thread, a comm callback) is found by :meth:`StateTracker.verify`, which the replica runs
in a thread while the kernel idles, and goes out with the next delta. Immutable atoms (numbers, str, bytes,
None) and modules cost an ``id()``; every other value fingerprinted costs one pickling, with its large buffers
out of band. What a large buffer costs depends on the replica's *change detection method*
(:attr:`StateTracker.method`):

- ``userfaultfd-wp+pagemap-scan`` (primary, Linux 6.7+): buffers of at least ``track_min_bytes`` are
  write-protected through a userfaultfd in asynchronous mode, and one ``PAGEMAP_SCAN`` ioctl per buffer at
  the start of ``after_cell`` lists the pages written since the last scan and protects them again
  (writetrack.py). A clean 1 GB array costs about 0.2 ms, whatever wrote to it (a called function, a view,
  ``np.add(..., out=)``, a C extension, another thread between or during cells, the OS in ``readinto``):
  the kernel saw the write. Smaller buffers, read-only views and file mappings are checksummed.
- ``checksum`` (fallback, where the kernel offers no write tracking): every buffer is checksummed with
  XXH3-128 per 4 MiB chunk, in one thread (about 0.2 s per GB here, against 0.45 s per GB for CRC-32).

``before_cell`` only parses the cell, except the first time (or after :meth:`StateTracker.reset`), when it
takes the baseline. A name that is new or bound to another object is in the delta whatever its content, so
the checksums of its large untracked buffers (those the record sends out of band, ``defer_min_bytes``) are
left for :meth:`StateTracker.settle`, which the replica calls after the reply
and before it uploads them: a cell that creates a large array does not wait for a pass over it before its
reply.

Limits (documented, not silently wrong where we can help it):

- Identity of immutable values is not kept across cells: after ``t = (1, 2)`` and, in a later cell,
  ``u = t``, the replica has ``u == t`` but not ``u is t``.
- numpy views are copies on the replica (pickle cannot express a view); both names are re-sent when the
  base changes, so values stay equal, but writing through a view on the replica does not change its base.
- Module objects are sent by name; attributes users set on imported modules (``np.foo = 1``,
  ``matplotlib.rcParams``) are not replicated.
- Values that cannot be pickled (locks, generators, open files, sockets, CUDA contexts...) are named in the
  delta's ``unpicklable`` and become explanatory placeholders on the replicas; in-place changes to them
  cannot be seen.
- A value that is the namespace itself (``g = globals()``) is sent as a reference to the replica's
  namespace; the namespace nested inside another value would be pickled by value.
- Function identity is not kept across cells: after ``handlers = [f]`` in a later cell than ``def f``, the
  replica's ``handlers[0]`` is an equal copy of ``f``, not ``f`` itself (counting functions as shared state
  would tie every instance of a notebook class to every other through the class's methods). Closure cells
  shared by several closures do count, so ``inc, get = make_counter()`` stay connected.
- Objects whose pickle is not deterministic (for example a set whose iteration order changes after being
  resized) are re-sent more often than needed; that costs bytes, never correctness.
- A checksum misses a random change with probability 2**-128 per 4 MiB chunk of an array.
- ``madvise(MADV_DONTNEED)`` on a write-tracked buffer (which zeroes it without writing) is not seen.
- A value changed in place by something the cell does not reach (see Cost) goes out with a later delta, once
  the idle verification has seen it; until then a failover loses that change.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jupyter_notebookos.replication.bindings import CellBindings, cell_bindings, ipython_transform
from jupyter_notebookos.replication.chunks import BufferLineage
from jupyter_notebookos.replication.fingerprint import Fingerprint, FingerprintAborted, fingerprint
from jupyter_notebookos.replication.reach import cell_reach, union
from jupyter_notebookos.replication.records import apply_record
from jupyter_notebookos.replication.writetrack import PageWriteTracker, open_write_tracker

log = logging.getLogger(__name__)

IPYTHON_NAMES = frozenset(
    {"In", "Out", "_", "__", "___", "_i", "_ii", "_iii", "_oh", "_dh", "_ih", "exit", "quit", "get_ipython"}
)
_IPYTHON_GENERATED = re.compile(r"^_i?\d+$|^__\w*__$")


def is_user_name(name: str, value: Any, hidden: Mapping[str, Any] | None = None) -> bool:
    """Whether ``name`` is a variable of the user's (not IPython's bookkeeping)."""
    if name in IPYTHON_NAMES or _IPYTHON_GENERATED.match(name):
        return False
    return not (hidden is not None and name in hidden and hidden[name] is value)


# -- the tracker -----------------------------------------------------------------------------------------


@dataclass
class StateDelta:
    """What one cell changed in the user namespace, ready for ``kernel.statelog.serialize_delta``.

    ``values`` maps every bound name to its value (references, taken right after the cell); ``deleted``
    lists removed names; ``unpicklable`` names values that cannot be serialized (with the reason);
    ``why`` says for each name which rule put it in the delta (for logs and tests).
    """

    namespace: dict[str, Any]
    values: dict[str, Any]
    deleted: tuple[str, ...]
    unpicklable: dict[str, str] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)
    capture_seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)

    @property
    def bound(self) -> tuple[str, ...]:
        """Names whose value the delta carries (or would, for the unpicklable ones), sorted."""
        return tuple(sorted({*self.values, *self.unpicklable}))

    @property
    def names(self) -> frozenset[str]:
        """Every name in the delta, bound or deleted."""
        return frozenset({*self.values, *self.unpicklable, *self.deleted})

    def is_empty(self) -> bool:
        """True when the cell changed nothing a replica needs."""
        return not self.names


@dataclass
class _Scan:
    prints: dict[str, Fingerprint]
    groups: dict[str, frozenset[str]]  # name -> names sharing a mutable object with it (itself included)
    scanned: set[str]  # the names fingerprinted now (the others keep their baseline fingerprint)


_MISSING = object()


class StateTracker:
    """Captures each cell's :class:`StateDelta` on one replica's user namespace.

    Call :meth:`before_cell` with the cell's source before running it and :meth:`after_cell` after it.
    On a replica that applies records (a follower), apply them through :meth:`apply` (or call
    :meth:`refresh` with the names), so that when it becomes the executor its baseline matches its namespace.
    While no cell runs, :meth:`verify` looks at the names the last captures did not (the replica calls it in a
    thread when the kernel is idle).

    ``hidden`` is the shell's ``user_ns_hidden``; ``transform`` turns IPython syntax into Python (default:
    IPython's own transformer, so ``%time x = f()`` still parses). ``write_tracking`` selects the primary
    change detection for buffers of at least ``track_min_bytes`` where this kernel offers it (see the module
    docstring); :attr:`method` says which one is in use.
    """

    def __init__(
        self,
        user_ns: dict[str, Any],
        *,
        hidden: Mapping[str, Any] | None = None,
        transform: Callable[[str], str] | None = None,
        defer_min_bytes: int | None = None,
        write_tracking: bool = True,
        track_min_bytes: int = 1 << 20,
    ):
        self.user_ns = user_ns
        self.writes: PageWriteTracker | None = None
        self.method = "checksum"
        if write_tracking:
            self.writes, why = open_write_tracker(track_min_bytes)
            self.method = why if self.writes is not None else f"checksum (write tracking {why})"
        # Which large buffers the other replicas hold, so that records send only their changed chunks.
        self.lineage = BufferLineage(self.writes)
        self.defer_min_bytes = defer_min_bytes
        self.track_min_bytes = track_min_bytes
        self.hidden = hidden
        self.transform = transform or ipython_transform
        self._baseline: dict[str, Fingerprint] | None = None
        self._code: str | None = None  # the running cell's source, until its capture
        self._tree: ast.Module | None = None  # the syntax tree the shell compiled it from, if it said (note_tree)
        self._bindings = CellBindings(frozenset(), parsed=False)
        self._reach: frozenset[str] | None = None  # the names the cell's code mentions (None: any name)
        self._recheck: set[str] = set()  # names the next capture fingerprints whatever the cell reaches
        self._unverified: set[str] = set()  # names verify() has yet to fingerprint since the last capture
        self.last_scanned = 0  # how many names the last capture fingerprinted
        self._aborted: Any = None  # what a stopped verification's pickler held (see verify())
        self.found: list[str] = []  # the names the last verify() found changed
        # Which names shared an object at the last capture (name -> its group, itself included), for a checkpoint
        # to pickle each group on its own; None when not known (no capture yet, or a record changed names since).
        self.groups: dict[str, frozenset[str]] | None = None
        # Names that are IPython's by their spelling alone (``_i42``, ``_42``): IPython adds one or two per
        # cell and never removes them, so after thousands of cells they are most of the namespace. A set
        # lookup rather than a regex match per name and per cell keeps a long session's cells cheap.
        self._ipython_spelled: set[str] = set()

    def user_names(self) -> list[str]:
        """The user's variables currently in the namespace."""
        spelled, hidden, names = self._ipython_spelled, self.hidden, []
        for name, value in list(self.user_ns.items()):
            if name in spelled:
                continue
            if name in IPYTHON_NAMES or _IPYTHON_GENERATED.match(name):
                spelled.add(name)
            elif not (hidden is not None and name in hidden and hidden[name] is value):
                names.append(name)
        return names

    def before_cell(self, code: str) -> None:
        """Note the cell's source (the capture reads it, from the tree :meth:`note_tree` gets, else parsed
        then); take the baseline if there is none yet."""
        self._code, self._tree = code, None
        if self._baseline is None:
            started = time.perf_counter()
            self._baseline = self._scan(None, baseline=None).prints
            self._recheck.clear()
            self._unverified.clear()
            log.info(
                "no baseline yet: fingerprinted all %d names before the cell, in %.1f ms",
                len(self._baseline),
                (time.perf_counter() - started) * 1e3,
            )

    def note_tree(self, tree: ast.Module) -> None:
        """The syntax tree the shell compiles the running cell from (an IPython AST transformer hands it over,
        see kernel/replica.py), so that the capture need not transform and parse the source again: a third of a
        millisecond per cell. Only the first tree after :meth:`before_cell` counts: magics such as ``%time``
        parse code of their own while the cell runs."""
        if self._code is not None and self._tree is None:
            self._tree = tree

    def _read_cell(self) -> tuple[CellBindings, frozenset[str] | None]:
        """What the cell noted by :meth:`before_cell` binds and reaches (unparsed, any name: no cell noted, or
        a source that does not parse)."""
        code, tree = self._code, self._tree
        self._code = self._tree = None
        if code is None:
            return CellBindings(frozenset(), parsed=False), None
        if tree is None:
            try:
                source = self.transform(code)
            except Exception:
                source = code
            try:
                tree = ast.parse(source)
            except (SyntaxError, ValueError):
                return CellBindings(frozenset(), parsed=False), None
        return cell_bindings(tree), cell_reach(tree)

    @property
    def has_baseline(self) -> bool:
        """Whether the next cell's capture compares against a baseline (else :meth:`before_cell` takes one)."""
        return self._baseline is not None

    def prepare(self, abort: threading.Event | None = None) -> bool:
        """Take the baseline now, as :meth:`before_cell` would: a follower does it while idle, so that the first
        cell it runs after it becomes the executor does not wait while the whole namespace is fingerprinted
        (seconds with a million objects). From then on, records applied keep it up to date (:meth:`refresh`,
        at the cost of what they changed). Returns False when ``abort`` was set first; nothing is kept then.

        Like :meth:`verify`, it runs in a thread while nothing else touches the namespace or this tracker, and
        reads the namespace only."""
        self._aborted = None
        if self._baseline is not None:
            return True
        try:
            prints = self._scan(None, baseline=None, abort=abort).prints
        except FingerprintAborted as exc:
            self._aborted = exc.memo  # freed by the next try, not while a request waits
            return False
        self._baseline = prints
        self._recheck.clear()
        self._unverified.clear()
        return True

    def after_cell(self) -> StateDelta:
        """The cell's delta; its fingerprints become the baseline of the next cell.

        The checksums of values that are new or bound to another object are left for :meth:`settle`."""
        started = time.perf_counter()
        self.settle()
        self._bindings, self._reach = self._read_cell()
        written: set[tuple[int, int]] = set()
        if self.writes is not None:
            self.writes.scan()  # bumps the version token of every tracked buffer written since the last scan
            written = self.writes.take_written()  # (also those a scan in refresh() found since the last capture)
        baseline = self._baseline if self._baseline is not None else {}
        scan = self._scan(self._reach if self._baseline is not None else None, baseline=baseline, written=written)
        why: dict[str, str] = {}
        for name in scan.scanned:
            now, before = scan.prints[name], baseline.get(name)
            if before is None:
                why[name] = "new"
            elif before.oid != now.oid or before.type is not now.type:
                why[name] = "rebound"
            elif not now.same_as(before):
                why[name] = "mutated"
            elif name in self._bindings.touched:
                why[name] = "assigned"
        for name in sorted(why):
            for other in scan.groups.get(name, ()):
                why.setdefault(other, f"shares an object with {name}")
        deleted = sorted((set(baseline) | self._bindings.touched) - set(scan.prints))
        values: dict[str, Any] = {}
        unpicklable: dict[str, str] = {}
        for name in why:
            error = scan.prints[name].error
            if error is not None:
                unpicklable[name] = error
            else:
                values[name] = self.user_ns[name]
        warnings = []
        if not self._bindings.parsed:
            warnings.append("the cell's source could not be parsed; the delta relies on value fingerprints only")
        self._baseline = scan.prints
        self.groups = scan.groups
        self._bindings = CellBindings(frozenset(), parsed=False)
        self._reach = None
        self._recheck.clear()
        # Anything may change a value after its capture (a thread, a comm callback): verify() looks at them all
        # but those every capture fingerprints anyway.
        self._unverified = {name for name, now in scan.prints.items() if not now.untracked}
        self.last_scanned = len(scan.scanned)
        return StateDelta(
            namespace=self.user_ns,
            values=values,
            deleted=tuple(deleted),
            unpicklable=unpicklable,
            why=why,
            capture_seconds=time.perf_counter() - started,
            warnings=warnings,
        )

    def settle(self) -> None:
        """Do the checksums the last :meth:`after_cell` left for later.

        Only buffers the record sends out of band are left (``defer_min_bytes`` must be the record's
        threshold): those are read for the upload after this, so a change made to one between the reply and
        this call (by a background thread) is in both the upload and the baseline, and one made after it is
        not in the baseline, so the next delta sends the value again. Not thread-safe with the other methods:
        the replica calls it between cells, while nothing else touches the tracker; :meth:`after_cell` calls
        it first anyway. It also unregisters the pages of buffers the last scan stopped tracking."""
        if self.writes is not None:
            self.writes.release_unneeded()
        baseline = self._baseline
        if baseline is None:
            return
        for name, print_ in list(baseline.items()):
            if print_.pending is not None:
                baseline[name] = print_.settled(self.writes)

    @property
    def unverified(self) -> int:
        """How many names :meth:`verify` has yet to look at."""
        return len(self._unverified)

    def unverify(self) -> None:
        """Have :meth:`verify` look at every name again (after a comm callback, or a while after the last time)."""
        if self._baseline is not None:
            self._unverified = {name for name, now in self._baseline.items() if not now.untracked}

    def verify(self, abort: threading.Event | None = None) -> bool:
        """Fingerprint the names again (those the captures do not fingerprint every time) to find the values that
        changed since the last capture; the next capture fingerprints those again, and so puts them in its
        delta. Returns False when ``abort`` was set before it finished (it goes on from there next time).

        The captures fingerprint only what a cell can reach (see the module docstring); this catches what
        reached the rest anyway (a library that kept a reference, a thread, a comm callback). The replica runs it
        in a thread while the kernel is idle and sets ``abort`` before anything else touches the namespace or
        this tracker: it is not thread-safe with the other methods, and reads the namespace only."""
        self._aborted = None
        self.found = []
        baseline = self._baseline
        if baseline is None:
            return True
        for name in list(self._unverified):
            before, value = baseline.get(name), self.user_ns.get(name, _MISSING)
            if before is None or value is _MISSING or before.pending is not None:
                pass  # gone (the next capture sees that), or new since the last capture (it fingerprints it)
            elif (before.oid, before.type) != (id(value), type(value)):
                self._recheck.add(name)
                self.found.append(name)
            elif before.digest is not None or before.error is not None:
                try:
                    now = fingerprint(
                        value, self.user_ns, writes=self.writes, untracked_min=self.track_min_bytes, abort=abort
                    )
                except FingerprintAborted as exc:
                    self._aborted = exc.memo  # freed by the next verification, not while a request waits
                    return False
                except Exception:  # e.g. a comm callback changed a dict while it was pickled: look again
                    self._recheck.add(name)
                else:
                    if now.pending is not None or not now.same_as(before):
                        self._recheck.add(name)
                        self.found.append(name)
            self._unverified.discard(name)
            if abort is not None and abort.is_set():
                return not self._unverified
        return True

    def refresh(self, names: Iterable[str]) -> None:
        """Re-fingerprint ``names`` into the baseline (after a record changed them from outside a cell)."""
        names = list(names)
        if names:
            self.groups = None  # what they share with other names is known again after the next capture
        if self.writes is not None:
            # The record's writes are not changes to publish: take them into the tokens now (writes to other
            # buffers found by this scan stay detectable: their tokens no longer match the baseline). Also before
            # the first baseline (a follower that never ran a cell): the baseline takes the tokens as they are,
            # and writes no scan had taken in yet would count as the first cell's, which would then send the
            # arrays that records patched here (their chunk lists: about 0.3 MiB per 256 MB) to the others again.
            self.writes.scan()
        baseline = self._baseline
        if baseline is None:
            return
        ids_of: dict[str, list[int]] = {}
        keep: list[Any] = []  # (the pickler memos: ids stay those of live objects while they are compared)
        for name in names:
            if name in self.user_ns and is_user_name(name, self.user_ns[name], self.hidden):
                ids_of[name] = []
                baseline[name] = fingerprint(
                    self.user_ns[name],
                    self.user_ns,
                    ids_of[name],
                    keep,
                    writes=self.writes,
                    clear_dirty=True,
                    untracked_min=self.track_min_bytes,
                )
            else:
                baseline.pop(name, None)
            self._recheck.discard(name)
        # What they share. A record carries every name that shares an object with a name its cell changed (see
        # after_cell), and unpickling it makes new objects but for those pickled by reference (the same objects
        # on the executor): so its names share objects among themselves only, and with other names only where
        # their baseline already says so. (Before, the next capture fingerprinted them again to find out: the
        # first cell a follower ran as the executor fingerprinted everything that records had changed since it
        # last ran one, seconds with a million objects.)
        reached = collections.Counter(oid for ids in ids_of.values() for oid in set(ids))
        elsewhere = {oid for name, now in baseline.items() if name not in ids_of for oid in now.shared}
        for name, ids in ids_of.items():
            shared = frozenset(oid for oid in ids if reached[oid] > 1 or oid in elsewhere)
            if shared != baseline[name].shared:
                baseline[name] = dataclasses.replace(baseline[name], shared=shared)
        keep.clear()

    def apply(self, record: Any, store: Any) -> Any:
        """Apply a state record to this tracker's namespace and keep the baseline in step."""
        rec = apply_record(record, self.user_ns, store, self.lineage)
        self.refresh([*rec.bound, *rec.deleted, *rec.unserializable])
        self.lineage.prune()
        return rec

    def reset(self) -> None:
        """Forget the baseline: the next :meth:`before_cell` fingerprints the whole namespace again."""
        self._baseline = None
        self.groups = None
        self._recheck.clear()
        self._unverified.clear()
        self._aborted = None

    def _must_scan(self, name: str, value: Any, before: Fingerprint | None, written: set[tuple[int, int]]) -> bool:
        """Whether a capture fingerprints ``name`` whether or not the cell reaches it."""
        return (
            before is None
            or before.oid != id(value)
            or before.type is not type(value)
            or before.untracked  # a large buffer that only its checksum can check (the fallback method)
            or not before.buffers.isdisjoint(written)  # a tracked buffer of it was written
            or name in self._recheck
        )

    def _scan(
        self,
        reach: frozenset[str] | None,
        *,
        baseline: Mapping[str, Fingerprint] | None,
        written: set[tuple[int, int]] | None = None,
        abort: threading.Event | None = None,
    ) -> _Scan:
        """Fingerprint the names a cell can reach (every name when ``reach`` or ``baseline`` is None) and those
        :meth:`_must_scan` selects; the others keep their baseline fingerprint."""
        names = self.user_names()
        present = set(names)
        full = reach is None or baseline is None
        if full:
            todo = list(names)
        else:
            assert baseline is not None
            ns, hit = self.user_ns, written or set()
            todo = [n for n in names if self._must_scan(n, ns[n], baseline.get(n), hit)]
            todo.extend(n for n in (*reach, *self._bindings.touched) if n in present)  # type: ignore[misc]
        prints: dict[str, Fingerprint] = {}
        ids_of: dict[str, list[int]] = {}
        keep: list[Any] = []
        queue = collections.deque(todo)
        while queue:
            name = queue.popleft()
            if name in prints:
                continue
            value = self.user_ns[name]
            # New, or bound to another object: in the delta whatever its content (see settle()).
            before = baseline.get(name, None) if baseline is not None else None
            fresh = baseline is not None and (before is None or (before.oid, before.type) != (id(value), type(value)))
            defer = self.defer_min_bytes if fresh else None
            ids: list[int] = []
            now = prints[name] = fingerprint(
                value,
                self.user_ns,
                ids,
                keep,
                defer_buffers=defer,
                writes=self.writes,
                untracked_min=self.track_min_bytes,
                abort=abort,
            )
            ids_of[name] = ids
            if full:
                continue
            # What it reached before the cell ran counts too: a thread's target is gone once it has run.
            reached = now.reach if before is None or before.oid != now.oid else union([now.reach, before.reach])
            if reached is None:  # its code can reach any name: all of them, then
                full = True
                queue.extend(n for n in names if n not in prints)
            else:
                queue.extend(n for n in reached if n in present and n not in prints)
        scanned = set(prints)
        parent: dict[str, str] = {}
        held: dict[str, set[int] | frozenset[int]] = {}  # per name: the ids of the objects it holds
        everyone: set[int] = set()  # the ids held by the names so far
        several: set[int] = set()  # ids reached from more than one name

        def find(name: str) -> str:
            while parent[name] != name:
                parent[name] = parent[parent[name]]
                name = parent[name]
            return name

        # Set operations, not a loop over every id: a list of a million dicts is a million ids.
        for name in names:
            if name in scanned:
                now = prints[name]
                if now.digest is None and now.error is None and now.pending is None:
                    parent[name] = name
                    continue  # immutable atom or module: never shared state
                oids: set[int] | frozenset[int] = set(ids_of[name]) or {id(self.user_ns[name])}
            else:
                assert baseline is not None
                now = prints[name] = baseline[name]
                oids = now.shared
            parent[name] = name
            if not everyone.isdisjoint(oids):
                common = everyone.intersection(oids)
                several |= common
                for other, theirs in held.items():
                    if not theirs.isdisjoint(common):
                        a, b = find(other), find(name)
                        if a != b:
                            parent[b] = a
            everyone |= oids
            held[name] = oids
        for name in scanned:
            mine = frozenset(several.intersection(ids_of[name]))
            if mine != prints[name].shared:
                prints[name] = dataclasses.replace(prints[name], shared=mine)
        keep.clear()
        if self.writes is not None:
            live: set[tuple[int, int]] = set()
            for now in prints.values():
                live |= now.buffers
            self.writes.prune(live)  # buffers no longer reachable from the namespace
        members: dict[str, set[str]] = {}
        for name in parent:
            members.setdefault(find(name), set()).add(name)
        groups: dict[str, frozenset[str]] = {}
        for group in members.values():
            frozen = frozenset(group)
            for name in group:
                groups[name] = frozen
        return _Scan(prints, groups, scanned)


__all__ = [
    "IPYTHON_NAMES",
    "Fingerprint",
    "StateDelta",
    "StateTracker",
    "fingerprint",
    "is_user_name",
]
