"""Soak benchmark (issue 12): does anything grow with the number of cells? One NotebookOS kernel runs N cells
(default 10,000; every 10th rebinds a 1.2 MB array, which goes to the object store); every N/10 cells it prints
etcd's database size and revision, the keys under the kernel's etcd prefix (log records, cell records), the GPU-ledger
entries, and the size of the kernel's object-store prefix. The first sample is the baseline of the same run.

etcd keeps its history for --etcd-history (default 1m here, 10m in `notebookos up`) and the gateway's maintenance
checks for free space every 20 s (defragmenting past 1 MiB free), so a run of a few minutes shows the steady state
that production reaches after its retention: etcd's file size should level off, not grow with the cells.

    .venv/bin/python benchmarks/soak.py [--cells N] [--quick] [--etcd-history 1m]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from jupyter_notebookos.coordination.client import Coordinator, EtcdCredentials  # noqa: E402
from jupyter_notebookos.embedded.platform import RUNTIME_FILE  # noqa: E402
from jupyter_notebookos.embedded.runner import PlatformProcess  # noqa: E402

KERNEL = "python3-notebookos"


def sample(state_dir: Path, kernel_id: str) -> dict[str, Any]:
    """etcd's size and the kernel's keys, and the kernel's object-store bytes, now."""
    endpoints = json.loads((state_dir / RUNTIME_FILE).read_text())["etcd_endpoints"]
    password = (state_dir / "etcd-root-password").read_text().strip()

    async def read() -> dict[str, Any]:
        co = await Coordinator.connect(endpoints, credentials=EtcdCredentials("root", password))
        try:
            status = await co.status()
            kernel_keys = await co.get_prefix(co.keys.kernel_prefix(kernel_id), keys_only=True)
            ledger = await co.get_prefix(co.keys.gpus_prefix(), keys_only=True)
            log = [kv for kv in kernel_keys if "/log/" in kv.key]
            return {
                "db_bytes": status["db_size"],
                "db_in_use": status["db_size_in_use"],
                "revision": status["revision"],
                "kernel_keys": len(kernel_keys),
                "log_records": len(log),
                "ledger": len(ledger),
            }
        finally:
            await co.close()

    found = asyncio.run(read())
    store = state_dir / "objects" / "kernels" / kernel_id
    found["store_bytes"] = sum(p.stat().st_size for p in store.rglob("*") if p.is_file()) if store.exists() else 0
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="2,000 cells")
    parser.add_argument("--etcd-history", default="1m", help="etcd's auto-compaction retention for this run")
    args = parser.parse_args()
    cells = 2_000 if args.quick else args.cells
    console = Console()
    with tempfile.TemporaryDirectory(prefix="nbos-soak-") as tmp:
        state = Path(tmp) / "state"
        platform = PlatformProcess.start(
            state, "--hosts", "3", "--gpus-per-host", "1", "--etcd-history", args.etcd_history,
            "--gateway-option", "EtcdMaintenance.interval=20",
            "--gateway-option", f"EtcdMaintenance.min_free_bytes={1 << 20}",
            cwd=REPO,
        )  # fmt: skip
        try:
            client = platform.client
            kernel_id = client.start_kernel(KERNEL, env={"KERNEL_GPUS": "0"})
            table = Table(title=f"Soak: {cells:,} cells on one kernel (first row: the baseline)")
            for column in ("cells", "cells/s", "etcd DB MB", "in use MB", "revision", "kernel keys", "log records",
                           "ledger", "store MB"):  # fmt: skip
                table.add_column(column, justify="right")
            with client.connect(kernel_id) as conn:
                conn.execute("import numpy as np\ni = 0")
                rows = []
                began = last = time.monotonic()
                step = max(1, cells // 10)
                for n in range(1, cells + 1):
                    code = "x = np.random.rand(150_000)" if n % 10 == 0 else f"i = {n}"
                    result = conn.execute(code, timeout=120)
                    if result.status != "ok":
                        raise SystemExit(f"cell {n} failed: {result.reply['content']}")
                    if n == 1 or n % step == 0:
                        now = time.monotonic()
                        found = sample(state, kernel_id)
                        rate = step / (now - last) if n > 1 else 0.0
                        last = now
                        rows.append(found)
                        table.add_row(
                            f"{n:,}",
                            f"{rate:.0f}",
                            f"{found['db_bytes'] / 1e6:.1f}",
                            f"{found['db_in_use'] / 1e6:.1f}",
                            f"{found['revision']:,}",
                            str(found["kernel_keys"]),
                            str(found["log_records"]),
                            str(found["ledger"]),
                            f"{found['store_bytes'] / 1e6:.1f}",
                        )
            console.print(table)
            first, final = rows[0], rows[-1]
            console.print(
                f"{cells:,} cells in {time.monotonic() - began:.0f} s. From the baseline to the end: etcd DB "
                f"{first['db_bytes'] / 1e6:.1f} -> {final['db_bytes'] / 1e6:.1f} MB, kernel keys "
                f"{first['kernel_keys']} -> {final['kernel_keys']}, log records {first['log_records']} -> "
                f"{final['log_records']}, store {first['store_bytes'] / 1e6:.1f} -> "
                f"{final['store_bytes'] / 1e6:.1f} MB (peak {max(r['store_bytes'] for r in rows) / 1e6:.1f} MB)."
            )
            client.shutdown_kernel(kernel_id)
        finally:
            platform.stop(60)


if __name__ == "__main__":
    main()
