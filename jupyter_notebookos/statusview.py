"""What ``notebookos status`` draws: the cluster (hosts, kernels, the queue, migrations, scaling) or one kernel, as
rich tables made from the gateway's JSON.

Tables fit the terminal they are drawn for without cutting a column: every header and value shows whole. Kernel
ids (36 characters, what one copies) are the one thing that gives way: where the tables with whole ids are wider
than the terminal, each id is shortened to its shortest unique start of at least 8 characters, which every command
that takes a kernel accepts, and a line under the tables says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from jupyter_notebookos.terminal import Cell, fitted_table, narrowest

#: The fewest characters of a shortened kernel id (a uuid's first group).
SHORT_ID = 8
SHORTENED = "Kernel ids are shortened to their unique starts; `notebookos status <id>` shows one kernel."
OTHERS = "(another user's)"  # users see other users' kernels without ids


def cluster_view(cluster: dict[str, Any], width: int | None = None) -> RenderableType:
    """The cluster as tables: hosts, then kernels, the queue, migrations and scaling; ``width``: the terminal's
    columns (None: no limit)."""
    parts = _cluster_parts(cluster, str)
    if width is None or all(narrowest(part) <= width for part in parts):
        return Group(*parts)
    short = short_ids(k["kernel_id"] for k in cluster.get("kernels", []) if k.get("kernel_id"))
    return Group(*_cluster_parts(cluster, lambda kernel_id: short.get(kernel_id, kernel_id)), Text(SHORTENED))


def short_ids(ids: Iterable[str]) -> dict[str, str]:
    """Each id's shortest start of at least :data:`SHORT_ID` characters that no other id of ``ids`` shares."""
    every = sorted(set(ids))
    short = {}
    for index, kernel_id in enumerate(every):
        neighbours = every[max(0, index - 1) : index] + every[index + 1 : index + 2]  # sorted: the closest ones
        shared = max((_common_start(kernel_id, other) for other in neighbours), default=0)
        short[kernel_id] = kernel_id[: max(SHORT_ID, shared + 1)]
    return short


def _common_start(a: str, b: str) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


def _cluster_parts(cluster: dict[str, Any], shown_id: Callable[[str], str]) -> list[RenderableType]:
    parts: list[RenderableType] = []
    host_rows = []
    for h in cluster.get("hosts", []):
        kind = "simulated" if h.get("simulated") else "real GPUs"
        if h.get("draining"):
            kind += ", draining"
        counts = (h["gpus"], h["gpus_committed"], h["gpus_pending"], h["gpus"] - h["gpus_committed"], h["replicas"])
        host_rows.append([str(h["name"]), *(str(n) for n in counts), kind])
    numbers = ("GPUs", "committed", "pending", "idle", "replicas")
    parts.append(fitted_table(("host", *numbers, "kind"), host_rows, right=numbers, title="Hosts"))
    totals = cluster.get("totals") or {}
    ratio = f"{totals['subscription_ratio']:.2f}, " if "subscription_ratio" in totals else ""
    parts.append(Text(f"Subscription ratio: {ratio}admission limit {cluster.get('subscription_ratio', 0):.2f}"))

    def kernel(item: dict[str, Any]) -> str:
        kernel_id = item.get("kernel_id")
        return shown_id(str(kernel_id)) if kernel_id else OTHERS

    kernels = cluster.get("kernels", [])
    if kernels:
        rows = [
            [
                kernel(k),
                str(k.get("owner") or ("-" if k.get("kernel_id") else "")),
                ", ".join(replica_text(r) for r in k.get("replicas", [])),
                str(k.get("executor") or "-"),
                str(k.get("gpus", "")),
                kernel_state(k),
                str(k.get("cells", "")),
            ]
            for k in kernels
        ]
        headers = ("kernel", "owner", "replicas", "executor", "GPUs/cell", "state", "cells")
        parts.append(fitted_table(headers, rows, flexible=("replicas", "state"), title="Kernels"))
    else:
        parts.append(Text("No NotebookOS kernels."))
    queue = cluster.get("queue", [])
    if queue:
        queued: list[list[Cell]] = [
            [
                str(q.get("position", position)),
                kernel(q),
                Text(str(q.get("cell_id") or "-"), overflow="fold"),  # a message id: folded, never cut
                str(q.get("gpus", "")),
                f"{float(q.get('waiting_ms', 0.0)) / 1000.0:.1f} s",
            ]
            for position, q in enumerate(queue, start=1)
        ]
        title = f"Queued cells ({len(queue)}, waiting for GPUs)"
        columns = ("#", "kernel", "cell", "GPUs", "waiting")
        parts.append(fitted_table(columns, queued, right=("#", "GPUs", "waiting"), flexible=("cell",), title=title))
    else:
        parts.append(Text("Queued cells: none"))
    migrations = cluster.get("migrations", [])
    if migrations:
        rows = [
            [
                f"m{m.get('migration_id')}",
                kernel(m),
                f"r{m.get('replica_id')}",
                str(m.get("source")),
                str(m.get("target")),
                str(m.get("trigger")),
                f"{m.get('seconds', 0):.1f} s",
            ]
            for m in migrations
        ]
        headers = ("#", "kernel", "replica", "from", "to", "why", "for")
        parts.append(
            fitted_table(headers, rows, flexible=("why",), title=f"Migrations in progress ({len(migrations)})")
        )
    scaling = cluster.get("scaling") or {}
    if scaling.get("enabled"):
        draining = ", ".join(scaling.get("draining", [])) or "none"
        parts.append(Text(f"Autoscaling: {scaling.get('provisioning', 0)} host(s) provisioning, draining: {draining}"))
        parts.extend(Text(f"  {event.get('decision')}") for event in scaling.get("recent", [])[-3:])
    return parts


