"""GPU state kept on the device between cells (sticky release), and moved off only when the GPU changes hands.

With ``NotebookOSGatewayApp.gpu_sticky`` a replica's framework state (tensors, models) stays on the GPU after its
cell instead of being copied to host memory and back before the next cell: the next cell of the kernel most often
runs on the same replica and device (the scheduler prefers it), and a copy of gigabytes each way costs seconds. The
scheduler counts the GPU as free all the same. Each execute_reply says which devices still hold the replica's state
(``metadata.notebookos.resident``), and :class:`GpuResidency` keeps that map. When the scheduler then gives such a
device to another replica (another kernel's, or another replica of the same kernel), :meth:`GpuResidency.make_room`
first asks the resident replica, on its control channel (``notebookos_evict_request``), to move its state to host
memory, and waits for the answer; that time is part of the new cell's ``queued_ms``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: Asks a replica (kernel id, replica id) to move its GPU state off its devices; returns the replica's answer.
Evict = Callable[[str, str], Awaitable[dict[str, object]]]


@dataclass(frozen=True)
class Resident:
    """One replica whose state stays on ``devices`` of ``host``."""

    kernel_id: str
    replica_id: str
    host: str
    devices: tuple[int, ...]


@dataclass
class Eviction:
    """What one eviction before a cell did (logged as one line)."""

    resident: Resident
    seconds: float
    status: str
    detail: str = ""

    def __str__(self) -> str:
        where = f"GPU {list(self.resident.devices)} of {self.resident.host}"
        who = f"replica {self.resident.replica_id} of kernel {self.resident.kernel_id}"
        if self.status == "ok":
            return f"evicted {who} from {where} in {self.seconds * 1000:.0f} ms"
        return f"evicting {who} from {where} failed after {self.seconds * 1000:.0f} ms: {self.detail}"


class GpuResidency:
    """Which replica's state stays on which GPU between cells; evicts it when another replica gets the GPU."""

    def __init__(self) -> None:
        self._by_replica: dict[tuple[str, str], Resident] = {}
        self.evictions = 0

    def note(self, kernel_id: str, replica_id: str, host: str, devices: list[int]) -> None:
        """A replica's reply said its state stays on ``devices`` of ``host`` (empty: it holds none)."""
        key = (kernel_id, replica_id)
        if devices:
            self._by_replica[key] = Resident(kernel_id, replica_id, host, tuple(sorted(devices)))
        else:
            self._by_replica.pop(key, None)

    def forget(self, kernel_id: str, replica_id: str | None = None) -> None:
        """A replica (or a whole kernel) is gone: its processes took their device memory with them."""
        for key in [k for k in self._by_replica if k[0] == kernel_id and (replica_id is None or k[1] == replica_id)]:
            del self._by_replica[key]

    def resident_on(self, kernel_id: str, replica_id: str) -> list[int]:
        """The devices a replica's state stays on now."""
        found = self._by_replica.get((kernel_id, replica_id))
        return list(found.devices) if found is not None else []

    def in_the_way(self, kernel_id: str, replica_id: str, host: str, devices: tuple[int, ...]) -> list[Resident]:
        """Other replicas whose state stays on any of ``devices`` of ``host``."""
        wanted = set(devices)
        return [
            r
            for key, r in self._by_replica.items()
            if key != (kernel_id, replica_id) and r.host == host and wanted & set(r.devices)
        ]

    async def make_room(
        self, kernel_id: str, replica_id: str, host: str, devices: tuple[int, ...], evict: Evict
    ) -> list[Eviction]:
        """Before ``replica_id`` of ``kernel_id`` runs a cell on ``devices`` of ``host``: move every other
        replica's state off them. A replica that does not answer loses its entry all the same (its process may be
        gone; the device memory then went with it)."""
        done = []
        for resident in self.in_the_way(kernel_id, replica_id, host, devices):
            began = time.monotonic()
            try:
                answer = await evict(resident.kernel_id, resident.replica_id)
                status = str(answer.get("status", "error"))
                detail = str(answer.get("evalue", "")) if status != "ok" else ""
            except Exception as exc:  # the cell must not fail because a neighbour did not answer
                status, detail = "error", f"{type(exc).__name__}: {exc}"
            self._by_replica.pop((resident.kernel_id, resident.replica_id), None)
            self.evictions += 1
            eviction = Eviction(resident, time.monotonic() - began, status, detail)
            (log.info if status == "ok" else log.warning)("%s", eviction)
            done.append(eviction)
        return done
