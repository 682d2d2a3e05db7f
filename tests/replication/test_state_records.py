"""Records, the object store, checkpoints and garbage collection, as a replica kernel would use them."""

from __future__ import annotations

import base64
import json
import struct

import nsprobe
import numpy as np
import pytest

from jupyter_notebookos.kernel.statelog import StateLog, collect_unreferenced
from jupyter_notebookos.replication.objectstore import (
    BufferCorruptError,
    BufferMissingError,
    BufferRef,
    ObjectStore,
    ObjectStoreUnreachable,
)
from jupyter_notebookos.replication.records import (
    MAGIC,
    PARTS_MAGIC,
    RecordFormatError,
    StateRecord,
    apply_record,
    encode_values,
)
from jupyter_notebookos.replication.serialization import UnreplicatedValue, UnreplicatedValueError


def test_unpicklable_values_give_one_warning_naming_them_and_the_rest_replicates(executor, replica):
    executor.run("import threading\nlock = threading.Lock()\ngen = (i for i in range(3))\nok = [1, 2]")
    record = executor.encoded[-1]
    assert set(record.unserializable) == {"lock", "gen"}
    warning = record.warning()
    assert warning is not None and "lock" in warning and "gen" in warning and "ok" not in warning.split(":")[1]
    assert "failover" in warning
    replica.apply(executor.records[-1])
    assert replica.eval("ok") == [1, 2]
    assert "not replicated" in replica.eval("repr(lock)")
    with pytest.raises(AssertionError, match=r"UnreplicatedValueError.*'lock' was not replicated"):
        replica.eval("lock.acquire()")
    # Unchanged, the unpicklable names do not warn again.
    executor.run("other = 3")
    assert executor.encoded[-1].warning() is None


def test_a_reducer_the_notebook_registers_with_copyreg_is_used_from_then_on(executor, replica):
    """Picklers take copyreg's table when they are made (one dict with cloudpickle's reducers, not a ChainMap looked up
    per object): a reducer registered by a cell counts for that cell's record and every later one."""
    executor.run(
        "import copyreg, threading\nclass Holder:\n    def __init__(self, n=0):\n        self.lock = threading.Lock()\n"
        "        self.n = n\nh = Holder(1)"
    )
    assert set(executor.encoded[-1].unserializable) == {"h"}
    executor.run("copyreg.pickle(Holder, lambda o: (Holder, (o.n,)))\nh.n = 2")
    assert not executor.encoded[-1].unserializable
    replica.apply(executor.records[-2])
    replica.apply(executor.records[-1])
    assert replica.eval("(type(h).__name__, h.n, h.lock.acquire(blocking=False))") == ("Holder", 2, True)


def test_numpy_views_of_named_arrays_stay_views_once_loaded(store):
    """numpy pickles a view as a copy; a record rebuilds it as a view of the named array it lies in, so that a write
    through it on the replica that loaded it (once that one runs cells) reaches the array, as on the executor."""
    base = np.arange(24, dtype=np.float64)
    big = np.arange(2**18, dtype=np.float64)  # out of band, through the store
    inner = np.arange(8, dtype=np.float64)
    locked_base = np.arange(4, dtype=np.float64)
    locked = locked_base.view()
    locked.flags.writeable = False
    ns = {
        "base": base,
        "tail": base[4:],
        "every_third": base[::3],
        "reversed": base[::-1],
        "grid": base.reshape(4, 6).T,
        "as_ints": base.view(np.int64)[2:5],
        "frozen": np.broadcast_to(base[:6], (3, 6)),
        "locked": locked,  # a read-only view: the writeable views of its memory are not rebuilt over it
        "open": locked_base[2:],
        "window": big[1000:2000],
        "big": big,
        "empty": base[5:5],
        "unnamed": np.ones(100)[10:20],  # its array has no name: a copy, not the 100 elements
        "views": [inner[2:5]],  # a view in one container, its array in another, pickled after it
        "arrays": [inner],
        "objects": np.array([[1], [2]], dtype=object)[1:],
    }
    for threshold in (2**20, 1024):  # in band, and every buffer out of band
        record = encode_values(ns, namespace=ns, store=store, threshold=threshold)
        out: dict = {}
        apply_record(record.to_bytes(), out, store)
        for name, value in ns.items():
            if name in ("views", "arrays"):
                assert np.array_equal(out[name][0], value[0])
                continue
            assert np.array_equal(out[name], value), name
            assert out[name].flags.writeable == value.flags.writeable, name
        assert np.shares_memory(out["views"][0], out["arrays"][0])
        for name in ("tail", "every_third", "reversed", "grid", "as_ints", "frozen"):
            assert np.shares_memory(out[name], out["base"]), name
        assert np.shares_memory(out["window"], out["big"])
        assert out["unnamed"].base is None or out["unnamed"].base.size == 10  # not the unnamed array
        out["tail"][0] = -1.0
        out["reversed"][0] = -2.0
        assert out["base"][4] == -1.0 and out["base"][-1] == -2.0 and out["grid"][5, 3] == -2.0
        assert out["objects"][0][0] == 2


