"""The data endpoint of a ``file://`` store the gateway brokers (objectbroker.ObjectDataHandler), served by a real
tornado server in this process: objects go in whole or not at all, and no file operation runs on the event loop.

On Kubernetes this endpoint carries every byte of every replica's state when kernels run in a namespace of
their own (the chart's default): the store is then a volume only the gateway mounts, often a network volume.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import pytest
import requests
from tornado import web
from tornado.httpserver import HTTPServer

from jupyter_notebookos.gateway.control.objectbroker import LocalObjectBroker, broker_handlers

KERNEL = "k-1"


@dataclass
class Endpoint:
    broker: LocalObjectBroker
    root: Path

    def url(self, op: str, key: str) -> str:
        _, url = asyncio.run(self.broker.sign(KERNEL, op, key))
        return url

    def leftovers(self) -> list[str]:
        return sorted(p.name for p in self.root.rglob("*") if p.is_file())


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[Endpoint]:
    """The gateway's object routes on a free port, its loop in a thread of its own."""
    root = tmp_path / "objects"
    started = threading.Event()
    state: dict[str, object] = {}

    def serve() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        listener.close()
        broker = LocalObjectBroker(f"file://{root}", f"http://127.0.0.1:{port}/api/notebookos/kernels")
        app = web.Application(broker_handlers(), notebookos_platform=SimpleNamespace(object_broker=broker))
        server = HTTPServer(app)
        server.listen(port, "127.0.0.1")
        state.update(loop=loop, broker=broker, server=server)
        loop.call_soon(started.set)
        loop.run_forever()
        server.stop()
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10)
    loop = state["loop"]
    assert isinstance(loop, asyncio.AbstractEventLoop)
    broker = state["broker"]
    assert isinstance(broker, LocalObjectBroker)
    try:
        yield Endpoint(broker, root)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_objects_go_in_and_come_out_whole(endpoint: Endpoint) -> None:
    big = os.urandom(9 << 20) + b"tail"  # more than two of the handler's 4 MiB writes
    for key, data in (("buffers/ab/big", big), ("deltas/empty", b""), ("small", b"x" * 1000)):
        put = requests.put(endpoint.url("put", key), data=data, timeout=30)
        assert put.status_code == 200, put.text
        head = requests.head(endpoint.url("head", key), timeout=30)
        assert head.status_code == 200 and int(head.headers["Content-Length"]) == len(data)
        got = requests.get(endpoint.url("get", key), timeout=30)
        assert got.status_code == 200 and got.content == data
    streamed = requests.put(endpoint.url("put", "streamed"), data=iter([big[: 1 << 20], big[1 << 20 :]]), timeout=30)
    assert streamed.status_code == 200  # chunked transfer encoding: no Content-Length up front
    assert requests.get(endpoint.url("get", "streamed"), timeout=30).content == big
    assert requests.delete(endpoint.url("delete", "small"), timeout=30).status_code == 204
    assert requests.get(endpoint.url("get", "small"), timeout=30).status_code == 404
    assert requests.head(endpoint.url("head", "small"), timeout=30).status_code == 404
    assert endpoint.leftovers() == ["big", "empty", "streamed"]
    # A URL signed for one operation does not open another, nor another key.
    assert requests.get(endpoint.url("put", "streamed"), timeout=30).status_code == 403
    assert requests.get(endpoint.url("get", "streamed").replace("streamed", "other"), timeout=30).status_code == 403


def test_an_upload_cut_off_midway_leaves_nothing_behind(endpoint: Endpoint) -> None:
    url = urlsplit(endpoint.url("put", "buffers/cd/cut"))
    with socket.create_connection((url.hostname or "", url.port or 80), timeout=30) as conn:
        conn.sendall(
            f"PUT {url.path}?{url.query} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Length: {32 << 20}\r\n\r\n".encode()
        )
        conn.sendall(os.urandom(10 << 20))  # two gathered writes reach the file, then the client is gone
        time.sleep(0.5)
    deadline = time.monotonic() + 10
    while endpoint.leftovers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert endpoint.leftovers() == []
    assert requests.head(endpoint.url("head", "buffers/cd/cut"), timeout=30).status_code == 404


def test_a_file_operation_that_blocks_does_not_hold_up_other_requests(endpoint: Endpoint) -> None:
    """On a network volume an open, a read or a close can take seconds. Here the object is a named pipe that
    nobody writes yet, so opening it blocks; on the event loop that stopped every request to the gateway."""
    requests.put(endpoint.url("put", "other"), data=b"123", timeout=30).raise_for_status()
    pipe = endpoint.broker.path(KERNEL, "stuck")
    os.mkfifo(pipe)
    outcome: dict[str, requests.Response] = {}
    reader = threading.Thread(
        target=lambda: outcome.update(get=requests.get(endpoint.url("get", "stuck"), timeout=60)), daemon=True
    )
    reader.start()
    try:
        time.sleep(0.5)  # the GET is now in open()
        assert "get" not in outcome
        began = time.monotonic()
        other = requests.get(endpoint.url("get", "other"), timeout=10)
        assert other.status_code == 200 and other.content == b"123"
        assert time.monotonic() - began < 5
    finally:
        os.close(os.open(pipe, os.O_WRONLY))  # a writer comes and goes: the GET reads an empty object
        reader.join(30)
    assert outcome["get"].status_code == 200 and outcome["get"].content == b""
