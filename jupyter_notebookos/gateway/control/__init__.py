"""The gateway's control plane: the platform that starts and stops kernels and their replica processes, places
cells through the scheduler (:mod:`.planner`), replaces lost replicas, re-attaches after a restart, runs migrations
and autoscaling, and keeps each kernel's narrow identity (:mod:`.access`, :mod:`.objectbroker`)."""
