"""GPU types: what kind of device a host offers and what kind a kernel asks for.

A device's type is a name: the GPU's product name (NVML's ``nvmlDeviceGetName``, or the node label
``nvidia.com/gpu.product`` on Kubernetes, e.g. ``NVIDIA-A100-SXM4-80GB``), or, for a slice of a MIG-partitioned
GPU, its MIG profile (``mig-1g.10gb``, the resource name ``nvidia.com/mig-1g.10gb`` without its prefix). A
device of no known type (a simulated host without ``--gpu-types``) has the type ``""``.

Names are compared in one canonical form (:func:`canonical`): lower case, spaces as dashes, without the
``nvidia.com/`` prefix, so ``"NVIDIA A100-SXM4-80GB"`` (NVML) and ``"NVIDIA-A100-SXM4-80GB"`` (the node label)
are one type.

A kernel asks for a list of types in order of preference (``KERNEL_GPU_TYPES``), or for none: then any whole
GPU does, but never a MIG slice (as on Kubernetes, where a MIG slice is a resource of its own and a plain
``nvidia.com/gpu`` request never gets one). A cell's GPUs are all of one type: the most preferred type of
which the host has enough idle devices.
"""

from __future__ import annotations

from collections.abc import Iterable

#: A kernel's wanted types, canonical, most preferred first; empty: any whole GPU.
Wants = tuple[str, ...]

_PREFIX = "nvidia.com/"


def canonical(name: str) -> str:
    """The canonical form of a GPU type name (see the module's docstring)."""
    text = "-".join(name.strip().lower().split())
    if text.startswith(_PREFIX):
        text = text[len(_PREFIX) :]
    return text


def is_mig(device_type: str) -> bool:
    """Whether a device type is a MIG slice (served only to kernels that name it)."""
    return device_type.startswith("mig-")


def serves(device_type: str, wants: Wants) -> bool:
    """Whether a device of ``device_type`` may run a cell of a kernel that wants ``wants``."""
    if not wants:
        return not is_mig(device_type)
    return device_type in wants


def parse_wants(value: str | Iterable[str] | None) -> Wants:
    """A kernel's wanted types from a comma-separated string or a list (``KERNEL_GPU_TYPES``), canonical and
    without repeats, in the given order."""
    if value is None:
        return ()
    names = value.split(",") if isinstance(value, str) else list(value)
    wanted = [canonical(n) for n in names if n.strip()]
    if any(not w for w in wanted):
        raise ValueError(f"a GPU type name is empty in {value!r}")
    return tuple(dict.fromkeys(wanted))


def parse_device_types(value: str) -> tuple[str, ...]:
    """Per-device types from ``"h100"`` (one device), ``"a100*2,mig-1g.10gb*7"`` (counts) or
    ``"a100,a100"``: the form of ``--gpu-types`` for a simulated host."""
    types: list[str] = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        name, _, count = part.partition("*")
        try:
            n = int(count) if count else 1
        except ValueError:
            raise ValueError(f"{part!r}: expected TYPE or TYPE*COUNT (e.g. a100*2)") from None
        if n < 1 or not name.strip():
            raise ValueError(f"{part!r}: expected TYPE or TYPE*COUNT with a count of at least 1")
        types.extend([canonical(name)] * n)
    return tuple(types)


def overlap(a: Wants, b: Wants) -> bool:
    """Whether two kernels' wanted types can compete for one device."""
    if not a and not b:
        return True
    if not a:
        return any(not is_mig(t) for t in b)
    if not b:
        return any(not is_mig(t) for t in a)
    return bool(set(a) & set(b))


def describe(wants: Wants) -> str:
    """``"any GPU"``, ``"h100"`` or ``"h100 or a100"``: for decision lines."""
    return " or ".join(wants) if wants else "any GPU"


def summary(counts: dict[str, int]) -> str:
    """``"a100 x16, mig-1g.10gb x7"``: the devices of a cluster by type, for refusals."""
    if not counts:
        return "none"
    return ", ".join(f"{t or 'untyped'} x{n}" for t, n in sorted(counts.items()))
