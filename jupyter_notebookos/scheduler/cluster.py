"""The cluster model: hosts and their GPUs, kernels and their replicas, cells holding GPUs.

It is pure bookkeeping with two indexes that keep decisions away from full scans:

* hosts that can run cells, bucketed by idle GPU count (``most_idle_host``: O(GPUs per host));
* hosts that accept new replicas, in a lazy min-heap by pending GPUs per GPU (``least_subscribed``:
  O(log hosts) per host examined).

Policy lives elsewhere (placement, executor, migration, autoscaling); the model only keeps the numbers
consistent. The ``*Spec`` values are what a caller passes in to build or rebuild a model (the gateway
rebuilds from etcd on restart); the mutable records are internal and read-only to callers.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from . import gputypes
from .decisions import MigrationPlan, ReplicaSlot
from .gputypes import Wants, canonical, is_mig, parse_wants
from .quotas import Owner


@dataclass(frozen=True, slots=True)
class HostSpec:
    """A host as the caller describes it. ``device_ids`` default to ``0..gpus-1``.

    ``gpu_type`` is the type of every device (NVML's product name, the node label ``nvidia.com/gpu.product``);
    ``device_types`` gives one type per device instead, in ``device_ids`` order (a MIG-partitioned GPU's
    slices: ``mig-1g.10gb``...). Neither: untyped devices, which serve any kernel that names no type.
    ``pool`` is the autoscaling pool the host belongs to (``""``: the default pool).
    """

    name: str
    gpus: int
    device_ids: tuple[int, ...] | None = None
    simulated: bool = True
    cordoned: bool = False
    gpu_type: str = ""
    device_types: tuple[str, ...] | None = None
    pool: str = ""


@dataclass(frozen=True, slots=True)
class KernelSpec:
    """A kernel and its GPUs per cell (``KERNEL_GPUS``), who owns it, and the GPU types it asks for, most
    preferred first (empty: any whole GPU)."""

    kernel_id: str
    gpus: int
    owner: Owner | None = None
    gpu_types: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RunningCellSpec:
    """A cell that holds GPUs, as recorded in the GPU ledger (used to rebuild the model)."""

    kernel_id: str
    cell_id: str
    replica_id: int
    device_ids: tuple[int, ...]
    started_at: float


class Host:
    """Mutable state of one host (internal; read it, do not change it)."""

    __slots__ = (
        "cordoned",
        "device_ids",
        "draining",
        "free",
        "general",
        "gpus",
        "name",
        "pending",
        "pool",
        "replicas",
        "simulated",
        "type_counts",
        "types",
        "version",
    )

    def __init__(self, spec: HostSpec) -> None:
        ids = spec.device_ids if spec.device_ids is not None else tuple(range(spec.gpus))
        if len(ids) != spec.gpus or len(set(ids)) != spec.gpus:
            raise ValueError(f"host {spec.name}: {spec.gpus} GPUs need {spec.gpus} distinct device ids")
        if spec.device_types is not None:
            if len(spec.device_types) != spec.gpus:
                raise ValueError(f"host {spec.name}: {spec.gpus} GPUs need {spec.gpus} device types")
            kinds = tuple(canonical(t) for t in spec.device_types)
        else:
            kinds = (canonical(spec.gpu_type),) * spec.gpus
        self.name = spec.name
        self.gpus = spec.gpus
        self.device_ids: tuple[int, ...] = tuple(ids)
        self.types: dict[int, str] = dict(zip(ids, kinds, strict=True))  # device id -> canonical type
        self.type_counts: dict[str, int] = {}
        for kind in kinds:
            self.type_counts[kind] = self.type_counts.get(kind, 0) + 1
        self.general = not any(is_mig(k) for k in kinds)  # every device serves a kernel that names no type
        self.pool = spec.pool
        self.simulated = spec.simulated
        self.cordoned = spec.cordoned
        self.draining = False
        self.free: list[int] = sorted(ids)
        self.pending = 0  # sum of the GPU requests of the kernels with a replica (or incoming one) here
        self.replicas: dict[tuple[str, int], None] = {}  # (kernel_id, replica_id), incoming ones included
        self.version = 0

    @property
    def idle(self) -> int:
        """Whole GPUs not committed to any cell (what a kernel that names no type can bind; MIG slices are not
        counted)."""
        if self.general:
            return len(self.free)
        return sum(1 for d in self.free if not is_mig(self.types[d]))

    def idle_for(self, wants: Wants) -> int:
        """Idle devices of one type a cell of a kernel wanting ``wants`` may bind: the most of any wanted type
        (a cell's GPUs are all of one type; a kernel that names no type may mix whole GPUs)."""
        if not wants:
            return self.idle
        best = 0
        for kind in wants:
            if kind in self.type_counts:
                best = max(best, sum(1 for d in self.free if self.types[d] == kind))
        return best

    def bind_type(self, gpus: int, wants: Wants) -> str | None:
        """The type a cell of ``gpus`` GPUs binds here now (the most preferred one with enough idle devices;
        ``""`` for a kernel that names no type), or None when this host cannot bind it now."""
        if not wants:
            return "" if self.idle >= gpus else None
        for kind in wants:
            if kind in self.type_counts and sum(1 for d in self.free if self.types[d] == kind) >= gpus:
                return kind
        return None

    def capacity(self, wants: Wants) -> int:
        """The most GPUs one cell of a kernel wanting ``wants`` could ever bind here."""
        if not wants:
            return self.gpus if self.general else sum(n for k, n in self.type_counts.items() if not is_mig(k))
        return max((self.type_counts.get(kind, 0) for kind in wants), default=0)

    def serves(self, wants: Wants) -> bool:
        """Whether this host has any device a kernel wanting ``wants`` may use."""
        return any(gputypes.serves(kind, wants) for kind in self.type_counts)

    @property
    def committed(self) -> int:
        """GPUs committed to running cells (or to a Reservation session)."""
        return self.gpus - len(self.free)

    @property
    def runnable(self) -> bool:
        """Whether cells may start here (draining hosts are being emptied)."""
        return not self.draining

    @property
    def placeable(self) -> bool:
        """Whether new replicas may come here."""
        return not self.cordoned and not self.draining

    def subscription_ratio(self, replicas_per_kernel: int) -> float:
        """Pending GPUs / GPUs / replicas per kernel."""
        if self.gpus == 0:
            return 0.0 if self.pending == 0 else float("inf")
        return self.pending / self.gpus / max(1, replicas_per_kernel)


class Kernel:
    """Mutable state of one kernel (internal)."""

    __slots__ = (
        "gpus",
        "hold",
        "kernel_id",
        "last_executor",
        "moving",
        "next_replica",
        "owner",
        "replicas",
        "running",
        "wants",
    )

    def __init__(self, kernel_id: str, gpus: int, owner: Owner | None = None, wants: Wants = ()) -> None:
        self.kernel_id = kernel_id
        self.gpus = gpus
        self.owner = owner  # who the kernel's usage counts against (quotas, fair share); None: nobody
        self.wants = wants  # GPU types, most preferred first; empty: any whole GPU
        self.replicas: dict[int, str] = {}  # replica id -> host
        self.next_replica = 0
        self.last_executor: int | None = None
        self.running: Cell | None = None
        self.moving: dict[int, tuple[int, str]] = {}  # replica id -> (migration id, target host)
        self.hold: tuple[str, tuple[int, ...]] | None = None  # Reservation: (host, devices) for life

    def hosts_in_use(self) -> set[str]:
        """Hosts holding a replica of this kernel, including targets of migrations in flight."""
        hosts = set(self.replicas.values())
        for _, target in self.moving.values():
            hosts.add(target)
        return hosts


class Cell:
    """A cell that holds GPUs: running, or waiting for the migration that will run it (internal)."""

    __slots__ = (
        "cell_id",
        "device_ids",
        "gpus",
        "host",
        "kernel_id",
        "migration_id",
        "owns_devices",
        "replica_id",
        "requested_at",
        "started_at",
    )

    def __init__(
        self,
        kernel_id: str,
        cell_id: str,
        replica_id: int,
        host: str,
        device_ids: tuple[int, ...],
        requested_at: float,
        started_at: float | None,
        owns_devices: bool = True,
        migration_id: int | None = None,
    ) -> None:
        self.kernel_id = kernel_id
        self.cell_id = cell_id
        self.replica_id = replica_id
        self.host = host
        self.device_ids = device_ids
        self.gpus = len(device_ids)
        self.requested_at = requested_at
        self.started_at = started_at
        self.owns_devices = owns_devices  # False when the devices are a Reservation session's hold
        self.migration_id = migration_id


class ClusterModel:
    """Hosts, kernels, replicas and committed GPUs, with the indexes the policies need."""

    def __init__(self) -> None:
        self.hosts: dict[str, Host] = {}
        self.kernels: dict[str, Kernel] = {}
        self.demand = 0  # sum of the GPU requests of all kernels
        self._requests: dict[int, int] = {}  # GPU request -> kernels asking for it
        self.busy = 0  # committed GPUs, cluster-wide
        self.total_gpus = 0
        self.max_host_gpus = 0
        self.migrations: dict[int, MigrationPlan] = {}  # in flight
        self.next_migration_id = 1
        self._by_idle: list[dict[str, None]] = [{}]  # runnable hosts by idle (whole) GPUs
        self.by_type: dict[str, dict[str, None]] = {}  # device type -> hosts that have it
        self._heap: list[tuple[float, str, int]] = []  # (pending / gpus, name, version), placeable hosts

    # --- hosts ----------------------------------------------------------------------------------------

    def add_host(self, spec: HostSpec) -> Host:
        """Add a host (its name must be new)."""
        if spec.name in self.hosts:
            raise ValueError(f"host {spec.name} already exists")
        host = Host(spec)
        self.hosts[host.name] = host
        self.total_gpus += host.gpus
        if host.gpus > self.max_host_gpus:
            self.max_host_gpus = host.gpus
            while len(self._by_idle) <= host.gpus:
                self._by_idle.append({})
        self._by_idle[host.idle][host.name] = None
        for kind in host.type_counts:
            self.by_type.setdefault(kind, {})[host.name] = None
        self._push(host)
        return host

    def remove_host(self, name: str) -> None:
        """Forget an empty host (no replicas, no committed GPUs)."""
        host = self.hosts.pop(name)
        assert not host.replicas and host.committed == 0, f"host {name} is not empty"
        self.total_gpus -= host.gpus
        self._by_idle[host.idle].pop(name, None)
        for kind in host.type_counts:
            self.by_type[kind].pop(name, None)
            if not self.by_type[kind]:
                del self.by_type[kind]
        host.version += 1  # invalidates heap entries
        if host.gpus == self.max_host_gpus:
            self.max_host_gpus = max((h.gpus for h in self.hosts.values()), default=0)

    def set_cordoned(self, host: Host, cordoned: bool) -> None:
        """Cordoned hosts keep their replicas (and run their cells) but get no new replicas."""
        host.cordoned = cordoned
        self._push(host)

    def set_draining(self, host: Host, draining: bool) -> None:
        """Draining hosts get no new replicas and start no cells: they are being emptied."""
        if host.draining == draining:
            return
        host.draining = draining
        if draining:
            self._by_idle[host.idle].pop(host.name, None)
        else:
            self._by_idle[host.idle][host.name] = None
        self._push(host)

    def restore(
        self,
        hosts: Iterable[HostSpec],
        kernels: Iterable[KernelSpec],
        replicas: Iterable[ReplicaSlot],
        running: Iterable[RunningCellSpec],
    ) -> list[Kernel]:
        """Rebuild part of the model as recorded (etcd, after a gateway restart); returns the kernels added.

        Raises ``ValueError`` with a precise message if the state is inconsistent.
        """
        model = self
        for spec in hosts:
            model.add_host(spec)
        added = [model.add_kernel(k.kernel_id, k.gpus, k.owner, parse_wants(k.gpu_types)) for k in kernels]
        # In id order: the order of a kernel's replicas breaks ties, and ids grow with the replicas' age.
        for r in sorted(replicas, key=lambda slot: slot.replica_id):
            kernel = model.kernels.get(r.kernel_id)
            host = model.hosts.get(r.host)
            if kernel is None or host is None:
                raise ValueError(f"{r}: unknown {'kernel' if kernel is None else 'host'}")
            if r.host in kernel.hosts_in_use() or r.replica_id in kernel.replicas:
                raise ValueError(f"{r}: the kernel already has that replica or a replica on that host")
            model.add_replica(kernel, host, r.replica_id)
        for c in running:
            kernel = model.kernels.get(c.kernel_id)
            if kernel is None or c.replica_id not in kernel.replicas or kernel.running is not None:
                raise ValueError(f"running cell {c.cell_id}: unknown kernel or replica, or kernel already busy")
            host = model.hosts[kernel.replicas[c.replica_id]]
            model.commit_ids(host, c.device_ids)
            kernel.running = Cell(
                c.kernel_id, c.cell_id, c.replica_id, host.name, c.device_ids, c.started_at, c.started_at
            )
            kernel.last_executor = c.replica_id
        return added

    # --- replicas -------------------------------------------------------------------------------------

    def add_kernel(self, kernel_id: str, gpus: int, owner: Owner | None = None, wants: Wants = ()) -> Kernel:
        """Register a kernel (no replicas yet)."""
        kernel = Kernel(kernel_id, gpus, owner, wants)
        self.kernels[kernel_id] = kernel
        self.demand += gpus
        self._requests[gpus] = self._requests.get(gpus, 0) + 1
        return kernel

    def remove_kernel(self, kernel: Kernel) -> None:
        """Forget a kernel whose replicas and GPUs are gone."""
        assert not kernel.replicas and kernel.running is None and kernel.hold is None
        del self.kernels[kernel.kernel_id]
        self.demand -= kernel.gpus
        left = self._requests[kernel.gpus] - 1
        if left:
            self._requests[kernel.gpus] = left
        else:
            del self._requests[kernel.gpus]

    def add_replica(self, kernel: Kernel, host: Host, replica_id: int | None = None) -> int:
        """Record a replica of ``kernel`` on ``host``; returns its id."""
        if replica_id is None:
            replica_id = kernel.next_replica
        kernel.next_replica = max(kernel.next_replica, replica_id + 1)
        kernel.replicas[replica_id] = host.name
        self.occupy(kernel, replica_id, host)
        return replica_id

    def occupy(self, kernel: Kernel, replica_id: int, host: Host) -> None:
        """Count ``kernel``'s request as pending on ``host`` (a replica or an incoming migration)."""
        host.replicas[(kernel.kernel_id, replica_id)] = None
        host.pending += kernel.gpus
        self._push(host)

    def vacate(self, kernel: Kernel, replica_id: int, host_name: str) -> None:
        """Undo :meth:`occupy` (no-op for a host that is gone)."""
        host = self.hosts.get(host_name)
        if host is None or (kernel.kernel_id, replica_id) not in host.replicas:
            return
        del host.replicas[(kernel.kernel_id, replica_id)]
        host.pending -= kernel.gpus
        self._push(host)

    def rename_replica(self, kernel: Kernel, old: int, new: int, host_name: str) -> None:
        """Replica ``old`` of ``kernel`` (on ``host_name``) is ``new`` from now on, in the same place of every
        order (the kernel's replicas, the host's), so ties still go the way they went."""
        if new in kernel.replicas:
            raise ValueError(f"kernel {kernel.kernel_id} already has a replica r{new}")
        kernel.replicas = {(new if rid == old else rid): h for rid, h in kernel.replicas.items()}
        kernel.replicas[new] = host_name
        host = self.hosts.get(host_name)
        if host is not None and (kernel.kernel_id, old) in host.replicas:
            entry = (kernel.kernel_id, old)
            host.replicas = {((kernel.kernel_id, new) if key == entry else key): None for key in host.replicas}
        if kernel.last_executor == old:
            kernel.last_executor = new
        if kernel.running is not None and kernel.running.replica_id == old:
            kernel.running.replica_id = new

    def remove_replica(self, kernel: Kernel, replica_id: int) -> str:
        """Forget a replica; returns the host it was on."""
        host_name = kernel.replicas.pop(replica_id)
        self.vacate(kernel, replica_id, host_name)
        if kernel.last_executor == replica_id:
            kernel.last_executor = None
        return host_name

    # --- GPUs -----------------------------------------------------------------------------------------

    def commit(self, host: Host, count: int, wants: Wants = ()) -> tuple[int, ...]:
        """Commit the lowest ``count`` idle devices of ``host`` that a kernel wanting ``wants`` may bind (all of
        the most preferred type the host has enough of)."""
        if count == 0:
            return ()
        if not wants and host.general:
            assert count <= len(host.free), f"host {host.name}: {count} GPUs asked, {len(host.free)} idle"
            ids = tuple(host.free[:count])
            self._reindex(host, lambda: host.free.__delitem__(slice(0, count)))
        else:
            kind = host.bind_type(count, wants)
            assert kind is not None, f"host {host.name}: {count} GPUs of {wants or 'any type'} asked, not idle"
            fits = (lambda d: host.types[d] == kind) if wants else (lambda d: not is_mig(host.types[d]))
            ids = tuple([d for d in host.free if fits(d)][:count])
            self._reindex(host, lambda: host.free.__setitem__(slice(None), [d for d in host.free if d not in ids]))
        self.busy += count
        return ids

    def commit_ids(self, host: Host, ids: tuple[int, ...]) -> None:
        """Commit exactly these devices (rebuilding from the ledger)."""
        missing = [i for i in ids if i not in host.free]
        if missing:
            raise ValueError(f"host {host.name}: devices {missing} are unknown or already committed")

        def take() -> None:
            host.free[:] = [i for i in host.free if i not in ids]

        self._reindex(host, take)
        self.busy += len(ids)

    def release(self, host_name: str, ids: tuple[int, ...]) -> None:
        """Return devices to their host (no-op for a host that is gone)."""
        host = self.hosts.get(host_name)
        if host is None or not ids:
            return

        def give_back() -> None:
            host.free.extend(ids)
            host.free.sort()

        self._reindex(host, give_back)
        self.busy -= len(ids)

    def _reindex(self, host: Host, change: Callable[[], None]) -> None:
        if host.draining:
            change()
            return
        self._by_idle[host.idle].pop(host.name, None)
        change()
        self._by_idle[host.idle][host.name] = None

    # --- queries --------------------------------------------------------------------------------------

    @property
    def largest_request(self) -> int:
        """The largest GPU request of any kernel (0 without kernels)."""
        return max(self._requests, default=0)

    def hosts_serving(self, wants: Wants) -> list[Host]:
        """The hosts that have a device of a wanted type (every host for a kernel that names no type), by name."""
        if not wants:
            return [h for _, h in sorted(self.hosts.items())]
        names = {name for kind in wants for name in self.by_type.get(kind, ())}
        return [self.hosts[name] for name in sorted(names)]

    def device_counts(self) -> dict[str, int]:
        """Devices of the cluster by type."""
        counts: dict[str, int] = {}
        for host in self.hosts.values():
            for kind, n in host.type_counts.items():
                counts[kind] = counts.get(kind, 0) + n
        return counts

    def capacity(self, wants: Wants) -> int:
        """The most GPUs one cell of a kernel wanting ``wants`` could bind on any host."""
        if not wants:
            return self.max_host_gpus
        return max((h.capacity(wants) for h in self.hosts_serving(wants)), default=0)

    def hosts_with_idle(self, gpus: int) -> list[Host]:
        """The runnable hosts with at least ``gpus`` idle GPUs."""
        return [self.hosts[name] for tier in self._by_idle[max(0, gpus) :] for name in tier]

    def max_idle(self) -> int:
        """Most idle GPUs on any runnable host."""
        for idle in range(len(self._by_idle) - 1, 0, -1):
            if self._by_idle[idle]:
                return idle
        return 0

    def idle_tier(self, idle: int) -> Collection[str]:
        """Names of the runnable hosts with exactly ``idle`` idle GPUs."""
        return self._by_idle[idle] if 0 <= idle < len(self._by_idle) else ()

    def most_idle_host(
        self, min_idle: int, exclude: Collection[str] = (), placeable_only: bool = False, wants: Wants = ()
    ) -> Host | None:
        """The runnable host with the most idle GPUs (at least ``min_idle``, of a type in ``wants``), skipping
        ``exclude``."""
        if wants:
            best: Host | None = None
            for host in self.hosts_serving(wants):
                if host.name in exclude or not host.runnable or (placeable_only and host.cordoned):
                    continue
                idle = host.idle_for(wants)
                if idle >= min_idle and (best is None or idle > best.idle_for(wants)):
                    best = host
            return best
        for idle in range(len(self._by_idle) - 1, min_idle - 1, -1):
            for name in self._by_idle[idle]:
                if name in exclude:
                    continue
                host = self.hosts[name]
                if placeable_only and host.cordoned:
                    continue
                return host
        return None

    def least_subscribed(
        self,
        count: int,
        fits: Callable[[Host], bool],
        exclude: Collection[str] = (),
        give_up: Callable[[Host], bool] | None = None,
    ) -> list[Host]:
        """Up to ``count`` placeable hosts, least pending GPUs per GPU first, that satisfy ``fits``.

        ``give_up(host)`` may stop the walk early when no later (more subscribed) host can fit.
        """
        chosen: list[Host] = []
        examined: list[Host] = []
        heap = self._heap
        while heap and len(chosen) < count:
            _, name, version = heapq.heappop(heap)
            host = self.hosts.get(name)
            if host is None or host.version != version:
                continue  # stale entry
            examined.append(host)
            if name in exclude:
                continue
            if fits(host):
                chosen.append(host)
            elif give_up is not None and give_up(host):
                break
        for host in examined:  # put back what we took off (their keys are unchanged)
            heapq.heappush(heap, (self._key(host), host.name, host.version))
        return chosen

    @staticmethod
    def _key(host: Host) -> float:
        return host.pending / host.gpus if host.gpus else float("inf")

    def _push(self, host: Host) -> None:
        host.version += 1
        if host.placeable:
            heapq.heappush(self._heap, (self._key(host), host.name, host.version))
        if len(self._heap) > 4 * len(self.hosts) + 64:  # drop stale entries now and then
            self._heap = [(self._key(h), h.name, h.version) for h in self.hosts.values() if h.placeable]
            heapq.heapify(self._heap)
