"""A replica's settings, read from the protocol's environment variables (and nothing else)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field

from jupyter_notebookos.coordination.client import EtcdCredentials, EtcdTls
from jupyter_notebookos.coordination.keys import DEFAULT_PREFIX
from jupyter_notebookos.gpu.binding import HostGpu
from jupyter_notebookos.replication import protocol as p
from jupyter_notebookos.replication.brokerfs import PROTOCOL as BROKER_PROTOCOL

#: How many bytes a serialized delta may have to go inline into its etcd log record; larger ones go to the
#: object store and the record holds their key (etcd is for metadata: DESIGN.md section 3).
INLINE_PAYLOAD_LIMIT = 64 * 1024


class ReplicaConfigError(ValueError):
    """The replica's environment is missing or has a malformed setting."""


def _int(env: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ReplicaConfigError(f"{name}={raw!r} is not a whole number") from None
    if value < minimum:
        raise ReplicaConfigError(f"{name}={value} is too small (at least {minimum})")
    return value


@dataclass(frozen=True)
class ReplicaSettings:
    """Everything a replica process is told by its launcher (see :mod:`replication.protocol`)."""

    kernel_id: str
    replica_id: str
    host: str
    etcd_endpoints: list[str]
    key: str
    etcd_prefix: str = DEFAULT_PREFIX
    object_store_url: str = ""
    object_store_options: dict[str, str] = field(default_factory=dict, repr=False)  # the broker's URL and token
    signature_scheme: str = "hmac-sha256"
    ip: str = "127.0.0.1"
    advertise_ip: str = "127.0.0.1"
    lease_ttl: int = p.DEFAULT_LEASE_TTL
    etcd_start_within: int = p.DEFAULT_ETCD_START_WITHIN
    gpus: list[HostGpu] = field(default_factory=list)
    gpu_sticky: bool = False  # keep GPU state on the device between cells (GpuBinding.sticky)
    buffer_threshold: int = p.DEFAULT_BUFFER_THRESHOLD
    checkpoint_every: int = p.DEFAULT_CHECKPOINT_EVERY
    hold_empty_records_ms: int = p.DEFAULT_HOLD_EMPTY_RECORDS_MS  # see LogWriter.publish
    pod: str | None = None
    etcd_tls: EtcdTls | None = None
    etcd_credentials: EtcdCredentials | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ReplicaSettings:
        """Read the settings from ``env`` (default: ``os.environ``).

        Raises:
            ReplicaConfigError: a required variable is missing or a value is malformed.
        """
        env = os.environ if env is None else env
        missing = [
            name
            for name in (p.ENV_KERNEL_ID, p.ENV_REPLICA_ID, p.ENV_ETCD_ENDPOINTS, p.ENV_KEY)
            if not env.get(name, "").strip()
        ]
        if missing:
            raise ReplicaConfigError(
                f"missing environment variable(s) {', '.join(missing)}: a replica is started by the NotebookOS "
                "launcher, which sets them (see jupyter_notebookos.replication.protocol)"
            )
        kernel_id = env[p.ENV_KERNEL_ID].strip()
        ip = env.get(p.ENV_IP, "").strip() or "127.0.0.1"
        advertise = env.get(p.ENV_ADVERTISE_IP, "").strip() or ("127.0.0.1" if ip == "0.0.0.0" else ip)
        store = env.get(p.ENV_OBJECT_STORE_URL, "").strip() or (
            "file://" + os.path.join(tempfile.gettempdir(), "notebookos-objects", kernel_id)
        )
        store_options: dict[str, str] = {}
        if store.startswith(f"{BROKER_PROTOCOL}://"):
            store_options = {
                "broker": env.get(p.ENV_OBJECT_BROKER_URL, "").strip(),
                "token": env.get(p.ENV_OBJECT_BROKER_TOKEN, "").strip(),
            }
            if not store_options["broker"] or not store_options["token"]:
                raise ReplicaConfigError(
                    f"{p.ENV_OBJECT_STORE_URL}={store} needs {p.ENV_OBJECT_BROKER_URL} and {p.ENV_OBJECT_BROKER_TOKEN} "
                    "(the gateway sets both when it brokers the store)"
                )
        try:
            gpus = HostGpu.parse_env(env.get(p.ENV_GPU_DEVICES))
            etcd_tls = EtcdTls.from_env(
                env, p.ENV_ETCD_CA_CERT, p.ENV_ETCD_CERT, p.ENV_ETCD_KEY, p.ENV_ETCD_SERVER_NAME
            )
            etcd_credentials = EtcdCredentials.from_env(env, p.ENV_ETCD_USER, p.ENV_ETCD_PASSWORD)
        except ValueError as exc:
            raise ReplicaConfigError(str(exc)) from None
        return cls(
            kernel_id=kernel_id,
            replica_id=env[p.ENV_REPLICA_ID].strip(),
            host=env.get(p.ENV_HOST, "").strip() or "localhost",
            etcd_endpoints=[e.strip() for e in env[p.ENV_ETCD_ENDPOINTS].split(",") if e.strip()],
            key=env[p.ENV_KEY].strip(),
            etcd_prefix=env.get(p.ENV_ETCD_PREFIX, "").strip() or DEFAULT_PREFIX,
            object_store_url=store,
            object_store_options=store_options,
            signature_scheme=env.get(p.ENV_SIGNATURE_SCHEME, "").strip() or "hmac-sha256",
            ip=ip,
            advertise_ip=advertise,
            lease_ttl=_int(env, p.ENV_LEASE_TTL, p.DEFAULT_LEASE_TTL, 1),
            etcd_start_within=_int(env, p.ENV_ETCD_START_WITHIN, p.DEFAULT_ETCD_START_WITHIN, 0),
            gpus=gpus,
            gpu_sticky=env.get(p.ENV_GPU_STICKY, "").strip().lower() in ("1", "true", "yes"),
            buffer_threshold=_int(env, p.ENV_BUFFER_THRESHOLD, p.DEFAULT_BUFFER_THRESHOLD, 0),
            checkpoint_every=_int(env, p.ENV_CHECKPOINT_EVERY, p.DEFAULT_CHECKPOINT_EVERY, 1),
            hold_empty_records_ms=_int(env, p.ENV_HOLD_EMPTY_RECORDS_MS, p.DEFAULT_HOLD_EMPTY_RECORDS_MS, 0),
            pod=env.get(p.ENV_POD_NAME, "").strip() or None,
            etcd_tls=etcd_tls,
            etcd_credentials=etcd_credentials,
        )
