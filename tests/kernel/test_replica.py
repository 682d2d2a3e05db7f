"""The replica kernel, as the router and the user see it: real etcd, real replica processes, real clients."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest
from replica_harness import REPO, Replica, ReplicaFactory
from support import wait_for

from jupyter_notebookos.embedded.etcd import EtcdCluster
from jupyter_notebookos.replication import protocol as p
from jupyter_notebookos.replication.protocol import CellDirective
from jupyter_notebookos.replication.writetrack import METHOD, open_write_tracker

# Prints a digest of the user namespace without binding anything in it: values (numpy arrays by dtype,
# shape and bytes; instances by class and attributes; functions by code), and which names share objects.
DIGEST = r'''
exec("""
import hashlib, types
import numpy as _np
from jupyter_notebookos.replication.state import is_user_name
_ip = get_ipython()
_names = sorted(n for n, v in ns.items() if is_user_name(n, v, _ip.user_ns_hidden) and not n.startswith('_'))
def canon(v, depth=0):
    if depth > 6: return '...'
    if isinstance(v, _np.ndarray):
        return ('nd', str(v.dtype), v.shape, hashlib.sha256(v.tobytes()).hexdigest())
    if isinstance(v, (list, tuple)): return (type(v).__name__, [canon(x, depth + 1) for x in v])
    if isinstance(v, dict): return ('dict', sorted((repr(k), canon(x, depth + 1)) for k, x in v.items()))
    if isinstance(v, types.ModuleType): return ('module', v.__name__)
    if isinstance(v, type): return ('class', v.__qualname__, sorted(k for k in vars(v) if not k.startswith('__')))
    if isinstance(v, types.FunctionType):
        return ('fn', v.__qualname__, v.__code__.co_code.hex(), canon(v.__defaults__, depth + 1))
    if hasattr(v, '__dict__'): return ('obj', type(v).__qualname__, canon(vars(v), depth + 1))
    return ('repr', repr(v))
shared = sorted(sorted(g) for g in {frozenset(m for m in _names if ns[m] is ns[n]) for n in _names
                                   if not isinstance(ns[n], (int, float, str, types.ModuleType))} if len(g) > 1)
print(hashlib.sha256(repr([(n, canon(ns[n])) for n in _names]).encode()).hexdigest(), _names, shared)
""", {"ns": globals(), "get_ipython": get_ipython})
'''


def digest(replica: Replica) -> str:
    cell = replica.execute(DIGEST)
    assert cell.status == "ok", cell.reply["content"]
    return cell.stdout.strip()


def log_keys(replicas: ReplicaFactory) -> list[int]:
    items = replicas.etcd.run(replicas.etcd.co.get_prefix(replicas.keys.log_prefix(replicas.kernel_id)))
    return [replicas.keys.seq_of(kv.key) for kv in items]


def test_replica_registers_and_runs_user_code(replicas: ReplicaFactory) -> None:
    r0 = replicas.start("r0")  # (it must register within the harness's start timeout; how fast is a benchmark's job)
    reg = r0.registration
    assert reg is not None
    assert (reg.kernel_id, reg.replica_id, reg.host, reg.ip) == (
        replicas.kernel_id,
        "r0",
        "host-r0",
        "127.0.0.1",
    )
    assert reg.pid == r0.proc.pid and reg.lease > 0 and reg.applied_seq == p.FIRST_SEQ - 1
    assert len({reg.shell_port, reg.iopub_port, reg.stdin_port, reg.control_port, reg.hb_port}) == 5
    # The change detection method it uses, as GET /api/notebookos/kernels/{id} shows it.
    tracker, why = open_write_tracker()
    assert reg.change_detection == (METHOD if tracker is not None else f"checksum (write tracking {why})")

    cell = r0.execute("print('hello from', 6 * 7)")
    assert cell.status == "ok" and cell.stdout == "hello from 42\n"

    cell = r0.execute("from IPython.display import HTML, display\ndisplay(HTML('<b>bold</b>'))\n21 * 2")
    kinds = [(o["msg_type"], sorted(o["content"]["data"])) for o in cell.outputs]
    assert ("display_data", ["text/html", "text/plain"]) in kinds
    assert cell.outputs[-1]["content"]["data"]["text/plain"] == "42"

    cell = r0.execute("1 / 0")
    assert cell.status == "error" and cell.reply["content"]["ename"] == "ZeroDivisionError"
    assert [o["msg_type"] for o in cell.outputs] == ["error"]

    # Plain requests (no directive) publish nothing, and say who ran them.
    assert log_keys(replicas) == []
    assert cell.meta == {"replica": "r0", "host": "host-r0", "gpus": [], "seq": None}


def test_a_cell_the_gateway_gave_up_is_refused_when_it_comes(replicas: ReplicaFactory) -> None:
    """A gateway that re-attached asks the executor whether it took the last cell its predecessor decided (that
    gateway may have died before sending it): one not taken by the answer is refused should it come after, and
    publishes no record; its seq goes to the next cell."""
    r0 = replicas.start("r0")
    fence = replicas.elect("r0")
    assert r0.execute("x = 1", CellDirective(seq=1, fence=fence), msg_id="sent").status == "ok"
    assert r0.control("notebookos_cell_request", {"msg_id": "sent"})["content"] == {"status": "ok", "taken": True}
    assert r0.control("notebookos_cell_request", {"msg_id": "lost"})["content"] == {"status": "ok", "taken": False}
    cell = r0.execute("x = 2", CellDirective(seq=2, fence=fence), msg_id="lost")
    assert cell.status == "error" and cell.reply["content"]["ename"] == "NotebookOSCellGivenUp"
    assert "came after the gateway gave it up" in r0.log()
    cell = r0.execute("print(x)\ny = 3", CellDirective(seq=2, fence=fence))
    assert cell.status == "ok" and cell.stdout == "1\n"
    wait_for(lambda: log_keys(replicas) == [1, 2], 10, "records 1 and 2")
    time.sleep(0.5)  # (nothing else comes)
    assert log_keys(replicas) == [1, 2]
    assert r0.control("notebookos_cell_request", {"msg_id": "lost"})["content"]["taken"] is False


def test_directed_cell_publishes_exactly_one_fenced_record(replicas: ReplicaFactory) -> None:
    r0 = replicas.start("r0")
    fence = replicas.elect("r0")
    code = (
        "import os\nfrom jupyter_notebookos.gpu.binding import current_devices\n"
        "x = 41\nprint(os.environ['CUDA_VISIBLE_DEVICES'], current_devices())"
    )
    cell = r0.execute(code, CellDirective(seq=1, fence=fence, gpus=[1]))
    assert cell.status == "ok" and cell.stdout == "1 [1]\n"
    assert cell.meta == {
        "replica": "r0",
        "host": "host-r0",
        "gpus": [1],
        "seq": 1,
        "changed": ["current_devices", "os", "x"],  # what the router names if r0 dies before publishing
    }
    record = replicas.wait_record(1)
    assert (record.kind, record.replica_id, record.msg_id) == (
        "delta",
        "r0",
        cell.reply["parent_header"]["msg_id"],
    )
    assert "x" in record.names
    replicas.wait_applied("r0", 1)

    # GPUs are released after the cell.
    after = r0.execute("print(repr(os.environ['CUDA_VISIBLE_DEVICES']), current_devices())")
    assert after.stdout == "'' []\n"

    # A cell that raises still publishes its record (here: what it bound before raising).
    cell = r0.execute("y = x + 1\nraise ValueError('boom')", CellDirective(seq=2, fence=fence))
    assert cell.status == "error"
    assert replicas.wait_record(2).names == ["y"]

    # A stale fence: the record is not written, and the replica's log says why.
    cell = r0.execute("z = 3", CellDirective(seq=3, fence=fence + 1000))
    assert cell.status == "ok"
    deadline = time.monotonic() + 5
    while "was NOT written" not in r0.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "log record 3 was NOT written" in r0.log()
    assert "no longer the executor" in r0.log()
    assert log_keys(replicas) == [1, 2]
    # It reloads its state from the log: the refused cell's effect is gone, and its next cell (here seq 3 again,
    # as the log never got it) says so, naming what was lost.
    cell = r0.execute("print('z' in globals(), y)", CellDirective(seq=3, fence=fence))
    assert cell.stdout == "False 42\n"
    assert "changes an earlier cell made to z were lost" in cell.stderr
    assert "log record 3) was refused" in cell.stderr and "z is not defined" in cell.stderr
    assert "lost" not in r0.execute("pass", CellDirective(seq=4, fence=fence)).stderr  # told once


def test_a_flush_with_nothing_written_skips_the_round_trip_to_the_io_thread(replicas: ReplicaFactory) -> None:
    """ipykernel flushes stdout and stderr before every reply and every "idle"; on a replica a flush with nothing
    written does not wait for ipykernel's I/O thread, and one with something written sends it as before."""
    r0 = replicas.start("r0")
    code = (
        "import sys\n"
        "thread = sys.stdout.pub_thread\n"
        "scheduled = []\n"
        "schedule = thread.schedule\n"
        "thread.schedule = lambda f: scheduled.append(f) or schedule(f)\n"
        "sys.stderr.flush(); sys.stdout.flush()\n"
        "empty = len(scheduled)\n"
        "sys.stdout.write('written'); sys.stdout.flush()\n"
        "thread.schedule = schedule\n"
        "print('', empty, len(scheduled) > empty)"
    )
    assert r0.execute(code).stdout == "written 0 True\n"


