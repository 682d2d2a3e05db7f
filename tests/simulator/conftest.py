"""Fixtures for the simulator tests: small hand-made traces in temporary folders."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

HEADER = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
REAL_TRACE = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "notebookos-trace"


@pytest.fixture
def write_csv(tmp_path: Path) -> Callable[[list[tuple[int, int, int]]], Path]:
    """Write rows of (num_gpu, submit_minute, duration_minutes), job ids in order, as a job-list CSV."""

    def write(rows: list[tuple[int, int, int]], name: str = "trace.csv") -> Path:
        path = tmp_path / name
        lines = [f"{i},{g},{t},0,resnet50,{d},0\n" for i, (g, t, d) in enumerate(rows)]
        path.write_text(HEADER + "".join(lines))
        return path

    return write


@pytest.fixture
def real_trace() -> Path:
    """The June trace, or skip when this checkout has no ../shared/data next to it."""
    path = REAL_TRACE / "sensei_june_60sec.csv"
    if not path.is_file():
        pytest.skip(f"{path} is not here")
    return path