def test_small_values_are_inline_and_the_record_is_compact(executor):
    executor.run("x = 1")
    assert len(executor.records[-1]) < 64
    executor.run("arr = __import__('numpy').arange(1000)")  # 8 kB: below the threshold, inline
    assert executor.encoded[-1].buffers == ()


def test_threshold_is_configurable(shell, store):
    from replication_harness import Executor

    ex = Executor(shell, store, threshold=1024)
    ex.run("import numpy as np\narr = np.arange(1000)")
    assert [ref.size for ref in ex.encoded[-1].buffers] == [8000]
    assert store.exists(ex.encoded[-1].buffers[0].key)


def test_a_failed_apply_leaves_the_namespace_untouched(executor, store):
    executor.run("import numpy as np\nbig = np.ones(2 ** 18)\nsmall = 1")
    record = executor.encoded[-1]
    store.delete(record.buffers[0].key)
    target = {"small": "old"}
    with pytest.raises(BufferMissingError, match="missing from the object store"):
        apply_record(executor.records[-1], target, store)
    assert target == {"small": "old"}


def test_deleted_names_are_applied(executor):
    executor.run("a = 1\nb = 2")
    executor.run("del a")
    target: dict = {}
    for data in executor.records:
        apply_record(data, target, executor.store)
    assert set(target) == {"b"}


def test_not_a_record_is_a_clear_error():
    with pytest.raises(RecordFormatError, match="not a NotebookOS state record"):
        StateRecord.from_bytes(b"{}")


def test_unreplicated_placeholder_explains_itself():
    value = UnreplicatedValue("lock", "TypeError: cannot pickle '_thread.lock' object")
    with pytest.raises(UnreplicatedValueError, match="Re-run the cell"):
        value.acquire()
    assert not hasattr(value, "anything")


# -- object store ------------------------------------------------------------------------------------------


def test_buffers_are_content_addressed_atomic_and_verified(store):
    data = np.arange(300_000, dtype=np.float64)
    ref = store.put_buffer(memoryview(data))
    assert store.put_buffer(memoryview(data.copy())) == ref  # same content, same key, stored once
    assert list(store.buffer_keys()) == [ref.key]
    assert not [p for p in store.fs.find(store.root) if ".tmp-" in p]
    assert bytes(store.get_buffer(ref)) == data.tobytes()
    with store.fs.open(f"{store.root}/{ref.key}", "wb") as f:
        f.write(b"x" * ref.size)
    with pytest.raises(BufferCorruptError, match="does not match its digest"):
        store.get_buffer(ref)


def test_unreachable_store_says_so(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ObjectStoreUnreachable, match="unreachable"):
        ObjectStore((blocker / "objects").as_uri())
    with pytest.raises(ObjectStoreUnreachable, match="cannot open the object store"):
        ObjectStore("nosuchprotocol://x")


def test_memory_store_works_too():
    store = ObjectStore("memory://notebookos-test-store")
    ref = store.put_buffer(b"abc" * 1000)
    assert bytes(store.get_buffer(ref)) == b"abc" * 1000


# -- checkpoints, restore, garbage collection --------------------------------------------------------------