def test_the_capture_reads_the_tree_ipython_compiled_and_parses_the_cell_itself_once_that_hook_is_gone(
    replicas: ReplicaFactory,
) -> None:
    """The state tracker learns what a cell binds and reaches from the syntax tree IPython compiled it from (an
    AST transformer of the shell), not by transforming and parsing its source again; if user code removes that
    hook, it parses the source itself and the records stay right."""
    r0 = replicas.start("r0")
    r1 = replicas.start("r1")
    fence = replicas.elect("r0")
    count = (  # (the tracker itself under no user name: it would be part of the state)
        "get_ipython().kernel.tracker.parsed = []\n"
        "get_ipython().kernel.tracker.transform = (\n"
        "    lambda code, t=get_ipython().kernel.tracker, parse=get_ipython().kernel.tracker.transform:\n"
        "    t.parsed.append(code) or parse(code)\n"
        ")"
    )
    assert r0.execute(count, CellDirective(1, fence)).status == "ok"
    assert r0.execute("a = 1\n%time b = a + 1", CellDirective(2, fence)).status == "ok"
    assert replicas.wait_record(2).names == ["a", "b"]
    hook_off = "get_ipython().ast_transformers.clear()\nc = len(get_ipython().kernel.tracker.parsed)"
    assert r0.execute(hook_off, CellDirective(3, fence)).status == "ok"
    assert r0.execute("d = c + 10", CellDirective(4, fence)).status == "ok"
    assert replicas.wait_record(4).names == ["d"]
    replicas.wait_applied("r1", 4)
    assert r1.execute("print(a, b, c, d)").stdout == "1 2 0 10\n"
    assert r0.execute("print(len(get_ipython().kernel.tracker.parsed))").stdout == "1\n"  # cell 4's


def test_records_of_cells_that_bind_nothing_go_out_together(replicas: ReplicaFactory) -> None:
    # An empty record waits 2 s here, not the default 0.1 s: on a loaded machine cells 2-5 took longer than
    # 0.1 s (a CI run found cell 2's record gone out on its own).
    r0 = replicas.start("r0", {p.ENV_HOLD_EMPTY_RECORDS_MS: "2000"})
    r1 = replicas.start("r1")
    fence = replicas.elect("r0")
    codes = ["x = 1", "print(x)", "x + 1", "pass", "x = 2", "len('abc')"]
    assert r0.execute(codes[0], CellDirective(seq=1, fence=fence)).status == "ok"
    # Cells 2-5 are sent at once, as "Run All" does: the replica takes them one after the other.
    client = r0.client
    assert client is not None
    sent = []
    for seq, code in enumerate(codes[1:5], start=2):
        msg = client.session.msg(
            "execute_request",
            {"code": code, "silent": False},
            metadata={p.METADATA_KEY: CellDirective(seq, fence).to_dict()},
        )
        client.shell_channel.send(msg)
        sent.append(msg["header"]["msg_id"])
    replies = {}
    while len(replies) < len(sent):
        reply = client.get_shell_msg(timeout=20)
        replies[reply["parent_header"]["msg_id"]] = reply["content"]["status"]
    assert [replies[m] for m in sent] == ["ok"] * 4
    assert r0.execute(codes[5], CellDirective(seq=6, fence=fence)).status == "ok"
    replicas.wait_applied("r1", len(codes))
    items = replicas.etcd.run(replicas.etcd.co.get_prefix(replicas.keys.log_prefix(replicas.kernel_id)))
    revision = {replicas.keys.seq_of(kv.key): kv.mod_revision for kv in items}
    assert sorted(revision) == [1, 2, 3, 4, 5, 6]  # one record per cell, in order, none lost
    # Cells 2-4 changed nothing: their records waited and went out with cell 5's, in one transaction; the
    # last one went out on its own after a short wait.
    assert revision[2] == revision[3] == revision[4] == revision[5] != revision[1]
    assert revision[6] > revision[5]
    assert r1.execute("print(x)").stdout == "2\n"
    # A held record under a stale fence is refused like any other, after its wait.
    assert r0.execute("pass", CellDirective(seq=7, fence=fence + 1000)).status == "ok"
    deadline = time.monotonic() + 10
    while "log record 7 was NOT written" not in r0.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "no longer the executor" in r0.log() and log_keys(replicas) == [1, 2, 3, 4, 5, 6]


