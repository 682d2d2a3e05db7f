"""Typed values read from etcd: key-values, prefix reads and watch events."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any

#: What callers may store: bytes as they are, str as UTF-8.
Value = str | bytes


def to_bytes(value: Value) -> bytes:
    """Encode ``value`` as etcd stores it."""
    return value.encode() if isinstance(value, str) else value


@dataclass(frozen=True)
class KeyValue:
    """One key as etcd stores it, with its revisions.

    ``create_revision`` is the cluster revision that created the key (fencing tokens use it);
    ``mod_revision`` the one that last changed it; ``version`` counts writes since creation;
    ``lease`` is the id of the lease it is bound to, or 0.
    """

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0

    @property
    def text(self) -> str:
        """The value as UTF-8 text."""
        return self.value.decode()

    def json(self) -> Any:
        """The value parsed as JSON."""
        return json.loads(self.value)

    @classmethod
    def from_proto(cls, kv: Any) -> KeyValue:
        return cls(
            key=kv.key.decode(),
            value=bytes(kv.value),
            create_revision=kv.create_revision,
            mod_revision=kv.mod_revision,
            version=kv.version,
            lease=kv.lease,
        )


@dataclass(frozen=True)
class RangeResult:
    """The keys under a prefix, in key order, and the cluster revision they were read at.

    Watch from ``revision + 1`` to see every change after this read and none before.
    """

    items: list[KeyValue]
    revision: int

    def __iter__(self) -> Iterator[KeyValue]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def as_dict(self) -> dict[str, bytes]:
        return {kv.key: kv.value for kv in self.items}


class EventType(Enum):
    """What happened to a key."""

    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True)
class WatchEvent:
    """One change seen by a watch.

    For a delete, ``value`` is empty and ``mod_revision`` is the revision of the delete.
    Events of one transaction share a ``mod_revision``.
    """

    type: EventType
    key: str
    value: bytes
    mod_revision: int
    create_revision: int = 0
    version: int = 0
    lease: int = 0

    @property
    def text(self) -> str:
        return self.value.decode()

    def json(self) -> Any:
        return json.loads(self.value)

    @classmethod
    def from_proto(cls, event: Any) -> WatchEvent:
        kv = event.kv
        return cls(
            type=EventType.DELETE if event.type == 1 else EventType.PUT,
            key=kv.key.decode(),
            value=bytes(kv.value),
            mod_revision=kv.mod_revision,
            create_revision=kv.create_revision,
            version=kv.version,
            lease=kv.lease,
        )
