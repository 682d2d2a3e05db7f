"""The replica's etcd agent and its log writer (kernel/agent.py, kernel/logwriter.py) against a real etcd, where a
replica process would hide the race."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from support import etcd_running, wait_for

from jupyter_notebookos.coordination.errors import EtcdUnavailable
from jupyter_notebookos.kernel.agent import ReplicaAgent
from jupyter_notebookos.kernel.settings import ReplicaSettings
from jupyter_notebookos.replication.protocol import LogRecord, ReplicaRegistration


def test_a_record_etcd_applied_late_reports_its_applied_seq_with_the_lease_held_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """etcd applies a publication after its answer timed out (a paused cluster resumes with the requests it had
    queued), then ends the lease the record's applied seq was put with (the outage outlived it). The replica takes
    a new lease and registers again, saying the seq it had reported before; its retry finds the record written by
    itself. Its applied seq must be put again, with the new lease: the router learns from that key that the replica
    holds the cell's state, and waited a minute (its launch timeout) for it to catch up with its own cell (a CI
    failure of test_etcd_failover.py::test_replicas_outlive_a_60_second_etcd_outage_with_their_memory)."""
    with etcd_running(tmp_path / "etcd") as cluster:
        settings = ReplicaSettings(
            kernel_id="k1", replica_id="r0", host="h0", etcd_endpoints=cluster.endpoints, key="k", lease_ttl=2
        )
        fatal: list[str] = []
        agent = ReplicaAgent(settings, on_fatal=fatal.append)
        agent.connect(timeout=2.0, within=10.0)
        try:
            assert agent.lease is not None
            ports = dict(shell_port=1, iopub_port=2, stdin_port=3, control_port=4, hb_port=5)
            agent.register(
                ReplicaRegistration(
                    "k1", "r0", "h0", "127.0.0.1", **ports, pid=os.getpid(), lease=agent.lease.id, applied_seq=0
                )
            )
            keys, co = agent.keys, agent._co()
            fence = agent.thread.run(co.put(keys.executor("k1"), "r0", lease=agent.lease.id), 10)
            record = LogRecord(seq=1, kind="lost", msg_id="m1", replica_id="r0")
            real_txn = co.txn
            late: list[Any] = []

            async def applied_late(*args: Any, **kwargs: Any) -> Any:
                result = await real_txn(*args, **kwargs)
                success = kwargs.get("success", args[1] if len(args) > 1 else ())
                if not late and any(op.key == keys.log_record("k1", 1) for op in success):
                    late.append(result)
                    assert agent.lease is not None
                    await agent.lease.revoke()  # the executor key, registration and applied seq go with it
                    raise EtcdUnavailable(cluster.endpoints, "txn: no answer in time; its outcome is unknown")
                return result

            monkeypatch.setattr(co, "txn", applied_late)
            outcome = agent.thread.run(agent.log_writer.publish(record, fence), 30)
            assert late and late[0].succeeded, "the first attempt was applied"
            assert outcome.written
            applied = keys.applied("k1", "r0")

            def applied_seq() -> int | None:
                kv = agent.thread.run(co.get(applied), 10)
                return int(kv.text) if kv is not None else None

            wait_for(lambda: applied_seq() == 1, 10, "the replica's applied seq 1 in etcd again")
            assert fatal == []
        finally:
            agent.revoke()
