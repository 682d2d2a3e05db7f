"""What a checkpoint costs against what changed since the last one (a table; not a test).

Runs one real replica kernel (the replica tests' harness: a local etcd, a file object store, the executor and a
follower), holding many small Python objects (``--objects``, dicts in one list, which only pickling can save) and a
numpy array (``--array-mb``), with a checkpoint every ``--every`` records. Cells then change only a counter, so
each checkpoint after the first can name the part holding the objects again; then one cell appends to the list,
and the checkpoint after it pickles the objects again; last, the follower becomes the executor, and its first
checkpoint names again what the last one holds (it learns the parts from the checkpoint object). For each
checkpoint it prints, from the executor's log, how long pickling took (in a thread, stopped by the next request:
see kernel/replica.py) and writing it (upload and the etcd commit), how many parts it had and how many it named
again, and the bytes the object store grew by. The first checkpoint is what every checkpoint cost before
checkpoints came in parts.

    .venv/bin/python benchmarks/checkpoints.py [--objects N] [--array-mb N] [--every N] [--rounds N]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the replica harness and support.py, as the tests use them
sys.path.insert(0, str(REPO / "tests" / "kernel"))

from replica_harness import ReplicaFactory  # noqa: E402

from benchmarks.state_size import store_bytes  # noqa: E402
from jupyter_notebookos.embedded.etcd import EtcdCluster  # noqa: E402
from jupyter_notebookos.replication import protocol as p  # noqa: E402
from jupyter_notebookos.replication.protocol import CellDirective  # noqa: E402

LINE = re.compile(
    r"checkpoint at seq (\d+) written: pickled in ([\d.]+) ms, then written in ([\d.]+) ms "
    r"\(\d+ records deleted; (\d+) parts, (\d+) of them named again"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1_000_000, help="small dicts held")
    parser.add_argument("--array-mb", type=int, default=256, help="MB of numpy array held")
    parser.add_argument("--every", type=int, default=8, help="records between checkpoints")
    parser.add_argument("--rounds", type=int, default=4, help="checkpoints while only a counter changes")
    args = parser.parse_args(argv)
    console = Console(width=160)
    rows: list[tuple[str, int, int]] = []  # what changed, checkpoint seq, store growth
    with tempfile.TemporaryDirectory(prefix="nbos-ckpt-") as tmp:
        cluster = EtcdCluster(Path(tmp) / "etcd", 1).start()
        factory = ReplicaFactory(cluster.endpoints, Path(tmp))
        try:
            every = {p.ENV_CHECKPOINT_EVERY: str(args.every)}
            r0 = factory.start("r0", every, timeout=60)
            r1 = factory.start("r1", every, timeout=60)  # a follower: records are deleted once it applied them
            fence = factory.elect("r0")
            executor, follower = r0, r1
            objects = Path(tmp) / "objects"
            key = factory.keys.checkpoint(factory.kernel_id)
            seq = 0

            def run(code: str) -> None:
                nonlocal seq
                seq += 1
                cell = executor.execute(code, CellDirective(seq=seq, fence=fence), timeout=600)
                assert cell.status == "ok", cell.reply["content"]

            def checkpoint(what: str) -> None:
                """Cells changing the counter until the next checkpoint is committed; a pause before each, so
                that no request stops the pickling."""
                factory.wait_applied(follower.rid, seq)  # the last cell's own record is uploaded: not counted
                before = store_bytes(objects)
                target = (seq // args.every + 1) * args.every
                while seq < target:
                    run("n += 1")
                factory.wait_applied(follower.rid, seq)
                deadline = time.monotonic() + 600
                while time.monotonic() < deadline:
                    kv = factory.etcd.get(key)
                    if kv is not None and p.CheckpointPointer.from_json(kv.value).seq == target:
                        break
                    time.sleep(0.1)
                else:
                    raise SystemExit(f"no checkpoint at seq {target} within 600 s:\n{executor.log()[-3000:]}")
                time.sleep(0.5)  # its garbage collection, which deletes only what is older than 10 minutes
                rows.append((what, target, store_bytes(objects) - before))

            console.print(f"holding {args.objects:,} dicts and a {args.array_mb} MB array ...")
            run(
                "import numpy as np\n"
                f"objs = [{{'a': i, 'b': str(i)}} for i in range({args.objects})]\n"
                f"w = np.random.default_rng(0).random({args.array_mb} * 2**20 // 8)\nn = 0"
            )
            checkpoint("first checkpoint (everything)")
            for _ in range(args.rounds):
                checkpoint("only the counter changed")
            run("objs.append({'a': -1, 'b': '-1'})")
            checkpoint("a cell appended to objs")
            run("w[:1000] = 0.0")
            checkpoint("a cell wrote 8 KB of w")
            factory.wait_applied("r1", seq)
            fence = factory.elect("r1")
            executor, follower = r1, r0
            checkpoint("another replica became the executor")
            found = {int(m[1]): m for m in LINE.finditer(r0.log() + r1.log())}
        finally:
            factory.close()
            cluster.stop()

    table = Table(title=f"Checkpoints of a replica holding {args.objects:,} dicts and a {args.array_mb} MB array")
    for col in ("since the last checkpoint", "seq", "pickled", "written", "parts (named again)", "store grew by"):
        table.add_column(col)
    for what, at, grew in rows:
        m = found.get(at)
        if m is None:
            table.add_row(what, str(at), "?", "?", "?", f"{grew / 2**20:.1f} MiB")
            continue
        pickled, written = f"{float(m[2]):.0f} ms", f"{float(m[3]):.0f} ms"
        table.add_row(what, str(at), pickled, written, f"{m[4]} ({m[5]})", f"{grew / 2**20:.1f} MiB")
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
