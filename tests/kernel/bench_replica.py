"""Replica kernel micro-benchmark (not a test): ``.venv/bin/python tests/kernel/bench_replica.py``.

Prints: process start until registered (replica) / until kernel_info answers (plain ipykernel); trivial-cell
round trip p50/p99 for plain ipykernel, a replica without directive, and a directed replica cell with a
follower; and for a cell creating a 100 MB array: reply latency, reply-to-published and reply-to-applied.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))  # support.py, which replica_harness imports

from jupyter_client.blocking.client import BlockingKernelClient
from replica_harness import Replica, ReplicaFactory

from jupyter_notebookos.embedded.etcd import EtcdCluster
from jupyter_notebookos.replication.protocol import FIRST_SEQ, CellDirective

N = int(os.environ.get("BENCH_CELLS", "200"))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def plain_kernel(tmp: Path) -> tuple[subprocess.Popen[bytes], BlockingKernelClient, float]:
    conn = tmp / "plain.json"
    from jupyter_client.connect import write_connection_file

    write_connection_file(str(conn), ip="127.0.0.1", key=b"k" * 16)
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ipykernel_launcher", "-f", str(conn)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    client = BlockingKernelClient()
    client.load_connection_info(json.loads(conn.read_text()))
    client.start_channels()
    client.wait_for_ready(timeout=30)
    return proc, client, time.monotonic() - started


def time_cells(run: object, n: int, think: float = 0.0) -> list[float]:
    out = []
    for _ in range(n):
        time.sleep(think)
        t0 = time.perf_counter()
        run()  # type: ignore[operator]
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def plain_execute(client: BlockingKernelClient, code: str) -> None:
    reply = client.execute_interactive(code, timeout=60, output_hook=lambda m: None)
    assert reply["content"]["status"] == "ok", reply["content"]


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    cluster = EtcdCluster(tmp / "etcd", members=1).start()
    factory = ReplicaFactory(cluster.endpoints, tmp)
    proc = None
    try:
        proc, plain, plain_start = plain_kernel(tmp)
        t0 = time.monotonic()
        r0 = factory.start("r0")
        r0_start = time.monotonic() - t0
        r1 = factory.start("r1")
        r0.connect()
        fence = factory.elect("r0")
        seq = [FIRST_SEQ]

        def directed(replica: Replica, code: str) -> None:
            cell = replica.execute(code, CellDirective(seq=seq[0], fence=fence))
            assert cell.status == "ok", cell.reply["content"]
            seq[0] += 1

        for _ in range(20):  # warm up
            plain_execute(plain, "pass")
            r0.execute("pass")
            directed(r0, "pass")
        rows = [
            ("plain ipykernel", time_cells(lambda: plain_execute(plain, "pass"), N)),
            ("replica, no directive", time_cells(lambda: r0.execute("pass"), N)),
            ("replica, directed + follower", time_cells(lambda: directed(r0, "pass"), N)),
            (
                "replica, directed, x += 1",
                time_cells(lambda: directed(r0, "x = globals().get('x', 0) + 1"), N),
            ),
            ("plain, 50 ms think time", time_cells(lambda: plain_execute(plain, "pass"), N, 0.05)),
            ("no directive, 50 ms think time", time_cells(lambda: r0.execute("pass"), N, 0.05)),
            ("directed, 50 ms think time", time_cells(lambda: directed(r0, "pass"), N, 0.05)),
        ]
        print(
            f"start: plain ipykernel until kernel_info {plain_start:.2f} s; replica until registered {r0_start:.2f} s"
        )
        print(f"{'trivial cell (ms)':32s} {'p50':>7s} {'p99':>7s}")
        for name, values in rows:
            print(f"{name:32s} {statistics.median(values):7.2f} {pct(values, 0.99):7.2f}")

        plain_execute(plain, "import numpy as np")
        directed(r0, "import numpy as np")
        factory.wait_applied("r1", seq[0] - 1)
        code = "big = np.full(12_500_000, {})"  # 100 MB of float64, new content each time
        plain_ms = [time_cells(lambda i=i: plain_execute(plain, code.format(i)), 1)[0] for i in range(5)]
        results = []
        for i in range(5):
            t0 = time.perf_counter()
            directed(r0, code.format(i))
            replied = time.perf_counter()
            mine = seq[0] - 1
            factory.wait_record(mine, timeout=30)
            published = time.perf_counter()
            factory.wait_applied("r1", mine, timeout=30)
            applied = time.perf_counter()
            results.append(((replied - t0) * 1e3, (published - replied) * 1e3, (applied - replied) * 1e3))
        print(
            f"100 MB array cell: plain reply {statistics.median(plain_ms):.0f} ms; replica reply "
            f"{statistics.median(r[0] for r in results):.0f} ms, reply->published "
            f"{statistics.median(r[1] for r in results):.0f} ms, reply->follower applied "
            f"{statistics.median(r[2] for r in results):.0f} ms"
        )
        assert r1.execute("print(big.shape, big[:2])").stdout == r0.execute("print(big.shape, big[:2])").stdout
    finally:
        if proc is not None:
            proc.kill()
        factory.close()
        cluster.stop()


if __name__ == "__main__":
    main()