def test_follower_applies_log_and_executor_can_swap(replicas: ReplicaFactory) -> None:
    r0 = replicas.start("r0")
    r1 = replicas.start("r1")
    fence = replicas.elect("r0")
    cells = [
        "import numpy as np\n"
        "a = b = []\n"
        "big = np.arange(300_000, dtype=np.float64)\n"  # 2.4 MB: out of band, through the object store
        "small = np.ones(10)\n"
        "class Point:\n"
        "    def __init__(self, x):\n"
        "        self.x = x\n"
        "    def norm(self):\n"
        "        return abs(self.x)\n"
        "p = Point(-3)\n"
        "def add(item):\n"
        "    a.append(item)\n",
        "b.append(1)\nadd(2)\nbig[0] = 42.0\nq, (r, s) = 1, (2, 3)\nfor i in range(3): pass\n"
        "total = sum(w for x in range(10) if (w := x) > 5)\n",
        "del small\np.x = 10\ncounter = {'n': 0}\ndef bump():\n    counter['n'] += 1\nbump(); bump()\n",
    ]
    for seq, code in enumerate(cells, start=p.FIRST_SEQ):
        cell = r0.execute(code, CellDirective(seq=seq, fence=fence))
        assert cell.status == "ok", cell.reply["content"]
    replicas.wait_applied("r1", 3)
    assert digest(r1) == digest(r0)
    check = "print(a is b, a, type(p) is Point, p.norm(), counter, big[0], 'small' in globals(), w)"
    assert r1.execute(check).stdout == "True [1, 2] True 10 {'n': 2} 42.0 False 9\n"

    # The executor changes: r1 (it has applied everything) runs seq 4, r0 follows.
    fence = replicas.elect("r1")
    cell = r1.execute("big *= 2\np2 = Point(5)\na.append(p2)\nbump()", CellDirective(seq=4, fence=fence))
    assert cell.status == "ok" and cell.meta["replica"] == "r1"
    replicas.wait_applied("r0", 4)
    replicas.wait_applied("r1", 4)
    assert digest(r0) == digest(r1)
    out = r0.execute("print(a[-1] is p2, type(p2) is Point, b[-1].norm(), counter['n'], big[0])").stdout
    assert out == "True True 5 3 84.0\n"


def test_new_replica_restores_from_checkpoint_and_log(replicas: ReplicaFactory) -> None:
    every = {p.ENV_CHECKPOINT_EVERY: "2"}
    r0 = replicas.start("r0", every)
    fence = replicas.elect("r0")
    codes = [
        "import numpy as np\nm = np.full((512, 512), 3.0)\nlog = []",
        "log.append(float(m.sum()))",
        "m[0, 0] = -1\nlog.append('x')",
        "def f(v):\n    return v + len(log)",
        "log.append(f(1))",
    ]
    for seq, code in enumerate(codes, start=p.FIRST_SEQ):
        assert r0.execute(code, CellDirective(seq=seq, fence=fence)).status == "ok"
    replicas.wait_applied("r0", 5)
    key = replicas.keys.checkpoint(replicas.kernel_id)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        kv = replicas.etcd.get(key)
        if kv is not None and p.CheckpointPointer.from_json(kv.value).seq >= 4:
            break
        time.sleep(0.05)
    time.sleep(0.2)  # a checkpoint at 5 may follow one at 3
    pointer = p.CheckpointPointer.from_json(replicas.etcd.get(key).value)
    assert pointer.seq in (4, 5) and pointer.replica_id == "r0"
    # Records every registered replica had reported applied are deleted with the checkpoint; later ones stay.
    # (r0's applied key is put in the background, so it may have read one or two records behind.)
    kept = log_keys(replicas)
    first_kept = kept[0] if kept else 6
    assert kept == list(range(first_kept, 6)) and p.FIRST_SEQ < first_kept <= pointer.seq + 1, (kept, pointer.seq)

    r2 = replicas.start("r2", every)
    assert r2.registration is not None and r2.registration.applied_seq == 5
    assert digest(r2) == digest(r0)
    assert r2.execute("print(log, m[0, 0], f(0))").stdout == "[786432.0, 'x', 3] -1.0 3\n"


def test_a_checkpoint_put_off_for_a_follower_behind_follows_when_it_catches_up(replicas: ReplicaFactory) -> None:
    """The executor looks again at a put-off checkpoint although no further cell comes."""
    every = {p.ENV_CHECKPOINT_EVERY: "2"}
    r0 = replicas.start("r0", every)
    r1 = replicas.start("r1", every)
    fence = replicas.elect("r0")
    os.kill(r1.proc.pid, signal.SIGSTOP)  # behind while the executor reaches its checkpoint
    try:
        for seq in (1, 2):
            assert r0.execute(f"v = {seq}", CellDirective(seq=seq, fence=fence)).status == "ok"
        replicas.wait_applied("r0", 2)
        time.sleep(0.5)
        assert replicas.etcd.get(replicas.keys.checkpoint(replicas.kernel_id)) is None, "r1 had not applied seq 1"
    finally:
        os.kill(r1.proc.pid, signal.SIGCONT)
    replicas.wait_applied("r1", 2)
    wait_for(lambda: replicas.etcd.get(replicas.keys.checkpoint(replicas.kernel_id)), 10, "the put-off checkpoint")
    assert log_keys(replicas) == []