@pytest.mark.slow
def test_checkpoint_plus_later_records_restores_the_executor_namespace(executor, replica, store):
    executor.run(
        "import numpy as np\nclass Acc:\n    def __init__(self):\n        self.items = []\n"
        "    def add(self, v):\n        self.items.append(v)\n        return len(self.items)\n"
        "acc = Acc()\nalias = acc.items\nbig = np.arange(2 ** 18, dtype=np.float64)"
    )
    executor.run("acc.add(1)")
    # As the executor checkpoints (Checkpointer) and a new replica restores (StateLog).
    statelog = StateLog(store, "r0", lineage=executor.tracker.lineage)
    pending = statelog.serialize_checkpoint(executor.ns, [executor.tracker.user_names()], executor.threshold)
    pointer, _ = statelog.finish_checkpoint(pending, 2)
    checkpoint = statelog.read_checkpoint(pointer)
    assert [r.kind for r in checkpoint.records] == ["part"]
    assert checkpoint.records[0].buffers and not checkpoint.records[0].unserializable
    start = len(executor.records)
    executor.run("acc.add(2)\nbig[0] = 99.0")
    executor.run("later = Acc()\nlater.add(acc)")
    executor.run("del alias")

    assert store.latest_checkpoint()[0] == 2
    replica.call("restore", ([r.to_bytes() for r in checkpoint.records], executor.records[start:]))
    assert replica.describe() == nsprobe.describe(executor.ns, executor.shell.user_ns_hidden)
    assert replica.eval("isinstance(later, Acc) and later.items[0] is acc and acc.add(3)") == 3


def test_garbage_collection_removes_only_unreferenced_buffers(executor, store):
    executor.run("import numpy as np\nold = np.ones(2 ** 18)")
    old_key = executor.encoded[-1].object_keys[0]
    executor.run("old = None\nkept = np.zeros(2 ** 18)")
    statelog = StateLog(store, "r0")
    pending = statelog.serialize_checkpoint(executor.ns, [executor.tracker.user_names()], executor.threshold)
    pointer, _ = statelog.finish_checkpoint(pending, 1)
    store.put_checkpoint(0, b"an older checkpoint, superseded")
    executor.run("newer = np.full(2 ** 18, 7.0)")
    newer_key = executor.encoded[-1].object_keys[0]
    # What the executor collects with after a checkpoint: the keys its pointer and the later records name.
    referenced = {*pointer.objects, *executor.encoded[-1].object_keys}

    young = collect_unreferenced(store, pointer.seq, referenced, grace_seconds=3600)
    assert young.deleted_buffers == () and old_key in young.kept_too_young
    assert young.deleted_checkpoints == (0,)

    report = collect_unreferenced(store, pointer.seq, referenced, grace_seconds=0)
    assert report.deleted_buffers == (old_key,)
    assert set(store.buffer_keys()) == {*pointer.objects, newer_key}
    assert store.checkpoint_seqs() == [1]
    assert "deleted 1 buffer(s)" in str(report)


def test_collecting_after_a_checkpoint_keeps_what_the_pointer_and_the_log_name(store):
    keep, young_key = store.put_buffer(b"named by a record").key, store.put_buffer(b"just uploaded").key
    gone = store.put_buffer(b"superseded").key
    for seq in (3, 5, 8):  # 5 is the committed checkpoint; 8 may be on its way to being committed
        store.put_checkpoint(seq, b"checkpoint")

    young = collect_unreferenced(store, 5, {keep}, grace_seconds=3600)
    assert young.deleted_buffers == () and set(young.kept_too_young) == {young_key, gone}
    assert young.deleted_checkpoints == (3,) and store.checkpoint_seqs() == [5, 8]

    report = collect_unreferenced(store, 5, {keep, young_key}, grace_seconds=0)
    assert report.deleted_buffers == (gone,)
    assert set(store.buffer_keys()) == {keep, young_key}
    assert collect_unreferenced(store, None, set(), grace_seconds=0).deleted_checkpoints == ()


# -- checkpoints in parts ----------------------------------------------------------------------------------


def _restore(statelog: StateLog, pointer) -> dict:
    ns: dict = {}
    for record in statelog.read_checkpoint(pointer).records:
        apply_record(record, ns, statelog.store)
    return ns


