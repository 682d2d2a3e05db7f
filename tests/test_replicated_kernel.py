"""NotebookOS kernels end to end: the real gateway, real etcd, real replica processes, through EG's API."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import websocket
from support import (
    REPO,
    Platform,
    etcd_admin,
    hold_uploads_until,
    jupyter_server,
    kernel_of,
    kill_the_gateway,
    processes_of,
    run_on_replica,
    start_platform,
    stop_platform,
    wait_for,
)

from jupyter_notebookos.client import GatewayClient, GatewayError, KernelConnection
from jupyter_notebookos.replication.writetrack import METHOD

KERNEL = "python3-notebookos"


def ready_replicas(client: GatewayClient, kernel_id: str) -> list[dict]:
    return [r for r in client.notebookos_kernel(kernel_id)["replicas"] if r["state"] == "ready"]


@pytest.fixture
def kernel(shared_up: Platform) -> Iterator[tuple[GatewayClient, str]]:
    with kernel_of(shared_up.client, KERNEL) as started:
        yield started


def test_three_replicas_on_distinct_hosts_and_every_output_exactly_once(kernel: tuple[GatewayClient, str]) -> None:
    client, kernel_id = kernel
    info = client.notebookos_kernel(kernel_id)
    hosts = [r["host"] for r in info["replicas"]]
    assert len(hosts) == 3 and len(set(hosts)) == 3
    assert all(r["state"] == "ready" and r["pid"] for r in info["replicas"])
    # Each replica says how it finds in-place changes (kernel write tracking, or checksums where unavailable).
    methods = [r["change_detection"] for r in info["replicas"]]
    assert all(m == METHOD or m.startswith("checksum") for m in methods), methods

    with client.connect(kernel_id) as conn:
        result = conn.execute(
            "from IPython.display import display, HTML\n"
            "print('out'); import sys; print('err', file=sys.stderr)\n"
            "display(HTML('<b>bold</b>'))\n"
            "6 * 7"
        )
        assert result.status == "ok"
        kinds = [o["msg_type"] for o in result.outputs]
        assert kinds.count("display_data") == 1 and kinds.count("execute_result") == 1
        assert result.stdout == "out\n" and result.stderr == "err\n"
        assert result.result_text() == "42"
        meta = result.notebookos
        assert set(meta) >= {"replica", "host", "gpus", "queued_ms", "attempt"}
        assert meta["host"] in hosts and len(meta["gpus"]) == 1 and meta["attempt"] == 1
        assert 0 <= meta["queued_ms"] < 5000

        error = conn.execute("1/0")
        assert error.status == "error" and error.reply["content"]["ename"] == "ZeroDivisionError"
        assert [o["msg_type"] for o in error.outputs] == ["error"]

        answered = conn.execute("name = input('who? ')\nprint('hi', name)", stdin=["ada"])
        assert answered.stdout == "hi ada\n"

    cluster = client.request("GET", "/api/notebookos/cluster")
    assert sum(h["replicas"] for h in cluster["hosts"]) >= 3
    assert any(k["kernel_id"] == kernel_id for k in cluster["kernels"])


def test_two_clients_see_the_output_of_each_others_cells(kernel: tuple[GatewayClient, str]) -> None:
    client, kernel_id = kernel
    with client.connect(kernel_id) as first, client.connect(kernel_id) as second:
        # The second connection's own cell first: its messages come in-process from the start, even when the first
        # one's nudge made the kernel busy and its open did not nudge it (whose iopub subscription could still be
        # joining: ZMQ drops what a PUB socket sends before then).
        assert second.execute("print('ready')").stdout == "ready\n"
        result = first.execute("print('shared')")
        assert result.stdout == "shared\n"
        # The second tab receives the same iopub stream, once.
        seen = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(m.get("msg_type") == "stream" for m in seen):
            try:
                seen.append(second.receive(0.5))
            except TimeoutError:
                continue
        streams = [m for m in seen if m.get("msg_type") == "stream"]
        assert len(streams) == 1 and streams[0]["content"]["text"] == "shared\n"


def test_a_clients_shell_messages_reach_the_router_in_process_and_in_order(kernel: tuple[GatewayClient, str]) -> None:
    """The gateway's websocket hands shell messages to the kernel's router directly, not over ZMQ, once the
    connection's messages sent over ZMQ have arrived; a burst sent at once on a fresh connection still runs in
    the order sent, each replied to once. (It connects while another client's cell runs: the gateway does not
    nudge a busy kernel, so the connection's first messages go over ZMQ and the rest directly.)"""
    client, kernel_id = kernel
    before = client.notebookos_kernel(kernel_id)["client_shell_messages"]
    with client.connect(kernel_id) as busy:
        assert busy.execute("import time").status == "ok"
        busy.send("shell", "execute_request", {"code": "time.sleep(1.5)"})
        time.sleep(0.5)
        with client.connect(kernel_id) as conn:
            sent = [
                conn.send("shell", "execute_request", {"code": f"order.append({i})" if i else "order = []"})
                for i in range(40)
            ]
            sent.append(conn.send("shell", "kernel_info_request", {}))
            replies: dict[str, str] = {}
            deadline = time.monotonic() + 60
            while len(replies) < len(sent) and time.monotonic() < deadline:
                msg = conn.receive(deadline - time.monotonic())
                if msg["channel"] == "shell":
                    parent = msg["parent_header"]["msg_id"]
                    assert parent not in replies, f"two replies to {msg['msg_type']} {parent}"
                    replies[parent] = msg["content"]["status"]
            assert [replies.get(m) for m in sent] == ["ok"] * len(sent)
            assert conn.execute("print(order == list(range(1, 40)))").stdout == "True\n"
            during = client.notebookos_kernel(kernel_id)["client_shell_messages"]
            assert conn.execute("pass").status == "ok"  # nothing on its way now: this one goes directly
    after = client.notebookos_kernel(kernel_id)["client_shell_messages"]
    assert during["zmq"] + during["direct"] - before["zmq"] - before["direct"] >= 42
    assert (after["zmq"], after["direct"]) == (during["zmq"], during["direct"] + 1), (during, after)


@pytest.mark.parametrize("name", ["python3", "python3-notebookos"])
def test_run_all_stops_at_the_first_error_as_with_a_plain_kernel(shared_up: Platform, name: str) -> None:
    """JupyterLab's "Run All" sends every cell at once. ipykernel aborts the requests queued behind a failed one; a
    NotebookOS kernel's cells wait in its router instead, and ran on after the error until the router did the same."""
    cells = ["import time\ntime.sleep(0.5)\n1/0", "x = 1", "x = 2"]
    content = {"silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False}
    with kernel_of(shared_up.client, name) as (client, kernel_id), client.connect(kernel_id) as conn:
        assert conn.execute("x = 0").status == "ok"
        sent = [
            conn.send("shell", "execute_request", {**content, "code": code, "stop_on_error": True}) for code in cells
        ]
        assert [conn.collect(msg_id, 30).status for msg_id in sent] == ["error", "aborted", "aborted"]
        assert conn.execute("print(x)").stdout == "0\n"  # a cell sent after the error runs
        # stop_on_error=False (as a console may send): the cells behind the failed one run.
        sent = [
            conn.send("shell", "execute_request", {**content, "code": code, "stop_on_error": False}) for code in cells
        ]
        assert [conn.collect(msg_id, 30).status for msg_id in sent] == ["error", "ok", "ok"]
        assert conn.execute("print(x)").stdout == "2\n"


def test_interrupt_reaches_the_running_cell(kernel: tuple[GatewayClient, str]) -> None:
    client, kernel_id = kernel
    with client.connect(kernel_id) as conn:
        msg_id = conn.send("shell", "execute_request", {"code": "import time\ntime.sleep(60)", "silent": False})
        time.sleep(1.5)
        began = time.monotonic()
        client.interrupt_kernel(kernel_id)
        reply = conn.reply(msg_id, 20)
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        assert time.monotonic() - began < 10
        alive = conn.execute("'still alive'")
        assert alive.result_text() == "'still alive'", (alive.reply["content"], kernel_id)


def test_unpicklable_variable_warns_once_and_the_cell_succeeds(kernel: tuple[GatewayClient, str]) -> None:
    client, kernel_id = kernel
    with client.connect(kernel_id) as conn:
        result = conn.execute("import threading\nlock = threading.Lock()\nfine = [1, 2, 3]")
        assert result.status == "ok"
        assert result.stderr.count("lock") >= 1 and "fine" not in result.stderr
        assert "failover" in result.stderr or "migration" in result.stderr
        assert len([o for o in result.outputs if o["msg_type"] == "stream" and o["content"]["name"] == "stderr"]) == 1
        again = conn.execute("fine.append(4)")
        assert again.status == "ok" and again.stderr == ""


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def _back_to_three(client: GatewayClient, kernel_id: str, gone_pid: int) -> list[dict]:
    def healed() -> list[dict] | None:
        replicas = ready_replicas(client, kernel_id)
        pids = {r["pid"] for r in replicas}
        hosts = {r["host"] for r in replicas}
        return replicas if len(replicas) == 3 and gone_pid not in pids and len(hosts) == 3 else None

    return wait_for(healed, 60, "the kernel to be back at three replicas")  # type: ignore[no-any-return]


def test_killing_an_idle_follower_is_invisible(kernel: tuple[GatewayClient, str]) -> None:
    client, kernel_id = kernel
    with client.connect(kernel_id) as conn:
        conn.execute("state = {'n': 1}")
        info = client.notebookos_kernel(kernel_id)
        follower = next(r for r in info["replicas"] if r["replica_id"] != info["executor"])
        _kill(follower["pid"])
        result = conn.execute("state['n'] += 1\nstate['n']")
        assert result.status == "ok" and result.result_text() == "2"
        _back_to_three(client, kernel_id, follower["pid"])
        assert conn.execute("state").result_text() == "{'n': 2}"


def test_killing_the_idle_executor_moves_the_next_cell_with_state_intact(kernel: tuple[GatewayClient, str]) -> None:
    client, kernel_id = kernel
    with client.connect(kernel_id) as conn:
        conn.execute("import numpy as np\nbig = np.arange(300_000)\nsmall = {'a': [1, 2]}\nalias = small")
        info = wait_for(lambda: _all_applied(client, kernel_id, 1), 10, "the followers to apply the cell")
        executor = next(r for r in info["replicas"] if r["replica_id"] == info["executor"])
        _kill(executor["pid"])
        result = conn.execute("int(big.sum()), small, alias is small", timeout=60)
        assert result.status == "ok", result.reply["content"]
        assert result.result_text() == "(44999850000, {'a': [1, 2]}, True)"
        assert result.notebookos["replica"] != executor["replica_id"]
        _back_to_three(client, kernel_id, executor["pid"])


def _all_applied(client: GatewayClient, kernel_id: str, seq: int) -> dict | None:
    info = client.notebookos_kernel(kernel_id)
    return info if all(r["applied_seq"] >= seq for r in info["replicas"]) else None


def _replies_then_dies(after_s: float) -> str:
    """A cell that stops its replica from publishing the "idle" of this cell, prints "replied", and has the replica
    exit ``after_s`` seconds after its reply."""
    return (
        "import os, threading\n"
        "def no_idle(status, *args, publish=get_ipython().kernel._publish_status, **kwargs):\n"
        "    if status != 'idle':\n"
        "        return publish(status, *args, **kwargs)\n"
        f"    threading.Timer({after_s}, os._exit, [1]).start()\n"
        "get_ipython().kernel._publish_status = no_idle\n"
        "print('replied')"
    )


def test_an_executor_that_dies_between_its_reply_and_its_idle_leaves_no_client_waiting(
    kernel: tuple[GatewayClient, str],
) -> None:
    """Clients wait for a cell's reply and its "idle". An executor that dies after sending the reply but before the
    idle (found by the chaos harness: a client waited forever) has the router say "idle" for it once it is known
    lost. (Here the cell stops its replica from publishing that idle, and exits 0.3 s later.)"""
    client, kernel_id = kernel
    with client.connect(kernel_id) as conn:
        assert conn.execute("x = 1").status == "ok"
        dies = _replies_then_dies(0.3)
        began = time.monotonic()
        result = conn.execute(dies, timeout=60)
        assert result.status == "ok" and result.stdout == "replied\n", result.reply["content"]
        assert time.monotonic() - began < 30
        # The next cell runs on another replica, with the state intact.
        after = conn.execute("print(x)", timeout=60)
        assert after.status == "ok" and after.stdout == "1\n", after.reply["content"]
        assert after.notebookos["replica"] != result.notebookos["replica"]


def test_an_executor_that_dies_owing_the_idle_of_a_cell_before_the_running_one_leaves_no_client_waiting(
    kernel: tuple[GatewayClient, str],
) -> None:
    """A replica sends a cell's reply before its idle, and the router sends the next queued cell on the reply. So an
    executor may owe the idle of one cell while it runs the next. Dying then, both must end for the client: the
    running cell as any cell whose executor died, and the one before with an "idle" the router says for it."""
    client, kernel_id = kernel
    with client.connect(kernel_id) as conn:
        assert conn.execute("x = 1").status == "ok"
        dies = _replies_then_dies(1.0)
        first = conn.send("shell", "execute_request", {"code": dies, "silent": False})
        second = conn.send("shell", "execute_request", {"code": "import time\ntime.sleep(5)", "silent": False})
        began = time.monotonic()
        result = conn.collect(first, timeout=60)
        assert result.status == "ok" and result.stdout == "replied\n", result.reply["content"]
        running = conn.collect(second, timeout=60)
        assert running.status in ("ok", "error"), running.reply["content"]  # failed, or sent again if not begun
        assert time.monotonic() - began < 30
        after = conn.execute("print(x)", timeout=60)
        assert after.status == "ok" and after.stdout == "1\n", after.reply["content"]
        assert after.notebookos["replica"] != result.notebookos["replica"]


def test_killing_the_executor_mid_cell_errors_that_cell_only(kernel: tuple[GatewayClient, str], tmp_path: Path) -> None:
    client, kernel_id = kernel
    marker = tmp_path / "runs.txt"
    with client.connect(kernel_id) as conn:
        conn.execute("before = 'intact'")
        msg_id = conn.send(
            "shell",
            "execute_request",
            {
                "code": f"open({str(marker)!r}, 'a').write('ran\\n')\nbefore = 'changed'\nimport time\ntime.sleep(60)",
                "silent": False,
            },
        )
        wait_for(marker.exists, 20, "the long cell to start")
        info = client.notebookos_kernel(kernel_id)
        executor = next(r for r in info["replicas"] if r["replica_id"] == info["executor"])
        _kill(executor["pid"])
        reply = conn.reply(msg_id, 30)
        content = reply["content"]
        assert content["status"] == "error" and content["ename"] == "ReplicaLost"
        assert "previous cell is intact" in content["evalue"] and "not re-run" in content["evalue"]
        result = conn.execute("before", timeout=60)
        assert result.result_text() == "'intact'"
        assert marker.read_text() == "ran\n"  # never silently re-run
        _back_to_three(client, kernel_id, executor["pid"])
        assert conn.execute("before").result_text() == "'intact'"


def test_gpus_are_held_only_while_a_cell_runs(kernel: tuple[GatewayClient, str]) -> None:
    client, kernel_id = kernel

    def committed() -> int:
        return sum(h["gpus_committed"] for h in client.request("GET", "/api/notebookos/cluster")["hosts"])

    with client.connect(kernel_id) as conn:
        assert committed() == 0
        msg_id = conn.send("shell", "execute_request", {"code": "import time\ntime.sleep(3)", "silent": False})
        wait_for(lambda: committed() == 1, 5, "the cell's GPU to be committed")
        conn.reply(msg_id, 20)
        wait_for(lambda: committed() == 0, 5, "the GPU to be released")
        devices = conn.execute("import os\nos.environ.get('CUDA_VISIBLE_DEVICES')")
        assert devices.result_text() == repr(",".join(str(g) for g in devices.notebookos["gpus"]))


def test_too_many_gpus_is_refused_clearly(shared_up: Platform) -> None:
    client = shared_up.client
    with pytest.raises(GatewayError) as refused:
        client.start_kernel(KERNEL, env={"KERNEL_GPUS": "64"})
    assert "64" in str(refused.value)
    with pytest.raises(GatewayError, match="KERNEL_GPUS='lots' is not a whole number"):
        client.start_kernel(KERNEL, env={"KERNEL_GPUS": "lots"})


def test_malformed_and_oversized_websocket_messages_leave_the_kernel_working(
    kernel: tuple[GatewayClient, str],
) -> None:
    client, kernel_id = kernel
    conn = client.connect(kernel_id)
    conn.ws.send("this is not json")
    conn.ws.send(json.dumps({"channel": "shell", "content": {}}))  # no header
    conn.ws.send(json.dumps({"channel": "nonsense", "header": {"msg_type": "x", "msg_id": "1"}}))
    conn.ws.send(json.dumps({"channel": "shell", "header": "not an object", "content": {}}))
    conn.ws.send("[1, 2]")
    # Each was logged and ignored: the same connection still runs cells.
    assert conn.execute("'still here'").result_text() == "'still here'"
    try:
        conn.ws.send("x" * (32 << 20))  # beyond the websocket's message limit: the gateway drops the socket
        conn.receive(5)
    except (websocket.WebSocketException, OSError):
        pass
    finally:
        conn.close()
    with client.connect(kernel_id) as fresh:
        assert fresh.execute("'ok'").result_text() == "'ok'"


def test_jupyter_server_with_gateway_url_runs_notebookos_cells(shared_up: Platform, tmp_path: Path) -> None:
    with jupyter_server(shared_up.url, shared_up.token, tmp_path) as client:
        specs = client.request("GET", "/api/kernelspecs")["kernelspecs"]
        assert KERNEL in specs
        kernel_id = client.start_kernel(KERNEL)
        try:
            with client.connect(kernel_id) as conn:
                result = conn.execute("print('via jupyter server')\n21 * 2")
                assert result.stdout == "via jupyter server\n" and result.result_text() == "42"
                assert result.notebookos["replica"] is not None
        finally:
            client.shutdown_kernel(kernel_id)


def test_a_replica_that_never_registers_fails_the_start_clearly(tmp_path: Path) -> None:
    hook = tmp_path / "hook"
    hook.mkdir()
    # Replica 1 of every kernel hangs before it can register.
    (hook / "sitecustomize.py").write_text(
        "import os, time\nif os.environ.get('NOTEBOOKOS_REPLICA_ID') == '1':\n    time.sleep(3600)\n"
    )
    # EG passes only the variables it is told to inherit (EG_INHERITED_ENVS) on to kernels.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", str(hook))
        patch.setenv("EG_INHERITED_ENVS", "PYTHONPATH")
        # Warm replica processes started before the hook is in place would not hang: start them cold.
        platform = start_platform(
            tmp_path / "state",
            "--hosts",
            "3",
            "--gpus-per-host",
            "1",
            "--gateway-option",
            "LocalLauncher.warm_replicas=0",
        )
    try:
        began = time.monotonic()
        with pytest.raises(GatewayError) as failed:
            platform.client.start_kernel(KERNEL, env={"KERNEL_LAUNCH_TIMEOUT": "8"})
        assert time.monotonic() - began < 40
        assert "replica 1" in str(failed.value) and "did not register" in str(failed.value)
        leftovers = [
            p
            for p in psutil.process_iter(["cmdline"])
            if "jupyter_notebookos.kernel" in " ".join(p.info["cmdline"] or [])
            and str(platform.state_dir) in (p.environ().get("NOTEBOOKOS_STATE_DIR") or "")
        ]
        assert leftovers == []
        cluster = platform.client.request("GET", "/api/notebookos/cluster")
        assert cluster["kernels"] == [] and all(h["replicas"] == 0 for h in cluster["hosts"])
    finally:
        stop_platform(platform)


DIGEST = """
def _ns_digest():
    import hashlib, types
    import numpy
    ip = get_ipython()
    skip = set(ip.user_ns_hidden) | {"In", "Out", "exit", "quit", "get_ipython"}
    owners, items = {}, []
    for name in sorted(ip.user_ns):
        if name.startswith("_") or name in skip:
            continue
        value = ip.user_ns[name]
        if isinstance(value, types.ModuleType):
            items.append((name, "module", value.__name__))
            continue
        if isinstance(value, numpy.ndarray):
            shown = ("ndarray", value.dtype.str, value.shape, hashlib.sha256(value.tobytes()).hexdigest())
        elif isinstance(value, type):
            shown = ("class", value.__qualname__, sorted(k for k in vars(value) if not k.startswith("__")))
        elif callable(value):
            cells = [c.cell_contents for c in (getattr(value, "__closure__", None) or ())]
            shown = ("callable", value.__qualname__, repr(cells))
        elif hasattr(value, "__dict__"):
            shown = (type(value).__qualname__, repr(sorted(vars(value).items())))
        else:
            shown = (type(value).__qualname__, repr(value))
        mutable = isinstance(value, (list, dict, set, numpy.ndarray)) or hasattr(value, "__dict__")
        alias = owners.setdefault(id(value), name) if mutable else name
        items.append((name, shown, alias))
    return hashlib.sha256(repr(items).encode()).hexdigest()[:16]
"""

NOTEBOOK = [
    "import numpy as np\nimport math as m\nfrom collections import OrderedDict as OD",
    "a = b = []\nx, (y, z) = 1, (2, 3)\nod = OD(k=1)",
    "b.append(1)\nfor i in range(3):\n    last = i * m.pi\n"
    "import contextlib\nwith contextlib.nullcontext([9]) as w:\n    pass",
    "def add(v):\n    a.append(v)\nadd(2)",
    "class Point:\n    def __init__(self, x):\n        self.x = x\n"
    "    def double(self):\n        return Point(self.x * 2)\n"
    "p = Point(3)\nq = p.double()",
    "def counter():\n    n = 0\n    def inc():\n        nonlocal n\n        n += 1\n        return n\n    return inc\n"
    "c = counter()\nc()\nc()",
    "small = np.arange(10)\nbig = np.ones((600, 600))\nd = {'k': [1]}\nd['k'].append(2)\np.x = 10\nholder = [d, a]",
    "if (walrus := 5) > 3:\n    pass\ndel x\nbig[0, 0] = 7.0\nsmall += 1",
    "def grow():\n    global grown\n    grown = [len(a)]\ngrow()\nlambda_sq = (lambda v: v * v)(4)",
]


def test_replicas_namespaces_equal_the_executors_while_the_executor_changes(
    kernel: tuple[GatewayClient, str],
) -> None:
    client, kernel_id = kernel
    replicas = sorted(r["replica_id"] for r in client.notebookos_kernel(kernel_id)["replicas"])
    with client.connect(kernel_id) as conn:

        def run_on(replica: str, code: str):  # type: ignore[no-untyped-def]
            msg_id = conn.send(
                "shell",
                "execute_request",
                {"code": code, "silent": False, "store_history": True},
                metadata={"notebookos": {"replica": replica}},
            )
            reply = conn.reply(msg_id, 60)
            assert reply["content"]["status"] == "ok", reply["content"]
            assert reply["metadata"]["notebookos"]["replica"] == replica
            return reply

        run_on(replicas[0], DIGEST)
        for i, cell in enumerate(NOTEBOOK):
            run_on(replicas[(i + 1) % 3], cell)
        digests = {}
        behaviour = {}
        for replica in replicas:
            reply = run_on(
                replica,
                "_d = _ns_digest()\n_b = (a is b, a, holder[1] is a, holder[0] is d, q.double().x, "
                "p.x, float(big[0, 0]), int(small[0]), Point(2).double().x, grown, walrus, 'x' in dir())",
            )
            assert reply["content"]["status"] == "ok"
            out = run_and_capture(conn, replica, "print(_d)\nprint(_b)")
            digests[replica], behaviour[replica] = out.splitlines()
        assert len(set(digests.values())) == 1, digests
        assert len(set(behaviour.values())) == 1, behaviour
        assert behaviour[replicas[0]] == "(True, [1, 2], True, True, 12, 10, 7.0, 1, 4, [2], 5, False)"


def run_and_capture(conn: KernelConnection, replica: str, code: str) -> str:
    msg_id = conn.send(
        "shell", "execute_request", {"code": code, "silent": False}, metadata={"notebookos": {"replica": replica}}
    )
    text, reply, idle = "", None, False
    deadline = time.monotonic() + 60
    while reply is None or not idle:
        msg = conn.receive(deadline - time.monotonic())
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            text += msg["content"]["text"]
        elif msg["msg_type"] == "execute_reply":
            reply = msg
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            idle = True
    assert reply["metadata"]["notebookos"]["replica"] == replica
    return text.strip()


def test_replicas_start_from_the_warm_pool(shared_up: Platform) -> None:
    def warm_pids() -> set[int]:
        found = set()
        for process in processes_of(shared_up.state_dir):
            with contextlib.suppress(psutil.Error):  # e.g. one exiting right now
                if "--warm" in process.cmdline() and process.status() != psutil.STATUS_ZOMBIE:
                    found.add(process.pid)
        return found

    waiting = wait_for(lambda: warm_pids() if len(warm_pids()) >= 3 else None, 60, "three warm replica processes")
    kernel_id = shared_up.client.start_kernel(KERNEL)
    try:
        replicas = {r["pid"] for r in shared_up.client.notebookos_kernel(kernel_id)["replicas"]}
        assert replicas <= waiting, (replicas, waiting)  # the kernel's replicas are the processes that waited
        wait_for(lambda: len(warm_pids() - replicas) >= 3, 60, "the pool to be refilled")
        with shared_up.client.connect(kernel_id) as conn:
            assert conn.execute("import os\nos.environ['NOTEBOOKOS_KERNEL_ID']").result_text() == repr(kernel_id)
    finally:
        shared_up.client.shutdown_kernel(kernel_id)


def test_a_restarted_gateway_reattaches_to_running_kernels(tmp_path: Path) -> None:
    platform = start_platform(tmp_path / "state", "--hosts", "3", "--gpus-per-host", "1")
    try:
        client = platform.client
        kernel_id = client.start_kernel(KERNEL)
        with client.connect(kernel_id) as conn:
            assert conn.execute("kept = {'v': [1, 2, 3]}\nlen(kept['v'])").result_text() == "3"
        before = {r["replica_id"]: r["pid"] for r in client.notebookos_kernel(kernel_id)["replicas"]}
        gateway = next(p for p in platform.descendants() if "jupyter_notebookos.gateway" in " ".join(p.cmdline()))
        gateway.kill()
        gateway.wait(10)

        wait_for(lambda: _gateway_lists(client, kernel_id), 60, "the restarted gateway to list the kernel again")
        after = {r["replica_id"]: r["pid"] for r in client.notebookos_kernel(kernel_id)["replicas"]}
        assert after == before  # the same replica processes, not new ones
        with client.connect(kernel_id) as conn:
            result = conn.execute("kept['v'].append(4)\nkept", timeout=60)
            assert result.result_text() == "{'v': [1, 2, 3, 4]}"
        client.shutdown_kernel(kernel_id)
        wait_for(lambda: not any(_alive(pid) for pid in before.values()), 20, "the replicas to exit on shutdown")
    finally:
        stop_platform(platform)


def test_a_restarted_gateway_adopts_a_cell_that_waits_behind_one_whose_state_is_not_stored(tmp_path: Path) -> None:
    """Two cell records at a gateway crash: a cell that replied but whose state its executor has not stored yet
    (its record stays until then), and the next cell, waiting on the executor for that upload and holding the
    kernel's GPU. The new gateway re-attaches, counts the GPU for the later cell only, and both cells' state
    reaches every replica in order."""
    platform = start_platform(tmp_path / "state", "--hosts", "3", "--gpus-per-host", "1")
    go = Path(tempfile.gettempdir()) / f"notebookos-upload-{uuid.uuid4().hex}"
    try:
        client = platform.client
        kernel_id = client.start_kernel(KERNEL)
        cells = f"/kernels/{kernel_id}/cells/"
        with client.connect(kernel_id) as conn:
            assert conn.execute("import numpy as np").status == "ok"
            replica = client.notebookos_kernel(kernel_id)["executor"]
            run_on_replica(conn, replica, hold_uploads_until(go))
            run_on_replica(conn, replica, "first = np.ones(1 << 18)")  # replies; its upload waits
            second = conn.send("shell", "execute_request", {"code": "second = 2", "silent": False})
            wait_for(lambda: len(etcd_admin(platform, read=cells)) == 2, 10, "both cells' records")
            # Its executor has it (it says busy as it takes it): the kill must not fall between the decision and the
            # sending, after which the new gateway gives the cell up (the next test).
            while not (
                (msg := conn.receive(10))["msg_type"] == "status"
                and msg["parent_header"].get("msg_id") == second
                and msg["content"]["execution_state"] == "busy"
            ):
                pass
        kill_the_gateway(platform, client, kernel_id)  # (it waits until the new gateway re-attached the kernel)
        go.touch()
        with client.connect(kernel_id) as conn:
            for host_replica in [r["replica_id"] for r in client.notebookos_kernel(kernel_id)["replicas"]]:
                # Each runs on its own host's one GPU: none is counted as taken by a cell that is over.
                run_on_replica(conn, host_replica, "assert first.sum() == 1 << 18 and second == 2")
        wait_for(lambda: not etcd_admin(platform, read=cells), 10, "the cells' records to go")
        client.shutdown_kernel(kernel_id)
    finally:
        go.unlink(missing_ok=True)
        stop_platform(platform)


def _applied_everywhere(client: GatewayClient, kernel_id: str) -> int:
    """The record every replica of the kernel has applied, once they all say the same one (within 30 s)."""

    def applied() -> int | None:
        seqs = {r["applied_seq"] for r in client.notebookos_kernel(kernel_id)["replicas"]}
        return seqs.pop() if len(seqs) == 1 and 0 not in seqs else None

    return int(wait_for(applied, 30, "every replica to apply the first cell"))


def test_a_restarted_gateway_gives_up_a_cell_its_predecessor_decided_but_never_sent(tmp_path: Path) -> None:
    """The gateway died between committing a cell's decision and sending the cell: its record is in etcd (here
    written as that gateway would have), holding the executor's one GPU, and no replica has the cell. The new
    gateway asks the executor, gives the cell up, and the kernel goes on: the next cell gets the GPU and the
    record's place in the log, on every replica. (Before, it waited for that cell for ever, and every later cell
    with it.)"""
    platform = start_platform(tmp_path / "state", "--hosts", "3", "--gpus-per-host", "1")
    try:
        client = platform.client
        kernel_id = client.start_kernel(KERNEL)
        cells = f"/kernels/{kernel_id}/cells/"
        with client.connect(kernel_id) as conn:
            assert conn.execute("x = 1").status == "ok"

        seq = _applied_everywhere(client, kernel_id)
        kernel = client.notebookos_kernel(kernel_id)
        executor = kernel["executor"]
        host = next(r["host"] for r in kernel["replicas"] if r["replica_id"] == executor)
        lost = uuid.uuid4().hex
        record = {"msg_id": lost, "executor": executor, "host": host, "gpus": [0], "attempt": 1, "seq": seq + 1}
        etcd_admin(platform, (f"{cells}{lost}", json.dumps(record)))
        kill_the_gateway(platform, client, kernel_id)
        with client.connect(kernel_id) as conn:
            run_on_replica(conn, executor, "y = x + 1", timeout=30)  # the same host's one GPU
            for replica in [r["replica_id"] for r in client.notebookos_kernel(kernel_id)["replicas"]]:
                run_on_replica(conn, replica, "assert y == 2", timeout=30)
        assert seq + 4 in {r["applied_seq"] for r in client.notebookos_kernel(kernel_id)["replicas"]}
        gateway_log = (platform.state_dir / "gateway.log").read_text(errors="replace")
        assert f"cell {lost} (record {seq + 1}), decided by the previous gateway, never reached replica" in gateway_log
        wait_for(lambda: not etcd_admin(platform, read=cells), 10, "the cells' records to go")
        client.shutdown_kernel(kernel_id)
    finally:
        stop_platform(platform)


def test_a_replica_holding_more_than_etcd_says_runs_the_next_cell_without_waiting_the_launch_timeout(
    tmp_path: Path,
) -> None:
    """A replica's applied key in etcd can say less than the replica holds (its report went with a lease etcd ended,
    and it has no newer record to report), and a new gateway reads what is left: the next cell waited for the replica
    to catch up for the launch timeout (a minute) before it ran there anyway (a CI failure after an etcd outage looked
    like this). The router now asks the replica itself after a few seconds (notebookos_applied_request)."""
    platform = start_platform(tmp_path / "state", "--hosts", "3", "--gpus-per-host", "1")
    try:
        client = platform.client
        kernel_id = client.start_kernel(KERNEL)
        with client.connect(kernel_id) as conn:
            assert conn.execute("x = 1").status == "ok"

        seq = _applied_everywhere(client, kernel_id)
        keys = etcd_admin(platform, read=f"/kernels/{kernel_id}/applied/")
        assert len(keys) == 3
        etcd_admin(platform, *((key.removeprefix("/notebookos"), str(seq - 1)) for key in keys), keep_leases=True)
        kill_the_gateway(platform, client, kernel_id)  # its successor reads the applied seqs left in etcd
        with client.connect(kernel_id) as conn:
            began = time.monotonic()
            assert conn.execute("x + 1", timeout=120).result_text() == "2"
            took = time.monotonic() - began
        assert took < 20, f"the cell took {took:.1f} s (the launch timeout is 60 s)"
        gateway_log = (platform.state_dir / "gateway.log").read_text(errors="replace")
        assert f"holds the state through record {seq}, more than etcd says ({seq - 1})" in gateway_log
        client.shutdown_kernel(kernel_id)
    finally:
        stop_platform(platform)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_gateway_stopped_politely_can_leave_kernels_running_for_the_next(tmp_path: Path) -> None:
    """As on Kubernetes (a gateway rollout): SIGTERM stops the gateway, not the users' kernels."""
    platform = start_platform(
        tmp_path / "state",
        "--hosts",
        "3",
        "--gpus-per-host",
        "1",
        "--gateway-option",
        "NotebookOSGatewayApp.stop_kernels_on_shutdown=False",
    )
    try:
        client = platform.client
        kernel_id = client.start_kernel(KERNEL)
        with client.connect(kernel_id) as conn:
            conn.execute("kept = 'across a rollout'")
        before = {r["replica_id"]: r["pid"] for r in client.notebookos_kernel(kernel_id)["replicas"]}
        gateway = next(p for p in platform.descendants() if "jupyter_notebookos.gateway" in " ".join(p.cmdline()))
        gateway.terminate()
        gateway.wait(30)
        assert all(_alive(pid) for pid in before.values())

        wait_for(lambda: _gateway_lists(client, kernel_id), 60, "the restarted gateway to list the kernel again")
        assert {r["replica_id"]: r["pid"] for r in client.notebookos_kernel(kernel_id)["replicas"]} == before
        with client.connect(kernel_id) as conn:
            assert conn.execute("kept", timeout=60).result_text() == "'across a rollout'"
    finally:
        stop_platform(platform)
    assert not any(_alive(pid) for pid in before.values())  # `notebookos up` itself stops everything


def test_bad_kernelspec_config_is_refused_before_anything_starts(tmp_path: Path) -> None:
    spec = json.loads((REPO / "kernelspecs" / "python3-notebookos" / "kernel.json").read_text())
    for name, config in {"nbos-five": {"replicas": 5}, "nbos-slow": {"launch_timeout": "soon"}}.items():
        bad = json.loads(json.dumps(spec))
        bad["metadata"]["process_proxy"]["config"].update(config)
        (tmp_path / "jupyter" / "kernels" / name).mkdir(parents=True)
        (tmp_path / "jupyter" / "kernels" / name / "kernel.json").write_text(json.dumps(bad))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
        platform = start_platform(tmp_path / "state", "--hosts", "3", "--gpus-per-host", "1")
    try:
        with pytest.raises(GatewayError, match=r"asks for 5 replicas per kernel but this gateway runs 3"):
            platform.client.start_kernel("nbos-five")
        with pytest.raises(GatewayError, match=r"launch timeout 'soon'.*is not a number of seconds"):
            platform.client.start_kernel("nbos-slow")
        assert platform.client.request("GET", "/api/notebookos/cluster")["kernels"] == []
    finally:
        stop_platform(platform)


def _gateway_lists(client: GatewayClient, kernel_id: str) -> bool:
    """Whether the gateway answers and lists the kernel (False while it is restarting)."""
    try:
        return any(k["id"] == kernel_id for k in client.request("GET", "/api/kernels", timeout=2))
    except Exception:
        return False
