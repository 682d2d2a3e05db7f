"""Chaos benchmark (issue 12): a long seeded fault schedule against several kernels, then the history checker.
Prints the faults injected, the cells acknowledged and the anomalies found (see tests/chaos/harness.py).

    .venv/bin/python benchmarks/chaos.py [--seconds 240] [--kernels 3] [--seed 1] [--fault-every 5] [--faults a,b]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # (the harness uses tests/support.py, as the tests do)

from tests.chaos.harness import FAULTS, ChaosRun  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=240)
    parser.add_argument("--kernels", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fault-every", type=float, default=5)
    parser.add_argument(
        "--faults", default=",".join(FAULTS), help="comma-separated fault kinds to draw from (default: all)"
    )
    parser.add_argument(
        "--partitions", action="store_true", help="hosts as network namespaces (root), and host partitions as faults"
    )
    args = parser.parse_args()
    faults = tuple(f for f in args.faults.split(",") if f)
    if set(faults) - set(FAULTS):
        parser.error(f"unknown faults {sorted(set(faults) - set(FAULTS))}; known: {', '.join(FAULTS)}")
    tmp = Path(tempfile.mkdtemp(prefix="nbos-chaos-"))
    try:
        report = ChaosRun(
            tmp / "state",
            seed=args.seed,
            kernels=args.kernels,
            seconds=args.seconds,
            fault_every=args.fault_every,
            faults=faults,
            partitions=args.partitions,
        ).run()
    except BaseException:
        print(f"state dir kept: {tmp / 'state'}")
        raise
    print("faults injected:")
    for fault in report.faults:
        print("  " + fault)
    print(report)
    for anomaly in report.anomalies:
        print("ANOMALY: " + anomaly)
    if report.anomalies:  # the gateway's, etcd's and the replicas' logs, to find out why
        print(f"state dir kept: {tmp / 'state'}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(1 if report.anomalies else 0)


if __name__ == "__main__":
    main()
