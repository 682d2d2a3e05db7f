"""A kernel's ports taken between the kernel manager's choice and the router's bind.

Enterprise Gateway picks a kernel's five ports by binding free ones and letting them go; the router binds them
later, after an etcd round trip. Kernels started at once (JupyterLab opening a workspace) can pick each other's
ports meanwhile, and the second bind failed the kernel's start with HTTP 500 (``Address already in use``, seen in
CI). A new kernel's router now takes another free port in the range and the kernel manager adopts it; a port
that is freed soon is kept (a restarted kernel binds its ports again while the previous router's sockets close).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from jupyter_client import KernelManager

from jupyter_notebookos.gateway.router.sockets import bind_client_socket
from jupyter_notebookos.gateway.web.processproxy import adopt_ports


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


def _taken() -> socket.socket:
    """A port some other process listens on."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def _free_range(size: int) -> tuple[int, int]:
    """``size`` consecutive ports nothing uses now, below the ephemeral range (where nothing binds port 0)."""
    for lowest in range(20000, 30000, size):
        probes = []
        try:
            for port in range(lowest, lowest + size):
                probe = socket.socket()
                probes.append(probe)
                probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
        return lowest, lowest + size - 1
    raise AssertionError("no free range of ports")


def _round_trip(ctx: zmq.Context[zmq.Socket[bytes]], server: zmq.Socket[bytes], port: int) -> None:
    client = ctx.socket(zmq.REQ)
    client.setsockopt(zmq.LINGER, 0)
    client.connect(f"tcp://127.0.0.1:{port}")
    client.send(b"ping")
    assert server.poll(5000), "nothing reached the socket at the port it says it bound"
    assert server.recv() == b"ping"
    server.send(b"pong")
    assert client.poll(5000) and client.recv() == b"pong"
    client.close(0)


def test_a_free_port_binds_as_chosen(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    lowest, highest = _free_range(4)
    server = ctx.socket(zmq.REP)
    assert asyncio.run(bind_client_socket(server, "127.0.0.1", lowest + 1, (lowest, highest))) == lowest + 1
    _round_trip(ctx, server, lowest + 1)
    server.close(0)


def test_a_taken_port_of_a_new_kernel_is_replaced_by_a_free_one_in_its_range(
    ctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    lowest, highest = _free_range(8)
    holder = socket.socket()
    holder.bind(("127.0.0.1", lowest))
    holder.listen()
    server = ctx.socket(zmq.REP)
    port = asyncio.run(bind_client_socket(server, "127.0.0.1", lowest, (lowest, highest), wait_s=0.05))
    assert port != lowest and lowest <= port <= highest
    _round_trip(ctx, server, port)
    server.close(0)
    holder.close()


def test_a_port_freed_soon_is_kept(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    """A restarted kernel binds its ports again while ZMQ's I/O thread may still close the previous router's."""
    holder = _taken()
    taken = holder.getsockname()[1]
    threading.Timer(0.1, holder.close).start()
    server = ctx.socket(zmq.REP)
    assert asyncio.run(bind_client_socket(server, "127.0.0.1", taken, (0, 0), wait_s=5)) == taken
    _round_trip(ctx, server, taken)
    server.close(0)


def test_with_no_range_configured_any_free_port_replaces_a_taken_one(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    holder = _taken()
    taken = holder.getsockname()[1]
    server = ctx.socket(zmq.REP)
    port = asyncio.run(bind_client_socket(server, "127.0.0.1", taken, (0, 0), wait_s=0))
    assert port not in (0, taken)
    _round_trip(ctx, server, port)
    server.close(0)
    holder.close()


def test_a_taken_port_that_must_stay_is_an_error(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    holder = _taken()
    server = ctx.socket(zmq.REP)
    with pytest.raises(zmq.ZMQError) as caught:
        asyncio.run(bind_client_socket(server, "127.0.0.1", holder.getsockname()[1], None, wait_s=0.05))
    assert caught.value.errno == zmq.EADDRINUSE
    server.close(0)
    holder.close()


def test_a_range_with_no_free_port_left_is_an_error(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    lowest, highest = _free_range(2)
    holders = []
    for port in (lowest, highest):
        holder = socket.socket()
        holder.bind(("127.0.0.1", port))
        holder.listen()
        holders.append(holder)
    server = ctx.socket(zmq.REP)
    with pytest.raises(zmq.ZMQBindError):
        asyncio.run(bind_client_socket(server, "127.0.0.1", lowest, (lowest, highest), wait_s=0))
    server.close(0)
    for holder in holders:
        holder.close()


def test_the_kernel_manager_adopts_the_ports_its_router_bound_and_rewrites_its_connection_file(
    tmp_path: Path,
) -> None:
    km = KernelManager(connection_file=str(tmp_path / "kernel-1.json"), ip="127.0.0.1")
    km.write_connection_file()
    before = json.loads(Path(km.connection_file).read_text())
    moved = {
        "shell": before["shell_port"],
        "iopub": before["iopub_port"] + 1000,
        "stdin": before["stdin_port"],
        "control": before["control_port"],
        "hb": before["hb_port"] + 1000,
    }
    adopt_ports(km, moved)
    after = json.loads(Path(km.connection_file).read_text())
    assert {name: after[f"{name}_port"] for name in moved} == moved
    assert {k: v for k, v in after.items() if not k.endswith("_port")} == {
        k: v for k, v in before.items() if not k.endswith("_port")
    }
    info = km.get_connection_info()
    assert {name: info[f"{name}_port"] for name in moved} == moved
    km.cleanup_connection_file()
    assert not Path(km.connection_file).exists()
