"""A short, seeded chaos schedule (CI): faults while two kernels run; the history checker finds no anomaly."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import FAULTS, ChaosRun, Reply, check_history

pytestmark = pytest.mark.timeout(300)


#: The schedule CI draws from. A whole-etcd outage (6-10 s of the 32) is left to `benchmarks/chaos.py` and to
#: tests/test_etcd_failover.py, which covers it directly.
CI_FAULTS = tuple(f for f in FAULTS if f != "stop-etcd-cluster")


def test_a_seeded_fault_schedule_leaves_no_anomaly(tmp_path: Path) -> None:
    report = ChaosRun(tmp_path / "state", seed=12, kernels=2, seconds=32, fault_every=4, faults=CI_FAULTS).run()
    print(report, *report.faults, sep="\n")
    assert len(report.faults) >= 5 and report.acknowledged >= 20, str(report)
    assert report.anomalies == [], "\n".join(report.anomalies)


def test_the_checker_finds_what_it_must() -> None:
    ok = [Reply("k", 1, "ok", 1, False), Reply("k", 2, "ok", 2, False), Reply("k", 3, "ok", 3, False)]
    assert check_history(ok, {"k": [1, 2, 3]}) == []
    assert "lost without a word" in check_history(ok, {"k": [1, 2]})[0]
    told = [*ok, Reply("k", 4, "ok", 3, True)]
    assert check_history(told, {"k": [1, 2, 4]}) == []
    assert "twice or out of order" in check_history(ok, {"k": [1, 2, 2, 3]})[0]
    assert any("entry" in a for a in check_history(ok, {"k": [2, 1, 3]}))
    failed = [Reply("k", 1, "ok", 1, False), Reply("k", 2, "error", None, False), Reply("k", 3, "ok", 3, False)]
    assert check_history(failed, {"k": [1, 2, 3]}) == []  # the error cell applied fully
    assert "replied len(log) = 3" in check_history(failed, {"k": [1, 3]})[0]  # ...or not: then 3 lied
    assert "never answered" in check_history(ok, {"k": [1, 2, 3, 9]})[0]
    # The last cell lost (its executor died before its record was stored, no cell came after): the read of the final
    # log tells of it, or it was lost without a word.
    assert check_history([*ok, Reply("k", 0, "final", None, True)], {"k": [1, 2]}) == []
    assert "lost without a word" in check_history([*ok, Reply("k", 0, "final", None, False)], {"k": [1, 2]})[0]
