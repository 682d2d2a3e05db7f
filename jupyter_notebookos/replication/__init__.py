"""State replication: capture each cell's state delta, serialize it, ship large buffers to the object store.

The replica kernel uses ``state.StateTracker`` (``before_cell`` / ``after_cell`` -> ``StateDelta``),
``serialization.encode_delta`` (-> ``StateRecord``, whose bytes go to the state log) and
``serialization.apply_record`` on followers and replacement replicas; ``objectstore.ObjectStore`` for the buffers.
Checkpoints (``serialization.encode_values`` of the whole namespace) and the object store's garbage collection
are the replica's: :mod:`jupyter_notebookos.kernel.statelog`.
"""
