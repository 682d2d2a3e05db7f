"""Many users, one platform: what one kernel's code can reach of another kernel's (nothing).

Real etcd with auth on, the real gateway, real replica processes. The attacks run as cells of kernel B, with
nothing but what B's replica process holds (its environment, the package's own etcd client, the filesystem).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support import Platform, replace_a_follower, run_on_replica, start_platform, stop_platform, wait_for

from jupyter_notebookos.client import GatewayClient, GatewayError, KernelConnection

KERNEL = "python3-notebookos"


# Where replicas can run as their kernels' own users: as root, where a process may take an unprivileged user and
# still read its Python (the launcher asks the same probe).
def _isolation_blocked() -> str:
    if os.geteuid() != 0:
        return "the tests do not run as root"
    probe = subprocess.run(
        [sys.executable, "-m", "jupyter_notebookos.kernel.sandbox"], capture_output=True, text=True, timeout=60
    )
    return probe.stderr.strip() or f"exit {probe.returncode}" if probe.returncode else ""


ISOLATION_BLOCKED = _isolation_blocked()


@pytest.fixture(scope="module")
def platform() -> Iterator[Platform]:
    # Under /tmp (every user may pass), not pytest's 0700 temporary root: kernels reach their own directories.
    base = Path(tempfile.mkdtemp(prefix="notebookos-isolation-", dir="/tmp"))
    base.chmod(0o711)
    # The operator lets kernels inherit an allocator setting and (wrongly) a secret: EG's EG_INHERITED_ENVS.
    inherited = {"MALLOC_ARENA_MAX": "2", "NOTEBOOKOS_TEST_SECRET_TOKEN": "gateway-secret"}
    env = {"EG_INHERITED_ENVS": ",".join(inherited), **inherited}
    up = start_platform(base / "state", "--hosts", "4", "--gpus-per-host", "2", env=env)
    try:
        yield up
    finally:
        stop_platform(up)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def two_kernels(platform: Platform) -> Iterator[tuple[GatewayClient, str, str]]:
    client = platform.client
    a, b = client.start_kernel(KERNEL), client.start_kernel(KERNEL)
    try:
        yield client, a, b
    finally:
        for kernel_id in (a, b):
            with contextlib.suppress(GatewayError):
                client.shutdown_kernel(kernel_id)


def _json_cell(conn: KernelConnection, code: str) -> dict:
    result = conn.execute(code + "\nimport json as _json\nprint(_json.dumps(_out))", timeout=60)
    assert result.status == "ok", result.reply["content"]
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


ETCD_ATTACK = """
import asyncio, concurrent.futures, os
from jupyter_notebookos.coordination.client import Coordinator, EtcdCredentials
from jupyter_notebookos.coordination.txn import Op

async def _attack(victim):
    co = await Coordinator.connect(
        os.environ["NOTEBOOKOS_ETCD_ENDPOINTS"].split(","), prefix=os.environ["NOTEBOOKOS_ETCD_PREFIX"],
        credentials=EtcdCredentials(os.environ["NOTEBOOKOS_ETCD_USER"], os.environ["NOTEBOOKOS_ETCD_PASSWORD"]),
    )
    keys, out = co.keys, {}
    attempts = {
        "read the victim's record": co.get(keys.kernel(victim)),
        "read the victim's log": co.get_prefix(keys.log_prefix(victim)),
        "write the victim's log": co.put(keys.log_record(victim, 10**6), "x"),
        "write the victim's log in a txn": co.txn([], [Op.put(keys.log_record(victim, 10**6 + 1), "x")]),
        "delete the victim's keys": co.delete_prefix(keys.kernel_prefix(victim)),
        "list every kernel": co.get_prefix(keys.kernels_prefix(), keys_only=True),
        "read the GPU ledger": co.get_prefix(keys.gpus_prefix()),
        "read its own log": co.get_prefix(keys.log_prefix(os.environ["NOTEBOOKOS_KERNEL_ID"])),
    }
    for name, attempt in attempts.items():
        try:
            await attempt
            out[name] = "allowed"
        except Exception as exc:
            out[name] = type(exc).__name__
    await co.close()
    return out

_out = concurrent.futures.ThreadPoolExecutor(1).submit(asyncio.run, _attack(VICTIM)).result()
_out["credentials"] = sorted(k for k in os.environ if "PASSWORD" in k or "TOKEN" in k)
_out["etcd user"] = os.environ["NOTEBOOKOS_ETCD_USER"]
"""


def test_a_kernel_cannot_read_or_write_another_kernels_etcd_keys(two_kernels: tuple[GatewayClient, str, str]) -> None:
    client, a, b = two_kernels
    with client.connect(a) as conn_a, client.connect(b) as conn_b:
        assert conn_a.execute("secret = 'only A knows'").status == "ok"
        seen = _json_cell(conn_b, ETCD_ATTACK.replace("VICTIM", repr(a)))
        denied = {k: v for k, v in seen.items() if k.startswith(("read the", "write the", "delete", "list"))}
        assert denied and set(denied.values()) == {"PermissionDenied"}, seen
        assert seen["read its own log"] == "allowed"
        # B holds its own kernel's etcd identity, and no other credential (no gateway token, no admin password).
        assert seen["etcd user"].endswith(b) and seen["credentials"] == ["NOTEBOOKOS_ETCD_PASSWORD"]
        # A is unaffected.
        after = conn_a.execute("secret")
        assert after.status == "ok" and after.result_text() == "'only A knows'"


FILE_ATTACK = """
import os
_out = {"uid": os.getuid()}
for _name, _path in PATHS.items():
    try:
        if os.path.isdir(_path):
            os.listdir(_path)
        else:
            open(_path, "rb").read(1)
        _out[_name] = "allowed"
    except OSError as exc:
        _out[_name] = type(exc).__name__
