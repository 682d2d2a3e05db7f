"""torch CPU tensors replicate with their storage as a buffer: write tracking, chunked deltas, views kept.

Needs torch (skipped without it: CI has none; run on a machine that has it, e.g.
``python -m pytest --noconftest tests/replication/test_torch_state.py``: nothing here uses the shared fixtures).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from dict_replica import DictReplica  # noqa: E402

from jupyter_notebookos.replication.chunks import TrackedBuffer  # noqa: E402
from jupyter_notebookos.replication.objectstore import ObjectStore  # noqa: E402
from jupyter_notebookos.replication.records import encode_values, load_values  # noqa: E402

MIB = 1 << 20


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    return ObjectStore(f"file://{tmp_path}/objects")


def test_tensors_round_trip_with_dtype_grad_and_shared_storage(store: ObjectStore) -> None:
    base = torch.arange(2 * MIB, dtype=torch.float32)  # 8 MiB: out of band
    values = {
        "base": base,
        "view": base[10:20],  # a view of the same storage
        "t": base.view(1024, -1).t(),  # strided
        "bf": torch.ones(300_000, dtype=torch.bfloat16),  # no numpy dtype
        "small": torch.tensor([1, 2, 3]),  # in band
        "w": torch.randn(512, 512, requires_grad=True),
        "model": torch.nn.Linear(256, 256),
        "empty": torch.empty(0),
    }
    record = encode_values(values, namespace=values, store=store, threshold=MIB)
    assert record.buffers, "large storages leave the pickle as buffers"
    assert len(record.payload) < MIB  # the bytes are not in the pickle
    loaded = load_values(record, store, {})
    for name in ("base", "view", "t", "bf", "small", "w", "empty"):
        a, b = values[name], loaded[name]
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b), name
    assert loaded["view"].untyped_storage().data_ptr() == loaded["base"].untyped_storage().data_ptr()
    assert loaded["w"].requires_grad and loaded["w"].is_leaf
    model = loaded["model"]
    assert isinstance(model.weight, torch.nn.Parameter) and torch.equal(model.weight, values["model"].weight)
    loaded["base"][15] = -1.0
    assert loaded["view"][5].item() == -1.0  # still one storage


def test_in_place_changes_are_detected_without_hashing_and_sent_as_chunks(store: ObjectStore) -> None:
    a, b = DictReplica(store), DictReplica(store)
    _, first = a.step("import torch\nbig = torch.zeros(16 * 2 ** 20)")  # 64 MiB
    b.apply(first)
    address = b.ns["big"].data_ptr()

    delta, record = a.step("x = 1")
    assert "big" not in delta.values  # unchanged: not sent

    # Through torch, through a view, through numpy, and from another thread while no cell runs.
    forms = [
        "big[123] = 5.0",
        "v = big[2 ** 22 : 2 ** 22 + 10]\nv.add_(1.0)",
        "big.numpy()[7] = 3.0",
    ]
    for code in forms:
        delta, record = a.step(code)
        assert "big" in delta.values, code
        entries = [e for e in record.buffers if isinstance(e, TrackedBuffer) and e.size == 64 * MIB]
        if a.tracker.writes is not None:  # write tracking: a patch of a few chunks, patched in place
            assert entries and entries[0].whole is None and 1 <= len(entries[0].chunks) <= 4, code
        b.apply(record)
        assert torch.equal(b.ns["big"], a.ns["big"]), code
    if a.tracker.writes is not None:
        assert b.ns["big"].data_ptr() == address

    writer = threading.Thread(target=lambda: a.ns["big"].__setitem__(999, 9.0))
    writer.start()
    writer.join()
    delta, record = a.step("y = 2")
    assert "big" in delta.values
    b.apply(record)
    assert b.ns["big"][999].item() == 9.0


LOAD_WITHOUT_GPU = """
import json, sys, torch
from jupyter_notebookos.replication.objectstore import ObjectStore
from jupyter_notebookos.replication.records import StateRecord, load_values
record = StateRecord.from_bytes(open(sys.argv[1], "rb").read())
v = load_values(record, ObjectStore(sys.argv[2]), {})
print(json.dumps({
    "cuda_visible": torch.cuda.is_available(),
    "devices": sorted({str(t.device) for t in (v["g"], v["gv"], v["model"].weight, *v["losses"])}),
    "g": v["g"].tolist(),
    "view_shares": v["gv"].untyped_storage().data_ptr() == v["g"].untyped_storage().data_ptr(),
    "parameter": isinstance(v["model"].weight, torch.nn.Parameter),
    "weight_sum": float(v["model"].weight.sum()),
    "losses": [float(t) for t in v["losses"]],
}))
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_are_recorded_as_host_tensors_any_replica_can_load(store: ObjectStore, tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    g = torch.arange(6, dtype=torch.float32, device="cuda")
    model = torch.nn.Linear(8, 8, device="cuda")
    values = {"g": g, "gv": g[2:5], "model": model, "losses": [g.sum(), g.mean()]}  # scalars in a list: common
    record = encode_values(values, namespace=values, store=store, threshold=MIB)
    path = tmp_path / "record"
    path.write_bytes(record.to_bytes())
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # a follower between cells
    out = subprocess.run(
        [sys.executable, "-c", LOAD_WITHOUT_GPU, str(path), store.url], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["cuda_visible"] is False and seen["devices"] == ["cpu"]
    assert seen["g"] == g.tolist() and seen["view_shares"] and seen["parameter"]
    assert seen["weight_sum"] == pytest.approx(float(model.weight.detach().sum()))
    assert seen["losses"] == pytest.approx([15.0, 2.5])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_an_in_place_change_to_a_cuda_tensor_is_detected(store: ObjectStore) -> None:
    a, b = DictReplica(store), DictReplica(store)
    b.apply(a.step("import torch\ng = torch.zeros(1000, device='cuda')")[1])
    assert "g" not in a.step("x = 1")[0].values
    delta, record = a.step("g[3] = 1.0")
    assert "g" in delta.values
    b.apply(record)
    assert b.ns["g"].device.type == "cpu" and b.ns["g"][3].item() == 1.0


def test_the_replica_that_sent_a_tensor_patches_it_in_place_when_the_next_executor_changes_it(
    store: ObjectStore,
) -> None:
    """Executors change from cell to cell: the one that sent a storage whole must still hold its lineage (its
    buffer was exported through temporary objects), not fail the next executor's patch and resync."""
    a, b = DictReplica(store), DictReplica(store)
    if a.tracker.writes is None:
        pytest.skip("no kernel write tracking here: every change goes whole")
    b.apply(a.run("import torch\nw = torch.zeros(4 * 2 ** 20)\nv = w[10:20]"))  # 16 MiB, whole
    b.apply(a.run("w[3] = 1.0"))
    address = a.ns["w"].data_ptr()
    record = b.run("w[2 ** 21] = 4.0")  # b executes now
    (entry,) = [e for e in record.buffers if isinstance(e, TrackedBuffer)]
    assert entry.whole is None and entry.chunks  # a patch of the lineage a sent
    a.apply(record)
    assert torch.equal(a.ns["w"], b.ns["w"]) and a.ns["w"][2**21].item() == 4.0
    assert a.ns["w"].data_ptr() == address  # patched in place
    a.ns["w"][11] = 7.0
    assert a.ns["v"][1].item() == 7.0  # the view still shares the storage
    b.apply(a.run("w[5] = 2.0"))  # and back to a
    assert torch.equal(a.ns["w"], b.ns["w"])


def test_a_device_checksum_sees_each_small_change_and_only_the_bytes() -> None:
    """digest.device_checksum, which fingerprints storages left on a GPU, run here on host storages (the same torch
    operations on another device): one word, two words of a row (sign flips, a swap), a +1/-2/+1 pattern, the
    last bytes past whole words, and nothing else than the bytes and their number."""
    from jupyter_notebookos.replication.digest import DEVICE_ROW_WORDS, device_checksum

    def checksum(t: torch.Tensor) -> bytes:
        return device_checksum(torch, t.untyped_storage())

    x = torch.randn(2 * DEVICE_ROW_WORDS + 123, dtype=torch.float64)  # whole rows, and words past them
    before = checksum(x)
    assert checksum(x.clone()) == before  # another storage with the same bytes

    def negate_two(t: torch.Tensor) -> None:  # 2**31 in two high words: cancels in a sum modulo 2**32
        t[0] = -t[0]
        t[1] = -t[1]

    def swap(t: torch.Tensor) -> None:
        t[[7, 8]] = t[[8, 7]]

    changes = [
        lambda t: t[5].neg_(),
        negate_two,
        swap,
        lambda t: t.view(torch.int32)[100:103].add_(torch.tensor([1, -2, 1], dtype=torch.int32)),
        lambda t: t[-1].add_(1),  # past the last whole row
        lambda t: t[DEVICE_ROW_WORDS // 2].mul_(2),  # in the second row
    ]
    for i, change in enumerate(changes):
        changed = x.clone()
        change(changed)
        assert checksum(changed) != before, i
    for n in (1, 3, 4, 7):  # sizes that end within a word
        b = torch.zeros(n, dtype=torch.uint8)
        zero = checksum(b)
        b[n - 1] = 1
        assert checksum(b) != zero, n
        assert zero != checksum(torch.zeros(n + 1, dtype=torch.uint8))  # the size counts
    assert checksum(torch.empty(0)) == checksum(torch.empty(0, dtype=torch.int64))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_model_left_on_the_gpu_is_fingerprinted_on_the_device(store: ObjectStore) -> None:
    from unittest import mock

    from jupyter_notebookos.replication import serialization

    a, b = DictReplica(store), DictReplica(store)
    b.apply(a.step("import torch\nmodel = torch.nn.Linear(1024, 1024, device='cuda')\nw = model.weight")[1])
    with mock.patch.object(serialization, "device_checksum", wraps=serialization.device_checksum) as summed:
        delta, _ = a.step("n = sum(p.numel() for p in model.parameters())")  # reaches the model, changes nothing
        assert "model" not in delta.values and summed.call_count >= 2  # weight and bias, on the device
    delta, record = a.step("with torch.no_grad():\n    model.weight[3, 4] += 1")
    assert "model" in delta.values and "w" in delta.values  # w shares the weight's storage
    b.apply(record)
    assert b.ns["model"].weight.device.type == "cpu" and b.ns["w"] is b.ns["model"].weight
    assert torch.equal(b.ns["model"].weight, a.ns["model"].weight.cpu())
