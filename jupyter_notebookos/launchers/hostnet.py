"""Simulated hosts as network namespaces (embedded mode, as root): network partitions on one machine.

With ``notebookos up --host-network netns`` every simulated host gets a network namespace of its own, joined to a
bridge of this platform by a veth pair. Its replicas bind their sockets on the host's address and reach etcd on the
bridge's; the gateway reaches them the same way. Taking the host's end of the veth pair down cuts that host off
from etcd and the gateway (packets are dropped, connections hang, as in a real partition) until it is brought up
again: :meth:`HostNetwork.partition` and :meth:`HostNetwork.heal`, or ``python -m
jupyter_notebookos.launchers.hostnet partition|heal STATE_DIR HOST``.

Names and addresses derive from the platform's state directory, so ``notebookos up`` (the bridge, etcd's listen
address), the gateway's launcher (one namespace per host, created when a replica first starts there) and a test
agree without talking; the host-to-address table is kept in ``<state_dir>/hostnet.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

TABLE = "hostnet.json"


class HostNetworkError(RuntimeError):
    """A namespace, veth pair or bridge could not be set up (not root, no ``ip`` command, ...)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise HostNetworkError("the `ip` command (iproute2) is missing: hosts cannot be network namespaces") from None
    if check and done.returncode != 0:
        raise HostNetworkError(f"ip {' '.join(args)}: {done.stderr.strip() or f'exit code {done.returncode}'}")
    return done


@dataclass(frozen=True)
class HostNetwork:
    """The bridge, namespaces and addresses of one platform's simulated hosts."""

    state_dir: Path
    tag: str  # 4 hex digits, in every interface and namespace name of this platform
    subnet: ipaddress.IPv4Network

    @classmethod
    def for_state_dir(cls, state_dir: str | os.PathLike[str]) -> HostNetwork:
        """The network of the platform whose state lives in ``state_dir`` (always the same for one directory)."""
        path = Path(state_dir).resolve()
        digest = hashlib.sha256(str(path).encode()).digest()
        subnet = ipaddress.IPv4Network(f"10.{200 + digest[2] % 50}.{digest[3]}.0/24")
        return cls(path, digest[:2].hex(), subnet)

    @staticmethod
    def unavailable() -> str | None:
        """Why hosts cannot be network namespaces here, or None when they can."""
        if os.geteuid() != 0:
            return "network namespaces need root (run `notebookos up --host-network netns` as root)"
        if shutil.which("ip") is None:
            return "the `ip` command (iproute2) is missing"
        return None

    @property
    def bridge(self) -> str:
        return f"nbos{self.tag}"

    @property
    def bridge_ip(self) -> str:
        """The address etcd (and the gateway's side) has on the bridge: the first of the subnet."""
        return str(self.subnet.network_address + 1)

    def namespace(self, host: str) -> str:
        return f"nbos-{self.tag}-{host}"

    def _veth(self, index: int) -> tuple[str, str]:
        return f"nb{self.tag}h{index}", f"nb{self.tag}n{index}"  # the bridge's end, the namespace's end

    # -- set-up and removal ----------------------------------------------------------------------------

    @property
    def bridge_mac(self) -> str:
        """The bridge's fixed, locally administered MAC address.

        A bridge whose address was not set takes the lowest MAC of its ports, so a host joining later could change
        it under the ARP caches of the hosts already joined: their packets to etcd and the gateway would go to the
        old address, now a port's, and be lost until the cache entry expires (CI saw replicas on a host of the first
        kernel unable to reach etcd for 20 s after a fourth host joined)."""
        return "02:4e:42:" + ":".join(self.tag[i : i + 2] for i in (0, 2)) + ":01"

    def ensure_bridge(self) -> None:
        """Create the bridge with its addresses (idempotent)."""
        if _ip("link", "show", self.bridge, check=False).returncode != 0:
            _ip("link", "add", self.bridge, "address", self.bridge_mac, "type", "bridge")
        if self.bridge_ip not in _ip("-4", "addr", "show", self.bridge).stdout:
            _ip("addr", "add", f"{self.bridge_ip}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def ensure_host(self, host: str) -> str:
        """The host's namespace, joined to the bridge (created the first time); returns the host's address."""
        self.ensure_bridge()
        index = self._index(host)
        address = str(self.subnet.network_address + 1 + index)
        namespace = self.namespace(host)
        outside, inside = self._veth(index)
        if namespace not in _ip("netns", "list").stdout.split():
            _ip("netns", "add", namespace)
        if _ip("link", "show", outside, check=False).returncode != 0:
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", outside, "master", self.bridge)
            _ip("link", "set", inside, "netns", namespace)
            _ip("-n", namespace, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", inside)
            _ip("-n", namespace, "link", "set", inside, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
            _ip("-n", namespace, "route", "add", "default", "via", self.bridge_ip)
            _ip("link", "set", outside, "up")
        return address

    def command(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` run inside the host's namespace."""
        return ["ip", "netns", "exec", self.namespace(host), *argv]

    def remove(self) -> None:
        """Every namespace, veth pair and the bridge of this platform (what is already gone is skipped)."""
        for host, index in self._table().items():
            _ip("link", "del", self._veth(index)[0], check=False)
            _ip("netns", "del", self.namespace(host), check=False)
        _ip("link", "del", self.bridge, check=False)
        with contextlib.suppress(OSError):
            (self.state_dir / TABLE).unlink()

    # -- partitions ------------------------------------------------------------------------------------

    def partition(self, host: str) -> None:
        """Cut the host off from etcd, the gateway and the other hosts (its processes keep running)."""
        _ip("link", "set", self._veth(self._known(host))[0], "down")

    def heal(self, host: str) -> None:
        """Join a partitioned host again."""
        _ip("link", "set", self._veth(self._known(host))[0], "up")

    def partitioned(self, host: str) -> bool:
        shown = _ip("link", "show", self._veth(self._known(host))[0]).stdout
        return "UP" not in shown.partition("<")[2].partition(">")[0].split(",")

    # -- the host table --------------------------------------------------------------------------------

    def _table(self) -> dict[str, int]:
        try:
            table = json.loads((self.state_dir / TABLE).read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): int(v) for k, v in table.items()} if isinstance(table, dict) else {}

    def _known(self, host: str) -> int:
        index = self._table().get(host)
        if index is None:
            raise HostNetworkError(f"host {host!r} has no network namespace on this platform")
        return index

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.state_dir / f"{TABLE}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _index(self, host: str) -> int:
        """The host's number on the bridge (1 onward), allocated the first time it is asked for."""
        with self._locked():
            table = self._table()
            if host not in table:
                taken = set(table.values())
                free = next(i for i in range(1, self.subnet.num_addresses - 2) if i not in taken)
                table[host] = free
                path = self.state_dir / TABLE
                path.with_suffix(".tmp").write_text(json.dumps(table))
                path.with_suffix(".tmp").replace(path)
            return table[host]


def main(argv: list[str] | None = None) -> int:
    """``partition``/``heal`` a simulated host of a running platform (as root)."""
    parser = argparse.ArgumentParser(prog="python -m jupyter_notebookos.launchers.hostnet", description=main.__doc__)
    parser.add_argument("action", choices=["partition", "heal"])
    parser.add_argument("state_dir", help="the platform's state directory (notebookos up --state-dir)")
    parser.add_argument("host", help="a simulated host, e.g. host-1")
    args = parser.parse_args(argv)
    network = HostNetwork.for_state_dir(args.state_dir)
    try:
        getattr(network, args.action)(args.host)
    except HostNetworkError as err:
        parser.exit(1, f"error: {err}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
