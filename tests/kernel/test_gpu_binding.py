"""GPU stickiness in GpuBinding: state stays on the device between cells until the GPU is given away.

No GPU here: a recording framework stands in for torch (the GpuFramework protocol is the seam binding.py
defines for frameworks), with devices marked real so that the framework path runs.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping, Sequence
from typing import Any

import pytest

from jupyter_notebookos.gpu import binding


class RecordingFramework:
    """A framework whose 'tensors' are dicts saying where they live; it records every call."""

    name = "fake"

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def loaded(self) -> bool:
        return True

    def initialised(self) -> bool:
        return False

    def bind(self, ordinals: Sequence[int]) -> None:
        self.calls.append(("bind", list(ordinals)))

    def to_device(self, ns: MutableMapping[str, Any], names: Iterable[str], ordinal: int) -> list[str]:
        moved = [n for n in names if isinstance(ns.get(n), dict) and ns[n].get("on") == "host"]
        for n in moved:
            ns[n]["on"] = f"cuda:{ordinal}"
        self.calls.append(("to_device", moved))
        return moved

    def offload(self, ns: MutableMapping[str, Any]) -> list[str]:
        moved = [n for n, v in ns.items() if isinstance(v, dict) and str(v.get("on", "")).startswith("cuda")]
        for n in moved:
            ns[n]["on"] = "host"
        self.calls.append(("offload", moved))
        return moved

    def unbind(self, release_memory: bool = True) -> None:
        self.calls.append(("unbind", release_memory))


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fw = RecordingFramework()
    devices = [binding.HostGpu(index=i, uuid=f"u{i}", simulated=False) for i in range(2)]
    return binding.GpuBinding(devices, [fw], sticky=True), fw


def test_sticky_release_keeps_state_on_the_device_and_the_next_cell_moves_nothing(gpus) -> None:
    gb, fw = gpus
    ns: dict[str, Any] = {"model": {"on": "cuda:0"}}
    gb.bind([0], ns)
    released = gb.release(ns)
    assert released.kept_on == [0] and released.offloaded == [] and gb.resident == [0]
    assert ns["model"]["on"] == "cuda:0"
    assert ("unbind", False) in fw.calls and not any(c[0] == "offload" for c in fw.calls)
    fw.calls.clear()
    gb.bind([0], ns)  # the same GPU again: nothing moves
    assert [c[0] for c in fw.calls] == ["bind"] and gb.resident == []


def test_eviction_moves_the_state_out_and_the_next_cell_brings_it_back(gpus) -> None:
    gb, fw = gpus
    ns: dict[str, Any] = {"model": {"on": "cuda:0"}}
    gb.bind([0], ns)
    gb.release(ns)
    evicted = gb.evict(ns)  # the scheduler gave GPU 0 to another kernel
    assert evicted.offloaded == ["model"] and ns["model"]["on"] == "host" and gb.resident == []
    assert ("unbind", True) in fw.calls and evicted.seconds >= 0
    assert gb.evict(ns).offloaded == []  # nothing left to evict
    gb.bind([0], ns)
    assert ns["model"]["on"] == "cuda:0"


def test_a_cell_on_another_device_evicts_first(gpus) -> None:
    gb, fw = gpus
    ns: dict[str, Any] = {"model": {"on": "cuda:0"}}
    gb.bind([0], ns)
    gb.release(ns)
    fw.calls.clear()
    gb.bind([1], ns)
    assert [c[0] for c in fw.calls] == ["offload", "unbind", "bind", "to_device"]
    assert ns["model"]["on"] == "cuda:0"  # in-process ordinal 0 of the newly visible device


def test_eviction_while_a_cell_holds_the_gpu_does_nothing(gpus) -> None:
    gb, _ = gpus
    ns: dict[str, Any] = {"model": {"on": "cuda:0"}}
    gb.bind([0], ns)
    assert gb.evict(ns).offloaded == [] and ns["model"]["on"] == "cuda:0"


def test_without_stickiness_release_offloads_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fw = RecordingFramework()
    gb = binding.GpuBinding([binding.HostGpu(index=0, simulated=False)], [fw])
    ns: dict[str, Any] = {"model": {"on": "cuda:0"}}
    gb.bind([0], ns)
    assert gb.release(ns).offloaded == ["model"] and gb.resident == []
