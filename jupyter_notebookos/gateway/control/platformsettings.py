"""What a deployer configures about the gateway platform, in one value built before the platform is
(:class:`PlatformSettings`: the gateway app fills it from its traitlets, tests fill it directly)."""

from __future__ import annotations

from dataclasses import dataclass, field

from jupyter_notebookos.coordination.client import EtcdCredentials, EtcdTls
from jupyter_notebookos.gateway.control.rejoin import DEFAULT_REJOIN_GRACE
from jupyter_notebookos.gateway.router.cells import RouterSettings
from jupyter_notebookos.gateway.upkeep.reconcile import DEFAULT_RECONCILE_INTERVAL
from jupyter_notebookos.replication import protocol

#: How a kernel's replicas reach the object store (``NotebookOSGatewayApp.object_store_access``).
OBJECT_STORE_ACCESS = ("auto", "broker", "direct")


@dataclass(frozen=True)
class PlatformSettings:
    """The platform's configuration (each field is the ``NotebookOSGatewayApp`` traitlet of the same name, or says
    which it comes from)."""

    etcd_endpoints: list[str]
    state_dir: str
    object_store_url: str
    etcd_prefix: str = "/notebookos"
    etcd_timeout: float = 5.0
    etcd_tls: EtcdTls | None = None  # client TLS; None: plain gRPC
    etcd_credentials: EtcdCredentials | None = None  # the gateway's etcd admin identity; None: etcd auth off
    simulated_hosts: int = 0  # hosts of this machine at start (embedded mode); Kubernetes: 0, nodes join
    gpus_per_host: int = 1
    autoscale_interval: float = 0.0  # seconds between autoscaling rounds; 0: no autoscaling
    router: RouterSettings = field(default_factory=RouterSettings)
    replica_lease_ttl: int = protocol.DEFAULT_LEASE_TTL
    # Seconds a live replica whose etcd lease ended may take to register again (replica_rejoin_grace).
    rejoin_grace: float = DEFAULT_REJOIN_GRACE
    # Seconds between two reconciliations of the GPU ledger with the scheduler (ledger_reconcile_interval; 0: off).
    reconcile_interval: float = DEFAULT_RECONCILE_INTERVAL
    # Replicas keep GPU state on the device between cells, evicted when the GPU changes hands.
    gpu_sticky: bool = False
    # Names the operator lets kernels inherit from the gateway (EG's inherited_envs).
    inherited_envs: frozenset[str] = frozenset()
    # S3-compatible stores: the gateway signs its kernels' object operations (replicas hold no store keys).
    object_store_access: str = "auto"
    object_broker_url: str = ""  # where replicas reach the broker
    object_url_expires: int = 900  # seconds a signed URL holds

    def __post_init__(self) -> None:
        if not self.etcd_endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        if self.object_store_access not in OBJECT_STORE_ACCESS:
            raise ValueError(
                f"object_store_access={self.object_store_access!r}: give one of {', '.join(OBJECT_STORE_ACCESS)}"
            )
        if not 60 <= self.object_url_expires <= 43200:
            raise ValueError(f"object_url_expires={self.object_url_expires}: give 60 to 43200 seconds")
