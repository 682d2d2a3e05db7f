"""Unit tests: KernelReplicas, the one record of a kernel's replicas (phases, handles, registrations, seqs)."""

from __future__ import annotations

import dataclasses

import pytest

from jupyter_notebookos.gateway.router.replicas import KernelReplicas, Phase, Replica, ReplicaIdError, scheduler_id
from jupyter_notebookos.launchers.base import LaunchError, ReplicaHandle
from jupyter_notebookos.replication.protocol import ReplicaRegistration

KERNEL = "k1"


def registration(rid: str, host: str = "host-0", applied_seq: int = 0, lease: int = 7) -> ReplicaRegistration:
    return ReplicaRegistration(
        KERNEL, rid, host, "127.0.0.1", 1, 2, 3, 4, 5, pid=100, lease=lease, applied_seq=applied_seq
    )


def started(replicas: KernelReplicas, rid: str, host: str = "host-0") -> ReplicaHandle:
    replicas.expect(rid, host)
    handle = ReplicaHandle(KERNEL, rid, host, pid=100 + int(rid))
    replicas.started(rid, handle)
    return handle


def test_a_replica_goes_from_starting_to_registered_and_counts_all_along() -> None:
    replicas = KernelReplicas(KERNEL)
    handle = started(replicas, "0")
    entry = replicas.get("0")
    assert entry is not None and entry.phase is Phase.STARTING and entry.handle is handle
    assert replicas.live_count() == 1 and replicas.registered_count() == 0 and not replicas.is_registered("0")
    replicas.register(registration("0", applied_seq=4))
    assert entry.phase is Phase.REGISTERED and replicas.is_registered("0") and replicas.applied("0") == 4
    assert replicas.registrations() == {"0": registration("0", applied_seq=4)}
    assert replicas.handles() == {"0": handle}


def test_applied_sequences_only_grow_and_survive_until_registration() -> None:
    replicas = KernelReplicas(KERNEL)
    replicas.note_applied("5", 9)  # etcd's applied key can come before anything else of the replica
    assert replicas.applied("5") == 9 and "5" not in replicas
    started(replicas, "5")
    replicas.note_applied("5", 3)
    assert replicas.applied("5") == 9
    replicas.register(registration("5", applied_seq=2))
    assert replicas.applied("5") == 9
    replicas.note_applied("5", 12)
    assert replicas.applied("5") == 12


def test_a_lost_replica_is_gone_but_held_until_the_platform_releases_its_process() -> None:
    replicas = KernelReplicas(KERNEL)
    handle = started(replicas, "1")
    replicas.register(registration("1", applied_seq=3))
    had, retiring = replicas.gone("1", "its etcd lease ended")
    assert had == registration("1", applied_seq=3) and not retiring
    entry = replicas.get("1")
    assert entry is not None and entry.phase is Phase.GONE and entry.reason == "its etcd lease ended"
    assert replicas.applied("1") == -1 and replicas.live_count() == 0
    assert replicas.handle("1") is handle  # a live process may still register again (rejoin)
    replicas.register(registration("1", applied_seq=5))
    assert entry.phase is Phase.REGISTERED and entry.reason == "" and replicas.live_count() == 1
    replicas.gone("1", "again")
    assert replicas.release("1") is handle
    assert "1" not in replicas and replicas.release("1") is None


def test_the_same_process_registering_again_keeps_what_the_router_knew_it_applied() -> None:
    """etcd ended a replica's lease in an outage after the router saw it reply to cell 2, and the registration it puts
    again says the seq it had reported to etcd (1). The same process still holds cell 2's state: the router keeps 2
    (with 1, a next cell that prefers it waited the launch timeout, a minute, for it to catch up with its own cell).
    Another process under the id is taken at its word."""
    replicas = KernelReplicas(KERNEL)
    started(replicas, "0")
    replicas.register(registration("0", applied_seq=1))
    replicas.note_applied("0", 2)  # the router saw it reply to cell 2
    replicas.gone("0", "its etcd lease ended")
    assert replicas.applied("0") == -1
    replicas.register(registration("0", applied_seq=1, lease=8))
    assert replicas.applied("0") == 2
    replicas.note_applied("0", 3)
    replicas.gone("0", "its etcd lease ended")
    replicas.register(dataclasses.replace(registration("0", applied_seq=1, lease=9), pid=101))
    assert replicas.applied("0") == 1


