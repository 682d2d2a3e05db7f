"""Binding the committed GPUs for one cell's user code, and releasing them after it.

A replica holds GPUs only while a cell runs (DESIGN.md section 5). :class:`GpuBinding` is the one interface
the replica kernel uses:

- :meth:`GpuBinding.bind` makes exactly the committed devices the current ones for the user's code:
  ``CUDA_VISIBLE_DEVICES`` (read by CUDA when it first initialises in this process, and inherited by any
  process the cell starts), :func:`current_devices` (what a cell, or a test, can ask), and for each installed
  framework (:class:`GpuFramework`; torch is the one we ship) its current and default device. State that the
  previous :meth:`~GpuBinding.release` moved to host memory goes back to the device.
- :meth:`GpuBinding.release` moves GPU-resident framework state in the user namespace to host memory, so
  the next executor of the kernel can be another replica, and leaves the process holding no device.
  With ``sticky`` (the replica's ``NOTEBOOKOS_GPU_STICKY``), release leaves the state on the device instead
  (:attr:`GpuBinding.resident`): moving gigabytes out after every cell and back before the next costs
  seconds, for nothing when the next cell runs here on the same device, which is the scheduler's first
  choice. :meth:`GpuBinding.evict` moves it out when the GPU is given to someone else (the replica does it on
  a ``notebookos_evict_request`` on its control channel), and :meth:`GpuBinding.bind` to another device
  evicts first.

Simulated GPUs (hosts without NVML) get the same bookkeeping and no framework calls.

One limitation comes from CUDA itself: a process reads ``CUDA_VISIBLE_DEVICES`` once, when CUDA initialises.
After that the visible set is fixed; a later cell committed to a device outside it runs on the devices the
process can still see, and the cell's stderr says so once.

torch is optional: it is used only when the user's code has already imported it (this module never imports
a framework itself, so binding costs nothing for kernels that do not use one). ``pynvml`` is never imported
here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterable, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)

CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"

# The devices bound for the running cell (host ordinals); empty between cells.
_current: tuple[int, ...] = ()


def current_devices() -> list[int]:
    """The host ordinals of the GPUs bound for the cell that is running now (empty when none are)."""
    return list(_current)


@dataclass(frozen=True)
class HostGpu:
    """One GPU of the replica's host, as the launcher describes it in ``NOTEBOOKOS_GPU_DEVICES``."""

    index: int
    uuid: str = ""
    simulated: bool = True

    @classmethod
    def parse_env(cls, raw: str | None) -> list[HostGpu]:
        """The host's devices from the JSON list in ``NOTEBOOKOS_GPU_DEVICES`` (empty or unset: none)."""
        if not raw or not raw.strip():
            return []
        try:
            items = json.loads(raw)
            return [
                cls(
                    index=int(d["index"]),
                    uuid=str(d.get("uuid", "")),
                    simulated=bool(d.get("simulated", True)),
                )
                for d in items
            ]
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(
                f"NOTEBOOKOS_GPU_DEVICES is not a JSON list of {{'index', 'uuid', 'simulated'}} objects: {exc}"
            ) from exc


@dataclass
class BindResult:
    """What :meth:`GpuBinding.bind` did: the devices bound and anything the user should be told."""

    devices: list[int]
    warnings: list[str] = field(default_factory=list)


@dataclass
class ReleaseResult:
    """What :meth:`GpuBinding.release` did: names whose GPU state moved to host memory, and problems."""

    offloaded: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    kept_on: list[int] = field(default_factory=list)  # sticky: the devices still holding the state
    seconds: float = 0.0


def host_copy(torch: Any, tensor: Any) -> Any:
    """A host copy of a dense device tensor (same shape and strides, not requiring grad). Its pages are faulted in
    first (torch's parallel ``zero_``), then it is copied: ``tensor.to("cpu")`` faults fresh pages in one by one
    inside the driver's copy, which measured 1.1-1.5 GB/s on an H200 against about 7 GB/s this way
    (benchmarks/gpu_offload.py)."""
    with torch.no_grad():
        host = torch.empty_like(tensor, device="cpu")
        host.zero_()
        host.copy_(tensor)
    return host


