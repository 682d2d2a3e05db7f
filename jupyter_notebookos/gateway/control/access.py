"""What one kernel may reach, created with the kernel and removed with it (DESIGN.md section 8).

- **Its etcd identity**: a user and role that read and write only ``<prefix>/kernels/<kernel_id>/`` (see
  :mod:`jupyter_notebookos.coordination.auth`). The password lives in the kernel's session record, which only the
  gateway's admin user can read, so a restarted gateway restores the identity and gives replacement replicas the
  same credentials.
- **Its object-store prefix**: ``<object_store_url>/kernels/<kernel_id>``. Every replica of the kernel opens its
  store there, so no key of one kernel can name another's, and deleting the kernel deletes the prefix. On an
  S3-compatible store the replicas get no store credentials, only the kernel's *object token*, with which the
  gateway signs URLs for that prefix alone (:mod:`jupyter_notebookos.gateway.control.objectbroker`).
- **Its environment**: a replica gets the kernel's ``KERNEL_*`` variables and the few that shape a process
  (``PATH``, locale, thread pools), never the gateway's own (its token, etcd's admin password, cloud keys).
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

import fsspec

from jupyter_notebookos.coordination import auth
from jupyter_notebookos.coordination.client import Coordinator, EtcdCredentials, EtcdTls
from jupyter_notebookos.coordination.errors import CoordinationError
from jupyter_notebookos.replication import protocol

log = logging.getLogger(__name__)

#: Variables of the gateway's environment that a replica inherits (besides ``KERNEL_*``): what shapes a process,
#: nothing that grants access.
_INHERITED = re.compile(
    r"^(PATH|LANG|LANGUAGE|LC_[A-Z]+|TZ|TERM|PYTHON[A-Z_]*|LD_LIBRARY_PATH|OMP_[A-Z_]+|MKL_[A-Z_]+|"
    r"OPENBLAS_[A-Z_]+|CUDA_[A-Z_]+|NVIDIA_[A-Z_]+|MPLBACKEND|JUPYTER_PATH|PYDEVD_[A-Z_]+)$"
)
#: Never passed on, whatever the name's prefix (KERNEL_* comes from users' requests; a secret there is theirs to
#: give their own kernel, but gateway-side secrets never carry that prefix, and these names say so plainly).
_SECRET = re.compile(r"(TOKEN|PASSWORD|SECRET|CREDENTIAL|PRIVATE_KEY|ACCESS_KEY)", re.IGNORECASE)


def replica_env(env: Mapping[str, str], inherited: Collection[str] = ()) -> dict[str, str]:
    """The part of a kernel's launch environment (EG passes the gateway's whole environment) a replica gets:
    ``KERNEL_*``, what shapes a process, and the names the operator lets kernels inherit (``inherited``: EG's
    ``inherited_envs``, e.g. ``MALLOC_ARENA_MAX``); never a name that says it is a secret."""
    return {
        k: v
        for k, v in env.items()
        if k.startswith("KERNEL_") or ((_INHERITED.match(k) or k in inherited) and not _SECRET.search(k))
    }


def kernel_store_url(object_store_url: str, kernel_id: str) -> str:
    """The object-store URL of one kernel: its own prefix of the platform's store."""
    if not kernel_id or "/" in kernel_id:
        raise ValueError(f"kernel id {kernel_id!r} cannot name an object-store prefix")
    return f"{object_store_url.rstrip('/')}/kernels/{kernel_id}"


def new_object_token() -> str:
    """A kernel's object token: what its replicas show the gateway's object broker."""
    return secrets.token_urlsafe(32)


@dataclass
class KernelAccess:
    """One kernel's credentials (etcd, object broker), as recorded in its session record and handed to its
    replicas."""

    kernel_id: str
    etcd_password: str = field(default="", repr=False)
    object_token: str = field(default_factory=new_object_token, repr=False)

    @property
    def etcd_user(self) -> str:
        return auth.kernel_user(self.kernel_id)

    def secret_env(self, *, brokered: bool = False) -> dict[str, str]:
        """The variables a replica needs to log in to etcd as its kernel (none with auth off) and, on a
        brokered store, to have the gateway sign its object operations."""
        env = {}
        if self.etcd_password:
            env.update({protocol.ENV_ETCD_USER: self.etcd_user, protocol.ENV_ETCD_PASSWORD: self.etcd_password})
        if brokered:
            env[protocol.ENV_OBJECT_BROKER_TOKEN] = self.object_token
        return env


