"""Per-cell cost against the state a notebook holds: plain EG kernel vs NotebookOS, in one run.

Starts one platform (`notebookos up --no-lab`), a plain ``python3`` kernel and a ``python3-notebookos`` kernel
on it, and measures, interleaving the two kernels so that noise on a shared machine hits both alike:

- trivial-cell latency (``pass``), p50 / p99, with 0, 0.25, 1 (and, with ``--max-gb``, more) GB of numpy
  arrays held in the namespace (both kernels hold the same arrays; ``--state torch``: torch CPU tensors, for
  which the kernels' Python needs torch);
- a cell changing 1 MiB of a 1 GB array: reply time, bytes published (what the object store grew by: the
  chunks; the etcd record is a few hundred bytes more), and the time until both followers applied it;
- trivial-cell latency with many small Python objects held (``--objects``: dicts in one list, which a checksum
  or write tracking cannot see into: only pickling them can), p50 / p99; a cell that reaches them (``len(objs)``,
  whose capture fingerprints them); and a trivial cell that arrives while the replica verifies the namespace in
  the background (1.3 s after the previous cell: the verification starts 1 s after a cell, see
  ``kernel/replica.py``);
- a cell creating a 100 MB array, kernels interleaved, with the transparent-huge-page setting and each
  kernel's AnonHugePages reported (THP moves the baseline between runs), the time the cell's own code took
  in each kernel (so that the platform's part of the reply time shows apart from the allocation's) with its
  thread's CPU time (equal to it when the difference is the vCPU's speed, not a wait), and the
  median of the ratios of neighbouring cells (which sees less of the host's slow and fast phases than the ratio
  of the medians, the target's measure).

Memory reuse moves the baseline too. On a VM that reports freed memory to its host (free page reporting, as
here: ``page_reporting.page_reporting_order=11``), touching a fresh page can cost 5 ms per 2 MB: a 100 MB array
then takes 40 ms or 300 ms depending on which pages the allocation got. So by default (``--memory reuse``) every
kernel, plain and NotebookOS alike, runs with glibc keeping freed memory (``MALLOC_MMAP_MAX_=0``, a trim threshold
of 1 TB; passed on with EG's ``EG_INHERITED_ENVS``); ``--memory fresh`` leaves glibc's defaults. So does the
kernel's writeback of what the object store wrote: Linux writes dirty pages back 30 s after they were written,
which for the 1 GB step landed in the middle of its trivial cells (plain and NotebookOS alike). Each step starts
after an ``os.sync()``, and so does the cell after each NotebookOS 100 MB array cell.

Memory: a NotebookOS kernel holds its state three times (executor + two followers) and the object store on
disk; at 1 GB that is 4 GB of kernels. ``--max-gb 2`` adds a 2 GB step (8 GB of kernels: run it alone).

    .venv/bin/python benchmarks/state_size.py [--cells N] [--max-gb 1|2|4] [--arrays N] [--state numpy|torch]
        [--memory reuse|fresh] [--objects N,N,...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack, suppress
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.replicated_kernel import (  # noqa: E402
    ARRAY_CELL,
    NOTEBOOKOS,
    PLAIN,
    Kernel,
    interleaved_latency,
    percentile,
    start_kernel,
    wait_applied,
)
from tests.support import processes_of, start_platform, stop_platform  # noqa: E402

GB = 1 << 30
MIB = 1 << 20
#: glibc keeps freed memory (no mmap for large blocks, no trimming), in the gateway and every kernel it starts.
REUSE_MEMORY = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40), "MALLOC_TOP_PAD_": str(256 * MIB)}


def store_bytes(root: Path) -> int:
    """Bytes of all files under the object store's root."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with suppress(FileNotFoundError):
                total += (Path(folder) / name).stat().st_size
    return total


def anon_huge_kb(pid: int) -> int:
    """AnonHugePages of a process, in KiB (0 when unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def thp_setting() -> str:
    """The system's transparent-huge-page mode and defrag setting."""
    out = []
    for name in ("enabled", "defrag"):
        try:
            text = Path(f"/sys/kernel/mm/transparent_hugepage/{name}").read_text().split()
            out.append(f"{name}=" + next((w.strip("[]") for w in text if w.startswith("[")), "?"))
        except OSError:
            out.append(f"{name}=?")
    return " ".join(out)


