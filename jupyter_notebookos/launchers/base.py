"""The launcher interface: how a replica process comes to exist on a host, and how it goes away.

A launcher only starts and stops replicas. It does not talk Jupyter: a started replica binds its own ZMQ ports
and registers its connection info in etcd under its own lease (see ``coordination.keys``), and the replica
router reads it from there. That keeps the local launcher (processes on simulated hosts) and the Kubernetes
launcher (one pod per replica) interchangeable for every caller.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from traitlets.config import LoggingConfigurable


class ReplicaPhase(enum.Enum):
    """What the launcher knows about a replica's process or pod."""

    STARTING = "starting"
    RUNNING = "running"
    EXITED = "exited"
    FAILED = "failed"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class ReplicaSpec:
    """Everything a launcher needs to start one replica of a kernel on one host."""

    kernel_id: str
    replica_id: str
    host: str
    kernel_name: str
    env: dict[str, str] = field(default_factory=dict)
    # Credentials of this kernel alone (its etcd user and password, its object-store access): the launcher gives
    # them to the replica without exposing them more widely than the replica itself (a process's environment on
    # the local launcher; a per-kernel Secret referenced by the pod on Kubernetes). Never the gateway's own.
    secret_env: dict[str, str] = field(default_factory=dict)
    # The kernelspec's process_proxy config (image, resources, ...), as Enterprise Gateway passes it.
    config: dict[str, object] = field(default_factory=dict)
    # The kernel's request, resolved once by the process proxy: GPUs per cell (KERNEL_GPUS), and seconds a replica
    # may take to start (KERNEL_LAUNCH_TIMEOUT or the kernelspec's launch_timeout; None: the launcher's default).
    gpus: int = 1
    launch_timeout: float | None = None


@dataclass(frozen=True)
class ReplicaHandle:
    """A started replica, as the launcher can find it again (also after a gateway restart)."""

    kernel_id: str
    replica_id: str
    host: str
    pid: int | None = None
    pod: str | None = None


@dataclass(frozen=True)
class ReplicaStatus:
    """The launcher's view of a replica: its phase, and why, when it is not running."""

    phase: ReplicaPhase
    reason: str = ""


class LaunchError(RuntimeError):
    """A replica could not be started; the message says why and what to do."""


class RequestRefused(LaunchError, ValueError):
    """The kernel's own request (kernelspec config, ``KERNEL_*``) is invalid or not allowed here: the user's to fix,
    so the gateway answers it with HTTP 400 and this message, which names the field and the rule."""


class Launcher(LoggingConfigurable):
    """Starts and stops replica processes (or pods) on hosts. Subclasses implement every method."""

    async def start_replica(self, spec: ReplicaSpec) -> ReplicaHandle:
        """Start one replica on ``spec.host`` and return at once; it registers itself in etcd when ready."""
        raise NotImplementedError

    async def stop_replica(self, handle: ReplicaHandle, *, now: bool = False) -> None:
        """Stop a replica: politely (SIGTERM, pod deletion with grace) unless ``now``."""
        raise NotImplementedError

    async def status(self, handle: ReplicaHandle) -> ReplicaStatus:
        """Whether the replica's process or pod is still there, and if not, why."""
        raise NotImplementedError

    async def find_replicas(self, kernel_id: str) -> list[ReplicaHandle]:
        """The replicas of a kernel that still exist (used to re-attach after a gateway restart)."""
        raise NotImplementedError

    async def forget_kernel(self, kernel_id: str) -> None:
        """The kernel is stopped (every replica): remove what the launcher kept for it. Nothing by default."""
