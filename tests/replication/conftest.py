"""Fixtures of the state-replication tests (defined in replication_harness.py, importable by name)."""

from replication_harness import executor, replica, shell, store, store_url

__all__ = ["executor", "replica", "shell", "store", "store_url"]
