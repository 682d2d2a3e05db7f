"""Fixtures of the replica kernel tests (defined in replica_harness.py, importable by name)."""

from replica_harness import etcd_cluster, replicas

__all__ = ["etcd_cluster", "replicas"]