def test_a_checkpoint_keeps_each_group_apart_and_small_groups_together(store):
    shared = {"k": [1, 2]}
    ns = {"a": shared, "b": [shared], "big": np.arange(2**18, dtype=np.float64), "n": 1, "s": "x" * 10}
    ns["objs"] = [{"i": i} for i in range(20_000)]  # no buffer, but over SMALL_PART_BYTES pickled
    groups = [["a", "b"], ["big"], ["n"], ["s"], ["objs"], ["gone"]]
    statelog = StateLog(store, "r0")
    pending = statelog.serialize_checkpoint(ns, groups, 2**20)
    assert sorted(sorted(part.names) for part in pending) == [["a", "b", "n", "s"], ["big"], ["objs"]]
    pointer, parts = statelog.finish_checkpoint(pending, 3)
    assert {name for part in parts for name in part.names} == {"a", "b", "big", "n", "s", "objs"}
    assert set(pointer.objects) == {key for part in parts for key in part.objects}
    restored = _restore(statelog, pointer)
    assert restored["b"][0] is restored["a"] and restored["a"]["k"] == [1, 2]
    assert np.array_equal(restored["big"], ns["big"]) and restored["objs"] == ns["objs"] and restored["n"] == 1
    # Beyond max_parts, the groups left go together with the small ones (the pointer lists every part).
    capped = statelog.serialize_checkpoint(ns, groups, 2**20, max_parts=2)
    assert sorted(sorted(part.names) for part in capped) == [["a", "b", "n", "objs", "s"], ["big"]]
    with pytest.raises(TypeError, match="groups of names"):
        statelog.serialize_checkpoint(ns, ["a", "b"], 2**20)  # type: ignore[list-item]

    # The next checkpoint names the parts it keeps again: they are neither pickled nor uploaded again.
    kept = [part for part in parts if "objs" in part.names or "big" in part.names]
    ns["n"] = 2
    later, later_parts = statelog.finish_checkpoint(
        statelog.serialize_checkpoint(ns, [["a", "b"], ["n", "s"]], 2**20), 5, kept
    )
    assert {key for part in kept for key in part.objects} <= set(later.objects)
    assert len(later_parts) == 3
    restored = _restore(statelog, later)
    assert restored["n"] == 2 and restored["objs"] == ns["objs"] and np.array_equal(restored["big"], ns["big"])


def test_a_checkpoint_in_one_piece_still_restores(store):
    """As an older NotebookOS wrote them: the whole namespace in the checkpoint object itself."""
    from jupyter_notebookos.replication.digest import content_digest
    from jupyter_notebookos.replication.protocol import CheckpointPointer

    ns = {"x": [1, 2, 3], "big": np.ones(2**18)}
    record = encode_values(ns, namespace=ns, store=store, kind="checkpoint", threshold=2**20)
    data = record.to_bytes()
    pointer = CheckpointPointer(
        seq=4, ref=store.put_checkpoint(4, data), objects=record.object_keys, digest=content_digest(data)
    )
    checkpoint = StateLog(store, "r0").read_checkpoint(pointer)
    assert checkpoint.parts == [] and len(checkpoint.records) == 1
    restored = _restore(StateLog(store, "r0"), pointer)
    assert restored["x"] == [1, 2, 3] and np.array_equal(restored["big"], ns["big"])


def test_a_damaged_tampered_or_missing_part_is_refused(store):
    statelog = StateLog(store, "r0")
    ns = {"objs": [{"i": i} for i in range(20_000)], "n": 1}
    pointer, parts = statelog.finish_checkpoint(statelog.serialize_checkpoint(ns, [["objs"], ["n"]], 2**20), 2)
    path = f"{store.root}/{parts[0].ref.key}"
    original = store.fs.cat_file(path)
    store.fs.pipe_file(path, original[:-8] + b"tampered")
    with pytest.raises(BufferCorruptError, match="does not match its digest"):
        statelog.read_checkpoint(pointer)
    store.fs.rm(path)
    with pytest.raises(BufferMissingError, match=r"part .* is missing"):
        statelog.read_checkpoint(pointer)
    # A NotebookOS that predates parts reads only MAGIC records: it refuses the checkpoint object as "newer" rather
    # than restore it as a record that binds nothing.
    whole = store.get_checkpoint(2)
    assert whole[:4] == PARTS_MAGIC != MAGIC and StateRecord.from_bytes(whole).parts
    with pytest.raises(RecordFormatError, match="do not match its magic"):
        StateRecord.from_bytes(MAGIC + whole[4:])
    with pytest.raises(RecordFormatError, match="damaged part entry"):
        StateRecord.from_bytes(StateRecord(kind="checkpoint", parts=(BufferRef("x", 1, "../x"),)).to_bytes())


