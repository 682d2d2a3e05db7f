"""Replicated kernel vs plain kernel, through Enterprise Gateway's REST + websocket API, in one run.

Starts one platform (`notebookos up --no-lab`: etcd, our gateway, simulated hosts) and, unless
``--no-stock``, a stock Enterprise Gateway beside it, then measures, interleaving the kernels so that noise
on a shared machine hits both alike:

- trivial-cell latency (``pass``): p50 / p99 over ``--cells`` cells after a warm-up, for a plain ``python3``
  kernel and a ``python3-notebookos`` kernel on our gateway (TCP_NODELAY on its websocket), and a plain kernel
  on stock EG (no TCP_NODELAY: our handler sets it unconditionally, so the stock baseline is the stock server);
- kernel start until the first cell has run (POST /api/kernels, websocket, first reply), ``--starts`` kernels
  of each kind;
- a cell creating a 100 MB numpy array: reply latency, and the time from the reply until every follower
  reports that it applied the cell's log record (``applied_seq`` in GET /api/notebookos/kernels/{id});
- trivial-cell latency again with the 100 MB array in the namespace;
- with ``--auth-compare``: a second platform with etcd auth off, and trivial / binding cells of a NotebookOS
  kernel there interleaved with the others (what per-kernel etcd users cost per cell);
- with ``--busy N``: N kernels of each kind running ``x += 1`` back to back at once, in alternating rounds, and the
  CPU time each side's processes spent per cell (process CPU time, steadier than wall time on a shared machine):
  the gateway's own, and the whole platform's (gateway, etcd and the replicas; for plain kernels, the gateway and
  the kernels).

Prints a table with the ratios (NotebookOS / plain) and the issue's targets. Not a timed test.

    .venv/bin/python benchmarks/replicated_kernel.py [--quick] [--cells N] [--no-stock] [--auth-compare]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from jupyter_notebookos.client import CellResult, GatewayClient, KernelConnection  # noqa: E402
from tests.support import free_port, processes_of, start_platform, stop_platform  # noqa: E402

PLAIN, NOTEBOOKOS = "python3", "python3-notebookos"
ARRAY_CELL = "big = np.random.default_rng({i}).random(100 * 1024 * 1024 // 8)"


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@dataclass
class Kernel:
    """A started kernel and its open websocket."""

    client: GatewayClient
    kernel_id: str
    conn: KernelConnection
    latencies: list[float] = field(default_factory=list)
    last_reply: CellResult | None = None
    # NotebookOS: each executor change, as (the cell's number in this kernel, the replica that ran it).
    executors: list[tuple[int, str]] = field(default_factory=list)
    cells: int = 0

    def run(self, code: str, timeout: float = 120.0) -> float:
        result = self.conn.execute(code, timeout)
        if result.status != "ok":
            raise RuntimeError(f"cell {code!r} failed on {self.kernel_id}: {result.reply['content']}")
        self.last_reply = result
        self.cells += 1
        replica = result.notebookos.get("replica")
        if replica and (not self.executors or self.executors[-1][1] != replica):
            self.executors.append((self.cells, replica))
        return result.seconds

    def close(self) -> None:
        self.conn.close()
        try:
            self.client.shutdown_kernel(self.kernel_id)
        except Exception as exc:  # the platform's shutdown stops it anyway
            print(f"shutting down {self.kernel_id}: {exc}", file=sys.stderr)


def start_kernel(client: GatewayClient, name: str) -> tuple[Kernel, float]:
    """Start a kernel and run its first cell; returns it and the seconds until that cell's reply."""
    began = time.perf_counter()
    kid = client.start_kernel(name)
    kernel = Kernel(client, kid, client.connect(kid))
    kernel.run("pass")
    return kernel, time.perf_counter() - began


