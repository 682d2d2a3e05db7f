"""``KnownCheckpoint``: the kernel's checkpoint as this replica knows it, and which names the records since changed.

A checkpoint comes in parts (``kernel/statelog.py``); the next one names again the parts whose names no record changed
since, instead of pickling them again. The log follower tells it what it restored and applied, the publisher (through
the follower) what this replica's own cells changed, and the checkpointer what it wrote; the checkpointer asks it
what its next checkpoint may name again (:meth:`KnownCheckpoint.plan`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from jupyter_notebookos.kernel.statelog import CheckpointPart
from jupyter_notebookos.replication.protocol import FIRST_SEQ

#: How many records' changed names a replica keeps for its next checkpoint (beyond that it pickles everything).
TOUCHED_RECORDS_KEPT = 4096


class KnownCheckpoint:
    """The latest checkpoint this replica knows of (:attr:`seq`), the parts of the one it wrote or read last
    (:attr:`parts_seq`), and which records changed which names since."""

    def __init__(self) -> None:
        self._seq = FIRST_SEQ - 1
        # The parts of the latest checkpoint this replica wrote or restored from (None: none known), which
        # records changed which names since (seq -> names; None: not known), and the last seq whose entry was
        # dropped to bound that map: a checkpoint names a part again only if no record since changed its names.
        self._parts: list[CheckpointPart] | None = None
        self._parts_seq = FIRST_SEQ - 1
        self._touched: dict[int, frozenset[str] | None] = {}
        self._touched_dropped = FIRST_SEQ - 1

    @property
    def seq(self) -> int:
        """The log record the latest checkpoint this replica knows of covers (one it restored from, or the last it
        wrote or tried to write)."""
        return self._seq

    @property
    def parts_seq(self) -> int:
        """The log record covered by the checkpoint whose parts this replica knows."""
        return self._parts_seq

    def checkpointed(self, seq: int) -> None:
        """A checkpoint at ``seq`` is restored here, or written (or tried) here: the next is due ``checkpoint_every``
        records after it, whatever the outcome."""
        self._seq = seq

    def forget(self) -> None:
        """The namespace is restored anew: no part and no change since is known."""
        self._touched.clear()
        self._touched_dropped = FIRST_SEQ - 1
        self.learned(FIRST_SEQ - 1, None)

    def learned(self, seq: int, parts: list[CheckpointPart] | None) -> None:
        """The checkpoint at ``seq`` (written or read here) has ``parts`` (None: none to name again)."""
        self._parts, self._parts_seq = parts, seq
        for after in [s for s in self._touched if s <= seq]:
            del self._touched[after]

    def note_touched(self, seq: int, names: Iterable[str] | None) -> None:
        """Record ``seq`` (applied here, or published by this replica) changed ``names`` (None: not known)."""
        if seq <= self._parts_seq:
            return
        self._touched[seq] = None if names is None else frozenset(names)
        while len(self._touched) > TOUCHED_RECORDS_KEPT:
            oldest = min(self._touched)
            del self._touched[oldest]
            self._touched_dropped = max(self._touched_dropped, oldest)

    def touched_since(self, seq: int) -> set[str] | None:
        """The names the records after ``seq`` changed; None when that is not known."""
        if self._touched_dropped > seq:
            return None
        names: set[str] = set()
        for after, changed in self._touched.items():
            if after > seq:
                if changed is None:
                    return None
                names |= changed
        return names

    def plan(
        self, names: list[str], current: int | None, groups: Mapping[str, frozenset[str]] | None
    ) -> tuple[list[CheckpointPart], list[list[str]]]:
        """What the next checkpoint names again and what it pickles: the parts of the kernel's checkpoint now
        (``current``) whose names are all still there, that no record since changed, and that share no object
        with a name outside the part; and the other names, in the groups that share objects (``groups``: name ->
        the names sharing an object with it; one group when the state tracker does not know them; see
        StateTracker.groups)."""
        present = set(names)
        kept: list[CheckpointPart] = []
        touched = self.touched_since(self._parts_seq)
        if self._parts is not None and current == self._parts_seq and touched is not None and groups is not None:
            for part in self._parts:
                alone = all(groups.get(name, part.names) <= part.names for name in part.names)
                if alone and part.names <= present and not part.names & touched:
                    kept.append(part)
        covered = {name for part in kept for name in part.names}
        rest = [name for name in names if name not in covered]
        if groups is None:
            return kept, [rest]
        order = {name: i for i, name in enumerate(rest)}
        plan: list[list[str]] = []
        seen: set[str] = set()
        for name in rest:
            if name not in seen:
                group = groups.get(name, frozenset((name,)))
                members = sorted((n for n in group | {name} if n in order), key=order.__getitem__)
                seen.update(members)
                plan.append(members)
        return kept, plan
