"""`--plot DIR`: provisioned vs busy GPUs over time per policy, and the CDF of the cell delay (PNGs)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from jupyter_notebookos.simulator.metrics import PolicyMetrics


def _wrapped(title: str, figure: Any, fontsize: float) -> str:
    """``title`` in lines that fit ``figure``'s width at ``fontsize`` points (an average glyph is about 0.6 em;
    tight_layout then makes room for the lines)."""
    characters = int(figure.get_figwidth() * 72 / (fontsize * 0.6))
    return "\n".join(textwrap.wrap(title, characters))


def write_plots(runs: dict[str, PolicyMetrics], directory: str | Path, title: str, prefix: str = "") -> list[Path]:
    """Write `<prefix>gpus_over_time.png` and `<prefix>delay_cdf.png` into `directory`; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 2.4 * len(runs) + 0.6), sharex=True, squeeze=False)
    for ax, (name, run) in zip(axes[:, 0], runs.items(), strict=True):
        lo = max(run.measure_start_s, run.provisioned_gpus.samples_t[0])
        hi = min(run.measure_end_s, run.end_s)
        for level, label, color in (
            (run.provisioned_gpus, "provisioned", "tab:red"),
            (run.busy_gpus, "busy (training)", "tab:blue"),
        ):
            t = np.asarray(level.samples_t)
            v = np.asarray(level.samples_v)
            keep = (t >= lo) & (t <= hi)
            # the value in force at `lo` starts the plotted step line
            before = np.searchsorted(t, lo, side="right") - 1
            t_plot = np.concatenate([[lo], t[keep]]) if before >= 0 else t[keep]
            v_plot = np.concatenate([[v[before]], v[keep]]) if before >= 0 else v[keep]
            ax.step((t_plot - lo) / 3600.0, v_plot, where="post", label=label, color=color, linewidth=0.9)
        ax.set_ylabel("GPUs")
        ax.set_title(name, fontsize=10, loc="left")
        ax.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("hours since window start")
    fig.suptitle(_wrapped(f"Provisioned vs busy GPUs: {title}", fig, 10), fontsize=10)
    fig.tight_layout()
    path = out / f"{prefix}gpus_over_time.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    written.append(path)

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, run in runs.items():
        delays = np.sort(np.asarray(run.delays_s, dtype=float))
        if delays.size == 0:
            continue
        y = np.arange(1, delays.size + 1) / delays.size
        ax.step(np.maximum(delays, 1e-3), y, where="post", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("delay from submission to start of execution (s; 1 ms floor)")
    ax.set_ylabel("fraction of cells")
    ax.axvline(1.0, color="grey", linestyle=":", linewidth=0.8)
    ax.axvline(10.0, color="grey", linestyle="--", linewidth=0.8)
    ax.legend(fontsize=8)
    ax.set_title(_wrapped(f"Cell delay CDF: {title}", fig, 10), fontsize=10)
    fig.tight_layout()
    path = out / f"{prefix}delay_cdf.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    written.append(path)
    return written
