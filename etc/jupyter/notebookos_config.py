# Example configuration of the NotebookOS gateway (a commented copy of the defaults).
# Use it with: python -m jupyter_notebookos.gateway --config=etc/jupyter/notebookos_config.py
# Every option is also a command-line flag (--Class.option=value); `notebookos up` passes the common ones.
c = get_config()  # noqa: F821 - provided by traitlets when the file is loaded

# --- Enterprise Gateway (unchanged semantics) -------------------------------------------------------------
# c.NotebookOSGatewayApp.ip = "127.0.0.1"
# c.NotebookOSGatewayApp.port = 8888
# c.NotebookOSGatewayApp.auth_token = ""            # or EG_AUTH_TOKEN; `notebookos up` generates one
# c.NotebookOSGatewayApp.list_kernels = False       # or EG_LIST_KERNELS=True (`notebookos up` and the chart turn it on)
# c.NotebookOSGatewayApp.unauthorized_users = {"root"}  # EG refuses kernels for these KERNEL_USERNAMEs
# EG's idle-kernel culler (docs/jupyterhub.md#idle-culling): an idle NotebookOS kernel holds no GPU, only its
# replicas' memory, so hours are reasonable. A culled kernel's replicas, ledger entries and objects are freed.
# c.MappingKernelManager.cull_idle_timeout = 0      # seconds idle (no client connected) before shutdown; 0: never
# c.MappingKernelManager.cull_interval = 300

# --- Users, tokens and kernel ownership (docs/security.md) ----------------------------------------------------
# c.NotebookOSGatewayApp.user_tokens_file = ""      # or NOTEBOOKOS_USER_TOKENS_FILE; {"<token>": "<user>"}, mode 0600
# c.NotebookOSGatewayApp.hub_api_url = ""           # or NOTEBOOKOS_HUB_API_URL, e.g. "http://hub:8081/hub/api"
# c.NotebookOSGatewayApp.hub_cache_seconds = 60.0   # a token the Hub confirmed is trusted this long
# c.NotebookOSGatewayApp.hub_unknown_cache_seconds = 5.0
# c.NotebookOSGatewayApp.hub_timeout = 5.0          # then 503: a Hub that is down never lets a request through
# c.NotebookOSGatewayApp.metrics_token = ""         # or NOTEBOOKOS_METRICS_TOKEN; reads /metrics only (Prometheus)

# --- etcd -------------------------------------------------------------------------------------------------
# c.NotebookOSGatewayApp.etcd_endpoints = ["127.0.0.1:2379"]   # or NOTEBOOKOS_ETCD_ENDPOINTS=a:1,b:2
# c.NotebookOSGatewayApp.etcd_prefix = "/notebookos"
# c.NotebookOSGatewayApp.etcd_timeout = 5                      # seconds before an etcd call fails clearly
# c.NotebookOSGatewayApp.replica_rejoin_grace = 10.0            # seconds a live replica dropped by etcd may re-register
# c.NotebookOSGatewayApp.ledger_reconcile_interval = 10.0       # seconds between GPU-ledger reconciliations
# c.NotebookOSGatewayApp.gpu_sticky = False                     # keep GPU state on the device between cells
# c.EtcdMaintenance.interval = 600.0              # seconds between checks of etcd's database files (0: off)
# c.EtcdMaintenance.min_free_fraction = 0.5        # defragment a member whose file is this much free space
# c.EtcdMaintenance.min_free_bytes = 67108864      # ... and at least this many bytes
# c.EtcdMaintenance.defragment_timeout = 120.0
# c.ClusterHistory.interval = 15.0                 # seconds between samples of the dashboard's history (0: off)
# c.ClusterHistory.hours = 6.0                     # hours of samples kept in memory
# c.ClusterHistory.usage_write_interval = 60.0     # seconds between writes of GPU-seconds per user and day to etcd
# c.ClusterHistory.usage_days = 90                 # days of GPU-seconds per user kept in etcd

