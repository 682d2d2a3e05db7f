"""Every way of changing a large array in place is detected and replicated, by both change detection methods.

The primary method is kernel write tracking (userfaultfd write-protect + PAGEMAP_SCAN, writetrack.py); the
fallback checksums every buffer. Each test runs with both; the tracking variant is skipped only where the
kernel offers no write tracking (and says why).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from replication_harness import Executor, published

from jupyter_notebookos.replication.writetrack import METHOD, PageWriteTracker, open_write_tracker

# Above glibc's largest mmap threshold (32 MiB), so each array has pages of its own: a write-tracked array that
# shares its edge page with a neighbour is re-sent when the neighbour's edge is written (a cost, not an error).
N = 2**22 + 512
SETUP = f"import numpy as np\nbig = np.arange({N}, dtype=np.float64)\nother = np.ones({N})\nsmall = [1, 2]"

FORMS = {
    "item assignment": "big[5] = -1.0",
    "augmented slice": "big[100:200] += 1",
    "through a function": "def bump(x):\n    x[7] *= 3\nbump(big)",
    "through a view made in a function": "def halve():\n    w = big[1000:3000]\n    w /= 2\nhalve()",
    "through a reshaped view": "big[: 2 ** 22].reshape(2048, 2048)[3, :] = 9",
    "np.add out=": "np.add(big[:50], 1, out=big[:50])",
    "C extension (ctypes.memset)": "import ctypes\nctypes.memset(big.ctypes.data + 8 * 70000, 0xFF, 8)",
    "the OS writing (readinto)": (
        "import io\nio.BytesIO(b'\\x11' * 4096).readinto(memoryview(big).cast('B')[8 * 2000000 :])"
    ),
    "a thread during the cell": (
        "import threading\nt = threading.Thread(target=lambda: big.__setitem__(3456789, 4.5))\nt.start()\nt.join()"
    ),
}


def _tracking_available() -> str | None:
    tracker, why = open_write_tracker()
    if tracker is None:
        return why
    tracker.close()
    return None


@pytest.fixture(params=["tracking", "checksum"])
def detector(request, shell, store) -> Executor:
    if request.param == "tracking" and (why := _tracking_available()) is not None:
        pytest.skip(f"write tracking {why}")
    ex = Executor(shell, store, write_tracking=request.param == "tracking")
    assert (ex.tracker.method == METHOD) == (request.param == "tracking")
    return ex


def _run(executor: Executor, code: str):
    delta = executor.run(code)
    executor.tracker.settle()  # as the replica does after the reply (checksums left for later)
    return delta


def _same_arrays(executor: Executor, replica, names=("big", "other")) -> None:
    for name in names:
        expected = executor.ns[name]
        got = replica.eval(f"{name}.tobytes()")
        assert got == expected.tobytes(), f"{name} differs on the replica"


@pytest.mark.parametrize("form", list(FORMS))
def test_every_in_place_change_form_is_detected_and_replicated(detector, replica, form):
    _run(detector, SETUP)
    replica.apply(detector.records[-1])
    before = detector.ns["big"].copy()
    delta = _run(detector, FORMS[form])
    assert not np.array_equal(before, detector.ns["big"]), "the form did not change the array"
    assert delta.why.get("big") == "mutated"
    assert "other" not in delta.values and "small" not in delta.values  # untouched: not re-sent
    replica.apply(detector.records[-1])
    _same_arrays(detector, replica)


def test_a_thread_writing_while_no_cell_runs_is_caught_by_the_next_cell(detector, replica):
    _run(detector, SETUP)
    replica.apply(detector.records[-1])
    go = threading.Event()
    detector.ns["go"] = go
    _run(
        detector,
        "import threading\n"
        "def writer():\n    go.wait(10)\n    other[77] = 42.0\n"
        "bg = threading.Thread(target=writer, daemon=True)\nbg.start()",
    )
    replica.apply(detector.records[-1])
    go.set()  # the write happens between cells
    detector.ns["bg"].join(10)
    delta = _run(detector, "pass")
    assert delta.why.get("other") == "mutated"
    replica.apply(detector.records[-1])
    _same_arrays(detector, replica)


def test_a_write_found_by_a_records_scan_still_reaches_the_next_capture(detector, replica):
    """A record applied on this replica scans the tracked buffers too (refresh): a thread's write it finds there
    must still put the buffer's name in the next capture, which the cell does not reach."""
    _run(detector, SETUP)
    replica.apply(detector.records[-1])
    detector.ns["other"][77] = 42.0  # as a thread would, between cells
    detector.tracker.refresh([])  # a record's names: none of these
    delta = _run(detector, "pass")
    assert delta.why.get("other") == "mutated"
    replica.apply(detector.records[-1])
    _same_arrays(detector, replica)


