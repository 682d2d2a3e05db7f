"""Object stores the gateway brokers: replicas hold no store credentials, only their kernel's object token, and
the gateway signs each object operation for that kernel's own prefix (gateway/control/objectbroker.py).

Two stores: an S3-compatible one (moto's S3 server with IAM auth on, tests/s3_store.py: presigned URLs, bytes go
to the store directly) and the platform's own file:// store served by the gateway (`object_store_access=broker`,
as for kernels in a namespace that cannot mount the store's volume). The gateway, etcd and replicas are real.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from s3_store import s3_store
from support import (
    Platform,
    hold_uploads_until,
    kill_the_gateway,
    replace_a_follower,
    run_on_replica,
    start_platform,
    stop_platform,
    wait_for,
)

from jupyter_notebookos.client import GatewayError

KERNEL = "python3-notebookos"
PREFIX = "platform"


@dataclass
class Brokered:
    platform: Platform
    keys: Callable[[str], list[str]]  # a kernel's keys in the store, as its administrator sees them
    unsigned_url: Callable[[str, str], str]  # where a kernel's object could be read without a signature


@pytest.fixture(scope="module", params=["s3", "file"])
def brokered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokered]:
    with contextlib.ExitStack() as stack:
        state_dir = tmp_path_factory.mktemp(request.param) / "state"
        args = ["--hosts", "3", "--gpus-per-host", "2"]
        if request.param == "s3":
            store = stack.enter_context(s3_store())
            args += ["--gateway-option", f"NotebookOSGatewayApp.object_store_url=s3://{store.bucket}/{PREFIX}"]
            up = start_platform(state_dir, *args, env=store.env())
            stack.callback(stop_platform, up)

            def base(kernel_id: str) -> str:
                return f"{store.bucket}/{PREFIX}/kernels/{kernel_id}"

            yield Brokered(
                up,
                lambda k: [path[len(base(k)) + 1 :] for path in store.fs().find(base(k))],
                lambda k, key: f"{store.endpoint}/{base(k)}/{key}",
            )
            return
        up = start_platform(state_dir, *args, "--gateway-option", "NotebookOSGatewayApp.object_store_access=broker")
        stack.callback(stop_platform, up)
        root = up.state_dir / "objects" / "kernels"

        def stored(k: str) -> list[str]:
            """The kernel's objects in the store; a walk that meets a directory as it is deleted looks again (CI,
            2026-12-06: FileNotFoundError from rglob while the gateway deleted the kernel's prefix)."""
            for _ in range(100):
                with contextlib.suppress(FileNotFoundError):
                    return sorted(
                        f.relative_to(root / k).as_posix()
                        for f in (root / k).rglob("*")
                        if f.is_file() and ".tmp-" not in f.name
                    )
            raise AssertionError(f"the store's directory of kernel {k} kept changing under the walk")

        yield Brokered(up, stored, lambda k, key: f"{up.url}/api/notebookos/kernels/{k}/objects/data/{key}")


def test_state_lives_under_the_kernels_prefix_and_a_replacement_restores_it(brokered: Brokered) -> None:
    client = brokered.platform.client
    kernel_id = client.start_kernel(KERNEL)
    try:
        with client.connect(kernel_id) as conn:
            assert conn.execute("import numpy as np\nbig = np.arange(1 << 20, dtype=np.float64)").status == "ok"
            buffers = wait_for(
                lambda: [k for k in brokered.keys(kernel_id) if k.startswith("buffers/")], 30, "the array in the store"
            )
            assert buffers, buffers
            run_on_replica(conn, replace_a_follower(client, kernel_id), "float(big.sum())")
            assert conn.execute("float(big.sum())").result_text() == str(float(sum(range(1 << 20))))
    finally:
        client.shutdown_kernel(kernel_id)
    wait_for(lambda: not brokered.keys(kernel_id), 30, "the kernel's prefix to be deleted with it")


ATTACK = """
import json, os, urllib.error, urllib.request
broker, token = os.environ["NOTEBOOKOS_OBJECT_BROKER_URL"], os.environ["NOTEBOOKOS_OBJECT_BROKER_TOKEN"]
mine = os.environ["NOTEBOOKOS_KERNEL_ID"]

def status(method, url, body=None, auth=True):
    headers = {"Authorization": "token " + token} if auth else {}
    data = json.dumps(body).encode() if body is not None else None
    try:
        return urllib.request.urlopen(urllib.request.Request(url, data=data, method=method, headers=headers)).status
    except urllib.error.HTTPError as err:
        return err.code

_out = {
    "store credentials": sorted(k for k in os.environ if k.startswith("AWS_") or "SECRET" in k),
    "sign the victim's key": status("POST", f"{broker}/{VICTIM}/objects", {"op": "get", "key": VICTIM_KEY}),
    "list the victim's keys": status("GET", f"{broker}/{VICTIM}/objects?prefix="),
    "climb out of its prefix": status(
        "POST", f"{broker}/{mine}/objects", {"op": "get", "key": f"../{VICTIM}/{VICTIM_KEY}"}
    ),
    "no token": status("POST", f"{broker}/{mine}/objects", {"op": "head", "key": "buffers/00/x"}, auth=False),
    "read the victim's object unsigned": status("GET", STORE_URL, auth=False),
    "sign its own key": status("POST", f"{broker}/{mine}/objects", {"op": "head", "key": "buffers/00/x"}),
    "list its own keys": status("GET", f"{broker}/{mine}/objects?prefix=buffers/"),
}
"""


