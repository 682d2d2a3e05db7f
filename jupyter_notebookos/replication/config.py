"""Deployer-tunable settings of state replication (``c.ReplicationConfig.<trait>`` in a config file)."""

from __future__ import annotations

from traitlets import Bool, Float, Int, Unicode
from traitlets.config import Configurable

DEFAULT_BUFFER_THRESHOLD = 1024 * 1024


class ReplicationConfig(Configurable):
    """How a replica kernel captures, ships and stores its namespace."""

    buffer_threshold = Int(
        DEFAULT_BUFFER_THRESHOLD,
        config=True,
        help="Pickle buffers (numpy arrays, bytes-like data) at least this many bytes go to the object store "
        "and only a pointer goes into the state log; smaller ones stay inline in the record.",
    )
    object_store_url = Unicode(
        "",
        config=True,
        help="fsspec URL of the object store for large buffers and checkpoints (file://, s3://, gs://, "
        "memory://). Empty: a directory 'objects' under the kernel's state directory.",
    )
    verify_buffers = Bool(
        True,
        config=True,
        help="Check every buffer read from the object store against its content digest.",
    )
    gc_grace_seconds = Float(
        600.0,
        config=True,
        help="Garbage collection leaves buffers younger than this alone: an executor may have uploaded them "
        "for a record that is not yet committed to the log.",
    )
