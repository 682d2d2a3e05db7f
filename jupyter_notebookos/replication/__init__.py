"""State replication: capture each cell's state delta, serialize it, ship large buffers to the object store.

The replica kernel uses ``state.StateTracker`` (``before_cell`` / ``after_cell`` -> ``StateDelta``),
``records.encode_values`` (-> ``StateRecord``, whose bytes go to the state log; the values pickled by
``serialization.NamespacePickler``) and ``records.apply_record`` on followers and replacement replicas;
``objectstore.ObjectStore`` for the buffers. Deltas and checkpoints in two steps (pickled, then uploaded) and the
object store's garbage collection are the replica's: :mod:`jupyter_notebookos.kernel.statelog`.
"""