def test_a_checkpoint_lists_what_its_parts_hold_for_a_replica_that_did_not_write_it(store):
    """A replica that becomes the executor learns the parts of the checkpoint in force from the checkpoint object
    alone (StateLog.read_parts), as the replica that wrote it knows them: names, part and every object they need."""
    writer, reader = StateLog(store, "r0"), StateLog(store, "r1")
    ns = {"objs": [{"i": i} for i in range(20_000)], "big": np.arange(2**18, dtype=np.float64), "n": 1}
    pointer, parts = writer.finish_checkpoint(writer.serialize_checkpoint(ns, [["objs"], ["big"], ["n"]], 2**20), 2)
    listed = reader.read_parts(pointer)
    assert listed is not None
    assert sorted(listed, key=lambda p: sorted(p.names)) == sorted(parts, key=lambda p: sorted(p.names))
    assert [sorted(p.names) for p in reader.read_checkpoint(pointer).parts] == [sorted(p.names) for p in listed]
    # Named again by the reader's checkpoint, they restore as they were.
    ns["n"] = 2
    kept = [part for part in listed if "n" not in part.names]
    later, _ = reader.finish_checkpoint(reader.serialize_checkpoint(ns, [["n"]], 2**20), 4, kept)
    assert {key for part in kept for key in part.objects} <= set(later.objects)
    restored = _restore(reader, later)
    assert restored["n"] == 2 and restored["objs"] == ns["objs"] and np.array_equal(restored["big"], ns["big"])

    # A checkpoint that does not list them (written by an older NotebookOS; or in one piece) gives None.
    from jupyter_notebookos.replication.digest import content_digest
    from jupyter_notebookos.replication.protocol import CheckpointPointer

    unlisted = StateRecord(kind="checkpoint", parts=tuple(part.ref for part in parts)).to_bytes()
    old = CheckpointPointer(seq=6, ref=store.put_checkpoint(6, unlisted), digest=content_digest(unlisted))
    assert reader.read_parts(old) is None
    assert len(reader.read_checkpoint(old).records) == 3

    # The list is checked like the rest of the checkpoint object.
    store.fs.pipe_file(f"{store.root}/{pointer.ref}", store.get_checkpoint(2)[:-1])
    with pytest.raises(BufferCorruptError, match="does not match its digest"):
        reader.read_parts(pointer)
    refs = tuple(part.ref for part in parts)
    raw = StateRecord(kind="checkpoint", parts=refs).to_bytes()
    (size,) = struct.unpack_from("<I", raw, 4)
    header = json.loads(raw[8 : 8 + size])
    # Fewer entries than parts, a digest that is not one, names that are not strings, not a list at all.
    for damaged in ([[["n"], []]], [[["n"], ["../x"]]] * 3, [[[1], []]] * 3, "n"):
        head = json.dumps({**header, "m": damaged}).encode()
        with pytest.raises(RecordFormatError, match="damaged"):
            StateRecord.from_bytes(raw[:4] + struct.pack("<I", len(head)) + head)


