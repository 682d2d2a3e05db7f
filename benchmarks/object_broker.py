"""What the object broker costs: a replica's buffer writes and reads through gateway-signed URLs vs opening the
store itself, in one run, on one S3 server and on a local disk.

Starts moto's S3 server (tests/s3_store.py) and the gateway's real broker handler (``ObjectBrokerHandler`` with
an ``ObjectBroker`` holding the store's keys) in this process, then times ``ObjectStore.put_buffer`` (a new
buffer: existence check + upload), ``put_buffer`` of a buffer already stored (existence check only) and
``get_buffer`` for several sizes, alternating the two stores so that noise hits both alike:

- **direct**: ``ObjectStore("s3://...")`` with the store's keys (what replicas did before: the admin keys in
  every replica);
- **brokered**: ``ObjectStore("notebookos-broker://<kernel>")`` with the kernel's object token only;
- the same two for a ``file://`` store: direct (the embedded mode's default) and served by the gateway's data
  endpoint (kernels that cannot mount the store's volume: the bytes pass through the gateway).

moto is not a real store's speed, so the S3 ratio says little; the per-operation difference (one signing round
trip to the gateway) is the figure to read. For the file store, the ratio is the cost of the bytes' detour.

    .venv/bin/python benchmarks/object_broker.py [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from s3_store import s3_store, serve_broker  # noqa: E402

from jupyter_notebookos.embedded.runner import free_port  # noqa: E402
from jupyter_notebookos.replication.objectstore import ObjectStore  # noqa: E402

SIZES = [("64 KiB", 64 << 10), ("8 MiB", 8 << 20), ("64 MiB", 64 << 20)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="operations per size and store (default 15)")
    args = parser.parse_args()
    console = Console()
    with s3_store() as store, tempfile.TemporaryDirectory(prefix="notebookos-broker-bench-") as tmp:
        os.environ.update(store.env())  # the gateway's environment: its broker signs with these keys
        kernel_id = str(uuid.uuid4())
        s3_broker = serve_broker(f"s3://{store.bucket}/bench", kernel_id, free_port())
        file_broker = serve_broker(f"file://{tmp}/served", kernel_id, free_port())
        keys = {"key": store.access_key, "secret": store.secret_key, "skip_instance_cache": True}
        pairs = {
            "S3": (
                ObjectStore(f"s3://{store.bucket}/bench/kernels/{kernel_id}", storage_options=keys),
                ObjectStore(
                    f"notebookos-broker://{kernel_id}",
                    storage_options={"broker": s3_broker.url, "token": s3_broker.token},
                ),
            ),
            "file": (
                ObjectStore(f"file://{tmp}/direct/kernels/{kernel_id}"),
                ObjectStore(
                    f"notebookos-broker://{kernel_id}",
                    storage_options={"broker": file_broker.url, "token": file_broker.token},
                ),
            ),
        }
        table = Table(title=f"object store operations, ms (median of {args.rounds}; moto S3 and a local disk)")
        for column in ("store", "operation", "size", "direct", "brokered", "difference", "ratio"):
            table.add_column(column, justify="left" if column in ("store", "operation", "size") else "right")
        for kind, (direct_store, brokered_store) in pairs.items():
            for label, size in SIZES:
                samples: dict[tuple[str, str], list[float]] = {}
                for _ in range(args.rounds):
                    for name, target in (("direct", direct_store), ("brokered", brokered_store)):
                        data = os.urandom(size)
                        began = time.perf_counter()
                        ref = target.put_buffer(data)
                        stored = time.perf_counter()
                        target.put_buffer(data)
                        checked = time.perf_counter()
                        target.get_buffer(ref)
                        read = time.perf_counter()
                        for operation, seconds in (
                            ("put (new)", stored - began),
                            ("put (stored)", checked - stored),
                            ("get", read - checked),
                        ):
                            samples.setdefault((operation, name), []).append(seconds * 1000)
                for operation in ("put (new)", "put (stored)", "get"):
                    direct = statistics.median(samples[(operation, "direct")])
                    brokered = statistics.median(samples[(operation, "brokered")])
                    table.add_row(
                        kind,
                        operation,
                        label,
                        f"{direct:.1f}",
                        f"{brokered:.1f}",
                        f"{brokered - direct:+.1f}",
                        f"{brokered / direct:.2f}",
                    )
        console.print(table)
        s3_broker.stop()
        file_broker.stop()


if __name__ == "__main__":
    main()