def test_an_unchanged_namespace_gives_an_empty_delta(detector):
    _run(detector, SETUP)
    assert _run(detector, "x = 1").names == {"x"}
    assert _run(detector, "pass").is_empty()


def test_a_new_value_mixing_buffer_kinds_is_not_sent_again_by_the_next_cell(detector, replica):
    """A new value's large buffers are registered (or checksummed) after the reply, not before: its settled
    fingerprint must be the one the next cell computes, whatever mix of buffers it holds (tracked, read-only and
    below the tracking size), or the next cell would send it all again."""
    _run(detector, SETUP)
    mixed = (
        f"mixed = {{'tracked': np.ones({N}), 'small': np.arange(1000), 'ro': np.frombuffer(bytes({N}), np.uint8),"
        " 'tracked2': np.zeros(2 ** 20)}"
    )
    assert _run(detector, mixed).why == {"mixed": "new"}
    replica.apply(detector.records[-1])
    assert _run(detector, "pass").is_empty()
    delta = _run(detector, "mixed['tracked2'][5] = 3.0")
    assert delta.why == {"mixed": "mutated"}
    replica.apply(detector.records[-1])
    assert replica.eval("float(mixed['tracked2'][5]) + float(mixed['small'][999])") == 1002.0


def test_a_write_to_a_new_array_between_the_reply_and_its_upload_is_published(detector, replica):
    """In the replica's order: capture before the reply, then (after it) settle() and the upload. The new
    array's pages are protected (or checksummed) in settle(), so a write before it (a thread the cell started)
    is in the upload and in the baseline, and a write after it is the next cell's change."""
    _run(detector, SETUP)
    replica.apply(detector.records[-1])
    tracker = detector.tracker
    code = f"fresh = np.zeros({N})"
    tracker.before_cell(code)
    assert detector.shell.run_cell(code, silent=True).success
    delta = tracker.after_cell()
    detector.ns["fresh"][123] = 7.0  # after the reply, before settle()
    tracker.settle()
    record = published(detector.statelog, delta, detector.threshold)
    replica.apply(record.to_bytes())
    assert replica.eval("float(fresh[123])") == 7.0
    assert _run(detector, "pass").is_empty()  # the write before settle() is not a change of the next cell
    detector.ns["fresh"][456] = 8.0  # after settle(): the next cell's change
    delta = _run(detector, "pass")
    assert delta.why == {"fresh": "mutated"}
    replica.apply(detector.records[-1])
    assert replica.eval("float(fresh[123]) + float(fresh[456])") == 15.0


def test_write_tracking_follows_an_array_and_its_view_independently():
    if (why := _tracking_available()) is not None:
        pytest.skip(f"write tracking {why}")
    tracker = PageWriteTracker(min_bytes=1)
    try:
        base = np.zeros(2**20)
        view = base[2**19 :]
        whole, half = memoryview(base), memoryview(view)
        t_whole, t_half = tracker.token(whole), tracker.token(half)
        base[10] = 1  # only the first half
        assert tracker.scan() == 1
        assert tracker.token(whole) != t_whole and tracker.token(half) == t_half
        view[10] = 1  # pages both of them cover: both are told
        assert tracker.scan() == 2
        assert tracker.token(half) != t_half
        spans = tracker.take_dirty(half)
        assert spans and spans[0][0] <= 80 < spans[0][1]
        assert tracker.take_dirty(half) == []
        ro = memoryview(bytes(2**20))
        assert tracker.token(ro) is None  # read-only: the caller checksums it
    finally:
        tracker.close()