def test_a_retired_replica_is_not_a_loss_and_leaves_no_trace() -> None:
    changes: list[tuple[str, Phase]] = []

    def on_change(replica: Replica) -> None:
        changes.append((replica.replica_id, replica.phase))

    replicas = KernelReplicas(KERNEL, on_change=on_change)
    for rid in ("0", "1", "2"):
        started(replicas, rid)
        replicas.register(registration(rid))
    replicas.retire("1")
    assert changes == [("1", Phase.RETIRING)]
    assert replicas.live_count() == 2 and replicas.registered_count() == 3  # registered until its lease ends
    handle = replicas.release("1")
    assert handle is not None and handle.replica_id == "1" and "1" in replicas
    had, retiring = replicas.gone("1", "its etcd lease ended")
    assert had is not None and retiring
    assert "1" not in replicas and [r.replica_id for r in replicas] == ["0", "2"]
    replicas.retire("9")  # unknown: nothing to do, nobody told
    assert changes == [("1", Phase.RETIRING)]


def test_a_retiring_replica_that_registers_again_stays_retiring() -> None:
    replicas = KernelReplicas(KERNEL)
    started(replicas, "0")
    replicas.register(registration("0"))
    replicas.retire("0")
    replicas.register(registration("0", applied_seq=8))
    entry = replicas.get("0")
    assert entry is not None and entry.phase is Phase.RETIRING and replicas.live_count() == 0


def test_a_failed_launch_is_remembered_after_its_process_is_released() -> None:
    changes: list[str] = []
    replicas = KernelReplicas(KERNEL, on_change=lambda r: changes.append(r.phase.value))
    started(replicas, "3", host="host-2")
    replicas.launch_failed("3", "exited with status 1")
    assert changes == ["failed"]
    assert replicas.failure("3") == "exited with status 1" and replicas.failed_ids() == {"3"}
    assert replicas.live_count() == 0
    replicas.release("3")
    assert replicas.failure("3") == "exited with status 1"  # a wait for it can still tell why
    replicas.retire("3")  # cleaning up after it does not hide the failure
    assert replicas.failure("3") == "exited with status 1"
    replicas.expect("3", "host-1")  # starting it anew forgets the old failure
    assert replicas.failure("3") is None and replicas.is_live("3")


def test_an_id_in_use_or_not_from_the_scheduler_cannot_be_started() -> None:
    replicas = KernelReplicas(KERNEL)
    started(replicas, "0")
    with pytest.raises(ReplicaIdError, match="replica 0 is in use already"):
        replicas.expect("0", "host-1")
    replicas.register(registration("4", host="host-3"))  # a replica nobody started here (a stray)
    with pytest.raises(ReplicaIdError, match="replica 4 is in use already"):
        replicas.expect("4", "host-1")
    with pytest.raises(LaunchError, match="is not a scheduler id"):
        replicas.expect("r1", "host-1")


def test_a_replica_registered_without_being_started_here_counts() -> None:
    replicas = KernelReplicas(KERNEL)
    replicas.register(registration("2", host="host-5", applied_seq=1))
    entry = replicas.get("2")
    assert entry is not None and entry.phase is Phase.REGISTERED and entry.host == "host-5" and entry.handle is None
    assert replicas.live_count() == 1 and replicas.handles() == {}
    replicas.gone("2", "lease ended")
    assert "2" not in replicas  # nothing of it is held any more


def test_scheduler_ids_are_the_decimal_replica_ids() -> None:
    assert scheduler_id("0") == 0 and scheduler_id("17") == 17
    assert scheduler_id("r1") is None and scheduler_id("-1") is None and scheduler_id("") is None