@contextmanager
def stock_gateway(workdir: Path, token: str) -> Iterator[GatewayClient]:
    """A stock Enterprise Gateway (its own websocket handler, without TCP_NODELAY) on a free port."""
    port = free_port()
    log = open(workdir / "stock-eg.log", "wb")  # noqa: SIM115 - the child writes to it
    env = dict(os.environ, EG_AUTH_TOKEN=token, EG_UNAUTHORIZED_USERS="", EG_LIST_KERNELS="True")
    process = subprocess.Popen(
        [sys.executable, "-m", "enterprise_gateway", "--ip=127.0.0.1", f"--port={port}", "--port_retries=0"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=workdir,
        start_new_session=True,
    )
    log.close()
    client = GatewayClient(f"http://127.0.0.1:{port}", token)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                client.request("GET", "/api/kernelspecs", timeout=2)
                break
            except Exception:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"stock EG did not start:\n{(workdir / 'stock-eg.log').read_text()}") from None
                time.sleep(0.2)
        yield client
    finally:
        children: list[psutil.Process] = []
        with suppress(psutil.Error):
            children = psutil.Process(process.pid).children(recursive=True)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        for child in children:
            with suppress(psutil.Error):
                child.kill()


def interleaved_latency(
    kernels: dict[str, Kernel], cells: int, warmup: int, block: int = 10, code: str = "pass"
) -> None:
    """Run ``code`` on every kernel, ``block`` cells at a time in turn, recording each round trip."""
    for kernel in kernels.values():
        for _ in range(warmup):
            kernel.run("pass")
        kernel.latencies = []
    done = 0
    while done < cells:
        n = min(block, cells - done)
        for kernel in kernels.values():
            for _ in range(n):
                kernel.latencies.append(kernel.run(code))
        done += n


def wait_applied(client: GatewayClient, kernel_id: str, seq: int, timeout: float = 60.0) -> float:
    """Seconds until every replica of the kernel reports ``applied_seq >= seq`` (polled every 5 ms)."""
    began = time.perf_counter()
    while time.perf_counter() - began < timeout:
        info = client.notebookos_kernel(kernel_id)
        replicas = info["replicas"]
        if len(replicas) >= 3 and all(r["applied_seq"] >= seq for r in replicas):
            return time.perf_counter() - began
        time.sleep(0.005)
    return float("inf")


#: What a process is, for the CPU accounting of ``--busy``: (label, what its command line contains).
PROCESS_KINDS = (
    ("gateway", "jupyter_notebookos.gateway"),
    ("replicas", "jupyter_notebookos.kernel"),
    ("plain kernels", "ipykernel_launcher"),
    ("etcd", "etcd"),
)


def cpu_by_kind(state_dir: Path) -> dict[str, float]:
    """CPU seconds (user + system) each kind of the platform's processes has used so far."""
    gateway = next((p for p in processes_of(state_dir) if "jupyter_notebookos.gateway" in " ".join(p.cmdline())), None)
    candidates = {p.pid: p for p in processes_of(state_dir)}
    if gateway is not None:  # plain kernels carry no trace of the state dir: they are the gateway's children
        candidates.update({p.pid: p for p in gateway.children(recursive=True)})
    used = dict.fromkeys((label for label, _ in PROCESS_KINDS), 0.0)
    for proc in candidates.values():
        with suppress(psutil.Error):
            cmdline = " ".join(proc.cmdline())
            label = next((label for label, marker in PROCESS_KINDS if marker in cmdline), None)
            if label is not None:
                times = proc.cpu_times()
                used[label] += times.user + times.system
    return used


