"""What the machines hold: replica memory, host memory and health, real GPUs' utilisation.

The dashboard shows per kernel the memory of its replicas (a kernel's state is held three times, once per
replica) and per host its memory, its health and, where NVML sees real GPUs, their utilisation and memory. These
are read by :class:`MachineReadings` once per history sample (:mod:`~jupyter_notebookos.gateway.control.history`),
never per cell or per request, and added to the cluster view by :meth:`MachineReadings.annotate`.

What can be read depends on where replicas run:

- **embedded mode** (replicas are processes of this machine): each replica's resident memory (RSS, with its
  child processes) from ``psutil``; a host's memory is what its replicas hold, and every simulated host shares
  this one machine's memory, which is shown as such (``machine_memory_*``);
- **Kubernetes** (replicas are pods on other nodes): the gateway sees neither, so memory is ``None`` (unknown);
  the cluster's own metrics (kubelet, cAdvisor) have it;
- **GPUs**: NVML on this machine (:func:`~jupyter_notebookos.gpu.discovery.nvml_readings`), for the real GPUs of
  hosts that are this machine; simulated GPUs have no readings and the fields are left out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psutil

from jupyter_notebookos.gpu.discovery import GpuReading, nvml_readings

#: A machine with less than this share of its memory available is flagged on every host it runs.
LOW_MEMORY_FRACTION = 0.1
#: A GPU whose memory is fuller than this is flagged on its host.
FULL_GPU_MEMORY_FRACTION = 0.95


def process_memory(pid: int) -> int | None:
    """Resident memory of process ``pid`` and its children, in bytes; None when it cannot be read."""
    try:
        process = psutil.Process(pid)
        total = int(process.memory_info().rss)
        for child in process.children(recursive=True):
            try:
                total += int(child.memory_info().rss)
            except psutil.Error:
                continue
    except psutil.Error:
        return None
    return total


@dataclass(frozen=True)
class MachineMemory:
    """This machine's memory (embedded mode: what every simulated host shares)."""

    total_bytes: int
    available_bytes: int

    @classmethod
    def read(cls) -> MachineMemory:
        memory = psutil.virtual_memory()
        return cls(int(memory.total), int(memory.available))


@dataclass
class Readings:
    """One round of readings."""

    at: float = 0.0
    replicas: dict[tuple[str, str], int | None] = field(default_factory=dict)  # (kernel, replica) -> bytes
    machine: MachineMemory | None = None
    gpus: dict[str, GpuReading] = field(default_factory=dict)  # by GPU UUID


class MachineReadings:
    """Reads replica memory, this machine's memory and the real GPUs once per round; annotates cluster views.

    ``local``: replicas are processes of this machine (embedded mode), so their memory and this machine's can be
    read; False on Kubernetes. ``host_gpus`` gives a host's real GPU UUIDs (none for simulated GPUs).
    """

    def __init__(
        self,
        *,
        local: bool,
        host_gpus: Callable[[str], Collection[str]],
        read_process: Callable[[int], int | None] = process_memory,
        read_machine: Callable[[], MachineMemory] = MachineMemory.read,
        read_gpus: Callable[[Collection[str]], dict[str, GpuReading]] = nvml_readings,
    ) -> None:
        self.local = local
        self._host_gpus = host_gpus
        self._read_process = read_process
        self._read_machine = read_machine
        self._read_gpus = read_gpus
        self._latest = Readings()

    def refresh(self, kernels: Iterable[dict[str, Any]], hosts: Iterable[str]) -> Readings:
        """Read everything once: ``kernels`` as the cluster view lists them (their replicas' ``pid`` or ``pod``),
        ``hosts`` by name."""
        readings = Readings(at=time.time())
        if self.local:
            readings.machine = self._read_machine()
            for kernel in kernels:
                for replica in kernel["replicas"]:
                    pid = replica.get("pid")
                    memory = self._read_process(pid) if pid and not replica.get("pod") else None
                    readings.replicas[(kernel["kernel_id"], str(replica["replica_id"]))] = memory
            uuids = {uuid for host in hosts for uuid in self._host_gpus(host)}
            readings.gpus = self._read_gpus(sorted(uuids)) if uuids else {}
        self._latest = readings
        return readings

    @property
    def latest(self) -> Readings:
        return self._latest

    def annotate(self, view: dict[str, Any]) -> None:
        """Add the latest readings to ``view`` (the body of ``GET /api/notebookos/cluster``, before users' views
        are cut from it): per replica and kernel ``memory_bytes``; per host ``memory_bytes`` (its replicas),
        ``machine_memory_*`` (embedded), ``health`` with its ``problems``, and ``gpu_readings`` where NVML read
        real GPUs. ``None`` means unknown."""
        latest = self._latest
        per_host: dict[str, int] = {}
        starting: dict[str, int] = {}
        for kernel in view["kernels"]:
            total: int | None = None
            for replica in kernel["replicas"]:
                memory = latest.replicas.get((kernel["kernel_id"], str(replica["replica_id"])))
                replica["memory_bytes"] = memory
                if memory is not None:
                    total = (total or 0) + memory
                    per_host[replica["host"]] = per_host.get(replica["host"], 0) + memory
                if replica["state"] != "ready":
                    starting[replica["host"]] = starting.get(replica["host"], 0) + 1
            kernel["memory_bytes"] = total
        machine = latest.machine
        for host in view["hosts"]:
            name = host["name"]
            host["memory_bytes"] = per_host.get(name, 0) if self.local else None
            host["shares_machine_memory"] = machine is not None
            host["machine_memory_total_bytes"] = machine.total_bytes if machine else None
            host["machine_memory_available_bytes"] = machine.available_bytes if machine else None
            problems = []
            if starting.get(name):
                problems.append(f"{starting[name]} replica(s) not registered yet")
            if machine is not None and machine.available_bytes < LOW_MEMORY_FRACTION * machine.total_bytes:
                problems.append(
                    f"this machine has {machine.available_bytes / 2**30:.1f} GiB of "
                    f"{machine.total_bytes / 2**30:.1f} GiB memory available"
                )
            gpus = [latest.gpus[uuid] for uuid in self._host_gpus(name) if uuid in latest.gpus]
            for index, gpu in enumerate(gpus):
                if gpu.memory_total_bytes and gpu.memory_used_bytes > FULL_GPU_MEMORY_FRACTION * gpu.memory_total_bytes:
                    problems.append(
                        f"GPU {index} memory is {100 * gpu.memory_used_bytes / gpu.memory_total_bytes:.0f}% full"
                    )
            if gpus:
                host["gpu_readings"] = [
                    {
                        "uuid": gpu.uuid,
                        "utilization_percent": gpu.utilization_percent,
                        "memory_used_bytes": gpu.memory_used_bytes,
                        "memory_total_bytes": gpu.memory_total_bytes,
                    }
                    for gpu in gpus
                ]
            host["health"] = "ok" if not problems else "attention"
            host["problems"] = problems
        view["readings_at"] = round(latest.at, 3) if latest.at else None


def host_gpu_uuids(hosts: Mapping[str, Any]) -> Callable[[str], list[str]]:
    """``host_gpus`` for :class:`MachineReadings` from the platform's host records: their real GPUs' UUIDs."""

    def uuids(name: str) -> list[str]:
        host = hosts.get(name)
        return [d.uuid for d in host.devices if not d.simulated] if host is not None else []

    return uuids


__all__ = ["MachineMemory", "MachineReadings", "Readings", "host_gpu_uuids", "process_memory"]
