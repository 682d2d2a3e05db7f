"""A cell that changes k bytes of a large array publishes and applies O(k): changed chunks, patched in place."""

from __future__ import annotations

import numpy as np
import pytest
from dict_replica import DictReplica
from replication_harness import Executor, Replica

from jupyter_notebookos.kernel.statelog import StateLog, collect_unreferenced
from jupyter_notebookos.replication.chunks import CHUNK_BYTES, LineageMissingError, TrackedBuffer
from jupyter_notebookos.replication.objectstore import ObjectStore
from jupyter_notebookos.replication.writetrack import open_write_tracker

MIB = 1 << 20


@pytest.fixture(autouse=True)
def _needs_write_tracking() -> None:
    tracker, why = open_write_tracker()
    if tracker is None:
        pytest.skip(f"write tracking {why}: every buffer goes whole")
    tracker.close()


def _entry(record, index: int = 0) -> TrackedBuffer:
    entry = record.buffers[index]
    assert isinstance(entry, TrackedBuffer)
    return entry


def test_a_1mib_change_to_a_64mib_array_publishes_its_chunks_and_is_patched_in_place(executor, replica):
    executor.run("import numpy as np\nbig = np.arange(2 ** 23, dtype=np.float64)")  # 64 MiB
    first = _entry(executor.encoded[-1])
    assert first.whole is not None and first.size == 64 * MIB
    replica.apply(executor.records[-1])
    address = replica.eval("big.__array_interface__['data'][0]")

    executor.run("big[1000 : 1000 + MIB // 8] += 1".replace("MIB", str(MIB)))  # 1 MiB, not chunk-aligned
    patch = _entry(executor.encoded[-1])
    assert patch.whole is None and patch.lineage == first.lineage
    assert len(patch.chunks) == 5 and executor.encoded[-1].buffer_bytes == 5 * CHUNK_BYTES  # <= 1.25x
    assert len(executor.records[-1]) < 4096  # the record itself: header and a small pickle
    replica.apply(executor.records[-1])
    assert replica.eval("big.tobytes()") == executor.ns["big"].tobytes()
    assert replica.eval("big.__array_interface__['data'][0]") == address  # patched in place, not copied

    executor.run("big[-1] = -5.0\nbig[2 ** 22] = 7.0")  # two far-apart values: a page each, 1-2 chunks each
    assert 2 <= len(_entry(executor.encoded[-1]).chunks) <= 4
    replica.apply(executor.records[-1])
    assert replica.eval("float(big[-1]), float(big[2 ** 22])") == (-5.0, 7.0)


def test_a_replica_that_never_held_the_buffer_refuses_the_patch_clearly(executor, replica, store_url):
    executor.run("import numpy as np\nbig = np.zeros(2 ** 21)")
    executor.run("big[3] = 1")
    late = Replica(store_url)
    try:
        with pytest.raises(AssertionError, match="does not hold"):
            late.apply(executor.records[-1])
        assert late.eval("'big' in globals()") is False  # nothing half-applied
    finally:
        late.close()


def test_the_next_executor_patches_the_same_lineage_and_checkpoints_keep_it(store: ObjectStore):
    a, b = DictReplica(store), DictReplica(store)
    b.apply(a.run("import numpy as np\nw = np.ones(2 ** 21)\nbias = [0.0]"))  # 16 MiB, whole
    record = a.run("w[10] = 2.0")
    lineage = _entry(record).lineage
    b.apply(record)
    b.apply(a.run("w[20] = 3.0"))
    # b becomes the executor: its patch names the lineage a sent, and a patches its own memory.
    record = b.run("w[2 ** 20] = 4.0\nbias.append(1.0)")
    assert _entry(record).lineage == lineage and _entry(record).chunks
    before = a.ns["w"].__array_interface__["data"][0]
    a.apply(record)
    assert np.array_equal(a.ns["w"], b.ns["w"]) and a.ns["bias"] == [0.0, 1.0]
    assert a.ns["w"].__array_interface__["data"][0] == before

    # A checkpoint names the lineage's layout (its base and chunks): a replica restored from it takes patches.
    log = StateLog(store, "b", lineage=b.tracker.lineage)
    pointer, _ = log.finish_checkpoint(StateLog.serialize_checkpoint(b.ns, [b.tracker.user_names()], MIB), 9)
    c = DictReplica(store)
    for part in log.read_checkpoint(pointer).records:
        c.apply(part)
    c.apply(b.run("w[5] = 9.0"))
    assert np.array_equal(c.ns["w"], b.ns["w"])
    fresh = DictReplica(store)
    with pytest.raises(LineageMissingError):
        fresh.apply(b.run("w[6] = 9.0"))


