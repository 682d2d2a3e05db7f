"""Telling the user about a cell whose state changes never reached the log.

A cell replied, but its changes were not published: its executor died between the reply and the publication, or
the object store refused the upload. Its log record is closed as ``lost`` (by the router, or by the executor
itself), naming the names the cell changed. Every replica keeps the names of such records; the replica that runs
the *next* cell prints, before that cell's own output, which names were lost and what they hold now. The other
replicas drop the notice when they apply that next cell's record: it was someone else's to show.

- The executor died: the survivors hold the values from before the lost cell (or the name is undefined).
- The executor's record was refused (its seq was closed as lost, or taken, or a newer executor term was in
  force): it reloads its state from the log, so it loses the changes too, and tells the user with its own next
  cell whatever that cell's seq (nobody else knows of them).
- The object store refused the upload: the executor keeps the new values; the others mark those names as not
  replicated (a clear marker instead of an old value), until the user assigns them again.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_REPR = reprlib.Repr()
_REPR.maxstring = 60
_REPR.maxother = 60


@dataclass
class LostChange:
    """The changes of the cell at log record ``seq`` to ``names`` were lost, because of ``reason``."""

    seq: int
    names: list[str]
    reason: str = ""
    kept: bool = False  # this replica ran the cell and still holds the changes (the others do not)
    refused: bool = False  # this replica ran the cell, but its record was refused; it reloaded the log since


@dataclass
class LostChanges:
    """The lost changes this replica has yet to tell the user about (see the module docstring)."""

    pending: list[LostChange] = field(default_factory=list)

    def add(self, seq: int, names: list[str], reason: str = "", *, kept: bool = False, refused: bool = False) -> None:
        if names and all(c.seq != seq for c in self.pending):
            self.pending.append(LostChange(seq, sorted(set(names)), reason, kept, refused))

    def add_unreadable(self, seq: int) -> None:
        """The record at ``seq`` could not be read (malformed in etcd): which names it changed is unknown."""
        if all(c.seq != seq for c in self.pending):
            self.pending.append(LostChange(seq, [], "its record in etcd is malformed"))

    def forget_before(self, seq: int) -> None:
        """A later cell's record (``seq``) was applied here: its executor told the user already (not of a refused
        record: only this replica knows of it)."""
        self.pending = [c for c in self.pending if c.seq >= seq or c.refused]

    def take_message(self, seq: int, namespace: Mapping[str, Any]) -> str | None:
        """The notice to show before running the cell at record ``seq`` (None when there is nothing to say)."""
        due = [c for c in self.pending if c.seq < seq or c.refused]
        self.pending = [c for c in self.pending if c not in due]
        if not due:
            return None
        lines = []
        for change in due:
            why = f" ({change.reason})" if change.reason else ""
            if not change.names:
                lines.append(
                    f"NotebookOS: the changes of an earlier cell (log record {change.seq}) could not be applied on "
                    f"this replica{why}; which names it changed is unknown. Names that cell set may be missing or "
                    "hold older values here: run it again if you need them."
                )
                continue
            now = ", ".join(
                f"{name} = {_REPR.repr(namespace[name])}" if name in namespace else f"{name} is not defined"
                for name in change.names
            )
            if change.refused:
                lines.append(
                    f"NotebookOS: the changes an earlier cell made to {', '.join(change.names)} were lost: this "
                    f"replica ran it, but its state record (log record {change.seq}) was refused{why}, so the "
                    f"replica reloaded the kernel's state from the log. Their values now: {now}. Run that cell "
                    "again if you need them."
                )
            elif change.kept:
                lines.append(
                    f"NotebookOS: the changes an earlier cell (log record {change.seq}) made to "
                    f"{', '.join(change.names)} could not be shared with the other replicas{why}. This replica "
                    f"keeps them ({now}); on the others they are marked as not replicated, so they do not survive "
                    "a failover or migration until you assign them again."
                )
            else:
                lines.append(
                    f"NotebookOS: the changes an earlier cell (log record {change.seq}) made to "
                    f"{', '.join(change.names)} were lost: they were never shared with the other replicas{why}. "
                    f"Their values now: {now}. Run that cell again if you need them."
                )
        return "\n".join(lines)