def test_a_request_stops_a_checkpoint_being_pickled_and_the_checkpoint_follows_later(replicas: ReplicaFactory) -> None:
    """Pickling a namespace of many small objects for a checkpoint takes long (here about a second); the next
    request stops it rather than wait for it, and the checkpoint is written once the kernel is idle."""
    every = {p.ENV_CHECKPOINT_EVERY: "2"}
    r0 = replicas.start("r0", every)
    fence = replicas.elect("r0")
    make = "objs = [{'a': i, 'b': str(i)} for i in range(1_000_000)]"
    assert r0.execute(make, CellDirective(seq=1, fence=fence), timeout=60).status == "ok"
    # Record 2 makes the checkpoint due: its pickling starts right after the record is published.
    assert r0.execute("x = 1", CellDirective(seq=2, fence=fence)).status == "ok"
    time.sleep(0.3)
    assert r0.execute("y = 2", CellDirective(seq=3, fence=fence)).status == "ok"
    wait_for(
        lambda: "put off: a request came while the namespace was pickled" in r0.log(), 10, "the put-off checkpoint"
    )
    key = replicas.keys.checkpoint(replicas.kernel_id)
    wait_for(lambda: replicas.etcd.get(key), 20, "the checkpoint, once the kernel idles")
    assert p.CheckpointPointer.from_json(replicas.etcd.get(key).value).seq == 3
    r1 = replicas.start("r1", every)
    out = r1.execute("print(len(objs), objs[-1], x, y)").stdout
    assert out == "1000000 {'a': 999999, 'b': '999999'} 1 2\n"


def _checkpoint_at(replicas: ReplicaFactory, seq: int) -> p.CheckpointPointer:
    key = replicas.keys.checkpoint(replicas.kernel_id)

    def committed() -> p.CheckpointPointer | None:
        kv = replicas.etcd.get(key)
        pointer = p.CheckpointPointer.from_json(kv.value) if kv is not None else None
        return pointer if pointer is not None and pointer.seq == seq else None

    return wait_for(committed, 30, f"the checkpoint at seq {seq}")


def test_a_checkpoint_pickles_again_only_the_names_records_changed_since_the_last_one(replicas: ReplicaFactory) -> None:
    """A checkpoint names again the parts of the kernel's checkpoint whose names no record changed since: the
    300,000 dicts here are pickled for the first checkpoint and again only once a cell changed them."""
    every = {p.ENV_CHECKPOINT_EVERY: "2"}
    r0 = replicas.start("r0", every)
    fence = replicas.elect("r0")

    def run(seq: int, code: str) -> None:
        assert r0.execute(code, CellDirective(seq=seq, fence=fence), timeout=60).status == "ok"

    run(1, "objs = [{'a': i} for i in range(300_000)]\nalias = objs\nn = 0")
    run(2, "n += 1")
    first = _checkpoint_at(replicas, 2)
    run(3, "n += 1")
    run(4, "m = n * 2")
    second = _checkpoint_at(replicas, 4)
    # objs and alias share their list, so they are one part, named again; n and m (small) share the other part.
    assert len(set(first.objects) & set(second.objects)) == 1
    assert "2 parts, 1 of them named again from checkpoint 2" in r0.log()
    run(5, "objs.append({'a': -1})")
    run(6, "n += 1")
    third = _checkpoint_at(replicas, 6)
    assert not set(third.objects) & set(second.objects)
    assert "2 parts, 0 of them named again from checkpoint 4" in r0.log()

    r1 = replicas.start("r1", every)  # restores from the checkpoint at 6: its parts, then nothing from the log
    assert r1.registration is not None and r1.registration.applied_seq == 6
    out = r1.execute("print(len(objs), objs[-1], alias is objs, n, m)").stdout
    assert out == "300001 {'a': -1} True 3 4\n"


def test_a_new_executor_names_again_the_parts_of_the_checkpoint_another_replica_wrote(
    replicas: ReplicaFactory,
) -> None:
    """A replica that becomes the executor learns the parts of the kernel's checkpoint from the checkpoint object,
    and its first checkpoint pickles only the names that records changed since, as the writer's next one would."""
    every = {p.ENV_CHECKPOINT_EVERY: "2"}
    r0 = replicas.start("r0", every)
    r1 = replicas.start("r1", every)
    fence = replicas.elect("r0")
    make = "objs = [{'a': i} for i in range(300_000)]\nalias = objs\nn = 0"
    assert r0.execute(make, CellDirective(seq=1, fence=fence), timeout=60).status == "ok"
    assert r0.execute("n += 1", CellDirective(seq=2, fence=fence)).status == "ok"
    first = _checkpoint_at(replicas, 2)
    fence = replicas.elect("r1")
    replicas.wait_applied("r1", 2)
    for seq in (3, 4):
        assert r1.execute("n += 1", CellDirective(seq=seq, fence=fence)).status == "ok"
    second = _checkpoint_at(replicas, 4)
    # (it logs that after it wrote the checkpoint's pointer, which is what _checkpoint_at waits for)
    wait_for(lambda: "2 parts, 1 of them named again from checkpoint 2" in r1.log(), 10, "the checkpoint's log line")
    assert len(set(first.objects) & set(second.objects)) == 1  # the part of objs and alias
    r2 = replicas.start("r2", every)
    assert r2.execute("print(len(objs), alias is objs, n)").stdout == "300000 True 3\n"


def test_a_new_executor_does_not_send_again_the_arrays_records_patched_on_it(replicas: ReplicaFactory) -> None:
    """A follower patches a tracked array in place when it applies a record that changed some of it; once it
    becomes the executor, its first cell must not count those writes as its own (it sent the array's chunk list,
    and the array's checkpoint part could not be named again), nor fingerprint the whole namespace."""
    r0 = replicas.start("r0")
    r1 = replicas.start("r1")
    fence = replicas.elect("r0")
    make = "import numpy as np\nw = np.random.default_rng(0).random(2**20)"
    assert r0.execute(make, CellDirective(seq=1, fence=fence)).status == "ok"
    assert r0.execute("w[:1000] = 0.0", CellDirective(seq=2, fence=fence)).status == "ok"
    replicas.wait_applied("r1", 2)
    fence = replicas.elect("r1")
    assert r1.execute("n = 1", CellDirective(seq=3, fence=fence)).status == "ok"
    record = replicas.wait_record(3)
    assert (record.names, record.objects) == (["n"], [])
    assert r1.execute("w[5] = 7.0", CellDirective(seq=4, fence=fence)).status == "ok"
    assert replicas.wait_record(4).names == ["w"]  # (a write of its own still counts)
    replicas.wait_applied("r0", 4)
    assert r0.execute("print(w[:2], w[5], n)").stdout == "[0. 0.] 7.0 1\n"
    assert "no baseline yet" not in r1.log()  # it took its baseline while it followed

    # A replica that restores takes its baseline once idle, not in the first cell it runs.
    r2 = replicas.start("r2")
    wait_for(lambda: "baseline of the namespace taken" in r2.log(), 10, "r2's baseline")
    fence = replicas.elect("r2")
    assert r2.execute("n += 1", CellDirective(seq=5, fence=fence)).status == "ok"
    assert replicas.wait_record(5).names == ["n"]
    assert "no baseline yet" not in r2.log()