def busy_cpu(client: GatewayClient, state_dir: Path, kernels: int, cells: int, rounds: int) -> dict[str, list[float]]:
    """``kernels`` kernels of each kind run ``x += 1`` back to back at once (a thread each), ``cells`` cells per kernel
    per round, the kinds alternating round by round. Returns, per kind, the CPU milliseconds per cell of the gateway
    and of the whole platform, one figure per round."""
    started = {name: [start_kernel(client, name)[0] for _ in range(kernels)] for name in (PLAIN, NOTEBOOKOS)}
    per_cell: dict[str, list[float]] = {f"{name} {part}": [] for name in (PLAIN, NOTEBOOKOS) for part in ("gw", "all")}
    try:
        for kernel in (k for ks in started.values() for k in ks):
            kernel.run("x = 0")
        for i in range(rounds):
            for name in (PLAIN, NOTEBOOKOS) if i % 2 == 0 else (NOTEBOOKOS, PLAIN):
                before = cpu_by_kind(state_dir)
                threads = [
                    threading.Thread(target=lambda k=k: [k.run("x += 1") for _ in range(cells)]) for k in started[name]
                ]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                after = cpu_by_kind(state_dir)
                spent = {label: after[label] - before[label] for label in after}
                total = kernels * cells
                ours = ("gateway", "replicas", "etcd") if name == NOTEBOOKOS else ("gateway", "plain kernels")
                per_cell[f"{name} gw"].append(spent["gateway"] / total * 1e3)
                per_cell[f"{name} all"].append(sum(spent[label] for label in ours) / total * 1e3)
    finally:
        for kernel in (k for ks in started.values() for k in ks):
            kernel.close()
    return per_cell


