"""An S3-compatible object store: the gateway holds the store's keys and signs each replica's object operations
for its own kernel's prefix; replicas hold no store credentials (jupyter_notebookos/gateway/objectbroker.py).

The store is moto's S3 server with IAM auth on (tests/s3_store.py); the gateway, etcd and the replicas are real.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import pytest
from s3_store import S3Store, s3_store
from support import (
    Platform,
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


@pytest.fixture(scope="module")
def store() -> Iterator[S3Store]:
    with s3_store() as started:
        yield started


@pytest.fixture(scope="module")
def platform(store: S3Store, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    up = start_platform(
        tmp_path_factory.mktemp("s3") / "state", "--hosts", "3", "--gpus-per-host", "2",
        "--gateway-option", f"NotebookOSGatewayApp.object_store_url=s3://{store.bucket}/{PREFIX}",
        env=store.env(),
    )  # fmt: skip
    try:
        yield up
    finally:
        stop_platform(up)


def kernel_keys(store: S3Store, kernel_id: str) -> list[str]:
    base = f"{store.bucket}/{PREFIX}/kernels/{kernel_id}"
    return [path[len(base) + 1 :] for path in store.fs().find(base)]


def test_state_lives_under_the_kernels_prefix_and_a_replacement_restores_it(platform: Platform, store: S3Store) -> None:
    client = platform.client
    kernel_id = client.start_kernel(KERNEL)
    try:
        with client.connect(kernel_id) as conn:
            assert conn.execute("import numpy as np\nbig = np.arange(1 << 20, dtype=np.float64)").status == "ok"
            buffers = wait_for(
                lambda: [k for k in kernel_keys(store, kernel_id) if k.startswith("buffers/")], 30, "the array in S3"
            )
            assert buffers, buffers
            run_on_replica(conn, replace_a_follower(client, kernel_id), "float(big.sum())")
            assert conn.execute("float(big.sum())").result_text() == str(float(sum(range(1 << 20))))
    finally:
        client.shutdown_kernel(kernel_id)
    wait_for(lambda: not kernel_keys(store, kernel_id), 30, "the kernel's prefix to be deleted with it")


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


def test_a_kernel_holds_no_store_keys_and_cannot_reach_another_kernels_objects(
    platform: Platform, store: S3Store
) -> None:
    client = platform.client
    victim, attacker = client.start_kernel(KERNEL), client.start_kernel(KERNEL)
    try:
        with client.connect(victim) as conn_v, client.connect(attacker) as conn_a:
            assert conn_v.execute("import numpy as np\nsecret = np.full(1 << 18, 7.0)").status == "ok"
            key = wait_for(
                lambda: next((k for k in kernel_keys(store, victim) if k.startswith("buffers/")), None),
                30,
                "the victim's array in S3",
            )
            code = (
                f"VICTIM, VICTIM_KEY = {victim!r}, {key!r}\n"
                f"STORE_URL = {store.endpoint + f'/{store.bucket}/{PREFIX}/kernels/{victim}/{key}'!r}\n"
                + ATTACK
                + "\nprint(json.dumps(_out))"
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


def test_a_restarted_gateway_still_signs_for_the_kernels_replicas(platform: Platform, store: S3Store) -> None:
    """The object token is recorded with the kernel: after a gateway crash, the replicas that kept running still
    store and read their buffers, and a replacement restores them."""
    client = platform.client
    kernel_id = client.start_kernel(KERNEL)
    try:
        with client.connect(kernel_id) as conn:
            assert conn.execute("import numpy as np\nbefore = np.ones(1 << 18)").status == "ok"
        kill_the_gateway(platform, client, kernel_id)
        stored = len(kernel_keys(store, kernel_id))
        with client.connect(kernel_id) as conn:
            assert conn.execute("after = np.full(1 << 18, 3.0)", timeout=60).status == "ok"
            wait_for(lambda: len(kernel_keys(store, kernel_id)) > stored, 30, "the new array in S3")
            run_on_replica(conn, replace_a_follower(client, kernel_id), "float(before.sum() + after.sum())")
        client.shutdown_kernel(kernel_id)
        # The restarted gateway listed the store's kernel prefixes at start: deleting one still sees it.
        wait_for(lambda: not kernel_keys(store, kernel_id), 30, "the kernel's prefix to be deleted with it")
    finally:
        with contextlib.suppress(GatewayError):
            client.shutdown_kernel(kernel_id)