def test_an_untracked_or_small_buffer_still_goes_whole(shell, store):
    ex = Executor(shell, store, write_tracking=False)
    ex.run("import numpy as np\nbig = np.zeros(2 ** 19)")
    ex.run("big[0] = 1")
    assert not isinstance(ex.encoded[-1].buffers[0], TrackedBuffer)
    assert ex.encoded[-1].buffer_bytes == 4 * MIB


def _checkpoint(replica: DictReplica, seq: int):
    log = StateLog(replica.store, "r", lineage=replica.tracker.lineage)
    names = [replica.tracker.user_names()]
    pointer, _ = log.finish_checkpoint(StateLog.serialize_checkpoint(replica.ns, names, MIB), seq)
    (part,) = log.read_checkpoint(pointer).records  # one group of names, holding a buffer: one part
    return pointer, part


def test_a_checkpoint_names_the_layout_instead_of_uploading_the_buffer_again(store: ObjectStore):
    a, b = DictReplica(store), DictReplica(store)
    first = a.run("import numpy as np\nw = np.arange(2 ** 23, dtype=np.float64)")  # 64 MiB, whole
    b.apply(first)
    b.apply(a.run("w[10] = -1.0"))
    b.apply(a.run("w[2 ** 22 : 2 ** 22 + 100] = 5.0"))
    b.apply(a.run("w[11] = -2.0"))  # the same chunk as the first patch: its newer version replaces it
    objects = set(store.buffer_keys())

    pointer, checkpoint = _checkpoint(a, 4)
    entry = _entry(checkpoint)
    # Nothing hashed or uploaded but the part's own record (a few hundred bytes): the buffer's are in the store.
    (part_key,) = set(store.buffer_keys()) - objects
    assert part_key in pointer.objects and len(store.fs.cat_file(f"{store.root}/{part_key}")) < 4096
    offsets = [off for off, _ in entry.chunks]  # one chunk per offset (where the array starts in its page moves)
    assert entry.whole == _entry(first).whole and offsets[0] == 0 and len(set(offsets)) == len(offsets) <= 3
    assert checkpoint.buffer_bytes == 64 * MIB + len(offsets) * CHUNK_BYTES

    # The follower's layout is the same, so its checkpoint (were it the executor) names the same objects.
    others = [_checkpoint(b, 4)]
    assert others[0][1].buffers == checkpoint.buffers

    # A replica restored from it holds the same bytes, under the lineage: the next patch applies.
    c = DictReplica(store)
    c.apply(checkpoint)
    assert np.array_equal(c.ns["w"], a.ns["w"])
    record = a.run("w[-1] = 0.5")
    b.apply(record)
    c.apply(record)
    assert np.array_equal(c.ns["w"], a.ns["w"]) and np.array_equal(b.ns["w"], a.ns["w"])
    # ... and c's layout (from the checkpoint, then the record) is everyone's.
    others += [_checkpoint(c, 5), _checkpoint(a, 5)]
    assert others[1][1].buffers == others[2][1].buffers
    their_parts = {key for p, part in others for key in set(p.objects) - set(part.object_keys)} - set(pointer.objects)

    # Garbage collection keeps what the checkpoint names and drops the chunk the newer one superseded (and the
    # parts of the other checkpoints, which the pointer does not name).
    report = collect_unreferenced(store, 4, [*pointer.objects, *record.object_keys], grace_seconds=0)
    assert len(set(report.deleted_buffers) - their_parts) == 1
    c2 = DictReplica(store)
    c2.apply(_checkpoint(a, 5)[1])
    assert np.array_equal(c2.ns["w"], a.ns["w"])


def test_a_patch_that_was_never_committed_stays_out_of_the_layout(store: ObjectStore):
    a, b = DictReplica(store), DictReplica(store)
    b.apply(a.run("import numpy as np\nw = np.zeros(2 ** 21)"))
    a.ns["w"][7] = 3.0
    a.tracker.writes.scan()
    # Uploaded for a record that never went out (its store write failed after this buffer): not committed.
    lost = a.tracker.lineage.encode(memoryview(a.ns["w"]).cast("B"), store)
    assert isinstance(lost, TrackedBuffer) and lost.chunks
    _, checkpoint = _checkpoint(a, 2)
    assert not _entry(checkpoint).chunks  # the layout is still what b holds
    assert _checkpoint(b, 2)[1].buffers == checkpoint.buffers
    c = DictReplica(store)
    c.apply(checkpoint)
    assert np.array_equal(c.ns["w"], b.ns["w"])
