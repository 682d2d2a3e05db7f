"""Host pools: the kinds of host the autoscaler can add, one per GPU type (or MIG layout).

Without pools the cluster has one implicit pool of ``gpus_per_host`` untyped GPUs per host, and autoscaling is
what it always was. With pools (``c.Scheduler.pools``), every host says which pool it belongs to
(``HostSpec.pool``), and each pool is scaled on its own: from the GPUs committed on its hosts, the cells waiting
for it and the kernels whose home it is (see ``autoscaling``). A kernel's **home pool** is the first pool that
can serve one of its cells, trying its wanted types in order of preference, pools in their configured order (so
list the cheaper pool first): that is the pool scaled out for it.

The config form, one mapping per pool::

    [{"name": "a100", "gpus": 8, "gpu_type": "NVIDIA-A100-SXM4-80GB", "min_hosts": 1, "max_hosts": 20},
     {"name": "mig", "gpus": 7, "device_types": "mig-1g.10gb*7", "max_hosts": 4}]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import gputypes
from .cluster import ClusterModel, HostSpec, Kernel
from .gputypes import Wants, canonical, describe, parse_device_types, summary


@dataclass(frozen=True, slots=True)
class HostPool:
    """One kind of host: its GPUs and their type(s), and the bounds on how many of them autoscaling keeps
    (``max_hosts`` 0: no bound)."""

    name: str
    gpus: int
    gpu_type: str = ""
    device_types: tuple[str, ...] | None = None
    min_hosts: int = 0
    max_hosts: int = 0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a host pool needs a name")
        if self.gpus < 1:
            raise ValueError(f"host pool {self.name}: gpus must be at least 1")
        if self.device_types is not None and len(self.device_types) != self.gpus:
            raise ValueError(f"host pool {self.name}: {self.gpus} GPUs need {self.gpus} device types")
        if self.min_hosts < 0 or self.max_hosts < 0 or (self.max_hosts and self.min_hosts > self.max_hosts):
            raise ValueError(f"host pool {self.name}: need 0 <= min_hosts <= max_hosts (max_hosts 0: no bound)")

    @property
    def types(self) -> tuple[str, ...]:
        """The canonical type of each device of a host of this pool."""
        if self.device_types is not None:
            return tuple(canonical(t) for t in self.device_types)
        return (canonical(self.gpu_type),) * self.gpus

    def capacity(self, wants: Wants) -> int:
        """The most GPUs one cell of a kernel wanting ``wants`` could bind on a host of this pool."""
        types = self.types
        if not wants:
            return sum(1 for t in types if not gputypes.is_mig(t))
        return max((types.count(t) for t in wants), default=0)

    def host_spec(self, name: str, simulated: bool = True) -> HostSpec:
        """A new host of this pool (what the simulator adds; the gateway adds what its launcher reports)."""
        if self.device_types is not None:
            return HostSpec(name, self.gpus, simulated=simulated, device_types=self.types, pool=self.name)
        return HostSpec(name, self.gpus, simulated=simulated, gpu_type=canonical(self.gpu_type), pool=self.name)

    @staticmethod
    def from_config(value: Mapping[str, Any]) -> HostPool:
        """One pool from its config mapping (see the module)."""
        if not isinstance(value, Mapping):
            raise ValueError(f"a host pool must be a mapping (name, gpus, gpu_type...), got {value!r}")
        known = {"name", "gpus", "gpu_type", "device_types", "min_hosts", "max_hosts"}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"host pool {value.get('name')!r}: unknown keys {', '.join(unknown)}")
        raw_types = value.get("device_types")
        device_types: tuple[str, ...] | None = None
        if isinstance(raw_types, str):
            device_types = parse_device_types(raw_types)
        elif raw_types is not None:
            device_types = tuple(canonical(str(t)) for t in raw_types)
        gpus = value.get("gpus", len(device_types) if device_types else 0)
        try:
            return HostPool(
                str(value.get("name", "")),
                int(gpus),
                str(value.get("gpu_type", "")),
                device_types,
                int(value.get("min_hosts", 0)),
                int(value.get("max_hosts", 0)),
            )
        except (TypeError, ValueError) as error:
            message = str(error)
            if not message.startswith("host pool"):
                message = f"host pool {value.get('name')!r}: {message}"
            raise ValueError(message) from None

    def to_config(self) -> dict[str, Any]:
        """The config mapping of this pool."""
        out: dict[str, Any] = {"name": self.name, "gpus": self.gpus}
        if self.device_types is not None:
            out["device_types"] = list(self.types)
        elif self.gpu_type:
            out["gpu_type"] = canonical(self.gpu_type)
        out.update(min_hosts=self.min_hosts, max_hosts=self.max_hosts)
        return out


def parse_pools(values: Iterable[Mapping[str, Any]]) -> tuple[HostPool, ...]:
    """Pools from their config form; names must be distinct."""
    pools = tuple(HostPool.from_config(v) for v in values)
    names = [p.name for p in pools]
    if len(names) != len(set(names)):
        raise ValueError(f"host pool names must be distinct, got {', '.join(names)}")
    return pools


def home_pool(pools: Sequence[HostPool], gpus: int, wants: Wants) -> HostPool | None:
    """The pool scaled out for a kernel: the first that can serve its cells, by wanted type, then pool order."""
    choices: list[Wants] = [(kind,) for kind in wants] if wants else [()]
    for want in choices:
        for pool in pools:
            if pool.capacity(want) >= max(1, gpus):
                return pool
    return None


def provides(pools: Sequence[HostPool], wants: Wants) -> int:
    """The most GPUs of a wanted type any pool's host offers (0: no pool provides it)."""
    return max((p.capacity(wants) for p in pools), default=0)


def too_big(model: ClusterModel, pools: Sequence[HostPool], gpus_per_host: int, gpus: int, wants: Wants) -> str:
    """Why no host, present or that autoscaling could add, can ever run a cell of ``gpus`` GPUs of a wanted
    type (``""``: some can). Without pools, scale-out adds hosts of ``gpus_per_host`` untyped GPUs."""
    if not wants:
        largest = max(model.max_host_gpus, provides(pools, ()) if pools else gpus_per_host)
        if gpus <= largest:
            return ""
        return f"it asks for {gpus} GPUs but the largest host has {largest}; set KERNEL_GPUS to {largest} or fewer"
    largest = max(model.capacity(wants), provides(pools, wants))
    if largest == 0:
        here = summary(model.device_counts())
        return (
            f"no host has GPUs of type {describe(wants)} (this cluster has {here}) and no autoscaling pool "
            "provides them; ask for a type the cluster has"
        )
    if gpus <= largest:
        return ""
    return (
        f"it asks for {gpus} GPUs of type {describe(wants)} but the largest host has {largest} of them; set "
        f"KERNEL_GPUS to {largest} or fewer"
    )


def can_grow(model: ClusterModel, pools: Sequence[HostPool], max_hosts: int, kernel: Kernel) -> bool:
    """Whether autoscaling may add a host that serves ``kernel``: its home pool is below the pool's
    ``max_hosts``, or (without pools) the cluster below ``max_hosts``."""
    if pools:
        home = home_pool(pools, kernel.gpus, kernel.wants)
        if home is None:
            return False
        return not home.max_hosts or sum(1 for h in model.hosts.values() if h.pool == home.name) < home.max_hosts
    return not max_hosts or len(model.hosts) < max_hosts