def test_a_checkpoint_names_no_part_of_a_checkpoint_another_replica_superseded(replicas: ReplicaFactory) -> None:
    """Only the parts of the kernel's checkpoint in force are named again: a replica that wrote an earlier one,
    and became the executor again after another replica checkpointed, names none of the parts it remembers (the
    store may already have collected them), only those of the checkpoint in force that no record changed since."""
    every = {p.ENV_CHECKPOINT_EVERY: "2"}
    r0 = replicas.start("r0", every)
    r1 = replicas.start("r1", every)
    fence = replicas.elect("r0")
    assert r0.execute("big = list(range(100_000))\nn = 0", CellDirective(seq=1, fence=fence)).status == "ok"
    assert r0.execute("n += 1", CellDirective(seq=2, fence=fence)).status == "ok"
    first = _checkpoint_at(replicas, 2)
    fence = replicas.elect("r1")
    replicas.wait_applied("r1", 2)
    assert r1.execute("big.append(-1)", CellDirective(seq=3, fence=fence)).status == "ok"
    assert r1.execute("n += 1", CellDirective(seq=4, fence=fence)).status == "ok"
    second = _checkpoint_at(replicas, 4)
    assert "2 parts, 0 of them named again from checkpoint 2" in r1.log()
    fence = replicas.elect("r0")
    replicas.wait_applied("r0", 4)
    for seq in (5, 6):
        assert r0.execute("n += 1", CellDirective(seq=seq, fence=fence)).status == "ok"
    third = _checkpoint_at(replicas, 6)
    assert "2 parts, 1 of them named again from checkpoint 4" in r0.log()
    assert not set(third.objects) & set(first.objects)
    assert len(set(third.objects) & set(second.objects)) == 1  # r1's part of big
    r2 = replicas.start("r2", every)
    assert r2.execute("print(len(big), big[-1], n)").stdout == "100001 -1 4\n"


def test_a_cell_holding_the_gil_past_the_lease_ttl_keeps_its_replica_registered(replicas: ReplicaFactory) -> None:
    """A C call that never releases the GIL (here libc's sleep through ctypes.PyDLL) stops the replica's own
    lease renewals; its lease keeper process renews the lease meanwhile, so the replica is not taken for dead."""
    r0 = replicas.start("r0")
    r1 = replicas.start("r1")
    fence = replicas.elect("r0")
    key = replicas.keys.replica(replicas.kernel_id, "r0")
    holds = 3 * 2  # three lease TTLs (the harness's replicas take 2 s leases)
    code = f"import ctypes\nctypes.PyDLL(None).sleep({holds})\nx = 'after the GIL came back'"
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(r0.execute, code, CellDirective(seq=1, fence=fence), holds + 30)
        while not running.done():  # the registration stays, bound to the lease, all along
            assert replicas.etcd.get(key) is not None, "r0's lease ended while its cell held the GIL"
            time.sleep(0.2)
        cell = running.result()
    assert cell.status == "ok", cell.reply["content"]
    replicas.wait_applied("r1", 1)
    assert r1.execute("print(x)").stdout == "after the GIL came back\n"
    assert replicas.etcd.get(key) is not None
    assert "etcd lease" not in r0.log(), r0.log()


def _start_directed(replica: Replica, code: str, directive: CellDirective) -> Any:
    """Send a directed cell to ``replica`` without waiting for it; returns the client it was sent with."""
    client = replica.connect()
    msg = client.session.msg(
        "execute_request", {"code": code, "silent": False}, metadata={p.METADATA_KEY: directive.to_dict()}
    )
    client.shell_channel.send(msg)
    return client


def test_an_interrupted_cell_leaves_the_lease_keeper_running(replicas: ReplicaFactory) -> None:
    """ipykernel interrupts a cell by signalling the replica's whole process group: the lease keeper is not in it,
    so a later cell that holds the GIL past the lease's TTL still keeps its replica registered."""
    r0 = replicas.start("r0")
    fence = replicas.elect("r0")
    client = _start_directed(r0, "import time\ntime.sleep(30)", CellDirective(seq=1, fence=fence))

    def keepers() -> list[psutil.Process]:
        found = []
        for child in psutil.Process(r0.proc.pid).children():
            with contextlib.suppress(psutil.ZombieProcess):
                if "jupyter_notebookos.kernel.keepalive" in " ".join(child.cmdline()):
                    found.append(child)
        return found

    keeper = wait_for(keepers, 10, "the lease keeper to start")[0]
    client.control_channel.send(client.session.msg("interrupt_request", {}))
    reply = client.get_shell_msg(timeout=10)
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    time.sleep(0.5)
    assert keeper.is_running() and keepers() == [keeper], "the interrupt stopped the lease keeper"
    key = replicas.keys.replica(replicas.kernel_id, "r0")
    holds = 3 * 2  # three lease TTLs (the harness's replicas take 2 s leases)
    with ThreadPoolExecutor(1) as pool:
        code = f"import ctypes\nctypes.PyDLL(None).sleep({holds})"
        running = pool.submit(r0.execute, code, CellDirective(seq=2, fence=fence), holds + 30)
        while not running.done():
            assert replicas.etcd.get(key) is not None, "r0's lease ended while its cell held the GIL"
            time.sleep(0.2)
        assert running.result().status == "ok"
    # A keeper that died anyway (killed) is started again by the replica's next cell (once it is reaped: a
    # process whose threads still exit shows as a zombie before the replica can reap it).
    keeper.kill()
    again: list[psutil.Process] = []
    for seq in range(3, 13):
        assert r0.execute("pass", CellDirective(seq=seq, fence=fence)).status == "ok"
        again = [k for k in keepers() if k != keeper]
        if again:
            break
        time.sleep(0.2)
    assert again, "no lease keeper was started again"


def test_unpicklable_variable_warns_once_and_cell_succeeds(replicas: ReplicaFactory) -> None:
    r0 = replicas.start("r0")
    r1 = replicas.start("r1")
    fence = replicas.elect("r0")
    cell = r0.execute("import threading\nlock = threading.Lock()\nkept = [1, 2]\nprint('ran')", CellDirective(1, fence))
    assert cell.status == "ok" and cell.stdout == "ran\n"
    assert cell.stderr.count("NotebookOS:") == 1, cell.stderr
    assert "lock" in cell.stderr and "will not survive a failover or migration" in cell.stderr
    assert "kept" not in cell.stderr.split("(")[0]
    assert cell.meta["unserializable"] == ["lock"]
    assert replicas.wait_record(1).unserializable == ["lock"]
    replicas.wait_applied("r1", 1)
    out = r1.execute("print(kept)\ntry:\n    lock.acquire()\nexcept Exception as e:\n    print(type(e).__name__, e)")
    assert out.stdout.startswith("[1, 2]\nUnreplicatedValueError variable 'lock' was not replicated")


