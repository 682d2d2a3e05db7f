# Example configuration of the NotebookOS gateway (a commented copy of the defaults).
# Use it with: python -m jupyter_notebookos.gateway --config=etc/jupyter/notebookos_config.py
# Every option is also a command-line flag (--Class.option=value); `notebookos up` passes the common ones.
c = get_config()  # noqa: F821 - provided by traitlets when the file is loaded

# --- Enterprise Gateway (unchanged semantics) -------------------------------------------------------------
# c.NotebookOSGatewayApp.ip = "127.0.0.1"
# c.NotebookOSGatewayApp.port = 8888
# c.NotebookOSGatewayApp.auth_token = ""            # or EG_AUTH_TOKEN; `notebookos up` generates one
# c.NotebookOSGatewayApp.list_kernels = True        # or EG_LIST_KERNELS=True
# c.NotebookOSGatewayApp.unauthorized_users = {"root"}  # EG refuses kernels for these KERNEL_USERNAMEs

# --- etcd -------------------------------------------------------------------------------------------------
# c.NotebookOSGatewayApp.etcd_endpoints = ["127.0.0.1:2379"]   # or NOTEBOOKOS_ETCD_ENDPOINTS=a:1,b:2
# c.NotebookOSGatewayApp.etcd_prefix = "/notebookos"
# c.NotebookOSGatewayApp.etcd_timeout = 5                      # seconds before an etcd call fails clearly
# c.NotebookOSGatewayApp.replica_rejoin_grace = 10.0            # seconds a live replica dropped by etcd may re-register
# c.NotebookOSGatewayApp.ledger_reconcile_interval = 10.0       # seconds between GPU-ledger reconciliations

# --- Embedded mode: simulated hosts on this machine ----------------------------------------------------------
# c.NotebookOSGatewayApp.simulated_hosts = 4
# c.NotebookOSGatewayApp.gpus_per_host = 8                     # real GPUs found by NVML are used instead
# c.NotebookOSGatewayApp.state_dir = ".state"
# c.NotebookOSGatewayApp.object_store_url = "file:///path/to/.state/objects"  # any fsspec URL (s3://...)
# c.LocalLauncher.stop_timeout = 5.0

# --- Scheduler (see `python -m jupyter_notebookos.gateway --help-all` for every knob) ------------------------
# c.Scheduler.policy = "notebookos"                # or the baselines "reservation" / "batch" (simulator)
# c.Scheduler.replicas_per_kernel = 3
# c.Scheduler.subscription_ratio_cap = 3.0
# c.Scheduler.subscription_ratio_half_life_s = 60.0
# c.Scheduler.migration_enabled = True
# c.Scheduler.max_concurrent_migrations = 32
# c.Scheduler.scaling_factor = 1.1
# c.Scheduler.min_hosts = 3
# c.Scheduler.idle_host_buffer = 1
# c.Scheduler.max_scale_in_per_round = 1
# c.Scheduler.scale_in_delay_s = 60.0