def test_a_kernel_holds_no_store_keys_and_cannot_reach_another_kernels_objects(brokered: Brokered) -> None:
    client = brokered.platform.client
    victim, attacker = client.start_kernel(KERNEL), client.start_kernel(KERNEL)
    try:
        with client.connect(victim) as conn_v, client.connect(attacker) as conn_a:
            assert conn_v.execute("import numpy as np\nsecret = np.full(1 << 18, 7.0)").status == "ok"
            key = wait_for(
                lambda: next((k for k in brokered.keys(victim) if k.startswith("buffers/")), None),
                30,
                "the victim's array in the store",
            )
            code = (
                f"VICTIM, VICTIM_KEY = {victim!r}, {key!r}\n"
                f"STORE_URL = {brokered.unsigned_url(victim, key)!r}\n" + ATTACK + "\nprint(json.dumps(_out))"
            )
            result = conn_a.execute(code, timeout=60)
            assert result.status == "ok", result.reply["content"]
            seen = json.loads(result.stdout.strip().splitlines()[-1])
            assert seen == {
                "store credentials": [],
                "sign the victim's key": 403,
                "list the victim's keys": 403,
                "climb out of its prefix": 400,
                "no token": 401,
                "read the victim's object unsigned": 403,
                "sign its own key": 200,
                "list its own keys": 200,
            }, seen
            assert conn_v.execute("float(secret.sum())").result_text() == str(7.0 * (1 << 18))
    finally:
        for kernel_id in (victim, attacker):
            with contextlib.suppress(GatewayError):
                client.shutdown_kernel(kernel_id)


def test_a_restarted_gateway_still_signs_for_the_kernels_replicas(brokered: Brokered) -> None:
    """The object token is recorded with the kernel: after a gateway crash, the replicas that kept running still
    store and read their buffers, and a replacement restores them."""
    platform, client = brokered.platform, brokered.platform.client
    kernel_id = client.start_kernel(KERNEL)
    try:
        with client.connect(kernel_id) as conn:
            assert conn.execute("import numpy as np\nbefore = np.ones(1 << 18)").status == "ok"
        kill_the_gateway(platform, client, kernel_id)
        stored = len(brokered.keys(kernel_id))
        with client.connect(kernel_id) as conn:
            assert conn.execute("after = np.full(1 << 18, 3.0)", timeout=60).status == "ok"
            wait_for(lambda: len(brokered.keys(kernel_id)) > stored, 30, "the new array in the store")
            run_on_replica(conn, replace_a_follower(client, kernel_id), "float(before.sum() + after.sum())")
        client.shutdown_kernel(kernel_id)
        # The restarted gateway listed the store's kernel prefixes at start: deleting one still sees it.
        wait_for(lambda: not brokered.keys(kernel_id), 30, "the kernel's prefix to be deleted with it")
    finally:
        with contextlib.suppress(GatewayError):
            client.shutdown_kernel(kernel_id)


def test_a_gateway_that_dies_before_a_cells_state_is_stored_gives_the_next_cell_the_next_seq(
    brokered: Brokered,
) -> None:
    """A cell replies before its executor stores its state: the upload (signed by the gateway here) follows the
    reply. A gateway that dies in between must leave the cell's seq known to its successor, which waits for the
    record; were the seq handed to the next cell as well, one of the two cells' state would be lost although
    both replied ok (a CI run lost the next cell's names this way)."""
    platform, client = brokered.platform, brokered.platform.client
    kernel_id = client.start_kernel(KERNEL)
    go = Path(tempfile.gettempdir()) / f"notebookos-upload-{uuid.uuid4().hex}"
    try:
        with client.connect(kernel_id) as conn:
            assert conn.execute("import numpy as np").status == "ok"
            replica = client.notebookos_kernel(kernel_id)["executor"]
            run_on_replica(conn, replica, hold_uploads_until(go))
            run_on_replica(conn, replica, "before = np.ones(1 << 18)")  # 2 MiB: its upload waits
        time.sleep(0.5)  # the router has handled the reply (the old code deleted the cell's record 0.1 s after)
        kill_the_gateway(platform, client, kernel_id)
        go.touch()
        with client.connect(kernel_id) as conn:
            assert conn.execute("after = np.full(1 << 18, 3.0)", timeout=60).status == "ok"
            # Every replica holds both cells' state (run_on_replica requires an ok reply: no NameError).
            for rid in [r["replica_id"] for r in client.notebookos_kernel(kernel_id)["replicas"]]:
                run_on_replica(conn, rid, "assert before.sum() + after.sum() == 4 << 18")
    finally:
        go.unlink(missing_ok=True)
        with contextlib.suppress(GatewayError):
            client.shutdown_kernel(kernel_id)
