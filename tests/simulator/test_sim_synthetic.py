"""The synthetic workload matches the trace statistics it is calibrated to, and is reproducible."""

from __future__ import annotations

import numpy as np
import pytest

from jupyter_notebookos.simulator.synthetic import default_session_count, generate


def test_calibrated_to_the_june_trace():
    workload = generate(hours=720, seed=11)
    tasks = [t for s in workload.sessions for t in s.tasks]
    gpus = np.array([t.gpus for t in tasks])
    minutes = np.array([t.duration_s for t in tasks]) / 60
    # GPU mix 49 / 20 / 31 % (sessions draw it, so tasks follow it only roughly)
    for count, share in ((1, 0.49), (4, 0.20), (8, 0.31)):
        assert np.mean(gpus == count) == pytest.approx(share, abs=0.08)
    # one task every 1.4 minutes on average, whole minutes of at least 1, a heavy tail
    assert len(tasks) / (720 * 60) == pytest.approx(1 / 1.4, rel=0.1)
    assert minutes.min() >= 1 and np.all(minutes == np.round(minutes))
    assert np.median(minutes) <= 10 and np.percentile(minutes, 99) > 300
    # about 216 busy GPUs on average, as in the trace (heavy tail: loose bound)
    assert workload.busy_gpu_seconds() / (720 * 3600) == pytest.approx(216, rel=0.3)


def test_same_seed_same_workload_and_sizes():
    assert generate(sessions=5, hours=2, seed=3) == generate(sessions=5, hours=2, seed=3)
    assert generate(sessions=5, hours=2, seed=3) != generate(sessions=5, hours=2, seed=4)
    assert len(generate(sessions=5, hours=2).sessions) == 5
    assert default_session_count(24) == round(24 * 60 / 1.4 / 12)
    with pytest.raises(ValueError):
        generate(hours=0)
