"""Free TCP ports for the embedded platform's listeners (gateway, JupyterLab, JupyterHub, etcd).

A port found free by binding port 0 comes from the kernel's ephemeral range, and the kernel hands it out again to
the next process that binds port 0 (a ZMQ ``tcp://...:*`` socket of a replica, an outgoing connection) before the
service it was picked for has bound it. That happened with two test workers side by side: the gateway's port was
taken by another platform's ZMQ socket while the gateway imported, and the platform failed to start. So ports are
drawn at random below the ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``), where binding port 0 never
lands, and checked free. Where that leaves too little room, they come from port 0 as before.

A port picked is free only at that moment: the service it is for binds it later. So a process never hands out the
same port twice (:data:`_handed_out`), and `notebookos up` excludes the ports it was given (``--port`` and the
like) before it picks etcd's. Processes picking side by side (parallel test workers) can each be given a range of
their own with ``NOTEBOOKOS_PORTS=LOW-HIGH``.

Kernels' ports come from the same range, in a part of their own (:func:`kernel_range`, the gateway's default
``port_range``: Enterprise Gateway's own picking binds port 0), and the services' from the first quarter: an etcd
member restarted on its port must not find a kernel there.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket

LOOPBACK = "127.0.0.1"
LOWEST = 15000  # below: well-known and registered services cluster there
ENV_RANGE = "NOTEBOOKOS_PORTS"
_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
_ATTEMPTS = 200
#: Ports this process picked (or was told are taken): never picked again, as their services may not have bound them.
_handed_out: set[int] = set()


def _ephemeral_start() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError), open(_RANGE_FILE) as ranges:
        return int(ranges.read().split()[0])
    return 32768  # Linux's default


def pick_range() -> tuple[int, int]:
    """The ports to draw from, both ends included: ``NOTEBOOKOS_PORTS`` if set, else from :data:`LOWEST` to just
    below the ephemeral range. Raises ValueError for a malformed ``NOTEBOOKOS_PORTS``."""
    given = os.environ.get(ENV_RANGE, "").strip()
    if not given:
        return LOWEST, _ephemeral_start() - 1
    low, sep, high = given.partition("-")
    try:
        bounds = int(low), int(high)
    except ValueError:
        bounds = (0, 0)
    if not sep or not 1024 <= bounds[0] <= bounds[1] <= 65535:
        raise ValueError(f"{ENV_RANGE}={given!r}: expected LOW-HIGH, two ports from 1024 to 65535, LOW <= HIGH")
    return bounds


#: The services' part of the range: its first 1/SERVICE_SHARE (the rest is the kernels', see kernel_range).
SERVICE_SHARE = 4
#: The fewest ports Enterprise Gateway accepts in a port range (its EG_MIN_PORT_RANGE_SIZE default).
KERNEL_RANGE_MIN = 1000


def kernel_range() -> tuple[int, int] | None:
    """The ports kernels' connection files are drawn from (both ends included): the range's last three quarters,
    which :func:`free_ports` never picks from; None where that part is too small for Enterprise Gateway."""
    return _kernel_part(*pick_range())


def _kernel_part(low: int, high: int) -> tuple[int, int] | None:
    first = low + (high - low + 1) // SERVICE_SHARE
    return (first, high) if high - first >= KERNEL_RANGE_MIN else None


def exclude(*ports: int) -> None:
    """Never pick ``ports`` in this process (0 is ignored): they are promised to a service that has not bound them."""
    _handed_out.update(p for p in ports if p)


def is_free(port: int, host: str = LOOPBACK) -> bool:
    """Whether nothing is bound to TCP ``port`` on ``host`` (a port in TIME_WAIT counts as free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # The services listen with SO_REUSEADDR (tornado, etcd): a port in TIME_WAIT is free for them too.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _from_port_zero(count: int, host: str) -> list[int]:
    sockets = []
    try:
        for _ in range(count):  # all bound at once, so they are distinct
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct TCP ports on ``host`` that nothing is bound to right now."""
    low, top = pick_range()
    if top - low < 1000 and not os.environ.get(ENV_RANGE):
        return _from_port_zero(count, host)
    kernels = _kernel_part(low, top)
    if kernels is not None:
        top = kernels[0] - 1  # the services' part: the kernels' is never picked from here
    draw = random.SystemRandom()
    picked: list[int] = []
    for _ in range(_ATTEMPTS):
        if len(picked) == count:
            break
        port = draw.randint(low, top)
        if port not in picked and port not in _handed_out and is_free(port, host):
            picked.append(port)
    picked += _from_port_zero(count - len(picked), host)
    exclude(*picked)
    return picked


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port on ``host`` that nothing is bound to right now."""
    return free_ports(1, host)[0]


__all__ = ["exclude", "free_port", "free_ports", "is_free", "kernel_range", "pick_range"]
