"""Ports for the embedded platform's listeners come from below the kernel's ephemeral range."""

from __future__ import annotations

import socket

from jupyter_notebookos.embedded import ports


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

        monkeypatch.setattr(ports.random, "SystemRandom", Draw)
        monkeypatch.setattr(ports, "_ephemeral_start", lambda: 65535)
        assert ports.free_ports(1) == [free]