def run_both(kernels: dict[str, Kernel], code: str, client, applied: bool = True) -> dict[str, float]:
    """Run ``code`` on both kernels (plain first); wait until the NotebookOS followers applied it."""
    took = {}
    for label, kernel in kernels.items():
        took[label] = kernel.run(code, timeout=600)
        if label == "notebookos" and applied:
            assert kernel.last_reply is not None
            took["applied"] = wait_applied(client, kernel.kernel_id, int(kernel.last_reply.notebookos["seq"]), 600)
    return took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=60, help="trivial cells per kernel and state size")
    parser.add_argument("--max-gb", type=float, default=1.0, help="largest state held (1, 2 or 4 GB)")
    parser.add_argument("--changes", type=int, default=5, help="1 MiB-change cells measured")
    # 21, not 11: the cell's own code moves by 1-2 ms between runs in either kernel on a 2-core VM (preemption, page
    # faults after the heap grew), which a median of 11 passed on to the ratio (1.08-1.11x in one session).
    parser.add_argument("--arrays", type=int, default=21, help="100 MB array cells per kernel (median)")
    parser.add_argument("--state", choices=("numpy", "torch"), default="numpy", help="what the held GBs are")
    parser.add_argument(
        "--memory", choices=("reuse", "fresh"), default="reuse", help="glibc keeps freed memory (reuse) or not"
    )
    parser.add_argument(
        "--quiet", type=float, default=10.0, help="seconds to let background work (uploads, checkpoints) finish"
    )
    parser.add_argument(
        "--objects",
        default="100000,1000000",
        help="numbers of small dicts held for the Python-object steps (comma-separated; empty: none)",
    )
    args = parser.parse_args(argv)
    object_counts = [int(n) for n in args.objects.split(",") if n.strip()]
    sizes = [0.0, 0.25, 1.0] + [s for s in (2.0, 4.0) if s <= args.max_gb]
    console = Console(width=160)

    trivial: dict[float, dict[str, list[float]]] = {}
    changes: list[dict[str, float]] = []
    arrays: dict[str, list[float]] = {"plain": [], "notebookos": []}
    own: dict[str, list[float]] = {"plain": [], "notebookos": []}  # the 100 MB cell's own code, timed inside it
    own_cpu: dict[str, list[float]] = {"plain": [], "notebookos": []}  # and the CPU time its thread took for it
    huge: dict[str, int] = {}
    python_objects: dict[int, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="nbos-state-") as tmp, ExitStack() as stack:
        console.print(f"starting the platform in {tmp} ...")
        env = {"EG_INHERITED_ENVS": ",".join(REUSE_MEMORY), **REUSE_MEMORY} if args.memory == "reuse" else None
        platform = start_platform(Path(tmp) / "state", env=env)
        stack.callback(stop_platform, platform)
        client = platform.client
        objects = Path(platform.state_dir) / "objects"
        kernels: dict[str, Kernel] = {}
        for label, name in (("plain", PLAIN), ("notebookos", NOTEBOOKOS)):
            kernels[label] = start_kernel(client, name)[0]
            stack.callback(kernels[label].close)
        nos = kernels["notebookos"]
        replicas = client.notebookos_kernel(nos.kernel_id)["replicas"]
        methods = sorted({r.get("change_detection") or "?" for r in replicas})
        console.print(
            f"NotebookOS replicas' change detection: {', '.join(methods)}; THP: {thp_setting()}; memory: {args.memory}"
        )
        setup = "import numpy as np\nimport os\nimport time\nstate = {}"
        run_both(kernels, setup + ("\nimport torch" if args.state == "torch" else ""), client)
        full = "torch.full(({n},), 1.5, dtype=torch.float64)" if args.state == "torch" else "np.full({n}, 1.5)"
        new_values = "torch.from_numpy({})" if args.state == "torch" else "{}"

        for size in sizes:
            # The state: one array of `size` GB (the previous step's array is dropped first).
            if size:
                run_both(kernels, "state.clear()", client)
                cell = "state['held'] = " + full.format(n=int(size * GB) // 8)
                took = run_both(kernels, cell, client)
                time.sleep(args.quiet)  # the executor's checkpoint of the new state runs in the background
                os.sync()  # the store's new GB goes to disk now, not in the kernel's writeback 30 s later, mid-step
                console.print(
                    f"{size:g} GB held: filling took {took['plain']:.1f} s plain, {took['notebookos']:.1f} s "
                    f"NotebookOS, followers applied {took['applied']:.1f} s after the reply"
                )
            interleaved_latency(kernels, args.cells, 10)
            trivial[size] = {label: list(k.latencies) for label, k in kernels.items()}

            if size == 1.0:
                # 1 MiB changed in the 1 GB array, at a different (unaligned) offset each time.
                for i in range(args.changes):
                    offset = (i * 97 + 13) * MIB // 8 + 3
                    before = store_bytes(objects)
                    # New random values: content-addressed chunks of repeated content would be deduplicated
                    # and hide bytes that were really sent.
                    values = new_values.format(f"np.random.default_rng({i}).random({MIB // 8})")
                    code = f"state['held'][{offset}:{offset + MIB // 8}] = {values}"
                    took = run_both(kernels, code, client)
                    took["bytes"] = store_bytes(objects) - before
                    changes.append(took)

        run_both(kernels, "state.clear()", client)
        for count in object_counts:
            took = run_both(kernels, f"objs = [{{'a': i, 'b': str(i)}} for i in range({count})]", client)
            console.print(
                f"{count} small dicts held: creating them took {took['plain']:.1f} s plain, "
                f"{took['notebookos']:.1f} s NotebookOS, followers applied {took['applied']:.1f} s after the reply"
            )
            interleaved_latency(kernels, args.cells, 10)
            step: dict[str, list[float]] = {label: list(k.latencies) for label, k in kernels.items()}
            for _ in range(3):
                for label, took_s in run_both(kernels, "len(objs)", client).items():
                    step.setdefault(f"reach {label}", []).append(took_s)
                for label, kernel in kernels.items():
                    time.sleep(1.3)
                    step.setdefault(f"idle {label}", []).append(kernel.run("pass", timeout=600))
            python_objects[count] = step
        if object_counts:
            run_both(kernels, "del objs", client)
        os.sync()
        # The 100 MB array cell, kernels interleaved (as benchmarks/replicated_kernel.py: each NotebookOS cell's
        # followers apply it before the next cell, so their work does not land in the next reply on this
        # machine, where all three replicas share its cores); THP state of each kernel afterwards.
        for i in range(args.arrays):
            for label in ("plain", "notebookos") if i % 2 == 0 else ("notebookos", "plain"):
                kernel = kernels[label]
                timed = (
                    f"_began, _cpu = time.perf_counter(), time.thread_time()\n{ARRAY_CELL.format(i=i)}\n"
                    "print(time.perf_counter() - _began, time.thread_time() - _cpu)"
                )
                arrays[label].append(kernel.run(timed, timeout=600))
                assert kernel.last_reply is not None
                wall, cpu = kernel.last_reply.stdout.split()
                own[label].append(float(wall))
                own_cpu[label].append(float(cpu))
                if label == "notebookos":
                    wait_applied(client, kernel.kernel_id, int(kernel.last_reply.notebookos["seq"]), 600)
                    os.sync()  # its 100 MB in the store go to disk now, not in writeback during a later cell
        for label, kernel in kernels.items():
            pid = int(kernel.conn.execute("print(os.getpid())", 30).stdout.strip())
            huge[label] = anon_huge_kb(pid)

    report(console, trivial, changes, arrays, own, huge, methods, args.state, python_objects, own_cpu)
    # A replica that became the executor holds what it loaded from records, not the arrays numpy allocated (and
    # madvised for huge pages) in the first executor: the AnonHugePages row means something else then.
    moves = kernels["notebookos"].executors
    if moves:
        console.print(
            f"NotebookOS executor: {moves[0][1]} from the first cell"
            + "".join(f", {replica} from cell {cell}" for cell, replica in moves[1:])
            + f" (of {kernels['notebookos'].cells})"
        )
    leftovers = processes_of(Path(tmp) / "state")
    if leftovers:
        console.print(f"[red]left-over processes: {[p.pid for p in leftovers]}[/red]")
        return 1
    return 0


def report(
    console: Console,
    trivial: dict[float, dict[str, list[float]]],
    changes: list[dict[str, float]],
    arrays: dict[str, list[float]],
    own: dict[str, list[float]],
    huge: dict[str, int],
    methods: list[str],
    state: str = "numpy",
    objects: dict[int, dict[str, list[float]]] | None = None,
    own_cpu: dict[str, list[float]] | None = None,
) -> None:
    ms = lambda s: f"{s * 1e3:.1f} ms"  # noqa: E731
    table = Table(
        title=f"Per-cell cost vs {state} state held (same run; NotebookOS change detection: {', '.join(methods)})"
    )
    for col in ("measure", "plain EG", "NotebookOS", "added / ratio", "target"):
        table.add_column(col)

    def trivial_row(held: str, lat: dict[str, list[float]]) -> None:
        p50, n50 = statistics.median(lat["plain"]), statistics.median(lat["notebookos"])
        p99, n99 = percentile(lat["plain"], 0.99), percentile(lat["notebookos"], 0.99)
        table.add_row(
            f"trivial cell, {held} held: p50 / p99 ({len(lat['plain'])} cells)",
            f"{ms(p50)} / {ms(p99)}",
            f"{ms(n50)} / {ms(n99)}",
            f"{(n50 - p50) * 1e3:+.1f} ms at p50",
            "<= +5 ms",
        )

    for size, lat in trivial.items():
        trivial_row(f"{size:g} GB", lat)
    if changes:
        pr = statistics.median(c["plain"] for c in changes)
        nr = statistics.median(c["notebookos"] for c in changes)
        table.add_row(
            f"1 MiB changed in a 1 GB array: reply (median of {len(changes)})",
            ms(pr),
            ms(nr),
            f"{(nr - pr) * 1e3:+.1f} ms",
            "",
        )
        sent = [c["bytes"] for c in changes]
        applied = [c["applied"] for c in changes]
        table.add_row(
            "  bytes published (object store growth)",
            "",
            f"{statistics.median(sent) / MIB:.2f} MiB median, {max(sent) / MIB:.2f} max",
            f"{statistics.median(sent) / MIB:.2f}x the change",
            "<= 2x",
        )
        table.add_row(
            "  both followers applied it, after the reply",
            "",
            f"{ms(statistics.median(applied))} median, {ms(max(applied))} max",
            "",
            "",
        )
    for count, step in (objects or {}).items():
        trivial_row(f"{count} small dicts", step)
        pr, nr = statistics.median(step["reach plain"]), statistics.median(step["reach notebookos"])
        table.add_row(
            "  a cell that reaches them, len(objs) (median of 3)", ms(pr), ms(nr), f"{(nr - pr) * 1e3:+.1f} ms", ""
        )
        pi, ni = statistics.median(step["idle plain"]), statistics.median(step["idle notebookos"])
        table.add_row(
            "  trivial cell during the idle verification (median of 3)",
            ms(pi),
            ms(ni),
            f"{(ni - pi) * 1e3:+.1f} ms",
            "",
        )
    if arrays["plain"]:
        pa, na = statistics.median(arrays["plain"]), statistics.median(arrays["notebookos"])
        table.add_row(
            f"100 MB array cell reply (median of {len(arrays['plain'])}, interleaved)",
            ms(pa),
            ms(na),
            f"{na / pa:.2f}x ({(na / pa - 1) * 100:+.0f} %)",
            "<= +10 %",
        )
        # The host runs the cell's own code at two speeds, in phases of several cells: the ratio of medians moves
        # with how the 21 cells of each kernel fell into them. The two cells of a pair ran one right after the
        # other (the order alternating), so a pair's ratio mostly sees one phase.
        paired = statistics.median(n / p for p, n in zip(arrays["plain"], arrays["notebookos"], strict=True))
        table.add_row(
            "  paired: median of each NotebookOS cell over the plain cell beside it", "", "", f"{paired:.2f}x", ""
        )
        po, no = statistics.median(own["plain"]), statistics.median(own["notebookos"])
        rest = {k: statistics.median(a - o for a, o in zip(arrays[k], own[k], strict=True)) for k in arrays}
        table.add_row(
            "  the cell's own code (timed inside it); reply minus it",
            f"{ms(po)}; {ms(rest['plain'])}",
            f"{ms(no)}; {ms(rest['notebookos'])}",
            f"{no / po:.2f}x",
            "",
        )
        if own_cpu and own_cpu["plain"]:
            # The CPU time of the thread that ran it: when it tracks the wall time, the own code's difference is the
            # speed the host gave the vCPU it ran on (this VM's vCPUs run 30-45 ms for the same fill, in phases and
            # not alike at one moment), not waiting for a core or for page faults.
            pc, nc = statistics.median(own_cpu["plain"]), statistics.median(own_cpu["notebookos"])
            table.add_row("  its thread's CPU time", ms(pc), ms(nc), f"{nc / pc:.2f}x", "")
        table.add_row(
            f"  THP: {thp_setting()}; AnonHugePages after",
            f"{huge.get('plain', 0) // 1024} MiB",
            f"{huge.get('notebookos', 0) // 1024} MiB (executor)",
            "",
            "",
        )
    console.print(table)


if __name__ == "__main__":
    sys.exit(main())
