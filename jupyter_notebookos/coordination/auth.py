"""etcd auth for NotebookOS: the admin identity, and one narrow identity per kernel.

With etcd's auth on, every client logs in as an etcd user whose roles say which keys it may touch. The
gateway holds the admin user (``root``); it creates, for every kernel, a user and a role of the same name that
may read and write only that kernel's keys (``<prefix>/kernels/<kernel_id>/``: its replicas' registrations,
applied sequences, log, checkpoint pointer, executor key and cell records). The kernel's replicas get only that
user's password, so code running in a kernel cannot read another kernel's record or log, write into it, or list
other kernels' keys (DESIGN.md section 8).

Not readable to a kernel: its own session record ``<prefix>/kernels/<kernel_id>`` (it holds the kernel's
etcd password and connection key; only the gateway needs it), the host records and the GPU ledger.

Passwords are random 256-bit secrets, so etcd's bcrypt cost adds nothing to their strength: the embedded etcd
runs with the minimum cost (``--bcrypt-cost 4``), which makes each log-in about 1 ms instead of 60 ms. That
matters because every change of users or roles (one kernel started or stopped) invalidates every client's
token ("revision of auth store is old"), and each client then logs in again once.
"""

from __future__ import annotations

import logging
import secrets

from jupyter_notebookos.coordination import _proto
from jupyter_notebookos.coordination.client import Coordinator, EtcdCredentials
from jupyter_notebookos.coordination.errors import AuthenticationFailed, CoordinationError

log = logging.getLogger(__name__)

#: The etcd user (and role) name of the admin identity, as etcd requires for enabling auth.
ROOT = "root"

#: Every per-kernel etcd user and role is named this followed by the kernel id.
KERNEL_USER_PREFIX = "notebookos-kernel-"


def kernel_user(kernel_id: str) -> str:
    """The etcd user and role name of one kernel."""
    return f"{KERNEL_USER_PREFIX}{kernel_id}"


def new_password() -> str:
    """A fresh random password (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def _already(err: CoordinationError, *words: str) -> bool:
    text = str(err).lower()
    return any(w in text for w in words)


async def ensure_auth_enabled(coordinator: Coordinator, root: EtcdCredentials) -> bool:
    """Make sure etcd's auth is on with ``root`` as its admin; returns whether this call turned it on.

    ``coordinator`` must be connected without credentials (auth may still be off). When auth is off, the
    ``root`` user and role are created (or the user's password set) and auth is enabled. When it is on, the
    credentials are checked by logging in.

    Raises:
        AuthenticationFailed: auth is on and ``root`` is refused (a wrong admin password), or the user is
            not ``root`` (etcd enables auth only with a ``root`` user).
    """
    if root.user != ROOT:
        raise AuthenticationFailed(
            f"the gateway's etcd user must be {ROOT!r} (etcd grants its admin rights to that user), not {root.user!r}"
        )
    try:
        await coordinator.auth_call(
            "Authenticate", _proto.AuthenticateRequest(name=root.user, password=root.password), "log in as root"
        )
        return False  # auth is on, and the password is right
    except CoordinationError as err:
        if not _already(err, "not enabled"):
            raise AuthenticationFailed(
                f"etcd auth is on and refused the gateway's admin user {root.user!r}: {err}. Check "
                "NOTEBOOKOS_ETCD_PASSWORD (embedded mode keeps it in the state directory's etcd-root-password)."
            ) from err
    try:
        await coordinator.auth_call(
            "UserAdd", _proto.AuthUserAddRequest(name=root.user, password=root.password), "add etcd user root"
        )
    except CoordinationError as err:
        if not _already(err, "already exists"):
            raise
        await coordinator.auth_call(
            "UserChangePassword",
            _proto.AuthUserChangePasswordRequest(name=root.user, password=root.password),
            "set root's password",
        )
    await _add_role(coordinator, ROOT)
    await coordinator.auth_call(
        "UserGrantRole", _proto.AuthUserGrantRoleRequest(user=root.user, role=ROOT), "grant root its role"
    )
    await coordinator.auth_call("AuthEnable", _proto.AuthEnableRequest(), "enable etcd auth")
    log.info("etcd auth enabled (admin user %r)", root.user)
    return True


async def _add_role(coordinator: Coordinator, role: str) -> None:
    try:
        await coordinator.auth_call("RoleAdd", _proto.AuthRoleAddRequest(name=role), f"add etcd role {role}")
    except CoordinationError as err:
        if not _already(err, "already exists"):
            raise


async def create_kernel_identity(coordinator: Coordinator, kernel_id: str, password: str) -> EtcdCredentials:
    """Create (or repair) the etcd user and role of one kernel; returns the credentials its replicas get.

    Idempotent: an existing user gets ``password`` (so a restarted gateway restores the identity it recorded).
    ``coordinator`` is logged in as the admin.
    """
    name = kernel_user(kernel_id)
    prefix = coordinator.keys.kernel_prefix(kernel_id).encode()
    await _add_role(coordinator, name)
    await coordinator.auth_call(
        "RoleGrantPermission",
        _proto.AuthRoleGrantPermissionRequest(
            name=name,
            perm=_proto.Permission(
                permType=_proto.Permission.READWRITE, key=prefix, range_end=_proto.prefix_range_end(prefix)
            ),
        ),
        f"grant role {name} its kernel's keys",
    )
    try:
        await coordinator.auth_call(
            "UserAdd", _proto.AuthUserAddRequest(name=name, password=password), f"add etcd user {name}"
        )
    except CoordinationError as err:
        if not _already(err, "already exists"):
            raise
        await coordinator.auth_call(
            "UserChangePassword",
            _proto.AuthUserChangePasswordRequest(name=name, password=password),
            f"set {name}'s password",
        )
    await coordinator.auth_call(
        "UserGrantRole", _proto.AuthUserGrantRoleRequest(user=name, role=name), f"grant {name} its role"
    )
    return EtcdCredentials(name, password)


async def delete_kernel_identity(coordinator: Coordinator, kernel_id: str) -> None:
    """Remove a kernel's etcd user and role (missing ones are not an error)."""
    name = kernel_user(kernel_id)
    for method, request in (
        ("UserDelete", _proto.AuthUserDeleteRequest(name=name)),
        ("RoleDelete", _proto.AuthRoleDeleteRequest(role=name)),
    ):
        try:
            await coordinator.auth_call(method, request, f"{method} {name}")
        except CoordinationError as err:
            if not _already(err, "not found"):
                raise


async def kernel_identities(coordinator: Coordinator) -> set[str]:
    """The kernel ids that have an etcd user (for sweeping those whose kernel is gone)."""
    reply = await coordinator.auth_call("UserList", _proto.AuthUserListRequest(), "list etcd users")
    return {u[len(KERNEL_USER_PREFIX) :] for u in reply.users if u.startswith(KERNEL_USER_PREFIX)}