# --- Embedded mode: simulated hosts on this machine ----------------------------------------------------------
# c.NotebookOSGatewayApp.simulated_hosts = 4
# c.NotebookOSGatewayApp.gpus_per_host = 8                     # real GPUs found by NVML are used instead
# c.NotebookOSGatewayApp.state_dir = ".state"
# c.NotebookOSGatewayApp.object_store_url = "file:///path/to/.state/objects"  # any fsspec URL (s3://...)
# c.LocalLauncher.stop_timeout = 5.0

# --- Scheduler (see `python -m jupyter_notebookos.gateway --help-all` for every knob) ------------------------
# c.Scheduler.policy = "notebookos"                # or the baselines "reservation" / "batch" (simulator)
# c.Scheduler.replicas_per_kernel = 3
# c.Scheduler.subscription_ratio_cap = 6.0          # docs/evaluation.md: lower caps miss the interactivity targets
# c.Scheduler.subscription_ratio_half_life_s = 60.0
# c.Scheduler.gpus_per_host = 8
# c.Scheduler.executor_fit = "best-fit"            # or "sticky"
# c.Scheduler.migration_enabled = True
# c.Scheduler.max_concurrent_migrations = 32
# c.Scheduler.max_prepare_migrations_per_round = 8  # ahead-of-time moves per autoscaling round (0: off)
# c.Scheduler.prepare_min_gpus = 1
# c.Scheduler.scaling_factor = 1.1
# c.Scheduler.min_hosts = 3
# c.Scheduler.idle_host_buffer = 1
# c.Scheduler.ready_host_buffer = 3
# c.Scheduler.ready_host_probability = 0.0         # > 0: size the ready-host buffer from observed arrivals
# c.Scheduler.ready_host_window_s = 1800.0
# c.Scheduler.ready_host_lead_s = 240.0
# c.Scheduler.ready_host_min = 1
# c.Scheduler.ready_host_max = 8
# c.Scheduler.headroom_placement = True             # one replica of a new kernel where its first cell fits now
# c.Scheduler.prepare_on_cell_start = True          # ahead-of-time moves right after a cell takes GPUs
# c.Scheduler.max_scale_in_per_round = 1
# c.Scheduler.scale_in_delay_s = 60.0
# c.Scheduler.scale_for_queued_cells = True
# c.Scheduler.max_hosts = 0                         # autoscaling never above this many hosts (0: no bound)
# c.Scheduler.pools = []                            # host pools per GPU type / MIG layout (docs/sharing.md)
# c.Scheduler.quotas = {}                           # {"default": {...}, "users": {...}, "groups": {...}}
# c.Scheduler.fair_share = True                     # order waiting cells of several users by decayed usage
# c.Scheduler.fair_share_half_life_s = 3600.0
# c.Scheduler.fair_share_max_wait_s = 600.0         # a cell that waited this long goes first (0: no bound)
# c.Scheduler.quota_reset_utc_offset_h = 0.0        # GPU-hour quotas reset at midnight of this UTC offset

# --- Kubernetes (the helm chart writes these; see docs/kubernetes.md) ------------------------------------------
# c.KubernetesLauncher.launch_timeout = 600.0
# c.KubernetesLauncher.allowed_images = []          # patterns a kernel may ask for with KERNEL_IMAGE
# c.KubernetesLauncher.allowed_service_accounts = []
# c.KubernetesLauncher.allowed_volume_types = ["persistentVolumeClaim", "configMap", "emptyDir"]
# c.KubernetesLauncher.allowed_volume_sources = {}  # e.g. {"persistentVolumeClaim": ["claim-*"]}
# c.KubernetesLauncher.run_as_user = 1000
# c.KubernetesLauncher.run_as_group = 100
# c.KubernetesLauncher.orphan_sweep_interval = 300.0
# c.KubernetesLauncher.orphan_grace = 900.0
