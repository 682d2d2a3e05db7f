"""What the object broker costs: a replica's buffer writes and reads through gateway-signed URLs vs the store's
own keys, in one run, on one S3 server.

Starts moto's S3 server (tests/s3_store.py) and the gateway's real broker handler (``ObjectBrokerHandler`` with
an ``ObjectBroker`` holding the store's keys) in this process, then times ``ObjectStore.put_buffer`` (a new
buffer: existence check + upload), ``put_buffer`` of a buffer already stored (existence check only) and
``get_buffer`` for several sizes, alternating the two stores so that noise hits both alike:

- **direct**: ``ObjectStore("s3://...")`` with the store's keys (what replicas did before: the admin keys in
  every replica);
- **brokered**: ``ObjectStore("notebookos-broker://<kernel>")`` with the kernel's object token only.

moto is slower than a real store, so the ratio understates the broker's share less than it overstates it: the
per-operation difference (one signing round trip to the gateway) is the figure to read.

    .venv/bin/python benchmarks/object_broker.py [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
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
    with s3_store() as store:
        os.environ.update(store.env())  # the gateway's environment: its broker signs with these keys
        kernel_id = str(uuid.uuid4())
        base = f"s3://{store.bucket}/bench/kernels/{kernel_id}"
        broker = serve_broker(f"s3://{store.bucket}/bench", kernel_id, free_port())
        stores = {
            "direct": ObjectStore(
                base, storage_options={"key": store.access_key, "secret": store.secret_key, "skip_instance_cache": True}
            ),
            "brokered": ObjectStore(
                f"notebookos-broker://{kernel_id}", storage_options={"broker": broker.url, "token": broker.token}
            ),
        }
        table = Table(title=f"object store operations, ms (median of {args.rounds}; moto S3 on this machine)")
        for column in ("operation", "size", "direct", "brokered", "difference", "ratio"):
            table.add_column(column, justify="right" if column not in ("operation", "size") else "left")
        for label, size in SIZES:
            samples: dict[tuple[str, str], list[float]] = {}
            for _ in range(args.rounds):
                for name, target in stores.items():
                    data = os.urandom(size)
                    began = time.perf_counter()
                    ref = target.put_buffer(data)
                    stored = time.perf_counter()
                    target.put_buffer(data)
                    checked = time.perf_counter()
                    target.get_buffer(ref)
                    read = time.perf_counter()
                    for operation, ms in (
                        ("put (new)", stored - began),
                        ("put (stored)", checked - stored),
                        ("get", read - checked),
                    ):
                        samples.setdefault((operation, name), []).append(ms * 1000)
            for operation in ("put (new)", "put (stored)", "get"):
                direct = statistics.median(samples[(operation, "direct")])
                brokered = statistics.median(samples[(operation, "brokered")])
                table.add_row(
                    operation,
                    label,
                    f"{direct:.1f}",
                    f"{brokered:.1f}",
                    f"{brokered - direct:+.1f}",
                    f"{brokered / direct:.2f}",
                )
        console.print(table)


if __name__ == "__main__":
    main()