def _second_pickling_differs(cls: str, then: str, *, and_later: bool = False) -> str:
    """Notebook code: class ``cls``, whose instances run ``then`` when pickled a second time (``and_later``: every
    time after the first), and ``picklings``. The capture's fingerprint before the reply pickles a new value first,
    the record after it second."""
    return (
        "picklings = []\n"
        f"class {cls}:\n"
        "    def __reduce__(self):\n"
        "        picklings.append(1)\n"
        f"        if len(picklings) {'>=' if and_later else '=='} 2:\n"
        f"            {then}\n"
        f"        return ({cls}, ())\n"
    )


def test_a_value_that_fingerprinted_but_then_did_not_pickle_is_named_by_the_record_and_the_next_cell(
    replicas: ReplicaFactory,
) -> None:
    """The record's pickling runs after the reply; the capture before it pickled each value alone, which is what
    the cell's warning and its reply's metadata come from. A value that pickled then but not for the record (here:
    only its first pickling works) is named in the record as not replicated, the executor keeps it, and the
    executor's next cell says so."""
    r0 = replicas.start("r0")
    r1 = replicas.start("r1")
    fence = replicas.elect("r0")
    code = (
        _second_pickling_differs("Flaky", "raise RuntimeError('pickled once only')", and_later=True)
        + "flaky = Flaky()\nkept = [1, 2]"
    )
    cell = r0.execute(code, CellDirective(1, fence))
    assert cell.status == "ok" and "NotebookOS" not in cell.stderr, cell.stderr
    assert "unserializable" not in cell.meta and "flaky" in cell.meta["changed"]
    assert replicas.wait_record(1).unserializable == ["flaky"]
    replicas.wait_applied("r1", 1)
    after = r0.execute("print(kept)", CellDirective(2, fence))
    assert after.stdout == "[1, 2]\n"
    assert "could not be shared with the other replicas (they could not be serialized: flaky:" in after.stderr
    assert "pickled once only" in after.stderr and "This replica keeps them" in after.stderr
    replicas.wait_applied("r1", 2)
    out = r1.execute("print(kept)\ntry:\n    flaky.attribute\nexcept Exception as e:\n    print(type(e).__name__)")
    assert out.stdout == "[1, 2]\nUnreplicatedValueError\n", out.stdout


def test_an_interrupt_while_the_record_is_pickled_after_the_reply_loses_nothing(replicas: ReplicaFactory) -> None:
    """The record is pickled after the reply, on the kernel's loop between requests; a SIGINT then (the user pressed
    stop just as the cell finished) has nothing to interrupt. It must neither end the pickling half-way, leaving
    the next cell to wait for an upload that never starts, nor lose the record. (ipykernel ignores SIGINT between
    requests; the next request's own wait for the pickling runs with it noted, not raised. Here the record's
    pickling takes 1.5 s: the capture's pickling of the value, before the reply, is quick.)"""
    r0 = replicas.start("r0")
    r1 = replicas.start("r1")
    fence = replicas.elect("r0")
    code = "import time\n" + _second_pickling_differs("Slow", "time.sleep(1.5)") + "slow = Slow()\nkept = 'here'"
    assert r0.execute(code, CellDirective(1, fence)).status == "ok"
    time.sleep(0.5)  # the publication's delay is over: the record is being pickled
    os.kill(r0.proc.pid, signal.SIGINT)
    after = r0.execute("print(kept, len(picklings))", CellDirective(2, fence), timeout=15)
    assert after.status == "ok" and after.stdout == "here 2\n", (after.reply["content"], after.stderr)
    assert replicas.wait_record(1).names == ["Slow", "kept", "picklings", "slow", "time"]
    replicas.wait_applied("r1", 2)
    assert r1.execute("print(kept, type(slow).__name__)").stdout == "here Slow\n"


def test_a_change_no_cell_reaches_is_found_while_the_kernel_idles_and_goes_out_with_the_next_cell(
    replicas: ReplicaFactory,
) -> None:
    """A capture fingerprints only the names the cell can reach. What changed elsewhere (here a timer thread that
    holds the list through a bound method, which no name's code mentions) is found by the verification the
    replica runs while it idles, and the next cell's record carries it."""
    r0 = replicas.start("r0")
    r1 = replicas.start("r1")
    fence = replicas.elect("r0")
    cell = r0.execute(
        "import threading\nlate = []\nthreading.Timer(0.3, late.append, ['written while idle']).start()",
        CellDirective(1, fence),
    )
    assert cell.status == "ok", cell.reply["content"]
    _found_then_sent_by_the_next_cell(replicas, r0, r1, fence, "late", "['written while idle']")


def test_what_a_comm_callback_changes_goes_out_with_the_next_cell(replicas: ReplicaFactory) -> None:
    """A widget's callback runs between cells and may change any value: the replica verifies the namespace after
    a comm message, so the next cell's record carries the change although that cell does not mention it."""
    r0 = replicas.start("r0")
    r1 = replicas.start("r1")
    fence = replicas.elect("r0")
    setup = (
        "seen = []\n"
        "def _on_open(comm, msg):\n    seen.append(msg['content']['data']['v'])\n"
        "get_ipython().kernel.comm_manager.register_target('probe', _on_open)"
    )
    assert r0.execute(setup, CellDirective(1, fence)).status == "ok"
    time.sleep(2.0)  # the verification after the cell has run: the next one follows the comm message
    client = r0.client
    assert client is not None
    opened = client.session.msg("comm_open", {"comm_id": "c1", "target_name": "probe", "data": {"v": 42}})
    client.shell_channel.send(opened)
    _found_then_sent_by_the_next_cell(replicas, r0, r1, fence, "seen", "[42]")


def _found_then_sent_by_the_next_cell(
    replicas: ReplicaFactory, r0: Replica, r1: Replica, fence: int, name: str, printed: str
) -> None:
    """r0's verification finds ``name`` changed; its next cell (record 2, which does not mention it) sends it to r1."""
    wait_for(lambda: f"verification: {name} changed" in r0.log(), 15, f"the verification finding {name}")
    cell = r0.execute("x = 1", CellDirective(2, fence))
    assert cell.status == "ok" and cell.meta["changed"] == sorted([name, "x"]), cell.meta
    replicas.wait_applied("r1", 2)
    assert r1.execute(f"print({name})").stdout == printed + "\n"


