"""Real-GPU check: a cell sees only its committed devices, and its GPU memory is released after it.

For a machine with an NVIDIA GPU. Starts the embedded platform (`notebookos up --no-lab`; with NVML present
every simulated host offers the machine's real GPUs), then through Enterprise Gateway's API:

- visibility: a ``KERNEL_GPUS=1`` kernel (and ``KERNEL_GPUS=2`` where the machine has two GPUs) runs a cell
  that reports ``CUDA_VISIBLE_DEVICES``, the CUDA driver's device count and device UUIDs (``libcuda``, which
  honours ``CUDA_VISIBLE_DEVICES`` like every CUDA framework), and torch's ``device_count()`` /
  ``current_device()`` where torch is installed; the UUIDs must be exactly those NVML gives for the devices
  the gateway committed (``execute_reply.metadata.notebookos.gpus``);
- memory (needs torch): a cell allocates 512 MiB on its GPU and holds it until told to finish; NVML's memory
  used by the executor's pid (or, where NVML cannot see the container's pids, by the whole device) is read
  before, during and after the cell. After the reply the tensor must be gone from the GPU (the replica moved
  it to host memory on release); the CUDA context itself stays. The platform runs with sticky GPUs off for this
  (``NotebookOSGatewayApp.gpu_sticky=False``); ``benchmarks/gpu_offload.py`` measures the sticky path.

Prints one table, exits 1 if a check failed. Without a GPU it prints
``skipped: no NVIDIA GPU (NVML not found)`` and exits 0.

    .venv/bin/python benchmarks/gpu_check.py
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from jupyter_notebookos.client import GatewayClient, KernelConnection  # noqa: E402

KERNEL = "python3-notebookos"
MIB = 1 << 20
TENSOR_MIB = 512

# Run inside the replica: what the user's code can see.
VISIBILITY_CELL = r"""
import ctypes as _ct, json as _json, os as _os
from jupyter_notebookos.gpu.binding import current_devices as _current
_seen = {"env": _os.environ.get("CUDA_VISIBLE_DEVICES"), "bound": _current()}
try:
    _cuda = _ct.CDLL("libcuda.so.1")
    assert _cuda.cuInit(0) == 0, "cuInit failed"
    _n = _ct.c_int()
    _cuda.cuDeviceGetCount(_ct.byref(_n))
    _uuids = []
    for _i in range(_n.value):
        _dev, _raw = _ct.c_int(), (_ct.c_ubyte * 16)()
        _cuda.cuDeviceGet(_ct.byref(_dev), _i)
        _cuda.cuDeviceGetUuid(_raw, _dev)
        _h = bytes(_raw).hex()
        _uuids.append(f"{_h[:8]}-{_h[8:12]}-{_h[12:16]}-{_h[16:20]}-{_h[20:]}")
    _seen.update(driver_count=_n.value, driver_uuids=_uuids)
except OSError as _err:
    _seen["driver_error"] = str(_err)
try:
    import torch as _torch
except ImportError:
    _seen["torch"] = None
else:
    _seen.update(torch=_torch.__version__, torch_count=_torch.cuda.device_count(),
                 torch_current=_torch.cuda.current_device(),
                 torch_uuids=[str(_torch.cuda.get_device_properties(i).uuid)
                              for i in range(_torch.cuda.device_count())])
