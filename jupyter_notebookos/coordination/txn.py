"""Typed builders for etcd transactions: compares, operations and results.

A transaction is one round trip: if every :class:`Compare` holds, the ``success`` operations run,
otherwise the ``failure`` ones, all at one cluster revision::

    cell = keys.cell(kid, msg_id)
    result = await coordinator.txn(
        compare=[Compare.absent(cell), Compare.create_revision(keys.executor(kid), "==", token)],
        success=[Op.put(cell, decision, lease=lease), Op.put(keys.gpu(host, 0), entry, lease=lease)],
        failure=[Op.get(cell)],
    )
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from jupyter_notebookos.coordination import _proto
from jupyter_notebookos.coordination.kv import KeyValue, Value, to_bytes

#: Comparison operators etcd supports.
Operator = Literal["==", "!=", "<", ">"]

_OPERATORS: dict[str, int] = {
    "==": _proto.Compare.EQUAL,
    "!=": _proto.Compare.NOT_EQUAL,
    "<": _proto.Compare.LESS,
    ">": _proto.Compare.GREATER,
}


class _HasLeaseId(Protocol):
    @property
    def id(self) -> int: ...


def lease_id(lease: _HasLeaseId | int | None) -> int:
    """0 for no lease, else the lease's id."""
    if lease is None:
        return 0
    return lease if isinstance(lease, int) else lease.id


@dataclass(frozen=True)
class Compare:
    """One condition of a transaction. Build with the class methods."""

    key: str
    target: Literal["value", "version", "create", "mod"]
    operator: Operator
    operand: int | bytes

    @classmethod
    def value(cls, key: str, operator: Operator, value: Value) -> Compare:
        """The key's value compared (bytewise) with ``value``. A missing key never matches."""
        return cls(key, "value", operator, to_bytes(value))

    @classmethod
    def version(cls, key: str, operator: Operator, version: int) -> Compare:
        """The key's version (writes since creation; 0 when absent)."""
        return cls(key, "version", operator, version)

    @classmethod
    def create_revision(cls, key: str, operator: Operator, revision: int) -> Compare:
        """The revision that created the key (0 when absent). Fencing tokens compare this."""
        return cls(key, "create", operator, revision)

    @classmethod
    def mod_revision(cls, key: str, operator: Operator, revision: int) -> Compare:
        """The revision of the key's last write (0 when absent): optimistic concurrency."""
        return cls(key, "mod", operator, revision)

    @classmethod
    def absent(cls, key: str) -> Compare:
        """The key does not exist."""
        return cls.version(key, "==", 0)

    @classmethod
    def present(cls, key: str) -> Compare:
        """The key exists."""
        return cls.version(key, ">", 0)

    def to_proto(self) -> Any:
        c = _proto.Compare(result=_OPERATORS[self.operator], key=self.key.encode())
        if self.target == "value":
            c.target = _proto.Compare.VALUE
            c.value = self.operand
        elif self.target == "version":
            c.target = _proto.Compare.VERSION
            c.version = self.operand
        elif self.target == "create":
            c.target = _proto.Compare.CREATE
            c.create_revision = self.operand
        else:
            c.target = _proto.Compare.MOD
            c.mod_revision = self.operand
        return c


@dataclass(frozen=True)
class Op:
    """One operation of a transaction branch. Build with :meth:`put`, :meth:`delete`, :meth:`get`."""

    kind: Literal["put", "delete", "get"]
    key: str
    value: bytes = b""
    lease: int = 0
    prefix: bool = False

    @classmethod
    def put(cls, key: str, value: Value, *, lease: _HasLeaseId | int | None = None) -> Op:
        """Write ``key``, bound to ``lease`` (a :class:`Lease` or its id) if given."""
        return cls("put", key, to_bytes(value), lease_id(lease))

    @classmethod
    def delete(cls, key: str, *, prefix: bool = False) -> Op:
        """Delete ``key``, or every key starting with it when ``prefix``."""
        return cls("delete", key, prefix=prefix)

    @classmethod
    def get(cls, key: str, *, prefix: bool = False) -> Op:
        """Read ``key`` (or the prefix) at the transaction's revision."""
        return cls("get", key, prefix=prefix)

    def to_proto(self) -> Any:
        key = self.key.encode()
        range_end = _proto.prefix_range_end(key) if self.prefix else b""
        if self.kind == "put":
            return _proto.RequestOp(request_put=_proto.PutRequest(key=key, value=self.value, lease=self.lease))
        if self.kind == "delete":
            return _proto.RequestOp(request_delete_range=_proto.DeleteRangeRequest(key=key, range_end=range_end))
        return _proto.RequestOp(request_range=_proto.RangeRequest(key=key, range_end=range_end))


@dataclass(frozen=True)
class OpResult:
    """The outcome of one operation: keys read (get), keys deleted (delete), nothing for put."""

    kind: Literal["put", "delete", "get"]
    items: list[KeyValue] = field(default_factory=list)
    deleted: int = 0

    @classmethod
    def from_proto(cls, response: Any) -> OpResult:
        which = response.WhichOneof("response")
        if which == "response_range":
            return cls("get", [KeyValue.from_proto(kv) for kv in response.response_range.kvs])
        if which == "response_delete_range":
            return cls("delete", deleted=response.response_delete_range.deleted)
        return cls("put")


@dataclass(frozen=True)
class TxnResult:
    """Whether the compares held, the revision the transaction ran at, and its branch's results."""

    succeeded: bool
    revision: int
    results: list[OpResult]

    def __bool__(self) -> bool:
        return self.succeeded