def test_interrupt_reaches_user_code_and_the_cell_still_publishes(replicas: ReplicaFactory) -> None:
    r0 = replicas.start("r0")
    fence = replicas.elect("r0")
    client = _start_directed(r0, "import time\nstarted = 1\ntime.sleep(30)", CellDirective(seq=1, fence=fence))
    time.sleep(0.5)
    interrupt = client.session.msg("interrupt_request", {})
    client.control_channel.send(interrupt)
    reply = client.get_shell_msg(timeout=10)
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    assert replicas.wait_record(1).names == ["started", "time"]


def test_a_request_sent_on_seeing_a_failed_cells_reply_runs(replicas: ReplicaFactory) -> None:
    """ipykernel aborts the requests queued behind a failed cell in ``_abort_queues``, which sends the reply and
    then takes in what arrived. A request sent by a client that had seen the reply could arrive in between and be
    aborted too (CI: the cell after an interrupt was answered "aborted", when the replica's main thread lost the CPU
    right after the send). Here a profile hook holds the main thread up at that point for a second."""
    r0 = replicas.start("r0")
    fence = replicas.elect("r0")
    failing = (
        "import sys, time\n"
        "def _hold(frame, event, arg):\n"
        "    if event != 'return' or frame.f_code.co_name != '_handle_send':\n"
        "        return\n"
        "    flush = frame.f_back\n"
        "    if flush is not None and flush.f_back is not None and flush.f_back.f_code.co_name == '_abort_queues':\n"
        "        time.sleep(1.0)\n"
        "sys.setprofile(_hold)\n"
        "raise ValueError('stop here')"
    )
    client = _start_directed(r0, failing, CellDirective(seq=1, fence=fence))
    reply = client.get_shell_msg(timeout=20)
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "ValueError", reply["content"]
    cell = r0.execute("sys.setprofile(None)\nx = 1", CellDirective(seq=2, fence=fence))
    assert cell.status == "ok", cell.reply["content"]


def test_an_interrupt_while_the_cell_waits_to_run_answers_it_and_the_replica_lives(replicas: ReplicaFactory) -> None:
    """A cell can wait before its code runs (the last cell's upload, records to apply first: seconds with GBs). An
    interrupt then used to raise in the replica's event loop and end the replica; now the cell is answered as
    interrupted at once, nothing runs, its (empty) record is published after the record it waited for, and the
    replica serves the next cell."""
    r0 = replicas.start("r0")
    fence = replicas.elect("r0")
    # Record 1 is not in the log yet: the cell (record 2) waits for it.
    client = _start_directed(r0, "ran = True", CellDirective(seq=2, fence=fence))
    time.sleep(1.0)
    client.control_channel.send(client.session.msg("interrupt_request", {}))
    reply = client.get_shell_msg(timeout=10)  # while the cell still waits (CATCH_UP_TIMEOUT is far longer)
    assert reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]
    assert "nothing ran" in reply["content"]["evalue"]
    assert reply["metadata"].get(p.METADATA_KEY, {}).get("seq") == 2, (reply["metadata"], reply["content"])
    time.sleep(0.5)
    assert log_keys(replicas) == [], "record 2 went out before record 1"
    lost = p.LogRecord(seq=1, kind="lost", msg_id="", replica_id="r9")
    replicas.etcd.run(replicas.etcd.co.put(replicas.keys.log_record(replicas.kernel_id, 1), lost.to_json()))
    record = replicas.wait_record(2)
    assert record.names == [] and record.replica_id == "r0"
    assert r0.proc.poll() is None, r0.log()
    cell = r0.execute("print('ran' in dir())", CellDirective(seq=3, fence=fence))
    assert cell.status == "ok" and cell.stdout == "False\n"


def test_shutdown_revokes_lease_and_exits(replicas: ReplicaFactory) -> None:
    r0 = replicas.start("r0")
    client = r0.connect()
    client.shutdown()
    assert r0.proc.wait(timeout=10) == 0
    assert replicas.etcd.get(replicas.keys.replica(replicas.kernel_id, "r0")) is None
    assert replicas.etcd.get(replicas.keys.applied(replicas.kernel_id, "r0")) is None


def test_etcd_unreachable_at_start_exits_with_one_line(replicas: ReplicaFactory) -> None:
    env = replicas.env("r0", {p.ENV_ETCD_ENDPOINTS: "127.0.0.1:9", p.ENV_ETCD_START_WITHIN: "0"})
    proc = subprocess.run(
        [sys.executable, "-m", "jupyter_notebookos.kernel"],
        env=env,
        capture_output=True,
        timeout=30,
        cwd=REPO,
    )
    assert proc.returncode == 3
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("notebookos replica cannot start: Cannot reach etcd at 127.0.0.1:9")


def test_a_replica_started_while_etcd_is_down_comes_up_when_etcd_is_back(tmp_path: Path) -> None:
    """A replica starting during an etcd outage (an election, a restart, a host whose network is settling)
    keeps trying for ``NOTEBOOKOS_ETCD_START_WITHIN`` seconds instead of failing its kernel's start."""
    cluster = EtcdCluster(tmp_path / "etcd", members=1).start()
    factory = ReplicaFactory(cluster.endpoints, tmp_path)
    try:
        cluster.kill_member(0)
        r0 = factory.spawn("r0", {p.ENV_ETCD_START_WITHIN: "30"})
        time.sleep(4)  # more than one attempt (3 s each)
        assert r0.proc.poll() is None, f"the replica gave up while etcd was down:\n{r0.log()}"
        cluster.start_member(0)
        r0.registration = factory.wait_registered(r0, 30)
        assert "etcd not reachable yet" in r0.log()
        assert r0.execute("print(6 * 7)").stdout == "42\n"
    finally:
        factory.close()
        cluster.stop()