# A delta record written by NotebookOS before the pickler and the record format were two modules (values: a notebook
# function reading a global, a closure, a notebook class and an instance, an array and a view of it, the namespace
# itself, a stand-in for a value that was not replicated, a module loaded with a submodule, an int). Records and
# checkpoints already in the log and the store, and replicas of other versions, name the functions that rebuild
# values by their module path.
_RECORD_BEFORE_THE_SPLIT = base64.b64decode(
    "TkJTMVYAAAB7ImsiOiJkZWx0YSIsImIiOlsic2NhbGUiLCJzdGVwIiwiUG9pbnQiLCJwIiwiYmFzZSIsInZpZXciLCJnIiwiZ29u"
    "ZSIsInhtbCIsImZhY3RvciJdfYAFlaAFAAAAAAAAXZQojCxqdXB5dGVyX25vdGVib29rb3MucmVwbGljYXRpb24uc2VyaWFsaXph"
    "dGlvbpSMF19tYWtlX25vdGVib29rX2Z1bmN0aW9ulJOUjBdjbG91ZHBpY2tsZS5jbG91ZHBpY2tsZZSMDV9idWlsdGluX3R5cGWU"
    "k5SMCENvZGVUeXBllIWUUpQoSwJLAEsASwJLAksDQxyXAHwAfAF6BQAAdAAAAAAAAAAAAAAAegUAAFMAlE6FlIwGZmFjdG9ylIWU"
    "jAF4lIwBa5SGlIwOPGR5bmFtaWMtY29kZT6UjAVzY2FsZZSMBXNjYWxllEsDQxCAANgLDIhxiTWVNok+0AQZlEMAlCkpdJRSlGgT"
    "SwCHlFKUaAGMG19ub3RlYm9va19mdW5jdGlvbl9zZXRzdGF0ZZSTlGgZfZR9lCiMCF9fbmFtZV9flGgTjAxfX3F1YWxuYW1lX1+U"
    "aBOMD19fYW5ub3RhdGlvbnNfX5R9lIwOX19rd2RlZmF1bHRzX1+UTowMX19kZWZhdWx0c19flEsChZSMCl9fbW9kdWxlX1+UjAhf"
    "X21haW5fX5SMB19fZG9jX1+UTowOY2xvc3VyZV92YWx1ZXOUXZR1hpSGUjBoA2gJKEsASwBLAEsASwJLE0MSlQGXAIkAZAF6DQAA"
    "igCJAFMAlE5LAYaUKSmMDjxkeW5hbWljLWNvZGU+lIwEc3RlcJSMFWNvdW50ZXIuPGxvY2Fscz4uc3RlcJRLB0MR+IAA4AgJiFGJ"
    "BogB2A8QiAiUaBWMAW6UhZQpdJRSlIwEc3RlcJRLAYeUUpRoG2g3fZR9lChoHmg1aB9oL2ggfZRoIk5oI05oJWgmaCdOaChdlEsA"
    "YXWGlIZSMGgEjBRfbWFrZV9za2VsZXRvbl9jbGFzc5STlCiMCGJ1aWx0aW5zlIwEdHlwZZSTlIwFUG9pbnSUaD+MBm9iamVjdJST"
    "lIWUfZRoJWgmc4wgYjNiYjZmNGY4N2Q2NDYwMjhjMjYxNDk2MDM3ZTlkZjeUTnSUUpRoBIwPX2NsYXNzX3NldHN0YXRllJOUaEl9"
    "lCiMB19fZG9jX1+UTowIX19pbml0X1+UaANoCShLAksASwBLAksCSwNDFJcAfAF8AF8AAAAAAAAAAABkAFMAlGgLaA6FlIwEc2Vs"
    "ZpRoDoaUjA48ZHluYW1pYy1jb2RlPpSMCF9faW5pdF9flIwOUG9pbnQuX19pbml0X1+USw1DDYAA2BESiASMBogGiAaUaBUpKXSU"
    "UpSMCF9faW5pdF9flEsAh5RSlGgbaFt9lH2UKGgeaFloH2hVaCB9lGgiTmgjTmglaCZoJ05oKF2UdYaUhlIwjApfX21vZHVsZV9f"
    "lGgmdX2UhpSGUjBoSSmBlH2UaA5LBHNijBNudW1weS5fY29yZS5udW1lcmljlIwLX2Zyb21idWZmZXKUk5QolkAAAAAAAAAAAAAA"
    "AAAAAAAAAAAAAADwPwAAAAAAAABAAAAAAAAACEAAAAAAAAAQQAAAAAAAABRAAAAAAAAAGEAAAAAAAAAcQJSMBW51bXB5lIwFZHR5"
    "cGWUk5SMAmY4lImIh5RSlChLA4wBPJROTk5K/////0r/////SwB0lGJLCIWUjAFDlHSUUpRoAYwTX3JlYnVpbGRfbnVtcHlfdmll"
    "d5STlChodWhvSwOFlEsIhZRLEIh0lFKUaAGMEl9jdXJyZW50X25hbWVzcGFjZZSTlClSlGgBjBFVbnJlcGxpY2F0ZWRWYWx1ZZST"
    "lIwEZ29uZZSMBmEgbG9ja5SGlFKUaAGMDl9pbXBvcnRfbW9kdWxllJOUjAN4bWyUXZQojAl4bWwuZXRyZWWUjBV4bWwuZXRyZWUu"
    "RWxlbWVudFBhdGiUjBV4bWwuZXRyZWUuRWxlbWVudFRyZWWUZYaUUpRLA2Uu"
)


def test_a_record_written_before_the_pickler_and_the_record_format_were_split_still_applies(store):
    ns: dict = {"__name__": "__main__"}
    record = apply_record(_RECORD_BEFORE_THE_SPLIT, ns, store)
    assert set(record.bound) == {"scale", "step", "Point", "p", "base", "view", "g", "gone", "xml", "factor"}
    assert ns["scale"](1) == 6 and ns["scale"].__globals__ is ns  # factor 3, read from this namespace
    ns["factor"] = 10
    assert ns["scale"](1) == 20
    assert (ns["step"](), ns["step"]()) == (1, 2)
    assert isinstance(ns["p"], ns["Point"]) and ns["p"].x == 4
    assert ns["view"].tolist() == [2.0, 3.0, 4.0] and np.shares_memory(ns["view"], ns["base"])
    assert ns["g"] is ns
    assert ns["gone"] == UnreplicatedValue("gone", "a lock")
    assert ns["xml"].etree.ElementTree.fromstring("<a/>").tag == "a"
