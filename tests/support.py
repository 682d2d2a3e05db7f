"""Helpers shared by the whole suite: run `notebookos up`, free ports, find left-over processes."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from jupyter_notebookos.embedded.runner import NOTEBOOKOS, PlatformProcess, free_port, processes_of

REPO = Path(__file__).resolve().parent.parent

Platform = PlatformProcess

__all__ = [
    "NOTEBOOKOS",
    "REPO",
    "Platform",
    "free_port",
    "processes_of",
    "start_platform",
    "stop_platform",
    "wait_for",
]

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.1) -> T:
    """Poll ``predicate`` until it returns something truthy (returned), or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def start_platform(state_dir: Path, *args: str, timeout: float = 90.0) -> Platform:
    """Run `notebookos up --no-lab` with ``args`` (from the repository root) and wait until it is up."""
    try:
        return PlatformProcess.start(state_dir, *args, timeout=timeout, cwd=REPO)
    except RuntimeError as err:
        raise AssertionError(str(err)) from None


def stop_platform(platform: Platform, timeout: float = 60.0) -> None:
    platform.stop(timeout)
