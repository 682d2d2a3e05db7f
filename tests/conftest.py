"""Fixtures shared by the whole suite (helpers live in support.py, importable from every test directory)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import Platform, start_platform, stop_platform


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Platform]:
    """A fresh embedded platform (4 hosts x 2 simulated GPUs, 1 etcd member)."""
    platform = start_platform(tmp_path / "state", "--hosts", "4", "--gpus-per-host", "2")
    try:
        yield platform
    finally:
        stop_platform(platform)


@pytest.fixture(scope="session")
def shared_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """One platform for the tests that only read or use their own kernels."""
    platform = start_platform(tmp_path_factory.mktemp("shared") / "state", "--hosts", "4", "--gpus-per-host", "2")
    try:
        yield platform
    finally:
        stop_platform(platform)
