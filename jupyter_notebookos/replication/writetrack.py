"""Kernel write tracking of large buffers: which pages of the user's arrays were written since the last look.

Checksumming every large buffer after every cell costs time in proportion to the state a notebook holds
(about 0.45 s per GB). Linux can instead tell us which pages were written: a buffer's pages are registered
with a ``userfaultfd`` in *asynchronous write-protect* mode (``UFFD_FEATURE_WP_ASYNC``, Linux 6.7+), and the
``PAGEMAP_SCAN`` ioctl on ``/proc/self/pagemap`` lists the pages written since they were last protected and
protects them again, atomically, in one call. The first write to a protected page is resolved by the kernel
itself (no fault-handling thread); it only clears the page's protection bit. So every write is seen, whoever
makes it: Python code, ``np.add(..., out=)``, a C extension, another thread, or the kernel itself
(``readinto``). A scan of a clean 256 MB range takes about 20 microseconds.

Cost model. :meth:`PageWriteTracker.scan` is one ioctl per tracked buffer; a buffer's *generation* is bumped
whenever a scan finds written pages in it. The state tracker uses ``(address, size, generation)`` as the
buffer's fingerprint instead of a checksum of its bytes, and :meth:`PageWriteTracker.take_dirty` says which
byte spans changed since they were last taken (for chunked deltas).

Where it is not available (another OS, an older kernel, a ``userfaultfd`` refused by seccomp or
``vm.unprivileged_userfaultfd``, a buffer in a file mapping), :func:`open_write_tracker` returns None or
:meth:`PageWriteTracker.token` returns None for that buffer, and the caller checksums it instead. The tracker
opens the ``userfaultfd`` with ``UFFD_USER_MODE_ONLY``, which an unprivileged process may always do.

Limits: a page is the unit (a one-byte write marks 4 KiB, or the huge page's 4 KiB sub-pages, dirty), so a
buffer that shares its first or last page with a neighbouring allocation (arrays below glibc's mmap
threshold, at most 32 MiB, may sit next to each other on the heap) counts as written when the neighbour's
edge is written. Such a buffer's own bytes in those shared pages are checksummed (a few KiB, read through
``/proc/self/mem``) when only they were seen written, so a busy neighbour does not make it look changed;
``madvise(MADV_DONTNEED)`` on a tracked buffer (which zeroes it) is not a write and is not seen. A write to a
protected transparent huge page splits it into 4 KiB mappings (the kernel's way of resolving it in asynchronous
mode), so a tracked array written in place loses its huge pages (see docs/state-tracking.md).
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import logging
import os
import struct
import sys
import threading
import weakref
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import xxhash

log = logging.getLogger(__name__)

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
METHOD = "userfaultfd-wp+pagemap-scan"

_SYS_USERFAULTFD = {"x86_64": 323, "aarch64": 282}
_UFFD_USER_MODE_ONLY = 1
_UFFD_API = 0xAA
_UFFD_FEATURE_WP_UNPOPULATED = 1 << 13
_UFFD_FEATURE_WP_ASYNC = 1 << 15
_UFFDIO_REGISTER_MODE_WP = 1 << 1


def _iowr(kind: int, nr: int, size: int) -> int:
    return (3 << 30) | (size << 16) | (kind << 8) | nr


def _ior(kind: int, nr: int, size: int) -> int:
    return (2 << 30) | (size << 16) | (kind << 8) | nr


_UFFDIO_API = _iowr(0xAA, 0x3F, 24)
_UFFDIO_REGISTER = _iowr(0xAA, 0x00, 32)
_UFFDIO_UNREGISTER = _ior(0xAA, 0x01, 16)
_PAGEMAP_SCAN = _iowr(ord("f"), 16, 96)
_PM_SCAN_WP_MATCHING = 1 << 0
_PM_SCAN_CHECK_WPASYNC = 1 << 1
_PAGE_IS_WRITTEN = 1 << 1


class _UffdApi(ctypes.Structure):
    _fields_ = [("api", ctypes.c_uint64), ("features", ctypes.c_uint64), ("ioctls", ctypes.c_uint64)]


class _UffdRange(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _UffdRegister(ctypes.Structure):
    _fields_ = [("range", _UffdRange), ("mode", ctypes.c_uint64), ("ioctls", ctypes.c_uint64)]


_SCAN_FIELDS = (
    "size flags start end walk_end vec vec_len max_pages "
    "category_inverted category_mask category_anyof_mask return_mask"
)


class _ScanArg(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in _SCAN_FIELDS.split(" ")]


class _PageRegion(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint64), ("end", ctypes.c_uint64), ("categories", ctypes.c_uint64)]


_REGIONS = 512
# Generations are unique across all buffers and re-registrations, so a token is never reused.
_generations = itertools.count(1)


class WriteTrackingUnavailable(OSError):
    """This process cannot track writes with userfaultfd + PAGEMAP_SCAN; the message says why."""


def buffer_address(view: memoryview) -> int | None:
    """The address of a writable, C-contiguous buffer's first byte (None when it is read-only)."""
    if view.readonly or not view.c_contiguous:
        return None
    if view.nbytes == 0:
        return None
    flat = view if (view.format == "B" and view.ndim == 1) else view.cast("B")
    return ctypes.addressof(ctypes.c_char.from_buffer(flat))


