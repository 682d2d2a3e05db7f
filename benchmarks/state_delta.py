"""State-delta cost per cell: capture (fingerprints) + encode over unchanged numpy state, and a 100 MB delta.

Runs real cells in IPython's InteractiveShell, tracks them with StateTracker and encodes them into records
with a local object store, as the replica kernel does (serialize_delta, then StateLog.finish; "encode" is both).
Prints a table; not a timed test.

    .venv/bin/python benchmarks/state_delta.py [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np
from IPython.core.interactiveshell import InteractiveShell

from jupyter_notebookos.kernel.statelog import StateLog, serialize_delta
from jupyter_notebookos.replication.config import DEFAULT_BUFFER_THRESHOLD
from jupyter_notebookos.replication.objectstore import ObjectStore
from jupyter_notebookos.replication.protocol import LogRecord
from jupyter_notebookos.replication.records import apply_record
from jupyter_notebookos.replication.state import StateDelta, StateTracker

MB = 1024 * 1024


def _encode(store: ObjectStore, delta: StateDelta) -> tuple[StateLog, LogRecord]:
    """What the replica kernel does with a cell's delta once it replied: pickle it, upload its buffers."""
    statelog = StateLog(store, "bench")
    return statelog, statelog.finish(serialize_delta(delta, DEFAULT_BUFFER_THRESHOLD), 1, "cell")


def _cell(shell: InteractiveShell, tracker: StateTracker, store: ObjectStore, code: str) -> tuple[float, float]:
    tracker.before_cell(code)
    shell.run_cell(code, silent=True)
    t0 = time.perf_counter()
    delta = tracker.after_cell()
    t1 = time.perf_counter()
    _encode(store, delta)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def unchanged_state(shell: InteractiveShell, store: ObjectStore, megabytes: int, repeat: int) -> list[str]:
    shell.reset(new_session=False)
    arrays = megabytes // 25
    shell.user_ns.update({f"w{i}": np.random.rand(25 * MB // 8) for i in range(arrays)})
    shell.run_cell("import numpy as np\nconfig = {'lr': 0.1, 'layers': [64, 64]}\nlosses = []", silent=True)
    tracker = StateTracker(shell.user_ns, hidden=shell.user_ns_hidden, transform=shell.transform_cell)
    tracker.before_cell("")  # baseline, as on the first cell of a kernel
    tracker.after_cell()
    captures, encodes = [], []
    for i in range(repeat):
        capture, encode = _cell(shell, tracker, store, f"losses.append({i} * 0.5)\nstep = {i}")
        captures.append(capture)
        encodes.append(encode)
    c, e = statistics.median(captures), statistics.median(encodes)
    return [
        f"trivial cell, {megabytes:>4} MB unchanged numpy state",
        f"{c * 1e3:9.1f}",
        f"{e * 1e3:9.1f}",
        f"{(c + e) * 1e3:9.1f}",
    ]


def big_delta(shell: InteractiveShell, store: ObjectStore, repeat: int) -> list[list[str]]:
    rows = []
    encode_times, apply_times, capture_times = [], [], []
    for i in range(repeat):
        shell.reset(new_session=False)
        tracker = StateTracker(shell.user_ns, hidden=shell.user_ns_hidden, transform=shell.transform_cell)
        code = f"import numpy as np\nbig = np.random.default_rng({i}).random(100 * 1024 * 1024 // 8)"
        tracker.before_cell(code)
        shell.run_cell(code, silent=True)
        t0 = time.perf_counter()
        delta = tracker.after_cell()
        t1 = time.perf_counter()
        statelog, published = _encode(store, delta)
        t2 = time.perf_counter()
        record = statelog.load(published)
        assert record is not None
        data = record.to_bytes()
        target: dict = {}
        t3 = time.perf_counter()
        apply_record(data, target, store)
        t4 = time.perf_counter()
        assert np.array_equal(target["big"], shell.user_ns["big"])
        capture_times.append(t1 - t0)
        encode_times.append(t2 - t1)
        apply_times.append(t4 - t3)
    rows.append(
        [
            "100 MB array delta: capture / encode+upload",
            f"{statistics.median(capture_times) * 1e3:9.1f}",
            f"{statistics.median(encode_times) * 1e3:9.1f}",
            f"{(statistics.median(capture_times) + statistics.median(encode_times)) * 1e3:9.1f}",
        ]
    )
    rows.append(
        [
            f"100 MB array delta: apply (fetch+verify), record {len(data)} B",
            "",
            f"{statistics.median(apply_times) * 1e3:9.1f}",
            f"{statistics.median(apply_times) * 1e3:9.1f}",
        ]
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    shell = InteractiveShell.instance()
    with tempfile.TemporaryDirectory() as tmp:
        store = ObjectStore(f"file://{tmp}/objects")
        rows = [unchanged_state(shell, store, mb, args.repeat) for mb in (0, 100, 500)]
        rows += big_delta(shell, store, max(2, args.repeat // 2))
    header = ["case (median of runs)", "capture ms", "encode ms", "total ms"]
    width = max(len(r[0]) for r in [header, *rows])
    print(f"{header[0]:<{width}}  {header[1]:>10} {header[2]:>10} {header[3]:>10}")
    for row in rows:
        print(f"{row[0]:<{width}}  {row[1]:>10} {row[2]:>10} {row[3]:>10}")


if __name__ == "__main__":
    main()
