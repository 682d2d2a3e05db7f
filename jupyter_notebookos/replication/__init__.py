"""replication."""
