"""Helpers shared by the whole suite: run `notebookos up`, free ports, find left-over processes."""

from __future__ import annotations

from pathlib import Path

from jupyter_notebookos.embedded.runner import NOTEBOOKOS, PlatformProcess, free_port, processes_of

REPO = Path(__file__).resolve().parent.parent

Platform = PlatformProcess

__all__ = ["NOTEBOOKOS", "REPO", "Platform", "free_port", "processes_of", "start_platform", "stop_platform"]


def start_platform(state_dir: Path, *args: str, timeout: float = 90.0) -> Platform:
    """Run `notebookos up --no-lab` with ``args`` (from the repository root) and wait until it is up."""
    try:
        return PlatformProcess.start(state_dir, *args, timeout=timeout, cwd=REPO)
    except RuntimeError as err:
        raise AssertionError(str(err)) from None


def stop_platform(platform: Platform, timeout: float = 60.0) -> None:
    platform.stop(timeout)
