"""Upkeep of etcd and the GPU ledger in the background: periodic rounds (:mod:`.rounds`) that reconcile the ledger
with the scheduler (:mod:`.reconcile`) and defragment etcd's members (:mod:`.defrag`)."""