def test_a_write_next_to_a_buffer_in_a_shared_page_does_not_count_as_its_change():
    if (why := _tracking_available()) is not None:
        pytest.skip(f"write tracking {why}")
    from jupyter_notebookos.replication.writetrack import PAGE, buffer_address

    tracker = PageWriteTracker(min_bytes=1)
    try:
        arena = bytearray(8 * PAGE)
        whole = memoryview(arena)
        skip = (PAGE - (buffer_address(whole) or 0) % PAGE) % PAGE + 100  # 100 bytes into a page
        buf = whole[skip : skip + 2 * PAGE]  # shares its first and last pages with the rest of the arena
        token = tracker.token(buf)
        arena[skip - 1] = 7  # a neighbour's byte in the first page
        arena[skip + 2 * PAGE + 5] = 7  # and in the last page
        assert tracker.scan() == 0 and tracker.token(buf) == token
        arena[skip + 2 * PAGE - 1] = 7  # its own last byte, in the shared page
        assert tracker.scan() == 1 and tracker.token(buf) != token
    finally:
        tracker.close()


def _protected_pages(tracker: PageWriteTracker, start: int, end: int) -> int:
    """Pages of [start, end) still write-protected (PAGEMAP_SCAN reports, without protecting anything)."""
    import ctypes

    from jupyter_notebookos.replication import writetrack as wt

    regions = (wt._PageRegion * 64)()
    arg = wt._ScanArg(
        ctypes.sizeof(wt._ScanArg), 0, start, end, 0, ctypes.addressof(regions), 64, 0, 0, 0, 0, wt._PAGE_IS_WRITTEN
    )
    n = tracker._libc.ioctl(tracker._pagemap, ctypes.c_ulong(wt._PAGEMAP_SCAN), ctypes.byref(arg))
    assert n >= 0
    written = sum(regions[i].end - regions[i].start for i in range(n) if regions[i].categories & wt._PAGE_IS_WRITTEN)
    return (end - start - written) // wt.PAGE


def test_a_buffer_no_longer_tracked_leaves_its_pages_unprotected_unless_a_tracked_one_shares_them():
    """Freed arrays often stay mapped (glibc's heap) and their memory is reused: protected pages would make
    every first write to them a fault, paid by whatever reuses the memory."""
    if (why := _tracking_available()) is not None:
        pytest.skip(f"write tracking {why}")
    import mmap

    from jupyter_notebookos.replication.writetrack import PAGE, buffer_address

    tracker = PageWriteTracker(min_bytes=1)
    memory = mmap.mmap(-1, 8 << 20)  # page-aligned, as a large array's mapping is, give or take its header
    try:
        base = np.frombuffer(memory, dtype=np.float64)
        view = base[2**19 :]
        start = buffer_address(memoryview(base)) or 0
        middle, end = start + base.nbytes // 2, start + base.nbytes
        assert start % PAGE == 0
        tracker.token(memoryview(base))
        tracker.token(memoryview(view))
        assert _protected_pages(tracker, start, end) == base.nbytes // PAGE
        tracker.forget(memoryview(base))
        assert _protected_pages(tracker, start, middle) == 0
        assert _protected_pages(tracker, middle, end) == view.nbytes // PAGE  # the view is still tracked
        token = tracker.token(memoryview(view))
        view[3] = 1.0
        assert tracker.scan() == 1 and tracker.token(memoryview(view)) != token
        tracker.prune(set())
        assert _protected_pages(tracker, middle, end) == view.nbytes // PAGE  # released after the reply...
        tracker.release_unneeded()
        assert _protected_pages(tracker, start, end) == 0  # ...as StateTracker.settle does
        token = tracker.token(memoryview(base))  # tracked again: protected again, writes seen
        assert _protected_pages(tracker, start, end) == base.nbytes // PAGE
        base[0] = 2.0
        assert tracker.scan() == 1 and tracker.token(memoryview(base)) != token
    finally:
        tracker.close()
