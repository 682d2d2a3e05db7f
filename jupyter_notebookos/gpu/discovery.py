"""GPU discovery: the real GPUs NVML reports, or a configured number of simulated ones.

This is the only module of the project that imports ``pynvml`` (from ``nvidia-ml-py``). Without the NVML
library (every machine without an NVIDIA driver) ``nvmlInit`` raises ``NVMLError_LibraryNotFound``: that
means zero real GPUs, not an error, and hosts then get simulated GPUs whose accounting is identical.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuDevice:
    """One GPU of a host: its ordinal on the host, and what it is."""

    index: int
    name: str
    uuid: str
    memory_bytes: int
    simulated: bool


def nvml_devices() -> list[GpuDevice]:
    """The GPUs NVML can see on this machine; an empty list where there is no NVML or no GPU."""
    try:
        import pynvml
    except ImportError:  # nvidia-ml-py is a dependency, but a trimmed image may lack it
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        log.debug("NVML unavailable (%s): no real GPUs", err)
        return []
    try:
        devices = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            devices.append(
                GpuDevice(
                    index=index,
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                    memory_bytes=int(memory),
                    simulated=False,
                )
            )
        return devices
    except pynvml.NVMLError as err:
        log.warning("NVML found a driver but could not list its GPUs (%s): using simulated GPUs", err)
        return []
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


@dataclass(frozen=True)
class GpuReading:
    """What NVML says one real GPU is doing now: its utilisation over the driver's last sample period (about
    1/6 s to 1 s) and its memory."""

    uuid: str
    utilization_percent: int
    memory_used_bytes: int
    memory_total_bytes: int


def nvml_readings(uuids: Collection[str]) -> dict[str, GpuReading]:
    """Utilisation and memory of this machine's real GPUs with these UUIDs, by UUID.

    Empty where there is no NVML (simulated GPUs have none to read); a GPU NVML cannot read is left out.
    """
    if not uuids:
        return {}
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        log.debug("NVML unavailable (%s): no GPU readings", err)
        return {}
    readings = {}
    try:
        for uuid in uuids:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid.encode() if isinstance(uuid, str) else uuid)
                rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            except pynvml.NVMLError as err:
                log.debug("NVML could not read GPU %s: %s", uuid, err)
                continue
            readings[uuid] = GpuReading(uuid, int(rates.gpu), int(memory.used), int(memory.total))
        return readings
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def simulated_devices(host: str, count: int) -> list[GpuDevice]:
    """``count`` simulated GPUs for ``host``, with stable made-up UUIDs."""
    if count < 0:
        raise ValueError(f"a host cannot have {count} GPUs; give 0 or more")
    return [
        GpuDevice(index=i, name="Simulated GPU", uuid=f"GPU-sim-{host}-{i}", memory_bytes=0, simulated=True)
        for i in range(count)
    ]


def host_devices(host: str, simulated_count: int, *, real: list[GpuDevice] | None = None) -> list[GpuDevice]:
    """The GPUs a host offers: the real ones where NVML found any, else ``simulated_count`` simulated ones.

    In the embedded mode every simulated host runs on this one machine, so where the machine has real GPUs
    each host offers those same devices (its replicas run here); the per-host ledger then keeps the accounting
    per host exactly as on a real cluster.
    """
    devices = nvml_devices() if real is None else real
    return devices if devices else simulated_devices(host, simulated_count)
