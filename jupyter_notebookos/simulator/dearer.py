"""Why NotebookOS bills more GPU-hours than Reservation in a run, measured: the line `notebookos simulate` prints.

NotebookOS keeps hosts *ready*: hosts with enough idle GPUs to start the largest kernel request at once (the
scheduler's ready-host buffer, ``ready_host_buffer`` hosts, or sized from large-cell arrivals with
``ready_host_probability``). That is what lets a cell of 8 GPUs start within a second. Where few GPUs are busy (a
small workload, or one draining), those idle hosts cost more than Reservation wastes by holding GPUs between
cells, and NotebookOS bills more. Where it does, ``simulate`` runs NotebookOS once more without the buffer and says
what the buffer cost and what it bought, rather than leaving a negative saving unexplained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jupyter_notebookos.simulator.simulation import Simulation

#: Scheduler options of the run that measures the buffer: no ready hosts kept.
WITHOUT_READY_HOSTS: dict[str, Any] = {"ready_host_buffer": 0, "ready_host_probability": 0.0}


@dataclass(frozen=True)
class Readiness:
    """The ready-host buffer a NotebookOS run kept."""

    buffer: int  # hosts (ready_host_buffer), when not sized from arrivals
    sized_from_arrivals: bool  # ready_host_probability > 0
    most: int  # ready_host_max: the most hosts sized from arrivals
    largest: int  # GPUs of the largest kernel request: what a ready host can start at once

    @property
    def buffer_kept(self) -> bool:
        """Whether the run kept any ready hosts."""
        return self.largest > 0 and (self.sized_from_arrivals or self.buffer > 0)

    def describe(self) -> str:
        """What the buffer is, in words: "keeps 3 hosts ready to start an 8-GPU cell at once"."""
        hosts = f"up to {self.most} hosts (as many as large cells arrive)" if self.sized_from_arrivals else (
            f"{self.buffer} host{'s' if self.buffer != 1 else ''}"
        )  # fmt: skip
        article = "an" if str(self.largest).startswith("8") or self.largest in (11, 18) else "a"
        return f"keeps {hosts} ready to start {article} {self.largest}-GPU cell at once"

    def option(self) -> str:
        """The `simulate` options that turn the buffer off."""
        return "--ready-host-buffer 0" + (" --ready-host-probability 0" if self.sized_from_arrivals else "")


def readiness_of(simulation: Simulation) -> Readiness:
    """The ready-host buffer of a NotebookOS ``simulation`` (its scheduler's settings, its workload's largest
    request)."""
    settings = simulation.scheduler.settings
    largest = max((s.gpus for s in simulation.workload.sessions), default=0)
    return Readiness(settings.ready_host_buffer, settings.ready_host_probability > 0, settings.ready_host_max, largest)


def dearer_than_reservation(summaries: dict[str, dict[str, Any]]) -> bool:
    """Whether NotebookOS provisioned more GPU-hours than Reservation (both were run)."""
    if "notebookos" not in summaries or "reservation" not in summaries:
        return False
    return bool(summaries["notebookos"]["provisioned_gpu_hours"] > summaries["reservation"]["provisioned_gpu_hours"])


def why_dearer(summaries: dict[str, dict[str, Any]], lean: dict[str, Any], readiness: Readiness, hours: float) -> str:
    """One line: how much more NotebookOS billed, what its ready hosts cost (``lean``: the summary of the same run
    without them), and what they bought (cells started within 1 s)."""
    ours, theirs = summaries["notebookos"], summaries["reservation"]
    more = ours["provisioned_gpu_hours"] - theirs["provisioned_gpu_hours"]
    cost = ours["provisioned_gpu_hours"] - lean["provisioned_gpu_hours"]
    busy = ours["busy_gpu_hours"] / hours if hours > 0 else 0.0
    without = lean["provisioned_gpu_hours"]
    gap = theirs["provisioned_gpu_hours"] - without
    versus = f"{gap:,.0f} fewer than Reservation" if gap > 0 else f"still {-gap:,.0f} more than Reservation"
    kept, lost = 100 * ours["immediate_fraction"], 100 * lean["immediate_fraction"]
    bought = f"{lost:.1f} % of cells within 1 s instead of {kept:.1f} %" if round(lost, 1) != round(kept, 1) else (
        f"as many cells within 1 s ({kept:.1f} %)"
    )  # fmt: skip
    return (
        f"NotebookOS bills {more:,.0f} GPU-h more than Reservation here: it {readiness.describe()}, which cost "
        f"{cost:,.0f} GPU-h while {busy:.0f} GPUs were busy on average; without them ({readiness.option()}) it bills "
        f"{without:,.0f} GPU-h, {versus}, and starts {bought}."
    )


__all__ = ["WITHOUT_READY_HOSTS", "Readiness", "dearer_than_reservation", "readiness_of", "why_dearer"]
