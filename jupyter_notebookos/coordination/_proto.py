"""The etcd v3 protobuf messages and gRPC stubs, taken from etcd3aio.

This is the only module of the project that imports the etcd client library. We use its generated
protobuf code and stubs directly (not its service wrappers) so that one place,
:mod:`jupyter_notebookos.coordination.client`, controls deadlines, retries, failover, the
``hasleader`` metadata and error mapping. etcd3aio is pinned (0.3.0); its ``_protobuf`` module is the
stable home of these names in that release.
"""

from __future__ import annotations

from etcd3aio._protobuf import (
    CompactionRequest,
    Compare,
    DeleteRangeRequest,
    KVStub,
    LeaseGrantRequest,
    LeaseKeepAliveRequest,
    LeaseRevokeRequest,
    LeaseStub,
    LeaseTimeToLiveRequest,
    MaintenanceStub,
    PutRequest,
    RangeRequest,
    RequestOp,
    StatusRequest,
    TxnRequest,
    WatchCancelRequest,
    WatchCreateRequest,
    WatchRequest,
    WatchStub,
)
from etcd3aio.kv import prefix_range_end

__all__ = [
    "CompactionRequest",
    "Compare",
    "DeleteRangeRequest",
    "KVStub",
    "LeaseGrantRequest",
    "LeaseKeepAliveRequest",
    "LeaseRevokeRequest",
    "LeaseStub",
    "LeaseTimeToLiveRequest",
    "MaintenanceStub",
    "PutRequest",
    "RangeRequest",
    "RequestOp",
    "StatusRequest",
    "TxnRequest",
    "WatchCancelRequest",
    "WatchCreateRequest",
    "WatchRequest",
    "WatchStub",
    "prefix_range_end",
]