"""


@pytest.mark.skipif(bool(ISOLATION_BLOCKED), reason=f"kernels cannot run as their own users here: {ISOLATION_BLOCKED}")
def test_a_kernel_cannot_read_another_kernels_files_environment_or_the_gateways_state(
    platform: Platform, two_kernels: tuple[GatewayClient, str, str]
) -> None:
    client, a, b = two_kernels
    state = platform.state_dir
    with client.connect(a) as conn_a, client.connect(b) as conn_b:
        # A big array: its buffer lands in A's object-store directory.
        assert conn_a.execute("import numpy as np\nbig = np.ones(1 << 19)").status == "ok"
        victim_pid = client.notebookos_kernel(a)["replicas"][0]["pid"]
        store = state / "objects" / "kernels"
        wait_for(lambda: any((store / a).rglob("*")) if (store / a).exists() else False, 30, "A's objects")
        paths = {
            "list every kernel's objects": str(store),
            "list A's objects": str(store / a),
            "read A's replica's environment": f"/proc/{victim_pid}/environ",
            "read etcd's root password": str(state / "etcd-root-password"),
            "read the gateway's runtime file": str(state / "runtime.json"),
            "list the gateway's state dir": str(state),
            "read its own objects": str(store / b),
        }
        seen = _json_cell(conn_b, FILE_ATTACK.replace("PATHS", repr(paths)))
        uid_a = _json_cell(conn_a, "import os\n_out = {'uid': os.getuid()}")["uid"]
        assert seen["uid"] != 0 and uid_a != 0 and seen["uid"] != uid_a, (seen, uid_a)
        # Running as its own user costs a replica nothing it needs of itself (its /proc/self, for write tracking).
        methods = [r.get("change_detection") or "" for r in client.notebookos_kernel(a)["replicas"]]
        assert methods and not any("Permission denied" in m for m in methods), methods
        refused = {k: v for k, v in seen.items() if k not in ("uid", "read its own objects")}
        assert set(refused.values()) == {"PermissionError"}, seen
        assert seen["read its own objects"] == "allowed"
        assert conn_a.execute("float(big.sum())").result_text() == str(float(1 << 19))


def test_replicas_inherit_what_the_operator_lets_kernels_inherit_but_never_a_secret(
    two_kernels: tuple[GatewayClient, str, str],
) -> None:
    client, a, _ = two_kernels
    pids = [r["pid"] for r in client.notebookos_kernel(a)["replicas"]]
    assert len(pids) == 3
    for pid in pids:  # every replica, the executor and the followers alike (glibc reads MALLOC_* at start)
        environ = psutil.Process(pid).environ()
        assert environ.get("MALLOC_ARENA_MAX") == "2", pid
        assert "NOTEBOOKOS_TEST_SECRET_TOKEN" not in environ and "gateway-secret" not in environ.values(), pid


def test_two_kernels_past_their_first_checkpoint_each_restore_their_own_state(
    platform: Platform, two_kernels: tuple[GatewayClient, str, str]
) -> None:
    client, a, b = two_kernels
    with client.connect(a) as conn_a, client.connect(b) as conn_b:
        for i in range(40):  # past the first checkpoint (every 32 records)
            assert conn_a.execute(f"owner = 'A'\nn = {i}").status == "ok"
            assert conn_b.execute(f"owner = 'B'\nn = {i + 100}").status == "ok"
        for kernel_id in (a, b):
            checkpoints = platform.state_dir / "objects" / "kernels" / kernel_id / "checkpoints"
            wait_for(lambda c=checkpoints: c.exists() and any(c.iterdir()), 30, f"{kernel_id}'s first checkpoint")
        for kernel_id, conn, expected in ((a, conn_a, "('A', 39)"), (b, conn_b, "('B', 139)")):
            run_on_replica(conn, replace_a_follower(client, kernel_id), "owner, n")
            assert conn.execute("owner, n").result_text() == expected


def test_a_tampered_checkpoint_is_refused_and_the_kernel_keeps_serving(
    platform: Platform, two_kernels: tuple[GatewayClient, str, str]
) -> None:
    client, a, _ = two_kernels
    with client.connect(a) as conn:
        checkpoints = platform.state_dir / "objects" / "kernels" / a / "checkpoints"
        # Cells until the first checkpoint is written (the executor checkpoints once the followers caught up).
        for last in range(100):
            assert conn.execute(f"value = {last}").status == "ok"
            if last >= 32 and checkpoints.exists() and any(checkpoints.glob("*.ckpt")):
                break
        files = wait_for(lambda: sorted(checkpoints.glob("*.ckpt")), 30, "a checkpoint")
        for path in files:
            path.write_bytes(path.read_bytes()[:-8] + b"tampered")
        info = client.notebookos_kernel(a)
        follower = next(r for r in info["replicas"] if r["replica_id"] != info["executor"])
        os.kill(follower["pid"], signal.SIGKILL)
        log_dir = platform.state_dir / "replicas" / a

        def refused() -> bool:
            return any("does not match its digest" in p.read_text(errors="replace") for p in log_dir.glob("*.log"))

        wait_for(refused, 60, "a replacement replica to refuse the tampered checkpoint")
        # The kernel goes on from the state its live replicas verified.
        result = conn.execute("value")
        assert result.status == "ok" and result.result_text() == str(last)


SPAWN = """
def _spawn(tag):
    import subprocess
    subprocess.Popen(["sleep", tag + "1"])  # a child: in the replica's process group
    subprocess.Popen(["sleep", tag + "2"], start_new_session=True)  # a daemon: a session of its own
    subprocess.run(["sh", "-c", f"sleep {tag}3 >/dev/null 2>&1 &"], check=True)  # orphaned at once, in the group
