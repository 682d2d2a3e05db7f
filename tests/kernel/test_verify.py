"""IdleVerifier on its own: what a thread changes where no cell reached is found while the kernel idles (and goes out
with the next cell), never while something else uses the namespace; a follower takes its baseline while idle."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from parts_harness import LoopKernel, until

from jupyter_notebookos.kernel.verify import IdleVerifier
from jupyter_notebookos.replication.state import StateTracker


@dataclass
class Idle:
    """A kernel between cells, with a verifier; the flags answer what the verifier asks."""

    kernel: LoopKernel
    tracker: StateTracker
    verifier: IdleVerifier
    flags: dict[str, bool]

    def cell(self, code: str) -> Any:
        """Run ``code`` as a cell (the verifier stopped first, as the kernel does); its delta."""
        self.verifier.stop()
        self.tracker.before_cell(code)
        exec(code, self.kernel.namespace)
        return self.tracker.after_cell()


@pytest_asyncio.fixture
async def idle() -> AsyncIterator[Idle]:
    ns: dict[str, Any] = {"__name__": "__main__"}
    kernel = LoopKernel(ns)
    tracker = StateTracker(ns, transform=lambda code: code)
    flags = {"excluded": False, "reading": False, "ran_last": True}
    verifier = IdleVerifier(
        kernel,
        tracker,
        excluded=lambda: flags["excluded"],
        reading=lambda: flags["reading"],
        ran_last_cell=lambda: flags["ran_last"],
    )
    state = Idle(kernel, tracker, verifier, flags)
    yield state
    verifier.stop()
    kernel.close()


@pytest.mark.asyncio
async def test_a_change_no_cell_reached_is_found_while_idle_and_goes_out_with_the_next_cell(idle: Idle):
    idle.cell("data = {'a': 1}\nother = [1]")
    idle.kernel.namespace["data"]["b"] = 2  # a thread the cell started, after the capture
    idle.verifier.schedule(0.01)
    await until(lambda: idle.tracker.found == ["data"])
    delta = idle.cell("n = 1")  # reaches neither name
    assert set(delta.values) == {"data", "n"}


@pytest.mark.asyncio
async def test_no_verification_while_a_cell_runs_and_one_after_an_upload_that_reads_the_namespace(idle: Idle):
    idle.cell("data = {'a': 1}")
    idle.kernel.namespace["data"]["b"] = 2
    idle.flags["excluded"] = True  # a cell runs
    idle.verifier.schedule(0.01)
    await asyncio.sleep(0.2)
    assert idle.tracker.found == []
    idle.flags.update(excluded=False, reading=True)  # an upload reads the namespace's objects
    idle.verifier.schedule(0.01)
    await asyncio.sleep(0.2)
    assert idle.tracker.found == []
    idle.flags["reading"] = False  # the verifier looks again by itself (VERIFY_AFTER_S later)
    await until(lambda: idle.tracker.found == ["data"], timeout=3.0)


@pytest.mark.asyncio
async def test_a_comm_callback_outside_a_cell_has_the_namespace_verified_again(idle: Idle):
    idle.cell("data = {'a': 1}")
    idle.flags["ran_last"] = False  # a follower that ran no cell since
    idle.verifier.stop()
    idle.kernel.namespace["data"]["b"] = 2  # a widget's callback
    idle.verifier.recheck()
    await until(lambda: idle.tracker.found == ["data"], timeout=3.0)


@pytest.mark.asyncio
async def test_a_follower_takes_its_baseline_while_idle_not_in_its_first_cell(idle: Idle):
    idle.kernel.namespace.update(big=list(range(1000)), small=1)  # applied from the log: no capture took them
    assert not idle.tracker.has_baseline
    idle.verifier.prepare_baseline()
    await until(lambda: idle.tracker.has_baseline, timeout=3.0)
    idle.cell("small = 2")
    assert idle.tracker.last_scanned == 1  # only what the cell reaches
