"""Ports for the embedded platform's listeners come from below the kernel's ephemeral range."""

from __future__ import annotations

import socket
import subprocess
from urllib.parse import urlparse

import pytest

from jupyter_notebookos.embedded import ports, runner
from tests.support import start_platform, stop_platform


def test_free_ports_are_distinct_bindable_and_never_what_port_zero_hands_out() -> None:
    start = ports._ephemeral_start()
    picked = ports.free_ports(20)
    assert len(set(picked)) == 20
    if start - 1 - ports.LOWEST >= 1000:
        assert all(ports.LOWEST <= port < start for port in picked), (picked, start)
    # What the kernel gives port 0 (ZMQ's random ports, outgoing connections) is never one of them.
    with socket.socket() as sock:
        sock.bind((ports.LOOPBACK, 0))
        assert sock.getsockname()[1] >= start
    for port in picked:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((ports.LOOPBACK, port))


def test_a_port_in_use_is_not_picked(monkeypatch) -> None:
    with socket.socket() as busy:
        busy.bind((ports.LOOPBACK, 0))
        busy.listen()
        taken = busy.getsockname()[1]
        free = ports.free_port()  # (below the ephemeral range: never the busy one)
        draws = iter([taken, taken, free])

        class Draw:
            def randint(self, low: int, high: int) -> int:
                return next(draws)

        monkeypatch.setattr(ports, "_handed_out", set())  # (free_port above handed ``free`` out already)
        monkeypatch.setattr(ports.random, "SystemRandom", Draw)
        monkeypatch.setattr(ports, "_ephemeral_start", lambda: 65535)
        assert ports.free_ports(1) == [free]


def test_a_platform_whose_port_is_taken_before_it_starts_comes_up_on_another(tmp_path, monkeypatch) -> None:
    """The port a test picks for a platform's gateway can be bound by another worker's platform before `notebookos
    up` checks it; the platform then starts on another port instead of failing the test."""
    with socket.socket() as busy:
        taken = ports.free_port()
        busy.bind((ports.LOOPBACK, taken))
        busy.listen()
        picks = iter([taken])  # the first pick is the busy port, later ones are really free
        monkeypatch.setattr(runner, "free_port", lambda: next(picks, None) or ports.free_port())
        platform = start_platform(tmp_path / "state")
        try:
            assert urlparse(platform.url).port != taken
            assert "python3-notebookos" in platform.client.request("GET", "/api/kernelspecs")["kernelspecs"]
            assert "is already in use" not in platform.log.read_text()  # (the log is the last attempt's)
        finally:
            stop_platform(platform)


def _time_wait_on(port: int) -> None:
    """Leave a connection to ``port`` in TIME_WAIT (its listening side closes first, as a stopped server's does) and
    nothing listening there."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as tornado's, etcd's and Lab's listeners
        server.bind((ports.LOOPBACK, port))
        server.listen()
        with socket.create_connection((ports.LOOPBACK, port)) as client:
            accepted, _ = server.accept()
            accepted.close()
            client.recv(1)  # the server's FIN: the accepted end is in TIME_WAIT once the client closes
    states = subprocess.run(["ss", "-Htan", "state", "time-wait", f"sport = :{port}"], capture_output=True, text=True)
    assert f":{port} " in states.stdout, states


def test_up_starts_on_a_port_its_last_run_left_in_time_wait(tmp_path) -> None:
    """A restart soon after a stop: the last run's connections to the gateway's port are in TIME_WAIT, nothing
    listens, and the gateway (SO_REUSEADDR, as every server) could bind it; `notebookos up` must not refuse it."""
    port = ports.free_port()
    _time_wait_on(port)
    platform = start_platform(tmp_path / "state", "--port", str(port))
    try:
        assert urlparse(platform.url).port == port, platform.url  # not a retry on another port
        assert "is already in use" not in platform.log.read_text()
    finally:
        stop_platform(platform)


def test_a_port_is_handed_out_once_and_the_range_can_be_narrowed(monkeypatch) -> None:
    monkeypatch.setattr(ports, "_handed_out", set())
    monkeypatch.setenv(ports.ENV_RANGE, "40000-40009")
    picked = ports.free_ports(4) + ports.free_ports(4)  # none bound in between: still all distinct
    assert len(set(picked)) == 8 and all(40000 <= p <= 40009 for p in picked), picked
    ports.exclude(*(p for p in range(40000, 40010) if p not in picked))
    # The range is used up: what is left comes from port 0 (the ephemeral range), still never twice.
    more = ports.free_ports(2)
    assert len(set(more) | set(picked)) == 10 and all(p >= ports._ephemeral_start() for p in more), more
    for bad in ("40000", "a-b", "50000-40000", "80-90"):
        monkeypatch.setenv(ports.ENV_RANGE, bad)
        with pytest.raises(ValueError, match=ports.ENV_RANGE):
            ports.free_port()


def test_kernels_get_a_part_of_the_range_that_services_never_get(monkeypatch) -> None:
    """Enterprise Gateway's own port picking binds port 0, so a plain kernel's ports came from the ephemeral range,
    where a replica's ZMQ socket could take one before the kernel bound it (a kernel left serving nothing). The
    gateway gives kernels the last three quarters of the range below it; services (etcd, restarted on its own
    ports) are picked from the first quarter only."""
    from jupyter_notebookos.gateway.web.gatewayapp import NotebookOSGatewayApp

    monkeypatch.delenv("EG_PORT_RANGE", raising=False)
    monkeypatch.setattr(ports, "_handed_out", set())
    monkeypatch.setenv(ports.ENV_RANGE, "20000-29999")
    assert ports.kernel_range() == (22500, 29999)
    assert NotebookOSGatewayApp().port_range == "22500..29999"
    assert all(20000 <= port < 22500 for port in ports.free_ports(50)), "a service port in the kernels' part"
    monkeypatch.setenv(ports.ENV_RANGE, "40000-40009")  # too small to share (EG wants 1000): EG's port 0 then
    assert ports.kernel_range() is None and NotebookOSGatewayApp().port_range == "0..0"
    monkeypatch.setenv("EG_PORT_RANGE", "50000..51000")  # EG's own setting wins
    assert NotebookOSGatewayApp().port_range == "50000..51000"
