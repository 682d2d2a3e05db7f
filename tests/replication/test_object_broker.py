"""The object broker between a replica's ObjectStore and an S3 store (moto's server, IAM auth on): the real
``ObjectBrokerHandler`` and ``ObjectBroker`` on a loop thread, the real ``notebookos-broker://`` filesystem.

What a routine gateway restart does to a replica's upload: the gateway is unreachable, then starting (503), then
back; the upload waits and lands instead of losing the cell's names."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from s3_store import S3Store, s3_store_in_environment, serve_broker

from jupyter_notebookos.embedded.runner import free_port
from jupyter_notebookos.replication.brokerfs import BrokerRefused
from jupyter_notebookos.replication.objectstore import BufferCorruptError, ObjectStore, ObjectStoreUnreachable


@pytest.fixture(scope="module")
def store() -> Iterator[S3Store]:
    with s3_store_in_environment() as started:  # the gateway's environment: its broker signs with these keys
        yield started


def brokered(kernel_id: str, url: str, token: str, wait: float = 30.0) -> ObjectStore:
    return ObjectStore(
        f"notebookos-broker://{kernel_id}", storage_options={"broker": url, "token": token, "broker_wait": wait}
    )


def test_buffers_and_checkpoints_round_trip_through_signed_urls(store: S3Store) -> None:
    kernel_id = str(uuid.uuid4())
    broker = serve_broker(f"s3://{store.bucket}/unit", kernel_id, free_port())
    try:
        objects = brokered(kernel_id, broker.url, broker.token)
        data = os.urandom(3 << 20)
        ref = objects.put_buffer(data)
        assert objects.exists(ref.key) and objects.get_buffer(ref) == data
        assert list(objects.buffer_keys()) == [ref.key]
        assert objects.age_seconds(ref.key) is not None
        objects.put_checkpoint(7, b"checkpoint")
        assert objects.checkpoint_seqs() == [7] and objects.get_checkpoint(7) == b"checkpoint"
        # The bytes sit under the kernel's prefix of the store, where the gateway put nothing itself.
        admin = store.fs()
        assert admin.cat_file(f"{store.bucket}/unit/kernels/{kernel_id}/{ref.key}") == data
        # Integrity holds on this store too: a swapped object is refused, not used.
        admin.pipe_file(f"{store.bucket}/unit/kernels/{kernel_id}/{ref.key}", os.urandom(3 << 20))
        with pytest.raises(BufferCorruptError, match="does not match its digest"):
            objects.get_buffer(ref)
        objects.delete(ref.key)
        assert not objects.exists(ref.key)
    finally:
        broker.stop()


def test_a_wrong_token_is_refused(store: S3Store) -> None:
    kernel_id = str(uuid.uuid4())
    broker = serve_broker(f"s3://{store.bucket}/unit", kernel_id, free_port())
    try:
        with pytest.raises(ObjectStoreUnreachable, match="refused"):
            brokered(kernel_id, broker.url, "not-the-token").put_buffer(b"x" * 100)
        with pytest.raises(BrokerRefused):
            brokered(str(uuid.uuid4()), broker.url, broker.token).fs.info(f"{uuid.uuid4()}/buffers/00/x")
    finally:
        broker.stop()


def test_an_upload_waits_for_a_restarting_gateway_instead_of_failing(store: S3Store) -> None:
    kernel_id = str(uuid.uuid4())
    port = free_port()
    first = serve_broker(f"s3://{store.bucket}/unit", kernel_id, port)
    objects = brokered(kernel_id, first.url, first.token)
    objects.put_buffer(os.urandom(1000))
    first.stop()  # the gateway goes away...
    time.sleep(0.5)
    later: list[object] = []

    def come_back() -> None:
        time.sleep(1.5)
        starting = serve_broker(f"s3://{store.bucket}/unit", kernel_id, port, ready=False)  # ...starts again...
        starting.platform.kernels[kernel_id].access.object_token = first.token  # (the token is in its record)
        time.sleep(1.0)
        starting.platform.loop.call_soon_threadsafe(starting.platform.ready.set)  # ...and has re-attached
        later.append(starting)

    threading.Thread(target=come_back, daemon=True).start()
    began = time.monotonic()
    data = os.urandom(2 << 20)
    ref = objects.put_buffer(data)
    assert time.monotonic() - began > 2.0, "the upload should have waited for the gateway"
    assert objects.get_buffer(ref) == data
    for broker in later:
        broker.stop()  # type: ignore[attr-defined]


def test_a_gateway_that_stays_away_fails_the_operation_after_the_wait(store: S3Store) -> None:
    objects = brokered(str(uuid.uuid4()), f"http://127.0.0.1:{free_port()}/api/notebookos/kernels", "t", wait=1.0)
    began = time.monotonic()
    with pytest.raises(ObjectStoreUnreachable, match="did not answer for 1 s"):
        objects.put_buffer(b"x" * 100)
    assert time.monotonic() - began < 10


def test_the_gateways_own_data_urls_open_one_operation_on_one_key_until_they_expire(tmp_path: Path) -> None:
    """A file:// store the gateway serves itself (kernels that cannot mount its volume): the bytes pass through
    the gateway, and each URL it signs opens one operation on one key for a while."""
    import urllib3

    kernel_id = str(uuid.uuid4())
    broker = serve_broker(f"file://{tmp_path}/store", kernel_id, free_port(), expires=2)
    try:
        objects = brokered(kernel_id, broker.url, broker.token)
        data = os.urandom(5 << 20)
        ref = objects.put_buffer(data)
        assert objects.get_buffer(ref) == data and objects.exists(ref.key)
        assert (tmp_path / "store" / "kernels" / kernel_id / ref.key).read_bytes() == data
        assert list(objects.buffer_keys()) == [ref.key]
        assert not list((tmp_path / "store").rglob("*.tmp-*")), "a finished upload leaves no temporary file"

        http = urllib3.PoolManager()
        answer = http.request(
            "POST",
            f"{broker.url}/{kernel_id}/objects",
            json={"op": "get", "key": ref.key},
            headers={"Authorization": f"token {broker.token}"},
        ).json()
        assert answer["method"] == "GET" and http.request("GET", answer["url"]).data == data
        other = ObjectStore.buffer_key("ab" * 32)
        assert http.request("DELETE", answer["url"]).status == 403, "signed for GET, not DELETE"
        assert http.request("GET", answer["url"].replace(ref.key, other)).status == 403, "signed for one key"
        unsigned = answer["url"].split("?")[0]
        assert http.request("GET", unsigned).status == 403
        time.sleep(3)
        assert http.request("GET", answer["url"]).status == 403, "expired"
        objects.delete(ref.key)
        assert not objects.exists(ref.key)
    finally:
        broker.stop()
