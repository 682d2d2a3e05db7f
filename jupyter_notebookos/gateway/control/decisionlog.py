"""The scheduler's clock and how the platform logs the scheduler's decisions (one line each)."""

from __future__ import annotations

import logging
import time
from typing import Any

from jupyter_notebookos.scheduler import CellFinished, Decision, RunCell

#: The platform's logger (the gateway app hands its own to the platform).
log = logging.getLogger("jupyter_notebookos.gateway.control")


def now() -> float:
    """The scheduler's clock (monotonic seconds): the platform passes it to every scheduler call."""
    return time.monotonic()


def log_decision(logger: logging.Logger | Any, decision: Decision) -> None:
    """Log a scheduler decision as its one line: routine per-cell decisions at DEBUG (two per cell), everything
    else at INFO."""
    routine = isinstance(decision, RunCell | CellFinished) and getattr(decision, "reason", "") != "migrated"
    logger.log(logging.DEBUG if routine else logging.INFO, "scheduler: %s", decision)