@dataclass
class _Tracked:
    """One registered buffer: its bytes, the page span that covers them, and what was seen written."""

    address: int
    nbytes: int
    generation: int
    registered: int = 0  # the generation it was registered with: names this registration
    edges: bytes | None = None  # checksum of its bytes in the pages it shares with its neighbours
    dirty: list[tuple[int, int]] = field(default_factory=list)  # byte spans relative to ``address``

    @property
    def head(self) -> int:
        """Bytes of the buffer in its first page when that page also holds something else (else 0)."""
        offset = self.address % PAGE
        return 0 if offset == 0 else min(self.nbytes, PAGE - offset)

    @property
    def tail(self) -> int:
        """Where the buffer's last page starts when that page also holds something else (else its size)."""
        end = self.address + self.nbytes
        return self.nbytes if end % PAGE == 0 else max(self.head, end - end % PAGE - self.address)

    def only_edges(self, spans: list[tuple[int, int]]) -> bool:
        """Whether every written span lies in the shared first or last page."""
        head, tail = self.head, self.tail
        return all(end <= head or start >= tail for start, end in spans)

    @property
    def span(self) -> tuple[int, int]:
        start = self.address - self.address % PAGE
        end = -(-(self.address + self.nbytes) // PAGE) * PAGE
        return start, end


class _Channel:
    """The process's userfaultfd and ``/proc/self/pagemap`` descriptors: one per process, because a memory
    area can be registered with only one userfaultfd, and shared by every tracker of the process."""

    _lock = threading.Lock()
    _current: _Channel | None = None

    def __init__(self) -> None:
        self.pid = os.getpid()
        # The page spans of every buffer the process's trackers follow (a span twice: two buffers share it).
        self.spans_lock = threading.Lock()
        self.held: Counter[tuple[int, int]] = Counter()
        # Spans of trackers collected without close(): released at the next register or release (a finalizer
        # may run inside either, so it only appends).
        self.orphaned: list[tuple[int, int]] = []
        self.libc = ctypes.CDLL(None, use_errno=True)
        machine = os.uname().machine if hasattr(os, "uname") else ""
        if not sys.platform.startswith("linux") or machine not in _SYS_USERFAULTFD:
            raise WriteTrackingUnavailable(f"write tracking needs Linux on x86_64 or aarch64 (here {machine})")
        fd = self.libc.syscall(_SYS_USERFAULTFD[machine], os.O_CLOEXEC | os.O_NONBLOCK | _UFFD_USER_MODE_ONLY)
        if fd < 0:
            raise WriteTrackingUnavailable(f"userfaultfd() failed: {os.strerror(ctypes.get_errno())}")
        self.uffd = fd
        try:
            api = _UffdApi(_UFFD_API, _UFFD_FEATURE_WP_ASYNC | _UFFD_FEATURE_WP_UNPOPULATED, 0)
            if self.libc.ioctl(fd, ctypes.c_ulong(_UFFDIO_API), ctypes.byref(api)) < 0:
                err = ctypes.get_errno()
                raise WriteTrackingUnavailable(
                    err, f"UFFDIO_API with WP_ASYNC (needs Linux 6.7+) failed: {os.strerror(err)}"
                )
            self.pagemap = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
            try:  # reads that fail (EIO) instead of crashing when the memory went away
                self.mem: int | None = os.open("/proc/self/mem", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self.mem = None
        except BaseException:
            os.close(fd)
            raise

    def register(self, start: int, end: int) -> bool:
        """Register the pages of [start, end) for write-protection; False when the kernel refuses."""
        with self.spans_lock:
            self._release_orphaned()
            reg = _UffdRegister(_UffdRange(start, end - start), _UFFDIO_REGISTER_MODE_WP, 0)
            if self.libc.ioctl(self.uffd, ctypes.c_ulong(_UFFDIO_REGISTER), ctypes.byref(reg)) < 0:
                return False
            self.held[(start, end)] += 1
            return True

    def release(self, spans: Iterable[tuple[int, int]]) -> None:
        """Spans no longer followed: unregister the pages in them that no other followed span covers.

        Unregistering also drops the pages' write protection. Without it, memory freed into the heap (glibc keeps
        it mapped) stays protected, and whatever reuses it next, such as the next array allocated, pays a
        protection fault on the first write to each page: about 30 ms for 100 MB."""
        with self.spans_lock:
            self._release_orphaned()
            self._release(list(spans))

    def _release_orphaned(self) -> None:
        orphaned, self.orphaned = self.orphaned, []
        if orphaned:
            self._release(orphaned)

    def _release(self, spans: list[tuple[int, int]]) -> None:
        released = [span for span in spans if self.held[span] > 0]
        for span in released:
            self.held[span] -= 1
            if self.held[span] == 0:
                del self.held[span]
        for span in released:
            for start, end in _uncovered(span, self.held):
                rng = _UffdRange(start, end - start)
                if self.libc.ioctl(self.uffd, ctypes.c_ulong(_UFFDIO_UNREGISTER), ctypes.byref(rng)) < 0:
                    # Unmapped already (the usual end of a large array): nothing is left to unprotect.
                    log.debug("unregistering %#x-%#x: %s", start, end, os.strerror(ctypes.get_errno()))

    @classmethod
    def get(cls) -> _Channel:
        """This process's channel (a forked child gets its own: the parent's describe the parent's memory)."""
        with cls._lock:
            if cls._current is None or cls._current.pid != os.getpid():
                cls._current = _Channel()
            return cls._current


def _orphan(channel: _Channel, tracked: dict[tuple[int, int], _Tracked], unneeded: list[tuple[int, int]]) -> None:
    """A tracker was collected without close(): its spans are no longer followed."""
    channel.orphaned.extend([*unneeded, *(t.span for t in tracked.values())])


def _uncovered(span: tuple[int, int], held: Counter[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of ``span`` that no span in ``held`` overlaps."""
    start, end = span
    out: list[tuple[int, int]] = []
    for other_start, other_end in sorted(s for s in held if s[0] < end and s[1] > start):
        if other_start > start:
            out.append((start, other_start))
        start = max(start, other_end)
        if start >= end:
            return out
    if start < end:
        out.append((start, end))
    return out


class PageWriteTracker:
    """Tracks writes to large buffers by page (see the module docstring). Thread-safe."""

    method = METHOD

    def __init__(self, *, min_bytes: int = 1 << 20) -> None:
        self.min_bytes = min_bytes
        channel = self._channel = _Channel.get()
        self._libc, self._uffd, self._pagemap = channel.libc, channel.uffd, channel.pagemap
        self._mem = channel.mem
        self._lock = threading.Lock()
        self._tracked: dict[tuple[int, int], _Tracked] = {}
        self._unneeded: list[tuple[int, int]] = []  # spans of buffers pruned, not yet released (see prune)
        self._written: set[tuple[int, int]] = set()  # the buffers scans found written, until take_written()
        # Changed in place only: the finalizer holds these two, not the tracker.
        weakref.finalize(self, _orphan, channel, self._tracked, self._unneeded)
        self._regions = (_PageRegion * _REGIONS)()
        self._probe()

    def _probe(self) -> None:
        """Check on a scratch buffer that a write is seen (PAGEMAP_SCAN exists and works here)."""
        scratch = bytearray(4 * PAGE)
        view = memoryview(scratch)
        token = self.token(view)
        if token is None:
            raise WriteTrackingUnavailable("registering a scratch buffer for write-protection failed")
        scratch[2 * PAGE] = 1
        self.scan()
        changed = self.token(view) != token
        self.forget(view)
        if not changed:
            raise WriteTrackingUnavailable("PAGEMAP_SCAN did not report a write to a protected page")

    # -- tracking --------------------------------------------------------------------------------------

    def token(self, view: memoryview, *, register: bool = True) -> bytes | None:
        """The buffer's version token (changes whenever a scan finds it written); None when it cannot be
        tracked (read-only or non-contiguous view, a file mapping...): checksum it instead.

        The first call registers the buffer and write-protects it: its token then stands for its content as
        of that moment. With ``register`` False, a buffer not tracked yet gets None."""
        address = buffer_address(view)
        if address is None:
            return None
        key = (address, view.nbytes)
        with self._lock:
            tracked = self._tracked.get(key)
            if tracked is None:
                if not register:
                    return None
                tracked = self._register(address, view.nbytes)
                if tracked is None:
                    return None
            return struct.pack("<QQQ", address, view.nbytes, tracked.generation)

    def _register(self, address: int, nbytes: int) -> _Tracked | None:
        generation = next(_generations)
        tracked = _Tracked(address, nbytes, generation, registered=generation)
        start, end = tracked.span
        if not self._channel.register(start, end):
            log.debug("cannot track %d bytes at %#x: %s", nbytes, address, os.strerror(ctypes.get_errno()))
            return None
        try:
            self._scan_span(start, end)  # write-protect every page; what it finds predates the token
        except OSError:
            self._channel.release([(start, end)])
            return None
        tracked.edges = self._edges(tracked)
        self._tracked[(address, nbytes)] = tracked
        return tracked

    def _scan_span(self, start: int, end: int) -> list[tuple[int, int]]:
        """Written page spans in [start, end), write-protecting them again. Raises OSError."""
        found: list[tuple[int, int]] = []
        regions = self._regions
        while start < end:
            arg = _ScanArg(
                ctypes.sizeof(_ScanArg),
                _PM_SCAN_WP_MATCHING | _PM_SCAN_CHECK_WPASYNC,
                start,
                end,
                0,
                ctypes.addressof(regions),
                _REGIONS,
                0,
                0,
                _PAGE_IS_WRITTEN,
                0,
                _PAGE_IS_WRITTEN,
            )
            n = int(self._libc.ioctl(self._pagemap, ctypes.c_ulong(_PAGEMAP_SCAN), ctypes.byref(arg)))
            if n < 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err))
            found.extend((regions[i].start, regions[i].end) for i in range(n))
            if arg.walk_end <= start:
                break
            start = arg.walk_end
        return found

    def _edges(self, tracked: _Tracked) -> bytes | None:
        """A checksum of the buffer's bytes in its shared first and last pages (None: cannot read them)."""
        head, tail, mem = tracked.head, tracked.tail, self._mem
        if mem is None or (head == 0 and tail == tracked.nbytes):
            return None
        try:
            data = os.pread(mem, head, tracked.address) + os.pread(mem, tracked.nbytes - tail, tracked.address + tail)
        except OSError:
            return None
        return xxhash.xxh3_128_digest(data)

    def scan(self) -> int:
        """Look at every tracked buffer: bump the generation of each one written since the last scan.
        Returns how many were written; their ``(address, size)`` are kept for :meth:`take_written`.

        Overlapping buffers (an array and a view of it) share pages, and a scan re-protects what it finds:
        so the union of their page spans is scanned once and what is found is given to each of them."""
        with self._lock:
            entries = sorted(self._tracked.items(), key=lambda kv: kv[1].span)
            written: set[tuple[int, int]] = set()
            i = 0
            while i < len(entries):
                start, end = entries[i][1].span
                j = i + 1
                while j < len(entries) and entries[j][1].span[0] < end:
                    end = max(end, entries[j][1].span[1])
                    j += 1
                group = entries[i:j]
                i = j
                try:
                    spans = self._scan_span(start, end)
                except OSError as exc:
                    # The mapping went away or was replaced (the buffer was freed and the address reused by
                    # a new mapping): count them as written everywhere and register them again next time.
                    if exc.errno not in (errno.EPERM, errno.EINVAL, errno.EFAULT, errno.ENOMEM):
                        log.warning("PAGEMAP_SCAN failed: %s", exc)
                    for key, _ in group:
                        del self._tracked[key]
                        written.add(key)
                    self._unneeded.extend(t.span for _, t in group)
                    continue
                if not spans:
                    continue
                for key, tracked in group:
                    base, size = tracked.address, tracked.nbytes
                    mine = [(max(s - base, 0), min(e - base, size)) for s, e in spans if s < base + size and e > base]
                    if mine and tracked.only_edges(mine):
                        # Only the pages it shares with neighbouring allocations: did its own bytes change?
                        edges = self._edges(tracked)
                        if edges is not None and edges == tracked.edges:
                            continue
                    if mine:
                        tracked.edges = self._edges(tracked)
                        tracked.generation = next(_generations)
                        tracked.dirty.extend(mine)
                        written.add(key)
            self._written |= written
        return len(written)

    def take_written(self) -> set[tuple[int, int]]:
        """The ``(address, size)`` of the buffers the scans since the last call found written, and forget them.
        (Whoever scans in between, such as a record applied on this replica, does not take them away.)"""
        with self._lock:
            written, self._written = self._written, set()
        return written

    def take_dirty(self, view: memoryview) -> list[tuple[int, int]] | None:
        """The byte spans of ``view`` seen written since the last call (merged, sorted), and forget them;
        None when the buffer is not tracked (its whole content must be taken as changed)."""
        address = buffer_address(view)
        if address is None:
            return None
        with self._lock:
            tracked = self._tracked.get((address, view.nbytes))
            if tracked is None:
                return None
            spans, tracked.dirty = sorted(tracked.dirty), []
        merged: list[tuple[int, int]] = []
        for start, end in spans:
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        return merged

    def registration(self, view: memoryview) -> int | None:
        """The id of ``view``'s current registration (None when not tracked): a buffer that stopped being
        tracked and was tracked again has lost the record of what was written in between."""
        address = buffer_address(view)
        return None if address is None else self.registration_at((address, view.nbytes))

    def registration_at(self, key: tuple[int, int]) -> int | None:
        """The id of the registration of the buffer at ``(address, size)``, or None."""
        with self._lock:
            tracked = self._tracked.get(key)
            return None if tracked is None else tracked.registered

    def forget(self, view: memoryview) -> None:
        """Stop tracking ``view`` (its pages no other tracked buffer shares are unregistered)."""
        address = buffer_address(view)
        if address is not None:
            with self._lock:
                dropped = self._tracked.pop((address, view.nbytes), None)
                if dropped is not None:
                    self._channel.release([dropped.span])

    def prune(self, live: set[tuple[int, int]]) -> None:
        """Stop tracking buffers whose ``(address, size)`` is not in ``live``.

        Their pages are unregistered by :meth:`release_unneeded`, which the state tracker calls after the reply
        (unregistering walks the pages: about 0.7 ms for 100 MB). Until then they stay protected; a buffer
        registered over them meanwhile keeps its own pages protected."""
        with self._lock:
            self._unneeded.extend(self._tracked.pop(k).span for k in [k for k in self._tracked if k not in live])

    def release_unneeded(self) -> None:
        """Unregister the pages of the buffers pruned since the last call (those no tracked buffer shares)."""
        with self._lock:
            spans = self._unneeded[:]
            self._unneeded.clear()
            if spans:
                self._channel.release(spans)

    @property
    def tracked_bytes(self) -> int:
        """Bytes of buffers currently tracked."""
        return sum(t.nbytes for t in list(self._tracked.values()))

    def close(self) -> None:
        """Stop tracking everything (the process's descriptors stay open for other trackers)."""
        with self._lock:
            self._channel.release([*self._unneeded, *(t.span for t in self._tracked.values())])
            self._tracked.clear()
            self._unneeded.clear()


def open_write_tracker(min_bytes: int = 1 << 20) -> tuple[PageWriteTracker | None, str]:
    """A tracker, or None with the reason it is unavailable here (the caller then checksums buffers)."""
    try:
        return PageWriteTracker(min_bytes=min_bytes), METHOD
    except (WriteTrackingUnavailable, OSError) as exc:
        return None, f"unavailable: {exc}"


__all__ = [
    "METHOD",
    "PAGE",
    "PageWriteTracker",
    "WriteTrackingUnavailable",
    "buffer_address",
    "open_write_tracker",
]