class GpuFramework(Protocol):
    """One framework's part in binding (torch; others can be added beside it)."""

    name: str

    def loaded(self) -> bool:
        """Whether the user's code has imported the framework (nothing is done otherwise)."""

    def initialised(self) -> bool:
        """Whether the framework has initialised CUDA in this process (visible devices are then fixed)."""

    def bind(self, ordinals: Sequence[int]) -> None:
        """Make in-process device ``ordinals[0]`` current and the default for new tensors."""

    def to_device(self, ns: MutableMapping[str, Any], names: Iterable[str], ordinal: int) -> list[str]:
        """Move the host-resident values of ``names`` back to device ``ordinal``; returns the names moved."""

    def offload(self, ns: MutableMapping[str, Any]) -> list[str]:
        """Move GPU-resident values of ``ns`` to host memory, keeping aliases aliases; returns the names."""

    def unbind(self, release_memory: bool = True) -> None:
        """Reset the default device to the CPU; with ``release_memory``, return cached device memory."""


class TorchFramework:
    """torch: ``torch.cuda.set_device``, ``torch.set_default_device``, tensors and modules moved to host."""

    name = "torch"

    def _torch(self) -> Any:
        return sys.modules.get("torch")

    def loaded(self) -> bool:
        torch = self._torch()
        return torch is not None and hasattr(torch, "cuda")

    def initialised(self) -> bool:
        torch = self._torch()
        try:
            return bool(torch is not None and torch.cuda.is_initialized())
        except Exception:
            return False

    def bind(self, ordinals: Sequence[int]) -> None:
        torch = self._torch()
        if torch is None or not ordinals or not torch.cuda.is_available():
            return
        torch.cuda.set_device(ordinals[0])
        if hasattr(torch, "set_default_device"):
            torch.set_default_device(f"cuda:{ordinals[0]}")

    def to_device(self, ns: MutableMapping[str, Any], names: Iterable[str], ordinal: int) -> list[str]:
        torch = self._torch()
        if torch is None or not torch.cuda.is_available():
            return []
        device = torch.device("cuda", ordinal)
        moved: list[str] = []
        memo: dict[int, Any] = {}
        for name in names:
            value = ns.get(name)
            new = self._move(value, device, memo, want_cuda=False)
            if new is not None:
                if new is not value:
                    ns[name] = new
                moved.append(name)
        return moved

    def offload(self, ns: MutableMapping[str, Any]) -> list[str]:
        torch = self._torch()
        if torch is None:
            return []
        cpu = torch.device("cpu")
        moved: list[str] = []
        memo: dict[int, Any] = {}
        for name, value in list(ns.items()):
            if name.startswith("_"):
                continue
            new = self._move(value, cpu, memo, want_cuda=True)
            if new is not None:
                if new is not value:
                    ns[name] = new
                moved.append(name)
        return moved

    def _move(self, value: Any, device: Any, memo: dict[int, Any], *, want_cuda: bool) -> Any:
        """``value`` on ``device`` (tensors: a new tensor, memoised so aliases stay aliases; modules and
        optimizers: moved in place), or None when it is not framework state on the other side."""
        torch = self._torch()
        key = id(value)
        if key in memo:
            return memo[key]
        result: Any = None
        move = self._to_host if want_cuda else (lambda t: self._to_device(t, device))
        if isinstance(value, torch.Tensor):
            if bool(value.is_cuda) == want_cuda:
                result = move(value)
        elif isinstance(value, torch.nn.Module):
            if any(bool(p.is_cuda) == want_cuda for p in value.parameters()) or any(
                bool(b.is_cuda) == want_cuda for b in value.buffers()
            ):
                if want_cuda:  # in place, as Module.to: parameters keep their identity
                    value._apply(lambda t: self._to_host(t) if t.is_cuda else t)
                else:
                    value.to(device)
                result = value
        elif isinstance(value, torch.optim.Optimizer):
            touched = False
            for state in value.state.values():
                for k, v in list(state.items()):
                    if isinstance(v, torch.Tensor) and bool(v.is_cuda) == want_cuda and v.dim() > 0:
                        state[k] = move(v)
                        touched = True
            result = value if touched else None
        if result is not None:
            memo[key] = result
        return result

    def _to_host(self, tensor: Any) -> Any:
        """A host copy of a device tensor (:func:`host_copy`, the fast way). A tensor that required grad comes back
        a leaf that requires grad, as the user made it (``.to()`` under autograd would make it a non-leaf whose
        ``.grad`` stays empty)."""
        torch = self._torch()
        if tensor.layout != torch.strided or tensor.is_quantized or not tensor.is_leaf:
            return tensor.to("cpu")
        return host_copy(torch, tensor).requires_grad_(tensor.requires_grad)

    def _to_device(self, tensor: Any, device: Any) -> Any:
        """A device copy of a host tensor (a leaf stays a leaf, as in :meth:`_to_host`)."""
        torch = self._torch()
        if not tensor.is_leaf:
            return tensor.to(device)
        with torch.no_grad():
            moved = tensor.to(device)
        return moved.requires_grad_(tensor.requires_grad)

    def unbind(self, release_memory: bool = True) -> None:
        torch = self._torch()
        if torch is None:
            return
        if hasattr(torch, "set_default_device"):
            torch.set_default_device(None)
        if release_memory and self.initialised():
            torch.cuda.empty_cache()


