"""KnownCheckpoint: which parts of the kernel's checkpoint the next checkpoint names again instead of pickling them."""

from __future__ import annotations

import pytest

from jupyter_notebookos.kernel import knowncheckpoint
from jupyter_notebookos.kernel.knowncheckpoint import KnownCheckpoint
from jupyter_notebookos.kernel.statelog import CheckpointPart
from jupyter_notebookos.replication.objectstore import BufferRef


def _part(*names: str) -> CheckpointPart:
    digest = "".join(names).ljust(64, "0")[:64]
    return CheckpointPart(frozenset(names), BufferRef(f"buffers/{digest}", 10, digest), (f"buffers/{digest}",))


def _alone(*groups: set[str]) -> dict[str, frozenset[str]]:
    """StateTracker.groups for names that share objects within ``groups`` only."""
    return {name: frozenset(group) for group in groups for name in group}


def test_a_part_no_record_changed_is_named_again_and_the_rest_is_pickled_in_groups() -> None:
    known = KnownCheckpoint()
    model, data, n = _part("model"), _part("a", "b"), _part("n")
    known.learned(10, [model, data, n])
    known.note_touched(11, ["n"])
    known.note_touched(12, ["new"])
    names = ["model", "a", "b", "n", "new", "other"]
    kept, groups = known.plan(names, 10, _alone({"model"}, {"a", "b"}, {"n"}, {"new", "other"}))
    assert kept == [model, data]
    assert groups == [["n"], ["new", "other"]]


def test_a_part_sharing_an_object_with_a_name_outside_it_or_missing_a_name_is_pickled_again() -> None:
    known = KnownCheckpoint()
    known.learned(10, [_part("a"), _part("b"), _part("c")])
    # a now shares an object with x (another part or a new name); b was deleted; c is as it was.
    kept, groups = known.plan(["a", "x", "c"], 10, _alone({"a", "x"}, {"c"}))
    assert [sorted(part.names) for part in kept] == [["c"]]
    assert groups == [["a", "x"]]


def test_nothing_is_named_again_when_the_checkpoint_in_force_or_the_changes_since_are_not_known(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    known = KnownCheckpoint()
    part = _part("a")
    known.learned(10, [part])
    groups = _alone({"a"}, {"b"})
    assert known.plan(["a", "b"], 10, groups)[0] == [part]
    assert known.plan(["a", "b"], 12, groups) == ([], [["a"], ["b"]])  # another replica wrote a newer one
    assert known.plan(["a", "b"], 10, None) == ([], [["a", "b"]])  # what names share is not known: one group
    known.note_touched(11, None)  # a record whose names are not known (malformed)
    assert known.touched_since(10) is None and known.plan(["a", "b"], 10, groups)[0] == []
    # Only so many records are remembered: beyond that, what changed is not known either.
    monkeypatch.setattr(knowncheckpoint, "TOUCHED_RECORDS_KEPT", 3)
    known.learned(20, [part])
    for seq in range(21, 25):
        known.note_touched(seq, ["b"])
    assert known.touched_since(20) is None and known.touched_since(21) == {"b"}


def test_restoring_forgets_the_parts_and_the_changes_and_a_newer_checkpoint_drops_older_changes() -> None:
    known = KnownCheckpoint()
    known.learned(10, [_part("a")])
    known.note_touched(11, ["a"])
    known.note_touched(12, ["b"])
    assert known.touched_since(10) == {"a", "b"}
    known.learned(11, [_part("a")])  # a checkpoint at 11: changes up to it are in it
    assert known.touched_since(11) == {"b"}
    known.note_touched(9, ["c"])  # older than the checkpoint whose parts are known: in it already
    assert known.touched_since(0) == {"b"}
    known.checkpointed(11)
    known.forget()
    assert known.seq == 11 and known.parts_seq == 0 and known.touched_since(0) == set()
    assert known.plan(["a"], 0, _alone({"a"})) == ([], [["a"]])