class KernelAccessManager:
    """Creates, restores and removes kernels' identities and storage prefixes (one per gateway)."""

    def __init__(self, coordinator: Coordinator, object_store_url: str, *, etcd_auth: bool) -> None:
        self.coordinator = coordinator
        self.object_store_url = object_store_url
        self.etcd_auth = etcd_auth

    def store_url(self, kernel_id: str) -> str:
        return kernel_store_url(self.object_store_url, kernel_id)

    async def create(self, kernel_id: str) -> KernelAccess:
        """A new kernel's etcd user (with auth on)."""
        access = KernelAccess(kernel_id, auth.new_password() if self.etcd_auth else "")
        if self.etcd_auth:
            await auth.create_kernel_identity(self.coordinator, kernel_id, access.etcd_password)
        return access

    async def restore(self, kernel_id: str, password: str, object_token: str = "") -> KernelAccess:
        """A re-attached kernel's identity, as its session record has it (re-created if etcd lost it). A record
        without an object token (an older gateway's) gets a new one: replacements get it, running replicas
        keep the one they had until they are replaced."""
        if self.etcd_auth and not password:
            # Recorded by a gateway without auth: give the kernel an identity now (its running replicas keep
            # working as they are; replacements log in with this).
            access = await self.create(kernel_id)
            access.object_token = object_token or access.object_token
            return access
        access = KernelAccess(kernel_id, password if self.etcd_auth else "", object_token or new_object_token())
        if self.etcd_auth:
            users = await auth.kernel_identities(self.coordinator)
            if kernel_id not in users:
                await auth.create_kernel_identity(self.coordinator, kernel_id, password)
        return access

    async def remove(self, kernel_id: str) -> None:
        """Delete the kernel's etcd user and its object-store prefix. Failures are logged, not raised: the
        start-up sweep (:meth:`sweep`) retries what is left."""
        if self.etcd_auth:
            try:
                await auth.delete_kernel_identity(self.coordinator, kernel_id)
            except CoordinationError as err:
                log.warning("kernel %s: could not delete its etcd user: %s", kernel_id, err)
        url = self.store_url(kernel_id)

        def delete_prefix() -> None:
            fs, path = fsspec.core.url_to_fs(url)
            fs.invalidate_cache()  # an object store's listing cache knows nothing of what replicas wrote
            if fs.exists(path):
                fs.rm(path, recursive=True)

        try:
            await asyncio.to_thread(delete_prefix)  # a remote store answers over the network: not on the loop
        except Exception as err:  # any filesystem's failure: the sweep retries
            log.warning("kernel %s: could not delete its objects under %s: %s", kernel_id, url, err)

    async def sweep(self, live: Iterable[str]) -> list[str]:
        """Remove the identities and store prefixes of kernels that no longer exist (a gateway that died
        between starting and recording a kernel, or while stopping one). Returns their ids."""
        alive = set(live)
        gone: set[str] = set()
        if self.etcd_auth:
            gone |= await auth.kernel_identities(self.coordinator) - alive

        def prefixes() -> set[str]:
            fs, root = fsspec.core.url_to_fs(f"{self.object_store_url.rstrip('/')}/kernels")
            fs.invalidate_cache()
            if not fs.exists(root):
                return set()
            return {p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)}

        try:
            gone |= await asyncio.to_thread(prefixes) - alive
        except Exception as err:
            log.warning("could not list the object store's kernel prefixes: %s", err)
        for kernel_id in sorted(gone):
            log.info("kernel %s is gone: removing its etcd user and objects", kernel_id)
            await self.remove(kernel_id)
        return sorted(gone)


async def ensure_etcd_auth(
    endpoints: list[str], admin: EtcdCredentials, *, prefix: str, timeout: float, tls: EtcdTls | None = None
) -> None:
    """Turn etcd's auth on with ``admin`` as root if it is off (a fresh embedded etcd, a new cluster)."""
    coordinator = await Coordinator.connect(endpoints, prefix=prefix, timeout=timeout, tls=tls)
    try:
        await auth.ensure_auth_enabled(coordinator, admin)
    finally:
        await coordinator.close()