def test_replica_outlives_etcd_going_away_and_registers_again_when_its_lease_is_gone(tmp_path: Path) -> None:
    cluster = EtcdCluster(tmp_path / "etcd", members=1).start()
    factory = ReplicaFactory(cluster.endpoints, tmp_path)
    try:
        r0 = factory.start("r0")
        key = factory.keys.replica(factory.kernel_id, "r0")
        assert r0.execute("x = 41").status == "ok"
        cluster.kill_member(0)
        time.sleep(5)  # more than twice the tests' 2 s lease TTL
        assert r0.proc.poll() is None, f"the replica ended during the outage:\n{r0.log()}"
        assert "keeps its state and serves again when etcd is back" in r0.log()
        cluster.start_member(0)
        # A restarted etcd extends every lease: the replica goes on as it was.
        assert wait_for(lambda: factory.etcd.get(key), 15, "the registration after the restart")

        # etcd says the lease is gone (here: revoked; after a long outage: expired): it registers again.
        factory.etcd.run(factory.etcd.co.revoke(r0.registration.lease))
        again = wait_for(
            lambda: (kv := factory.etcd.get(key)) and p.ReplicaRegistration.from_json(kv.value), 15, "re-registration"
        )
        assert again.lease != r0.registration.lease and again.pid == r0.registration.pid
        assert factory.applied("r0") is not None
        assert r0.execute("print(x + 1)").stdout == "42\n", "the same process, with its memory, serves again"
        assert r0.proc.poll() is None
    finally:
        factory.close()
        cluster.stop()


def test_a_record_held_up_by_an_ended_lease_goes_out_in_the_term_the_router_opens_again_for_it(
    replicas: ReplicaFactory,
) -> None:
    """etcd ends the executor's lease (and so its term) while a cell runs; the same process registers again and
    the router opens the next term for it before the cell's record went out (the client sends the next cell as
    soon as it has the reply). That record is the replica's own and still the log's next one: it goes out in the
    new term. It used to be refused ("no longer the executor"), and the replica reloaded its state without it."""
    r0 = replicas.start("r0")
    executor, registration = replicas.keys.executor(replicas.kernel_id), replicas.keys.replica(replicas.kernel_id, "r0")

    def open_term(lease: int) -> int:  # as the router does: a fresh executor key, bound to the replica's lease
        replicas.etcd.run(replicas.etcd.co.delete(executor))
        return replicas.etcd.run(replicas.etcd.co.put(executor, "r0", lease=lease))

    first = open_term(r0.registration.lease)
    assert r0.execute("x = 1", CellDirective(seq=1, fence=first)).status == "ok"
    replicas.wait_applied("r0", 1)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(r0.execute, "import time\ntime.sleep(3)\nx = 2", CellDirective(seq=2, fence=first))
        time.sleep(0.5)
        replicas.etcd.run(replicas.etcd.co.revoke(r0.registration.lease))  # as etcd does after a long outage
        again = wait_for(
            lambda: (kv := replicas.etcd.get(registration)) and p.ReplicaRegistration.from_json(kv.value),
            10,
            "the replica to register again",
        )
        assert again.pid == r0.registration.pid and again.lease != r0.registration.lease
        second = open_term(again.lease)  # the next cell's decision, committed while the cell still runs
        assert running.result(30).status == "ok"
    after = r0.execute("y = x + 1\nprint(y)", CellDirective(seq=3, fence=second))
    assert after.status == "ok" and after.stdout == "3\n"
    assert "x" in replicas.wait_record(2).names and "y" in replicas.wait_record(3).names
    assert "NOT written" not in r0.log()
    assert r0.execute("print(x, y)").stdout == "2 3\n", "the replica kept the cell's state"
    # Only a term opened for this very process counts: one bound to another lease still refuses the record.
    other = replicas.etcd.run(replicas.etcd.co.grant_lease(30))
    open_term(other.id)
    assert r0.execute("z = 1", CellDirective(seq=4, fence=second)).status == "ok"
    wait_for(lambda: "log record 4 was NOT written" in r0.log(), 10, "the refusal of record 4")
    assert log_keys(replicas) == [1, 2, 3]


@pytest.mark.parametrize("raw", ["", "[]"])
def test_no_gpus_configured(raw: str) -> None:
    from jupyter_notebookos.gpu.binding import HostGpu

    assert HostGpu.parse_env(raw) == []


def test_gpu_binding_bookkeeping(monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_notebookos.gpu import binding

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    devices = binding.HostGpu.parse_env(
        json.dumps([{"index": i, "uuid": f"u{i}", "simulated": True} for i in range(4)])
    )
    gpus = binding.GpuBinding(devices)
    assert binding.current_devices() == [] and binding.os.environ["CUDA_VISIBLE_DEVICES"] == ""
    assert gpus.bind([2, 3]).devices == [2, 3]
    assert binding.current_devices() == [2, 3] and binding.os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
    gpus.release({})
    assert binding.current_devices() == [] and binding.os.environ["CUDA_VISIBLE_DEVICES"] == ""
    with pytest.raises(ValueError, match=r"GPU\(s\) \[7\] were committed"):
        gpus.bind([7])


def test_sticky_gpu_state_stays_until_an_evict_request_on_the_control_channel(replicas: ReplicaFactory) -> None:
    r0 = replicas.start("r0", {p.ENV_GPU_STICKY: "1"})
    fence = replicas.elect("r0")
    cell = r0.execute("x = 1", CellDirective(seq=p.FIRST_SEQ, fence=fence, gpus=[1]))
    assert cell.status == "ok" and cell.meta["gpus"] == [1]
    # Released after the reply, but the (simulated) device still holds the kernel's GPU state.
    assert r0.execute("print(get_ipython().kernel.gpus.resident)").stdout == "[1]\n"
    client = r0.client
    assert client is not None
    msg = client.session.msg("notebookos_evict_request", {})
    client.control_channel.send(msg)
    reply = client.get_control_msg(timeout=10)
    assert reply["msg_type"] == "notebookos_evict_reply" and reply["parent_header"]["msg_id"] == msg["header"]["msg_id"]
    assert reply["content"]["status"] == "ok" and reply["content"]["devices"] == [1]
    assert r0.execute("print(get_ipython().kernel.gpus.resident)").stdout == "[]\n"


def test_overlapping_quick_gil_handoffs_put_the_switch_interval_back() -> None:
    """A checkpoint and a verification each hand the GIL over quickly while they pickle; when they overlap and end
    in either order, the process's switch interval is what it was before either began."""
    from jupyter_notebookos.kernel.loop import quick_gil_handoff

    before = sys.getswitchinterval()
    try:
        for order in ((0, 1), (1, 0)):
            handoffs = [quick_gil_handoff(), quick_gil_handoff()]
            for handoff in handoffs:
                handoff.__enter__()
                assert sys.getswitchinterval() == min(before, 0.0005)
            for i in order:
                handoffs[i].__exit__(None, None, None)
            assert sys.getswitchinterval() == before, order
    finally:
        sys.setswitchinterval(before)