class GpuBinding:
    """Binds the committed devices of a cell for the user's code, and releases them after it.

    ``devices`` are the host's GPUs (from the launcher); ``frameworks`` defaults to torch. Use one instance
    per replica process: it remembers what the previous release moved to host memory, and which devices CUDA
    could see when it initialised.
    """

    def __init__(
        self, devices: Sequence[HostGpu], frameworks: Sequence[GpuFramework] | None = None, *, sticky: bool = False
    ):
        self.devices = {d.index: d for d in devices}
        self.sticky = sticky
        self._resident: tuple[int, ...] = ()  # sticky: devices holding the user's state between cells
        self.frameworks: list[GpuFramework] = list(frameworks) if frameworks is not None else [TorchFramework()]
        self.simulated = all(d.simulated for d in devices)
        self._bound: tuple[int, ...] = ()
        self._offloaded: list[str] = []
        # The devices CUDA saw when it initialised in this process (host ordinals), once it has.
        self._cuda_visible_at_init: tuple[int, ...] | None = None
        self._env_before = os.environ.get(CUDA_VISIBLE_DEVICES)
        if not self.simulated:
            # NVML numbers devices in PCI bus order; make CUDA use the same numbering.
            os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        self._set_env(())

    @property
    def bound(self) -> list[int]:
        """The host ordinals bound now."""
        return list(self._bound)

    @property
    def resident(self) -> list[int]:
        """The devices that still hold the user's GPU state between cells (sticky release); empty if none."""
        return list(self._resident)

    def bind(self, ordinals: Sequence[int], ns: MutableMapping[str, Any] | None = None) -> BindResult:
        """Make ``ordinals`` (host device ordinals) the current devices for the user's code.

        Unknown ordinals are refused (ValueError): the router and the replica disagree about the host.
        With ``ns``, state the previous release moved to host memory goes back to the first device.
        """
        global _current
        unknown = [o for o in ordinals if o not in self.devices]
        if unknown:
            raise ValueError(
                f"GPU(s) {unknown} were committed to this cell but this host has devices {sorted(self.devices)}"
            )
        result = BindResult(devices=list(ordinals))
        if self._resident and tuple(ordinals) != self._resident:
            # The state is on other devices than this cell's: out to host memory, then in again below.
            result.warnings.extend(self.evict(ns).warnings)
        elif self._resident:
            self._resident = ()  # the same devices: the state is where the cell needs it, nothing moves
        if not self.simulated:
            self._note_cuda_init()  # before the environment changes: CUDA may have started in an unbound cell
        self._bound = tuple(ordinals)
        _current = self._bound
        if self._cuda_visible_at_init is None:
            self._set_env(self._bound)
        if self.simulated or not ordinals:
            return result
        local = self._in_process_ordinals(self._bound, result)
        for fw in self.frameworks:
            if not fw.loaded() or not local:
                continue
            try:
                fw.bind(local)
                if ns is not None and self._offloaded:
                    fw.to_device(ns, self._offloaded, local[0])
            except Exception as exc:  # a framework failure must not fail the cell before it starts
                result.warnings.append(f"NotebookOS: could not make GPU {list(ordinals)} current for {fw.name}: {exc}")
        self._offloaded = []
        return result

    def release(self, ns: MutableMapping[str, Any] | None = None) -> ReleaseResult:
        """Move GPU-resident state in ``ns`` to host memory and leave the process holding no device."""
        global _current
        result = ReleaseResult()
        was_bound = self._bound
        self._bound = ()
        _current = ()
        if self.sticky and was_bound:
            # Keep the state on the device until the GPU is given to someone else (evict) or the next cell
            # is bound to other devices.
            self._resident = was_bound
            result.kept_on = list(was_bound)
            if not self.simulated:
                for fw in self.frameworks:
                    if fw.loaded():
                        with contextlib.suppress(Exception):
                            fw.unbind(release_memory=False)
            if self._cuda_visible_at_init is None:
                self._set_env(())
            return result
        if not self.simulated and was_bound:
            self._note_cuda_init()
            for fw in self.frameworks:
                if not fw.loaded():
                    continue
                try:
                    if ns is not None:
                        result.offloaded.extend(fw.offload(ns))
                    fw.unbind()
                except Exception as exc:
                    result.warnings.append(
                        f"NotebookOS: could not move {fw.name} state off GPU {list(was_bound)}: {exc}. "
                        "It stays on the device and will not be usable if the next cell runs on another "
                        "replica."
                    )
        self._offloaded = sorted(set(result.offloaded))
        if self._cuda_visible_at_init is None:
            self._set_env(())
        return result

    def evict(self, ns: MutableMapping[str, Any] | None = None) -> ReleaseResult:
        """Move the state a sticky release left on the devices to host memory, and free the devices' memory.

        Called when the scheduler gives the GPU to another kernel (the replica's control request), or by
        :meth:`bind` for other devices. A no-op when nothing is resident or a cell holds the devices now."""
        started = time.perf_counter()
        result = ReleaseResult()
        resident, self._resident = self._resident, ()
        if not resident or self._bound:
            self._resident = resident if self._bound else ()
            return result
        if not self.simulated:
            self._note_cuda_init()
            for fw in self.frameworks:
                if not fw.loaded():
                    continue
                try:
                    if ns is not None:
                        result.offloaded.extend(fw.offload(ns))
                    fw.unbind(release_memory=True)
                except Exception as exc:
                    result.warnings.append(
                        f"NotebookOS: could not move {fw.name} state off GPU {list(resident)}: {exc}. "
                        "It stays on the device."
                    )
        self._offloaded = sorted(set(result.offloaded))
        result.seconds = time.perf_counter() - started
        return result

    # -- internals ---------------------------------------------------------------------------------

    def _set_env(self, ordinals: Sequence[int]) -> None:
        os.environ[CUDA_VISIBLE_DEVICES] = ",".join(str(o) for o in ordinals)

    def _note_cuda_init(self) -> None:
        if self._cuda_visible_at_init is None and any(fw.loaded() and fw.initialised() for fw in self.frameworks):
            raw = os.environ.get(CUDA_VISIBLE_DEVICES, "")
            self._cuda_visible_at_init = tuple(int(x) for x in raw.split(",") if x.strip().isdigit())

    def _in_process_ordinals(self, ordinals: Sequence[int], result: BindResult) -> list[int]:
        """The in-process CUDA ordinals of host devices ``ordinals``."""
        visible = self._cuda_visible_at_init
        if visible is None:
            # CUDA not initialised yet: it will see exactly the committed devices, numbered from 0.
            return list(range(len(ordinals)))
        local = [visible.index(o) for o in ordinals if o in visible]
        if len(local) < len(ordinals):
            result.warnings.append(
                f"NotebookOS: this cell was given GPU(s) {list(ordinals)}, but CUDA in this kernel "
                f"process was initialised with GPU(s) {list(visible)} visible and cannot see others; "
                f"the cell uses {[visible[i] for i in local] or 'no GPU'}."
            )
        return local