print(_json.dumps(_seen))
"""

MEMORY_CELL = """
import os, time, torch
gpu_state = torch.ones({n} // 4, dtype=torch.float32, device="cuda")
torch.cuda.synchronize()
open({started!r}, "w").close()
while not os.path.exists({flag!r}):
    time.sleep(0.05)
"""


def _no_gpu_reason() -> str | None:
    """Why this machine cannot run the check (None: it can)."""
    try:
        import pynvml
    except ImportError:
        return "no NVIDIA GPU (nvidia-ml-py is not installed)"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return "no NVIDIA GPU (NVML not found)"
    try:
        return None if pynvml.nvmlDeviceGetCount() > 0 else "no NVIDIA GPU (NVML lists no devices)"
    finally:
        pynvml.nvmlShutdown()


class Nvml:
    """Reads from NVML in this process (the check's own view, independent of the platform's)."""

    def __init__(self) -> None:
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

    def uuid(self, index: int) -> str:
        raw = self.nvml.nvmlDeviceGetUUID(self.handles[index])
        return _plain_uuid(raw.decode() if isinstance(raw, bytes) else str(raw))

    def used(self, pid: int) -> tuple[int | None, int]:
        """(MiB ``pid`` uses on all GPUs, None where NVML lists no process of it; MiB used on all GPUs)."""
        by_pid: int | None = None
        total = 0
        for handle in self.handles:
            total += int(self.nvml.nvmlDeviceGetMemoryInfo(handle).used) // MIB
            try:
                processes = self.nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except self.nvml.NVMLError:
                continue
            for process in processes:
                if process.pid == pid and process.usedGpuMemory is not None:
                    by_pid = (by_pid or 0) + int(process.usedGpuMemory) // MIB
        return by_pid, total

    def close(self) -> None:
        self.nvml.nvmlShutdown()


def _plain_uuid(uuid: str) -> str:
    return uuid.lower().removeprefix("gpu-")


def _execute(conn: KernelConnection, code: str, timeout: float = 120.0) -> tuple[dict[str, Any], str]:
    result = conn.execute(code, timeout=timeout)
    if result.status != "ok":
        content = result.reply["content"]
        raise RuntimeError(f"cell failed: {content.get('ename')}: {content.get('evalue')}")
    return result.notebookos, result.stdout


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def check_visibility(client: GatewayClient, nvml: Nvml, gpus: int) -> list[tuple[str, str, str, bool]]:
    """Rows (check, expected, seen, ok) for one kernel with ``KERNEL_GPUS=gpus``."""
    kernel_id = client.start_kernel(KERNEL, env={"KERNEL_GPUS": str(gpus)})
    try:
        with client.connect(kernel_id) as conn:
            meta, out = _execute(conn, VISIBILITY_CELL)
    finally:
        client.shutdown_kernel(kernel_id)
    seen = json.loads(out.strip().splitlines()[-1])
    committed = [int(d) for d in meta["gpus"]]
    expected_uuids = [nvml.uuid(d) for d in committed]
    label = f"KERNEL_GPUS={gpus}"
    rows = [
        (f"{label}: devices committed", f"{gpus} device(s)", f"{committed} on {meta['host']}", len(committed) == gpus),
        (
            f"{label}: CUDA_VISIBLE_DEVICES",
            ",".join(map(str, committed)),
            str(seen["env"]),
            seen["env"] == ",".join(map(str, committed)),
        ),
        (f"{label}: binding.current_devices()", str(committed), str(seen["bound"]), seen["bound"] == committed),
    ]
    if "driver_error" in seen:
        rows.append((f"{label}: CUDA driver (libcuda)", "loadable", seen["driver_error"], False))
    else:
        rows.append(
            (f"{label}: CUDA driver device count", str(gpus), str(seen["driver_count"]), seen["driver_count"] == gpus)
        )
        driver = [_plain_uuid(u) for u in seen["driver_uuids"]]
        rows.append(
            (f"{label}: CUDA driver device UUIDs", _short(expected_uuids), _short(driver), driver == expected_uuids)
        )
    if seen.get("torch") is None:
        rows.append((f"{label}: torch", "installed", "not installed (skipped)", True))
    else:
        torch_uuids = [_plain_uuid(u) for u in seen["torch_uuids"]]
        rows += [
            (f"{label}: torch.cuda.device_count()", str(gpus), str(seen["torch_count"]), seen["torch_count"] == gpus),
            (f"{label}: torch.cuda.current_device()", "0", str(seen["torch_current"]), seen["torch_current"] == 0),
            (
                f"{label}: torch device UUIDs",
                _short(expected_uuids),
                _short(torch_uuids),
                torch_uuids == expected_uuids,
            ),
        ]
    return rows


def _short(uuids: list[str]) -> str:
    return ", ".join(u[:8] for u in uuids) or "-"


def check_memory(client: GatewayClient, nvml: Nvml, workdir: Path) -> list[tuple[str, str, str, bool]]:
    """Rows for the memory check: a tensor allocated by a cell is off the GPU once the cell replied."""
    kernel_id = client.start_kernel(KERNEL, env={"KERNEL_GPUS": "1"})
    try:
        with client.connect(kernel_id) as conn:
            _, out = _execute(conn, "import importlib.util\nprint(importlib.util.find_spec('torch') is not None)")
            if out.strip() != "True":
                return [("GPU memory released after the cell", "torch installed", "no torch (skipped)", True)]
            # CUDA is initialised first, so the context's own memory is part of the baseline.
            meta, _ = _execute(conn, "import torch\ntorch.zeros(1, device='cuda')\ntorch.cuda.synchronize()")
            replica = meta["replica"]
            info = client.notebookos_kernel(kernel_id)
            pid = next(int(r["pid"]) for r in info["replicas"] if r["replica_id"] == replica)
            before = nvml.used(pid)
            started, flag = workdir / "mem-started", workdir / "mem-release"
            code = MEMORY_CELL.format(n=TENSOR_MIB * MIB, started=str(started), flag=str(flag))
            msg_id = conn.send(
                "shell",
                "execute_request",
                {"code": code, "silent": False},
                metadata={"notebookos": {"replica": replica}},
            )
            _wait(started.exists, 120, "the memory cell to allocate its tensor")
            during = nvml.used(pid)
            flag.touch()
            deadline = time.monotonic() + 120
            while True:
                msg = conn.receive(deadline - time.monotonic())
                if msg["channel"] == "shell" and msg["parent_header"].get("msg_id") == msg_id:
                    break
            status = msg["content"]["status"]
            time.sleep(1.0)  # the release runs right after the reply
            after = nvml.used(pid)
            _, where = _execute(conn, "print(gpu_state.device)")
    finally:
        client.shutdown_kernel(kernel_id)
    by_pid = all(m[0] is not None for m in (before, during, after))
    what = f"used by the executor (pid {pid})" if by_pid else "used on the GPUs (NVML lists no pid of this namespace)"
    b, d, a = ((m[0] if by_pid else m[1]) or 0 for m in (before, during, after))
    need = TENSOR_MIB * 3 // 4
    return [
        (f"GPU memory {what}: before the cell", "CUDA context only", f"{b} MiB", True),
        (f"... while the cell holds a {TENSOR_MIB} MiB tensor", f">= {b + need} MiB", f"{d} MiB", d - b >= need),
        ("... after the reply (GPUs released)", f"<= {d - need} MiB", f"{a} MiB ({d - a} MiB freed)", d - a >= need),
        ("the cell itself", "ok", str(status), status == "ok"),
        ("the tensor in the next cell (bound again)", "on a GPU", where.strip(), where.strip().startswith("cuda")),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=3, help="simulated hosts (each offers the real GPUs)")
    args = parser.parse_args(argv)
    reason = _no_gpu_reason()
    if reason is not None:
        print(f"skipped: {reason}")
        return 0

    from rich.console import Console
    from rich.table import Table

    from tests.support import start_platform, stop_platform

    console = Console(width=160)
    nvml = Nvml()
    rows: list[tuple[str, str, str, bool]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="nbos-gpu-check-") as tmp:
            workdir = Path(tmp)
            # Not sticky: the memory check is about the release after a cell (gpu_offload.py measures sticky).
            sticky_off = ("--gateway-option", "NotebookOSGatewayApp.gpu_sticky=False")
            platform = start_platform(workdir / "state", "--hosts", str(args.hosts), *sticky_off)
            try:
                client = platform.client
                for gpus in (1, 2) if len(nvml.handles) >= 2 else (1,):
                    rows += check_visibility(client, nvml, gpus)
                rows += check_memory(client, nvml, workdir)
            finally:
                stop_platform(platform)
    finally:
        nvml.close()

    table = Table(title=f"NotebookOS GPU check ({len(nvml.handles)} NVIDIA GPU(s))")
    for column in ("check", "expected", "seen", "ok"):
        table.add_column(column)
    for check, expected, seen, ok in rows:
        table.add_row(check, expected, seen, "yes" if ok else "[red]NO[/red]")
    console.print(table)
    return 0 if all(ok for *_, ok in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