def kernel_view(kernel: dict[str, Any]) -> RenderableType:
    """One kernel: its replicas (host, state, up to date), executor, cells and GPU-seconds (fits 80 columns)."""
    replicas = kernel.get("replicas", [])
    head = max((int(r.get("applied_seq", -1)) for r in replicas), default=-1)
    rows = [
        [
            str(r.get("replica_id")),
            str(r.get("host")),
            str(r.get("state")),
            str(r.get("applied_seq")),
            "yes" if r.get("state") == "ready" and int(r.get("applied_seq", -1)) >= head else "no",
            "yes" if r.get("replica_id") == kernel.get("executor") else "",
            f"{(r.get('memory_bytes') or 0) / 2**20:.0f} MiB" if isinstance(r.get("memory_bytes"), int) else "-",
        ]
        for r in replicas
    ]
    headers = ("replica", "host", "state", "applied", "up to date", "executor", "memory")
    title = f"Kernel {kernel['kernel_id']} ({kernel.get('kernel_name')})"
    table = fitted_table(headers, rows, right=("applied", "memory"), title=title)
    used = float(kernel.get("gpu_seconds_used") or 0.0)
    held = float(kernel.get("gpu_seconds_held_if_reserved") or 0.0)
    share = f" ({100.0 * used / held:.1f} %)" if held > 0 else ""
    lines = [
        f"Owner: {kernel.get('owner') or 'the admin'}",
        f"State: {kernel_state(kernel)}; executor: {kernel.get('executor') or '-'}",
        f"GPUs per cell: {kernel.get('gpus')}",
        f"Cells: {kernel.get('cells')} run, {kernel.get('queued', 0)} queued",
        f"GPU-seconds: {used:.1f} used; a reservation would have held {held:.1f}{share}",
    ]
    return Group(table, *(Text(line) for line in lines))


def replica_text(replica: Any) -> str:
    """``0@host-1`` for a ready replica, ``0@host-1 (starting)`` otherwise."""
    if not isinstance(replica, dict):
        return str(replica)
    text = f"{replica['replica_id']}@{replica.get('host')}" if "replica_id" in replica else str(replica.get("host"))
    state = replica.get("state", "ready")
    return text if state == "ready" else f"{text} ({state})"


def kernel_state(kernel: dict[str, Any]) -> str:
    """What a kernel is doing: running a cell, waiting for GPUs, or idle."""
    if kernel.get("state"):
        return str(kernel["state"])
    return "running" if kernel.get("running") else "idle"


__all__ = ["cluster_view", "kernel_state", "kernel_view", "replica_text", "short_ids"]
