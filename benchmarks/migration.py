"""Migration benchmark (issue 5): how long moving a replica takes, by state size, and how long a cell waits
when it needs a migration. Embedded mode, local object store; prints a table.

    .venv/bin/python benchmarks/migration.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from jupyter_notebookos.client import GatewayClient  # noqa: E402
from jupyter_notebookos.embedded.runner import PlatformProcess  # noqa: E402
from tests.support import gpus_held_on  # noqa: E402

KERNEL = "python3-notebookos"


def wait_applied(client: GatewayClient, kernel_id: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        replicas = client.notebookos_kernel(kernel_id)["replicas"]
        if len({r["applied_seq"] for r in replicas}) == 1:
            return
        time.sleep(0.1)
    raise TimeoutError("followers did not apply the state")


def migrate_once(client: GatewayClient, kernel_id: str) -> float:
    info = client.notebookos_kernel(kernel_id)
    used = {r["host"] for r in info["replicas"]}
    free = next(h["name"] for h in client.request("GET", "/api/notebookos/cluster")["hosts"] if h["name"] not in used)
    replica = info["replicas"][0]["replica_id"]
    began = time.perf_counter()
    client.request("POST", f"/api/notebookos/kernels/{kernel_id}/replicas/{replica}/migrate", json={"host": free})
    return time.perf_counter() - began


def migration_times(client: GatewayClient, megabytes: int, repeats: int) -> list[float]:
    kernel_id = client.start_kernel(KERNEL)
    try:
        with client.connect(kernel_id) as conn:
            result = conn.execute(f"import numpy as np\nstate = np.ones({megabytes} * 131072)", timeout=300)
            assert result.status == "ok", result.reply["content"]
        wait_applied(client, kernel_id)
        return [migrate_once(client, kernel_id) for _ in range(repeats)]
    finally:
        client.shutdown_kernel(kernel_id)


def cell_wait_with_migration(client: GatewayClient) -> tuple[float, float]:
    """(queued_ms of a cell that needed a migration, queued_ms of the next, sticky, cell)."""
    kernel_id = client.start_kernel(KERNEL)
    try:
        with client.connect(kernel_id) as conn:
            conn.execute("x = 1")
            hosts = {r["host"] for r in client.notebookos_kernel(kernel_id)["replicas"]}
            with gpus_held_on(client, hosts, KERNEL, 60):
                moved = conn.execute("x += 1", timeout=120).notebookos["queued_ms"]
                sticky = conn.execute("x += 1", timeout=120).notebookos["queued_ms"]
            return moved, sticky
    finally:
        client.shutdown_kernel(kernel_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one migration per size")
    args = parser.parse_args()
    repeats = 1 if args.quick else 3
    console = Console()
    with tempfile.TemporaryDirectory(prefix="nbos-bench-") as tmp:
        platform = PlatformProcess.start(Path(tmp) / "state", "--hosts", "4", "--gpus-per-host", "1")
        try:
            client = platform.client
            table = Table(title="Replica migration (embedded mode, local object store)")
            for column in ("case", "runs", "p50 s", "min s", "max s"):
                table.add_column(column, justify="left" if column == "case" else "right")
            for megabytes in (10, 500):
                times = migration_times(client, megabytes, repeats)
                table.add_row(
                    f"migrate, {megabytes} MB of state",
                    str(len(times)),
                    f"{statistics.median(times):.2f}",
                    f"{min(times):.2f}",
                    f"{max(times):.2f}",
                )
            moved, sticky = cell_wait_with_migration(client)
            table.add_row("cell that needed a migration: queued", "1", f"{moved / 1000:.2f}", "", "")
            table.add_row("the next (sticky) cell: queued", "1", f"{sticky / 1000:.3f}", "", "")
            console.print(table)
        finally:
            platform.stop()


if __name__ == "__main__":
    main()
