"""The platform's planner with the real scheduler and no platform around it: what a waiting cell hears when the
scheduler refuses it at dispatch."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from jupyter_notebookos.gateway.control.migrator import MigrationRunner
from jupyter_notebookos.gateway.control.planner import Planner
from jupyter_notebookos.gateway.control.platformmetrics import PlatformMetrics
from jupyter_notebookos.gateway.control.records import KernelRecord, KernelRegistry
from jupyter_notebookos.gateway.control.residency import GpuResidency
from jupyter_notebookos.gateway.router.cells import CellGrant, CellRejected, CellRequest
from jupyter_notebookos.scheduler import HostSpec, Owner, Placement, RunCell, Scheduler

ALICE, BOB = Owner("alice"), Owner("bob")


def planner_for(scheduler: Scheduler, *kernel_ids: str) -> Planner:
    kernels = KernelRegistry()
    for kernel_id in kernel_ids:  # routers whose replicas hold every earlier cell's state
        router: Any = SimpleNamespace(caught_up=lambda replica_id: True)
        kernels.add(KernelRecord(kernel_id, "python3-notebookos", 1, router, {}))
    migrations = MigrationRunner(SimpleNamespace(), launch_timeout=1.0)  # type: ignore[arg-type]
    return Planner(
        scheduler=scheduler,
        kernels=kernels,
        residency=GpuResidency(),
        metrics=PlatformMetrics(),
        migrations=migrations,
        autoscaler=None,
        launch_timeout=1.0,
    )


@pytest.mark.asyncio
async def test_a_queued_cell_whose_user_spent_the_gpu_hours_is_refused_with_the_reason() -> None:
    # 1 GPU on each of 3 hosts; alice may use 0.0001 GPU-hours (0.36 GPU-seconds) a week.
    scheduler = Scheduler(
        hosts=[HostSpec(f"h{i}", 1) for i in range(3)],
        quotas={"users": {"alice": {"gpu_hours_per_week": 0.0001}}},
    )
    clock = time.monotonic
    for kernel_id, owner in (("a1", ALICE), ("a2", ALICE), ("b1", BOB), ("b2", BOB)):
        assert isinstance(scheduler.start_kernel(kernel_id, 1, clock(), owner), Placement)
    planner = planner_for(scheduler, "a1", "a2", "b1", "b2")
    for kernel_id, cell_id in (("b1", "x"), ("b2", "y"), ("a1", "c1")):  # every GPU busy
        assert isinstance(planner.place(CellRequest(kernel_id, cell_id, 1, clock())), CellGrant)
    waiting = planner.place(CellRequest("a2", "c2", 1, clock()))
    assert not isinstance(waiting, CellGrant)
    cell = asyncio.ensure_future(waiting)
    await asyncio.sleep(0.5)  # alice's running cell spends her hours meanwhile
    assert not cell.done() and planner.queue_position("a2", "c2") == 1

    planner.release("a1", "c1")  # a GPU is free, but alice may use no more

    with pytest.raises(CellRejected, match="GPU-hours"):
        await asyncio.wait_for(cell, 2)
    assert scheduler.queued_cells() == ()
    # Bob's cells go on as before.
    planner.release("b1", "x")
    assert isinstance(scheduler.request_cell("b1", "z", clock()), RunCell)
