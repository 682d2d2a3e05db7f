"""The NotebookOS gateway application: Enterprise Gateway 3.3 with our platform inside.

``NotebookOSGatewayApp`` is an ``EnterpriseGatewayApp``: EG's REST and websocket API stay as they are (plain
kernelspecs keep working), and we add

- user identities and kernel ownership on every handler, EG's and ours
  (:mod:`jupyter_notebookos.gateway.web.identity`, :mod:`jupyter_notebookos.gateway.web.authorization`),
- ``/api/notebookos/*`` and ``/metrics``,
- a kernel-channels websocket handler that sets TCP_NODELAY and survives JupyterLab's reconnects
  (:mod:`jupyter_notebookos.gateway.web.websocket`),
- message timestamps read with ``datetime.fromisoformat`` instead of dateutil
  (:mod:`jupyter_notebookos.gateway.web.dates`: about 1 ms of every cell, plain kernels too),
- the platform (:class:`~jupyter_notebookos.gateway.control.gatewayplatform.GatewayPlatform`): the cluster model, etcd,
  the launcher and the replica routers of NotebookOS kernels.

Every knob is a traitlet, so ``c.NotebookOSGatewayApp.x`` in ``etc/jupyter/notebookos_config.py`` and
``--NotebookOSGatewayApp.x=...`` on the command line both reach it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from enterprise_gateway.enterprisegatewayapp import EnterpriseGatewayApp
from enterprise_gateway.services.processproxies.processproxy import min_port_range_size
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_server.utils import url_path_join
from tornado import ioloop
from traitlets import Bool, Enum, Float, Integer, List, TraitError, Unicode, default, validate

from jupyter_notebookos.coordination.client import Coordinator, EtcdCredentials, EtcdTls
from jupyter_notebookos.coordination.errors import CoordinationError
from jupyter_notebookos.embedded import ports
from jupyter_notebookos.gateway.control.gatewayplatform import GatewayPlatform
from jupyter_notebookos.gateway.control.history import ClusterHistory
from jupyter_notebookos.gateway.control.objectbroker import broker_handlers
from jupyter_notebookos.gateway.control.platformsettings import PlatformSettings
from jupyter_notebookos.gateway.control.readings import MachineReadings, host_gpu_uuids
from jupyter_notebookos.gateway.control.rejoin import DEFAULT_REJOIN_GRACE
from jupyter_notebookos.gateway.upkeep.defrag import EtcdMaintenance
from jupyter_notebookos.gateway.upkeep.reconcile import DEFAULT_RECONCILE_INTERVAL
from jupyter_notebookos.gateway.web import dates
from jupyter_notebookos.gateway.web.authorization import ENV_KERNEL_OWNER, with_identity
from jupyter_notebookos.gateway.web.dashboard.notebooks import ENV_SESSION_NAME
from jupyter_notebookos.gateway.web.handlers import notebookos_handlers
from jupyter_notebookos.gateway.web.identity import Identities, IdentityConfig, IdentityConfigError
from jupyter_notebookos.launchers.local import LocalLauncher
from jupyter_notebookos.launchers.provisioning import SimulatedHostProvisioner
from jupyter_notebookos.replication import protocol
from jupyter_notebookos.scheduler import Scheduler

try:  # the stale-session fix and TCP_NODELAY (see that module's docstring)
    from jupyter_notebookos.gateway.web.websocket import handler_overrides
except ImportError:  # pragma: no cover - only while the module is being written

    def handler_overrides() -> list[tuple[str, type]]:
        return []


#: The kernelspec of NotebookOS kernels (1 GPU per cell); ``python3-notebookos-2gpus`` and ``-4gpus`` ask for more.
NOTEBOOKOS_KERNELSPEC = "python3-notebookos"


class NotebookOSGatewayApp(IdentityConfig, EnterpriseGatewayApp):
    """Enterprise Gateway with NotebookOS's replicated kernels, scheduler and REST API."""

    name = "notebookos-gateway"
    description = "NotebookOS: GPU-efficient replicated notebook kernels on Jupyter Enterprise Gateway"
    classes = [
        *EnterpriseGatewayApp.classes,
        Scheduler,
        LocalLauncher,
        SimulatedHostProvisioner,
        EtcdMaintenance,
        ClusterHistory,
    ]

    @default("client_envs")
    def _client_envs_default(self) -> list[str]:
        # EG's default (EG_CLIENT_ENVS), and the notebook's path that Jupyter servers send when their
        # GatewayClient.allowed_envs names it: the dashboard shows it, ipykernel names __session__ after it.
        given = os.getenv("EG_CLIENT_ENVS", os.getenv("EG_ENV_WHITELIST", ""))
        return [name for name in given.split(",") if name] + [ENV_SESSION_NAME]

    etcd_endpoints = List(
        Unicode(),
        config=True,
        help="etcd client endpoints (host:port), e.g. ['127.0.0.1:2379']. Env: NOTEBOOKOS_ETCD_ENDPOINTS "
        "(comma-separated).",
    )

    @default("etcd_endpoints")
    def _etcd_endpoints_default(self) -> list[str]:
        raw = os.environ.get("NOTEBOOKOS_ETCD_ENDPOINTS", "127.0.0.1:2379")
        return [e.strip() for e in raw.split(",") if e.strip()]

    launcher = Enum(
        ["local", "kubernetes"],
        config=True,
        help="Where replicas run: 'local' (embedded: processes on simulated hosts) or 'kubernetes' (one pod "
        "per replica on GPU nodes; hosts come from the nodes, scaling from placeholder pods). Env: "
        "NOTEBOOKOS_LAUNCHER (the helm chart sets 'kubernetes').",
    )

    @default("launcher")
    def _launcher_default(self) -> str:
        return os.environ.get("NOTEBOOKOS_LAUNCHER", "").strip().lower() or "local"

    stop_kernels_on_shutdown = Bool(
        config=True,
        help="Whether stopping the gateway stops the NotebookOS kernels' replicas. Default: yes for the local "
        "launcher (the embedded platform stops as a whole); no on Kubernetes, so a gateway rollout leaves users' "
        "kernels running and the new gateway re-attaches to them.",
    )

    @default("stop_kernels_on_shutdown")
    def _stop_kernels_default(self) -> bool:
        return self.launcher == "local"

    @default("default_kernel_name")
    def _default_kernel_name_default(self) -> str:
        """EG's ``EG_DEFAULT_KERNEL_NAME`` if set, else NotebookOS's kernelspec where it is installed: the kernel
        that clients preselect (JupyterLab's kernel picker and launcher, Notebook 7's New menu, a new notebook)
        is the one this gateway exists for, not the plain ``python3``."""
        configured = str(super()._default_kernel_name_default())
        if configured:
            return configured
        installed = KernelSpecManager(parent=self).find_kernel_specs()
        return NOTEBOOKOS_KERNELSPEC if NOTEBOOKOS_KERNELSPEC in installed else ""

    @default("port_range")
    def _port_range_default(self) -> str:
        """EG's ``EG_PORT_RANGE`` if set, else the kernels' part of the ports below the ephemeral range
        (``embedded.ports.kernel_range``).

        Enterprise Gateway picks a plain kernel's five ports by binding port 0 and letting go, so they come from the
        ephemeral range, and the next process that binds port 0 there (a replica's ZMQ socket, an outgoing
        connection) can take one before the kernel binds it. ipykernel then exits if it was the shell port, and the
        restarter gives it new ports; any other port leaves it alive with nothing served, and a client's websocket
        handshake waits 60 s for a kernel_info reply, its nudge 60 s more, and then the gateway aborts the
        connection (CI, 2026-12-05: EG's own ``test_interrupt`` lost its cells). Below the ephemeral range nothing
        binds port 0. Left as EG's default (port 0) where that part is smaller than EG accepts.
        """
        if os.environ.get(self.port_range_env):
            return os.environ[self.port_range_env]
        kernels = ports.kernel_range()
        if kernels is None or kernels[1] - kernels[0] < min_port_range_size:
            return self.port_range_default_value
        return f"{kernels[0]}..{kernels[1]}"

    etcd_ca_cert = Unicode(
        config=True, help="PEM file of the CA of etcd's certificates (TLS). Env: NOTEBOOKOS_ETCD_CA_CERT."
    )
    etcd_cert = Unicode(
        config=True, help="PEM file of the gateway's etcd client certificate. Env: NOTEBOOKOS_ETCD_CERT."
    )
    etcd_key = Unicode(config=True, help="PEM file of the gateway's etcd client key. Env: NOTEBOOKOS_ETCD_KEY.")
    etcd_server_name = Unicode(
        config=True,
        help="Name checked against etcd's certificate (default: the first endpoint's host name). "
        "Env: NOTEBOOKOS_ETCD_SERVER_NAME.",
    )

    @default("etcd_ca_cert")
    def _etcd_ca_cert_default(self) -> str:
        return os.environ.get(protocol.ENV_ETCD_CA_CERT, "")

    @default("etcd_cert")
    def _etcd_cert_default(self) -> str:
        return os.environ.get(protocol.ENV_ETCD_CERT, "")

    @default("etcd_key")
    def _etcd_key_default(self) -> str:
        return os.environ.get(protocol.ENV_ETCD_KEY, "")

    @default("etcd_server_name")
    def _etcd_server_name_default(self) -> str:
        return os.environ.get(protocol.ENV_ETCD_SERVER_NAME, "")

    def etcd_tls(self) -> EtcdTls | None:
        """The etcd client TLS settings, or None for plain gRPC."""
        if not (self.etcd_ca_cert or self.etcd_cert or self.etcd_key):
            return None
        try:
            return EtcdTls(self.etcd_ca_cert, self.etcd_cert, self.etcd_key, self.etcd_server_name)
        except ValueError as err:
            raise TraitError(f"NotebookOSGatewayApp.etcd_cert / etcd_key: {err}") from None

    etcd_auth = Bool(
        True,
        config=True,
        help="Use etcd's auth: the gateway logs in as etcd's root user (turning auth on at start if it is off) and "
        "gives each kernel an etcd user that reaches only that kernel's keys. Off: every replica can read and "
        "write every kernel's keys (a single trusted user only). Env: NOTEBOOKOS_ETCD_AUTH=0 turns it off.",
    )

    @default("etcd_auth")
    def _etcd_auth_default(self) -> bool:
        return os.environ.get("NOTEBOOKOS_ETCD_AUTH", "1").strip().lower() not in ("0", "false", "no", "off")

    etcd_user = Unicode(
        "root",
        config=True,
        help="The gateway's etcd user: etcd's admin, 'root' (etcd enables auth only with that user). "
        "Env: NOTEBOOKOS_ETCD_USER.",
    )

    @default("etcd_user")
    def _etcd_user_default(self) -> str:
        return os.environ.get(protocol.ENV_ETCD_USER, "").strip() or "root"

    etcd_password = Unicode(
        config=True,
        help="The password of etcd_user. Give it in the environment (NOTEBOOKOS_ETCD_PASSWORD) or a config file, "
        "never on a command line (other users can read those). `notebookos up` generates one.",
    )

    @default("etcd_password")
    def _etcd_password_default(self) -> str:
        return os.environ.get(protocol.ENV_ETCD_PASSWORD, "").strip()

    def etcd_credentials(self) -> EtcdCredentials | None:
        """The gateway's etcd admin identity, or None with etcd auth off."""
        if not self.etcd_auth:
            return None
        if not self.etcd_password:
            raise TraitError(
                "etcd auth is on (NotebookOSGatewayApp.etcd_auth) but no etcd admin password is set: set "
                "NOTEBOOKOS_ETCD_PASSWORD (the password of etcd's root user; on a fresh etcd the gateway turns auth "
                "on with it), or NOTEBOOKOS_ETCD_AUTH=0 for a single trusted user"
            )
        return EtcdCredentials(self.etcd_user, self.etcd_password)

    etcd_prefix = Unicode("/notebookos", config=True, help="Key prefix of everything NotebookOS stores in etcd.")

    etcd_timeout = Integer(5, config=True, help="Seconds an etcd call may take before it fails with a clear error.")

    replica_rejoin_grace = Float(
        DEFAULT_REJOIN_GRACE,
        config=True,
        help="Seconds a replica whose etcd lease ended while its process lives (an etcd outage longer than the "
        "lease) may take to register again, keeping its memory, before it is replaced. 0: replace at once.",
    )

    gpu_sticky = Bool(
        False,
        config=True,
        help="Replicas keep their GPU state (tensors, models) on the device between cells instead of copying it to "
        "host memory after every cell and back before the next; it moves off only when the scheduler gives that GPU "
        "to another replica (the new cell's queued time includes the move). Each reply's metadata.notebookos."
        "resident names the devices kept.",
    )

    object_broker_url = Unicode(
        config=True,
        help="Brokered object stores (object_store_access): the URL at which replicas reach this gateway's object "
        "broker, ending in "
        "/api/notebookos/kernels (replicas get signed URLs for their own kernel's objects there and hold no store "
        "keys). Default: this gateway's own address (127.0.0.1 when it listens on every interface); on Kubernetes "
        "the chart sets the gateway Service's. Env: NOTEBOOKOS_OBJECT_BROKER_URL.",
    )

    @default("object_broker_url")
    def _object_broker_url_default(self) -> str:
        if os.environ.get(protocol.ENV_OBJECT_BROKER_URL):
            return os.environ[protocol.ENV_OBJECT_BROKER_URL]
        host = self.ip if self.ip not in ("", "0.0.0.0", "::") else "127.0.0.1"
        scheme = "https" if self.certfile else "http"
        return f"{scheme}://{host}:{self.port}" + url_path_join("/", self.base_url, "/api/notebookos/kernels")

    object_store_access = Enum(
        ["auto", "broker", "direct"],
        "auto",
        config=True,
        help="How replicas reach the object store. broker: through URLs this gateway signs for their own kernel's "
        "prefix, holding no store credentials (an S3 store: presigned URLs, bytes go to the store directly; a "
        "file:// store: this gateway's own data endpoint, bytes pass through it; for kernels in a namespace that "
        "cannot mount the store's volume). direct: replicas open the store URL themselves (file:// stores on "
        "this machine, with per-kernel directories). auto: broker for S3 stores, direct otherwise.",
    )

    object_url_expires = Integer(
        900,
        config=True,
        help="Seconds a URL the object broker signs stays valid (brokered stores; 60-43200).",
    )

    ledger_reconcile_interval = Float(
        DEFAULT_RECONCILE_INTERVAL,
        config=True,
        help="Seconds between two reconciliations of the GPU ledger in etcd with the scheduler: an entry or "
        "cell no router holds is removed after two rounds. 0: off.",
    )

    simulated_hosts = Integer(
        4,
        config=True,
        help="Embedded mode: number of simulated hosts (each runs replica processes on this machine).",
    )

    gpus_per_host = Integer(
        8,
        config=True,
        help="Embedded mode: simulated GPUs per host (real GPUs found by NVML are used instead where present).",
    )

    state_dir = Unicode(
        config=True,
        help="Directory for the platform's local state (object store, logs). Env: NOTEBOOKOS_STATE_DIR.",
    )

    @default("state_dir")
    def _state_dir_default(self) -> str:
        return os.environ.get("NOTEBOOKOS_STATE_DIR", os.path.join(os.getcwd(), ".state"))

    object_store_url = Unicode(
        config=True,
        help="fsspec URL of the object store for large buffers and checkpoints. Default: file:// under the "
        "state dir. Env: NOTEBOOKOS_OBJECT_STORE_URL.",
    )

    @default("object_store_url")
    def _object_store_url_default(self) -> str:
        return os.environ.get(
            "NOTEBOOKOS_OBJECT_STORE_URL",
            "file://" + os.path.join(os.path.abspath(self.state_dir), "objects"),
        )

    autoscale = Bool(
        False,
        config=True,
        help="Let the autoscaler add and remove hosts with the load: simulated hosts (embedded mode), or "
        "placeholder pods that make the cluster autoscaler add and remove GPU nodes (Kubernetes).",
    )

    autoscale_interval = Float(5.0, config=True, help="Seconds between autoscaling rounds.")

    @validate("simulated_hosts")
    def _validate_hosts(self, proposal: Any) -> int:
        if proposal["value"] < 1:
            raise TraitError(f"simulated_hosts must be at least 1, not {proposal['value']}")
        return int(proposal["value"])

    @validate("gpus_per_host")
    def _validate_gpus(self, proposal: Any) -> int:
        if proposal["value"] < 0:
            raise TraitError(f"gpus_per_host must be 0 or more, not {proposal['value']}")
        return int(proposal["value"])

    @validate("etcd_endpoints")
    def _validate_endpoints(self, proposal: Any) -> list[str]:
        endpoints = list(proposal["value"])
        if not endpoints:
            raise TraitError("etcd_endpoints is empty: give at least one host:port")
        for endpoint in endpoints:
            host, sep, port = endpoint.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise TraitError(f"etcd endpoint {endpoint!r} is not host:port")
        return endpoints

    node_hosts: Any = None  # Kubernetes: the GPU nodes as hosts (gateway.nodes.NodeHosts)
    etcd_maintenance: EtcdMaintenance | None = None
    history: ClusterHistory | None = None  # the dashboard's history and GPU-hours per user (built with the web app)
    identities: Identities | None = None  # who is asking (admin token, token file, JupyterHub, metrics token)

    def init_identities(self) -> None:
        """Read the identity options; a bad token file or option stops the gateway with a clear message."""
        try:
            self.identities = self.build_identities(self.auth_token)
        except IdentityConfigError as err:
            self.log.critical("NotebookOS cannot start: %s", err)
            sys.exit(1)
        if self.identities.open:
            self.log.warning(
                "No token configured (EG_AUTH_TOKEN, user tokens, JupyterHub): anyone can use every kernel"
            )

    def init_configurables(self) -> None:
        # traitlets leaves the app's logger at DEBUG (its handler filters): records built for nothing on every
        # message. The logger itself gets the configured level.
        self.log.setLevel(self.log_level)
        dates.install()
        self.init_identities()
        self._allow_only_listed_kernels()
        super().init_configurables()
        # The autoscaler thinks in hosts of the embedded mode's size unless configured otherwise.
        sized_hosts: dict[str, Any] = {}
        if "gpus_per_host" not in self.config.get("Scheduler", {}):
            sized_hosts["gpus_per_host"] = max(1, self.gpus_per_host)
        scheduler = Scheduler(parent=self, **sized_hosts)
        sized = (
            {}
            if "gpus_per_host" in self.config.get("SimulatedHostProvisioner", {})
            else {"gpus_per_host": self.gpus_per_host}
        )
        if self.launcher == "kubernetes":
            self._init_kubernetes(scheduler)
            return
        self.platform = GatewayPlatform(
            self._platform_settings(simulated_hosts=self.simulated_hosts),
            scheduler=scheduler,
            launcher=LocalLauncher(parent=self, log_dir=os.path.join(self.state_dir, "replicas")),
            provisioner=SimulatedHostProvisioner(parent=self, existing=self.simulated_hosts, **sized),
            log=self.log,
        )

    def _allow_only_listed_kernels(self) -> None:
        """``EG_ALLOWED_KERNELS`` (the kernelspecs users may start, comma-separated; the helm chart sets it) as
        ``KernelSpecManager.whitelist``, unless that is configured itself. Enterprise Gateway 3.3 does not read the
        variable (its container's start script did), so without this every installed kernelspec would be offered,
        the image's plain ``python3`` too, which runs inside the gateway's own pod."""
        allowed = {name.strip() for name in os.environ.get("EG_ALLOWED_KERNELS", "").split(",") if name.strip()}
        if allowed and "whitelist" not in self.config.get("KernelSpecManager", {}):
            self.config.KernelSpecManager.whitelist = allowed

    def _platform_settings(self, *, simulated_hosts: int) -> PlatformSettings:
        """The platform's configuration, from this app's traitlets; one it cannot be built from ends the gateway
        with the reason (an etcd admin password missing, an object URL lifetime out of range)."""
        try:
            return PlatformSettings(
                etcd_endpoints=list(self.etcd_endpoints),
                etcd_prefix=self.etcd_prefix,
                etcd_timeout=float(self.etcd_timeout),
                etcd_tls=self.etcd_tls(),
                etcd_credentials=self.etcd_credentials(),
                state_dir=self.state_dir,
                object_store_url=self.object_store_url,
                simulated_hosts=simulated_hosts,
                gpus_per_host=self.gpus_per_host,
                autoscale_interval=self.autoscale_interval if self.autoscale else 0.0,
                rejoin_grace=self.replica_rejoin_grace,
                reconcile_interval=self.ledger_reconcile_interval,
                gpu_sticky=self.gpu_sticky,
                inherited_envs=frozenset(name for name in self.inherited_envs if name),
                object_store_access=self.object_store_access,
                object_broker_url=self.object_broker_url,
                object_url_expires=self.object_url_expires,
            )
        except (TraitError, ValueError) as err:
            self.log.critical("NotebookOS could not start: %s", err)
            sys.exit(1)

    def _init_kubernetes(self, scheduler: Scheduler) -> None:
        """Replica pods, GPU nodes as hosts, placeholder pods for scaling (the helm chart's deployment)."""
        # Imported here: only this mode needs the kubernetes client.
        from jupyter_notebookos.gateway.control.nodehosts import NodeHosts
        from jupyter_notebookos.launchers.kubernetes import (
            KubernetesLauncher,
            NodeInventory,
            PlaceholderPool,
            PlaceholderProvisioner,
        )

        launcher = KubernetesLauncher(parent=self)
        inventory = NodeInventory(parent=self)
        placeholders = PlaceholderProvisioner(PlaceholderPool(parent=self), inventory, parent=self)
        self.platform = GatewayPlatform(
            self._platform_settings(simulated_hosts=0),  # hosts are the GPU nodes, added by NodeHosts
            scheduler=scheduler,
            launcher=launcher,
            provisioner=placeholders,
            log=self.log,
        )
        self.node_hosts = NodeHosts(self.platform, inventory, placeholders)

    async def start_platform(self) -> None:
        """Kubernetes: check the placeholder PriorityClass and make the GPU nodes hosts (before re-attaching
        replicas, which needs their hosts); then connect to etcd and start the platform."""
        if self.node_hosts is not None:
            if self.platform.autoscaler is not None and self.node_hosts.provisioner is not None:
                await self.node_hosts.provisioner.pool.check_priority_class()
            await self.node_hosts.start()
            self.log.info("NotebookOS on Kubernetes: %d GPU node(s) as hosts", len(self.platform.hosts))
        await self.platform.start()
        assert self.platform.coordinator is not None
        if self.history is not None:
            await self.history.load()
            self.history.start()
        self.etcd_maintenance = EtcdMaintenance(self.platform.coordinator, self._connect_etcd_member, parent=self)
        self.etcd_maintenance.start()

    async def _connect_etcd_member(self, url: str) -> Coordinator:
        """A connection to one etcd member only (defragmentation acts on the member it is sent to)."""
        return await Coordinator.connect(
            [url],
            timeout=float(self.etcd_timeout),
            prefix=self.etcd_prefix,
            tls=self.platform.settings.etcd_tls,
            credentials=self.platform.settings.etcd_credentials,
        )

    async def stop_platform(self) -> None:
        """Stop the platform, then the node and pod watches (replica pods keep running)."""
        if self.etcd_maintenance is not None:
            await self.etcd_maintenance.stop()
        if self.history is not None:
            try:
                await self.history.stop()  # its last GPU-seconds written before the kernels stop
            except CoordinationError as err:
                self.log.warning("the last GPU-seconds per user could not be written to etcd: %s", err)
        await self.platform.stop(stop_kernels=self.stop_kernels_on_shutdown)
        if self.node_hosts is not None:
            await self.node_hosts.stop()
        stop_watches = getattr(self.platform.launcher, "stop", None)
        if stop_watches is not None:
            await stop_watches()

    def _create_request_handlers(self) -> list[tuple]:
        """EG's handlers, with our API first and EG's channels handler replaced by ours."""
        ours = [
            (url_path_join("/", self.base_url, pattern), *rest)
            for pattern, *rest in [*broker_handlers(), *notebookos_handlers()]
        ]
        overrides = {url_path_join("/", self.base_url, p): cls for p, cls in handler_overrides()}
        handlers: list[tuple] = []
        for pattern, *rest in super()._create_request_handlers():
            if pattern in overrides:
                rest = [overrides[pattern], *rest[1:]]
            handlers.append((pattern, *rest))
        return with_identity(ours + handlers, self.authorized_origin)

    def init_webapp(self) -> None:
        super().init_webapp()
        readings = MachineReadings(local=self.launcher != "kubernetes", host_gpus=host_gpu_uuids(self.platform.hosts))
        self.history = ClusterHistory(
            self.platform,
            owner_of=lambda record: record.env.get(ENV_KERNEL_OWNER, ""),
            readings=readings,
            parent=self,
        )
        self.web_app.settings["notebookos_platform"] = self.platform
        self.web_app.settings["notebookos_history"] = self.history
        self.web_app.settings["notebookos_identities"] = self.identities

    def start(self) -> None:
        """Connect to etcd and start the platform, then serve (EG's start runs the IO loop)."""
        loop = ioloop.IOLoop.current()
        try:
            loop.run_sync(self.start_platform)
        except Exception as err:
            self.log.critical("NotebookOS could not start: %s", err)
            sys.exit(1)
        self._adopt_running_kernels()
        super().start()

    def _adopt_running_kernels(self) -> None:
        """Make the kernels a previous gateway left running EG kernels again (list, websockets, shutdown)."""
        for session in self.platform.adopted:
            connection_info = {
                "transport": "tcp",
                "ip": session["ip"],
                **{f"{name}_port": port for name, port in session["ports"].items()},
                "key": session["key"],
                "signature_scheme": session["signature_scheme"],
                "kernel_name": session["kernel_name"],
            }
            process_info = {"pid": 0, "pgid": 0, "ip": session["ip"], "notebookos": True}
            launch_args = {"env": dict(session.get("env") or {})}
            adopted = self.kernel_manager.start_kernel_from_session(
                session["kernel_id"], session["kernel_name"], connection_info, process_info, launch_args
            )
            if adopted:
                self.log.info("Re-attached NotebookOS kernel %s", session["kernel_id"])
            else:
                self.log.warning("Could not re-attach NotebookOS kernel %s", session["kernel_id"])

    def shutdown(self) -> None:
        if self.stop_kernels_on_shutdown:
            super().shutdown()
        else:
            # EG's shutdown stops every kernel; ours outlive the gateway (their routers re-attach next time).
            ours = set(self.platform.kernels)
            for kernel_id in self.kernel_manager.list_kernel_ids():
                if kernel_id not in ours:
                    with contextlib.suppress(Exception):
                        ioloop.IOLoop.current().run_sync(
                            lambda k=kernel_id: self.kernel_manager.shutdown_kernel(k, now=True)
                        )
            self.log.info("Leaving %d NotebookOS kernel(s) running for the next gateway", len(ours))
        try:
            ioloop.IOLoop.current().run_sync(self.stop_platform)
        except Exception as err:
            self.log.warning("NotebookOS platform did not stop cleanly: %s", err)


launch_instance = NotebookOSGatewayApp.launch_instance
