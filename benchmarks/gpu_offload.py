"""GPU state between cells: moved out and back (the default) against left on the device (sticky).

For a machine with an NVIDIA GPU and torch. Drives the replica's own ``GpuBinding`` (gpu/binding.py) in this
process, as a replica does around each cell, on a namespace holding a model of ``--gb`` GB (square fp32 linear
layers), and measures, against what the link itself gives in the same run:

- the link: one pinned host buffer copied to the device and back (``copy_``, the fastest a transfer gets), and a
  plain ``tensor.to()`` of the same size to pageable memory and back (what moving framework state costs);
- the default release (not sticky): ``release`` moves the state to host memory after a cell and ``bind`` moves
  it back before the next; GB/s each way;
- sticky: ``bind`` + ``release`` around a cell on the same device with the state resident: the time they add
  to a cell (target: at most 5 ms with 10 GB), median of ``--cells``;
- the capture with the state resident (the replica's ``StateTracker``, as around each cell): a cell that does not
  reach the model (counted in the 5 ms above), one that reaches it without changing it (its storages are then
  checksummed on the device, ``digest.device_checksum``: GB/s against a device-to-device copy), and one that
  changes one element (which the capture must see);
- eviction: ``evict`` (the GPU given to someone else) moves it out; GB/s, and the device memory it frees.

Prints one table; exits 1 when a check fails. Without torch or a CUDA device it prints ``skipped: ...`` and
exits 0.

    python benchmarks/gpu_offload.py [--gb 10] [--cells 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from jupyter_notebookos.gpu.binding import GpuBinding, HostGpu  # noqa: E402

GB = 1e9
STICKY_TARGET_MS = 5.0


def _no_gpu_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


def _timed(torch: Any, step: Callable[[], Any]) -> float:
    """Seconds ``step`` takes, the device synchronised before and after."""
    torch.cuda.synchronize()
    started = time.perf_counter()
    step()
    torch.cuda.synchronize()
    return time.perf_counter() - started


def _model(torch: Any, gb: float) -> Any:
    """A model of square fp32 linear layers (no bias) with about ``gb`` GB of parameters, on the device."""
    side = 16384  # 1.07 GB per layer
    layers = max(1, round(gb * GB / (side * side * 4)))
    with torch.device("cuda"):
        model = torch.nn.Sequential(*(torch.nn.Linear(side, side, bias=False) for _ in range(layers)))
    for p in model.parameters():
        torch.nn.init.constant_(p, 0.5)  # fast, and every byte is written (the memory is really used)
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=10.0, help="GB of state on the GPU")
    parser.add_argument("--cells", type=int, default=20, help="sticky cells measured")
    args = parser.parse_args(argv)
    reason = _no_gpu_reason()
    if reason is not None:
        print(f"skipped: {reason}")
        return 0
    import torch

    rows: list[tuple[str, str, str, bool | None]] = []
    gbps = lambda nbytes, s: f"{nbytes / GB / s:.1f} GB/s ({s:.2f} s)"  # noqa: E731

    # One binding, as in a replica: made before CUDA starts, which it then does in the first bound "cell".
    ns: dict[str, Any] = {}
    binding = GpuBinding([HostGpu(index=0, uuid="gpu-0", simulated=False)], sticky=False)
    binding.bind([0], ns)

    d2h, h2d, paged_out, paged_in = _link(torch)
    rows += [
        ("link, pinned 1 GB: device -> host", "", gbps(GB, d2h), None),
        ("link, pinned 1 GB: host -> device", "", gbps(GB, h2d), None),
        ("tensor.to() 1 GB, pageable: device -> host", "", gbps(GB, paged_out), None),
        ("tensor.to() 1 GB, pageable: host -> device", "", gbps(GB, paged_in), None),
    ]

    rows += _round_trip_keeps_state(torch, binding)

    # torch's own device memory before the state exists (the cuBLAS workspace of the round trip's matrix products):
    # what "left allocated" is measured against below.
    own = torch.cuda.memory_allocated()
    ns["model"] = _model(torch, args.gb)
    nbytes = sum(p.numel() * p.element_size() for p in ns["model"].parameters())
    name = torch.cuda.get_device_name(0)

    # The default: the state goes out after every cell and back before the next.
    out_s = _timed(torch, lambda: binding.release(ns))
    left = torch.cuda.memory_allocated()
    in_s = _timed(torch, lambda: binding.bind([0], ns))
    back = all(p.is_cuda for p in ns["model"].parameters())
    rows += [
        (
            f"release, not sticky: {nbytes / GB:.1f} GB out",
            f">= 50 % of pageable .to() ({1 / paged_out:.1f})",
            gbps(nbytes, out_s),
            nbytes / out_s >= 0.5 * GB / paged_out,
        ),
        (
            "  device memory still allocated after it",
            f"< 1 % of the state above torch's own {own / GB:.2f} GB",
            f"{left / GB:.2f} GB",
            left - own < 0.01 * nbytes,
        ),
        (
            f"bind, not sticky: {nbytes / GB:.1f} GB back",
            f">= 50 % of pageable .to() ({1 / paged_in:.1f})",
            gbps(nbytes, in_s),
            nbytes / in_s >= 0.5 * GB / paged_in and back,
        ),
        (
            "  of the pinned link: out / back",
            "",
            f"{nbytes / out_s * d2h / GB:.0%} / {nbytes / in_s * h2d / GB:.0%}",
            None,
        ),
    ]

    # Sticky: the state stays on the device between cells. What do bind + release add to a cell?
    binding.sticky = True
    binding.release(ns)
    x = torch.ones(1024, device="cuda")
    added: list[float] = []
    for _ in range(args.cells):
        torch.cuda.synchronize()
        started = time.perf_counter()
        binding.bind([0], ns)
        bound = time.perf_counter()
        x.add_(1.0)  # the cell: one kernel on the bound device
        torch.cuda.synchronize()
        ran = time.perf_counter()
        binding.release(ns)
        torch.cuda.synchronize()
        added.append(bound - started + time.perf_counter() - ran)
    stayed = all(p.is_cuda for p in ns["model"].parameters()) and binding.resident == [0]
    p50 = statistics.median(added) * 1e3
    rows += [
        (
            f"sticky cell, {nbytes / GB:.1f} GB resident: bind + release (p50 of {args.cells})",
            f"<= {STICKY_TARGET_MS:g} ms",
            f"{p50:.3f} ms (max {max(added) * 1e3:.3f})",
            p50 <= STICKY_TARGET_MS,
        ),
        ("  the state stayed on the device", "yes", "yes" if stayed else "no", stayed),
    ]
    rows += _capture(torch, ns, nbytes, args.cells, p50)

    # Eviction: the GPU is given to someone else. (What stays allocated is torch's own, such as the cuBLAS
    # workspace of the first matrix product; what stays reserved is whatever segment that sits in.)
    before = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    evicted: list[Any] = []
    evict_s = _timed(torch, lambda: evicted.append(binding.evict(ns)))
    after = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    rows += [
        (f"evict: {nbytes / GB:.1f} GB out", "", gbps(nbytes, evict_s), None),
        (
            "  device memory allocated (reserved) before / after",
            f"< 1 % of the state above torch's own {own / GB:.2f} GB",
            f"{before[0] / GB:.2f} ({before[1] / GB:.2f}) / {after[0] / GB:.2f} ({after[1] / GB:.2f}) GB",
            after[0] - own < 0.01 * nbytes and evicted[0].offloaded == ["model"],
        ),
    ]
    _print(f"GPU state between cells on {name}: {nbytes / GB:.1f} GB (torch {torch.__version__})", rows)
    return 0 if all(ok is not False for *_, ok in rows) else 1


def _capture(
    torch: Any, ns: dict[str, Any], nbytes: int, cells: int, binding_ms: float
) -> list[tuple[str, str, str, bool | None]]:
    """The state tracker's capture after sticky cells, with the model resident (see the module's docstring)."""
    from jupyter_notebookos.replication.state import StateTracker

    ns.update({"__name__": "__main__", "torch": torch, "x": torch.ones(1024, device="cuda")})
    tracker = StateTracker(ns, transform=lambda code: code)

    def cell(code: str) -> tuple[float, Any]:
        tracker.before_cell(code)  # (the first one fingerprints the whole namespace: the baseline)
        exec(code, ns)
        torch.cuda.synchronize()
        started = time.perf_counter()
        delta = tracker.after_cell()
        tracker.settle()
        return time.perf_counter() - started, delta

    cell("pass")
    apart = [cell("x.add_(1.0)")[0] for _ in range(cells)]
    reaching = [cell("n = sum(p.numel() for p in model.parameters())") for _ in range(max(3, cells // 4))]
    _, changed = cell("with torch.no_grad():\n    model[0].weight[0, 0] += 1")
    source = torch.empty(int(GB) // 4, device="cuda")
    target = torch.empty_like(source)
    copy_s = min(_timed(torch, lambda: target.copy_(source)) for _ in range(3))
    apart_ms = statistics.median(apart) * 1e3
    reach_s = statistics.median(t for t, _ in reaching)
    unchanged = all("model" not in delta.values for _, delta in reaching)
    return [
        (
            "  the capture of a cell not reaching the model (p50)",
            f"bind + release + it <= {STICKY_TARGET_MS:g} ms",
            f"{apart_ms:.3f} ms (with bind + release {binding_ms + apart_ms:.3f} ms)",
            binding_ms + apart_ms <= STICKY_TARGET_MS,
        ),
        (
            "  the capture of a cell reaching it, unchanged (median)",
            f"not in the delta; 1 GB device copy: {GB / copy_s / GB:.0f} GB/s",
            f"{reach_s * 1e3:.1f} ms, {nbytes / GB / reach_s:.0f} GB/s",
            unchanged,
        ),
        (
            "  a cell changing one element of it",
            "in the delta",
            str("model" in changed.values),
            "model" in changed.values,
        ),
    ]


def _round_trip_keeps_state(torch: Any, binding: GpuBinding) -> list[tuple[str, str, str, bool | None]]:
    """Small state out to host memory and back (not sticky): values, leaves, strides and identities kept."""
    ns: dict[str, Any] = {}
    model = torch.nn.Linear(64, 64, device="cuda")
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(2, 64, device="cuda")).sum().backward()
    opt.step()
    ns.update(model=model, opt=opt, w=torch.randn(256, 256, device="cuda", requires_grad=True))
    ns["t"] = torch.randn(64, 32, device="cuda").t()  # not contiguous
    want = {k: ns[k].detach().cpu().clone() for k in ("w", "t")}
    ids = [id(p) for p in model.parameters()]
    binding.release(ns)
    on_host = not ns["w"].is_cuda and not next(model.parameters()).is_cuda
    binding.bind([0], ns)
    w, t = ns["w"], ns["t"]
    kept = (
        torch.equal(w.detach().cpu(), want["w"])
        and w.is_cuda
        and w.is_leaf
        and w.requires_grad
        and torch.equal(t.cpu(), want["t"])
        and t.stride() == (1, 32)
    )
    params = [id(p) for p in model.parameters()] == ids and all(p.is_cuda for p in model.parameters())
    moments = all(v.is_cuda for s in opt.state.values() for v in s.values() if v.dim() > 0)
    model(torch.ones(2, 64, device="cuda")).sum().backward()
    opt.step()  # the optimizer still steps the model's parameters, on the device
    binding.release(ns)
    binding.bind([0], {})
    return [
        ("round trip: state on the host between cells", "yes", str(on_host), on_host),
        ("  tensors: values, leaf + requires_grad, strides", "kept", str(kept), kept),
        ("  module: parameter identities, on the device", "kept", str(params), params),
        ("  optimizer moments on the device", "yes", str(moments), moments),
    ]


def _link(torch: Any) -> tuple[float, float, float, float]:
    """Seconds for 1 GB, best of 3: pinned device -> host, pinned host -> device, and a pageable ``.to()`` each
    way (what moving framework state uses)."""
    probe = torch.empty(int(GB) // 4, dtype=torch.float32, device="cuda").fill_(1.0)
    pinned = torch.empty(probe.shape, dtype=probe.dtype, device="cpu", pin_memory=True)
    _timed(torch, lambda: pinned.copy_(probe))  # warm-up
    host = probe.to("cpu")
    return (
        min(_timed(torch, lambda: pinned.copy_(probe)) for _ in range(3)),
        min(_timed(torch, lambda: probe.copy_(pinned)) for _ in range(3)),
        min(_timed(torch, lambda: probe.to("cpu")) for _ in range(3)),
        min(_timed(torch, lambda: host.to("cuda")) for _ in range(3)),
    )


def _print(title: str, rows: list[tuple[str, str, str, bool | None]]) -> None:
    """A rich table where rich is installed (the platform's venv), else plain columns (a bare GPU machine)."""
    cells = [(m, t, s, "" if ok is None else ("yes" if ok else "NO")) for m, t, s, ok in rows]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title)
        widths = [max(len(row[i]) for row in cells) for i in range(4)]
        for row in cells:
            print("  ".join(col.ljust(w) for col, w in zip(row, widths, strict=True)))
        return
    table = Table(title=title)
    for column in ("measure", "target", "seen", "ok"):
        table.add_column(column)
    for row in cells:
        table.add_row(*row)
    Console(width=160).print(table)


if __name__ == "__main__":
    sys.exit(main())