_spawn(TAG)
del _spawn
"""


def _sleepers(tag: str) -> set[str]:
    """Which of the processes a SPAWN cell with ``tag`` started still run ("1", "2", "3")."""
    found = set()
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = process.info["cmdline"] or []
        ours = len(cmdline) == 2 and cmdline[0] == "sleep" and cmdline[1].startswith(tag)
        if ours and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.add(cmdline[1][len(tag) :])
    return found


@pytest.mark.skipif(bool(ISOLATION_BLOCKED), reason=f"kernels cannot run as their own users here: {ISOLATION_BLOCKED}")
def test_processes_a_cell_started_go_with_their_replica_and_daemons_with_the_kernel(platform: Platform) -> None:
    """A replica that dies takes its process group along (children, orphans); a stopped one its descendants and
    group; a daemon (a session of its own) lives as long as its kernel, whose own OS user it runs as: when the
    kernel stops, nothing runs as that user any more (the uid may be another kernel's next)."""
    client = platform.client
    kernel_id = client.start_kernel(KERNEL)
    tags = [f"600.{os.getpid()}{i}{n}" for i, n in enumerate(os.urandom(2))]
    try:
        with client.connect(kernel_id) as conn:
            replicas = client.notebookos_kernel(kernel_id)["replicas"]
            for tag, replica in zip(tags, replicas, strict=False):
                run_on_replica(conn, replica["replica_id"], SPAWN.replace("TAG", repr(tag)))
                wait_for(lambda tag=tag: _sleepers(tag) == {"1", "2", "3"}, 30, "the cell's processes")
            # The first replica dies: its child and the orphan go when the platform replaces it, the daemon stays.
            os.kill(replicas[0]["pid"], signal.SIGKILL)
            wait_for(lambda: _sleepers(tags[0]) == {"2"}, 90, "the dead replica's process group to be stopped")
            assert _sleepers(tags[1]) == {"1", "2", "3"}  # another replica's are not touched
            assert conn.execute("1 + 1").result_text() == "2"
    finally:
        client.shutdown_kernel(kernel_id)
    wait_for(lambda: not _sleepers(tags[0]) and not _sleepers(tags[1]), 30, "every process of the kernel to go")


@pytest.mark.skipif(bool(ISOLATION_BLOCKED), reason=f"kernels cannot run as their own users here: {ISOLATION_BLOCKED}")
def test_a_stopping_kernel_with_many_files_does_not_hold_up_another_users_cells(
    platform: Platform, two_kernels: tuple[GatewayClient, str, str]
) -> None:
    """A stopped kernel's home is removed with everything its user wrote there. That ran on the gateway's event
    loop: with 60,000 files another user's cell waited 0.7 s for it (150,000 here: about 2 s)."""
    client, a, b = two_kernels
    with client.connect(a) as conn_a:
        made = conn_a.execute(
            "import os\nd = os.path.expanduser('~/many')\nos.makedirs(d)\n"
            "for i in range(150_000):\n    open(f'{d}/{i}', 'w').close()\nprint(d)",
            timeout=300,
        )
        assert made.status == "ok", made.reply["content"]
    home = Path(made.stdout.strip()).parent
    assert home.name == a and home.is_dir()  # the kernel's own home, which goes when it stops
    with client.connect(b) as conn_b:
        assert conn_b.execute("1 + 1").result_text() == "2"
        client.shutdown_kernel(a)
        began, slowest = time.monotonic(), 0.0
        while time.monotonic() - began < 20 and (home.exists() or time.monotonic() - began < 3):
            started = time.monotonic()
            assert conn_b.execute("1 + 1").result_text() == "2"
            slowest = max(slowest, time.monotonic() - started)
    assert not home.exists(), "the stopped kernel's home is still there"
    assert slowest < 1.0, f"a cell of another kernel took {slowest:.2f} s while the kernel with many files stopped"