def report_cpu(console: Console, per_cell: dict[str, list[float]], kernels: int) -> None:
    """The CPU per cell of ``--busy``: medians over the rounds, and the ratios the several-gateways issue targets."""
    table = Table(title=f"CPU per cell, {kernels} kernels of each kind busy at once (median of the rounds)")
    for col in ("processes", "plain EG kernel", "NotebookOS", "ratio", "target"):
        table.add_column(col)
    for part, title, target in (("gw", "gateway", "<= 1.5x"), ("all", "whole platform", "<= 2x")):
        plain, ours = (statistics.median(per_cell[f"{name} {part}"]) for name in (PLAIN, NOTEBOOKOS))
        table.add_row(title, f"{plain:.2f} ms", f"{ours:.2f} ms", f"{ours / plain:.2f}x", target)
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer cells and kernels (about a minute)")
    parser.add_argument("--cells", type=int, help="trivial cells measured per kernel (default 200; quick 60)")
    parser.add_argument("--starts", type=int, help="kernels started per kind (default 4; quick 2)")
    parser.add_argument("--arrays", type=int, help="100 MB array cells per kind (default 5; quick 1)")
    parser.add_argument("--no-stock", action="store_true", help="skip the stock Enterprise Gateway baseline")
    parser.add_argument(
        "--start-gap",
        type=float,
        default=3.0,
        help="quiet seconds before each kernel start, as between users opening notebooks (0: back to back, "
        "the worst case for the warm replica pool)",
    )
    parser.add_argument(
        "--auth-compare",
        action="store_true",
        help="also run a platform with etcd auth off, and compare its NotebookOS cells with auth on",
    )
    parser.add_argument(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="also measure the CPU per cell with N kernels of each kind busy at once (the issue's figure: 8)",
    )
    parser.add_argument("--busy-cells", type=int, default=40, help="cells per kernel per --busy round")
    parser.add_argument("--busy-rounds", type=int, default=6, help="--busy rounds (the kinds alternate)")
    parser.add_argument("--busy-only", action="store_true", help="measure --busy alone")
    args = parser.parse_args(argv)
    cells = args.cells or (60 if args.quick else 200)
    starts = args.starts or (2 if args.quick else 4)
    arrays = args.arrays or (1 if args.quick else 5)
    warmup = 10 if args.quick else 30
    console = Console(width=150)

    with tempfile.TemporaryDirectory(prefix="nbos-bench-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        console.print(f"starting the platform in {workdir} ...")
        platform = start_platform(workdir / "state")
        stack.callback(_stop_platform, platform)
        ours = platform.client
        stock = stack.enter_context(stock_gateway(workdir, platform.token)) if not args.no_stock else None
        no_auth = None
        if args.auth_compare:
            unauthenticated = start_platform(
                workdir / "state-no-auth", "--gateway-option", "NotebookOSGatewayApp.etcd_auth=False"
            )
            stack.callback(_stop_platform, unauthenticated)
            no_auth = unauthenticated.client

        busy = args.busy or (8 if args.busy_only else 0)
        if args.busy_only:
            report_cpu(console, busy_cpu(ours, workdir / "state", busy, args.busy_cells, args.busy_rounds), busy)
            return 0

        # -- kernel start, interleaved ----------------------------------------------------------------
        start_times: dict[str, list[float]] = {PLAIN: [], NOTEBOOKOS: []}
        for i in range(starts):
            for name in (PLAIN, NOTEBOOKOS) if i % 2 == 0 else (NOTEBOOKOS, PLAIN):
                time.sleep(args.start_gap)
                kernel, seconds = start_kernel(ours, name)
                start_times[name].append(seconds)
                kernel.close()
        console.print(f"kernel starts: { {k: [round(v, 2) for v in s] for k, s in start_times.items()} }")

        # -- trivial cells ------------------------------------------------------------------------------
        kernels: dict[str, Kernel] = {}
        for label, client, name in [
            ("plain", ours, PLAIN),
            ("notebookos", ours, NOTEBOOKOS),
            *([("stock", stock, PLAIN)] if stock is not None else []),
            *([("notebookos, etcd auth off", no_auth, NOTEBOOKOS)] if no_auth is not None else []),
        ]:
            kernels[label] = start_kernel(client, name)[0]
            stack.callback(kernels[label].close)
        interleaved_latency(kernels, cells, warmup)
        trivial = {label: list(k.latencies) for label, k in kernels.items()}
        # A cell that binds a name: its state record goes out at once (a trivial cell's record, empty, may
        # wait and go out with later ones).
        binding_kernels = {
            label: kernels[label] for label in ("plain", "notebookos", "notebookos, etcd auth off") if label in kernels
        }
        interleaved_latency(binding_kernels, max(20, cells // 2), 5, code="x = 1")
        binding = {label: list(k.latencies) for label, k in binding_kernels.items()}

        # -- 100 MB array ---------------------------------------------------------------------------------
        plain, nos = kernels["plain"], kernels["notebookos"]
        for kernel in (plain, nos):
            kernel.run("import numpy as np")
        array_reply: dict[str, list[float]] = {"plain": [], "notebookos": []}
        applied: list[float] = []
        for i in range(arrays):
            for label in ("plain", "notebookos") if i % 2 == 0 else ("notebookos", "plain"):
                kernel = kernels[label]
                array_reply[label].append(kernel.run(ARRAY_CELL.format(i=i)))
                if label == "notebookos":
                    assert kernel.last_reply is not None
                    seq = int(kernel.last_reply.notebookos["seq"])
                    applied.append(wait_applied(ours, kernel.kernel_id, seq))

        # -- trivial cells with 100 MB of state -----------------------------------------------------------
        with_state = {"plain": plain, "notebookos": nos}
        interleaved_latency(with_state, max(20, cells // 4), 5)
        trivial_big = {label: list(k.latencies) for label, k in with_state.items()}
        cpu = busy_cpu(ours, workdir / "state", busy, args.busy_cells, args.busy_rounds) if busy else None

    report(console, trivial, binding, start_times, array_reply, applied, trivial_big, args.start_gap)
    if cpu is not None:
        report_cpu(console, cpu, busy)
    if "notebookos, etcd auth off" in trivial:
        report_auth(console, trivial, binding)
    leftovers = processes_of(workdir / "state")
    if leftovers:
        console.print(f"[red]left-over processes: {[p.pid for p in leftovers]}[/red]")
        return 1
    return 0


def _stop_platform(platform: object) -> None:
    stop_platform(platform)  # type: ignore[arg-type]


def report_auth(console: Console, trivial: dict[str, list[float]], binding: dict[str, list[float]]) -> None:
    """etcd auth on (per-kernel users, the default) against off, same run, interleaved."""
    table = Table(title="etcd auth on (per-kernel etcd users) vs off, same run")
    for col in ("measure", "plain EG", "NotebookOS, auth off", "NotebookOS, auth on", "on - off", "on - plain"):
        table.add_column(col)
    for title, samples in (("trivial cell p50", trivial), ("cell binding a name p50", binding)):
        plain, off, on = (statistics.median(samples[k]) for k in ("plain", "notebookos, etcd auth off", "notebookos"))
        table.add_row(
            title,
            f"{plain * 1e3:.1f} ms",
            f"{off * 1e3:.1f} ms",
            f"{on * 1e3:.1f} ms",
            f"{(on - off) * 1e3:+.1f} ms",
            f"{(on - plain) * 1e3:+.1f} ms (target <= +5 ms)",
        )
    console.print(table)


def report(
    console: Console,
    trivial: dict[str, list[float]],
    binding: dict[str, list[float]],
    start_times: dict[str, list[float]],
    array_reply: dict[str, list[float]],
    applied: list[float],
    trivial_big: dict[str, list[float]],
    start_gap: float,
) -> None:
    ms: Callable[[float], str] = lambda s: f"{s * 1e3:.1f} ms"  # noqa: E731
    table = Table(title="NotebookOS replicated kernel vs plain EG kernel (same run, same machine)")
    for col in ("measure", "plain EG (nodelay)", "NotebookOS", "ratio / added", "target"):
        table.add_column(col)
    p_med, n_med = statistics.median(trivial["plain"]), statistics.median(trivial["notebookos"])
    table.add_row(
        f"trivial cell p50 ({len(trivial['plain'])} cells)",
        ms(p_med),
        ms(n_med),
        f"{n_med / p_med:.2f}x, +{(n_med - p_med) * 1e3:.1f} ms",
        "<= +5 ms",
    )
    p99, n99 = percentile(trivial["plain"], 0.99), percentile(trivial["notebookos"], 0.99)
    table.add_row("trivial cell p99", ms(p99), ms(n99), f"{n99 / p99:.2f}x", "")
    xp, xn = statistics.median(binding["plain"]), statistics.median(binding["notebookos"])
    table.add_row(
        f"cell binding a name (x = 1) p50 ({len(binding['plain'])} cells)",
        ms(xp),
        ms(xn),
        f"{xn / xp:.2f}x, +{(xn - xp) * 1e3:.1f} ms",
        "",
    )
    if "stock" in trivial:
        s_med, s99 = statistics.median(trivial["stock"]), percentile(trivial["stock"], 0.99)
        table.add_row(
            "stock EG (no nodelay) p50 / p99",
            "",
            f"stock: {ms(s_med)} / {ms(s99)}",
            f"NotebookOS {s_med / n_med:.1f}x faster at p50",
            "faster than stock",
        )
    ps, ns = statistics.median(start_times[PLAIN]), statistics.median(start_times[NOTEBOOKOS])
    table.add_row(
        f"start to first cell, median of {len(start_times[PLAIN])} ({start_gap:g} s apart)",
        f"{ps:.2f} s",
        f"{ns:.2f} s",
        f"{ns / ps:.2f}x",
        "<= 1.5x",
    )
    pa, na = statistics.median(array_reply["plain"]), statistics.median(array_reply["notebookos"])
    table.add_row(
        f"100 MB array cell reply, median of {len(array_reply['plain'])}",
        ms(pa),
        ms(na),
        f"{na / pa:.2f}x ({(na / pa - 1) * 100:+.0f} %)",
        "<= +10 %",
    )
    table.add_row(
        "followers applied it, after the reply",
        "",
        f"{max(applied):.2f} s (max of {len(applied)})",
        "",
        "< 2 s",
    )
    pb, nb = statistics.median(trivial_big["plain"]), statistics.median(trivial_big["notebookos"])
    table.add_row(
        f"trivial cell p50 with 100 MB state ({len(trivial_big['plain'])} cells)",
        ms(pb),
        ms(nb),
        f"{nb / pb:.2f}x, +{(nb - pb) * 1e3:.1f} ms",
        "",
    )
    console.print(table)


if __name__ == "__main__":
    sys.exit(main())
