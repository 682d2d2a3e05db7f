"""Kernel ownership: every handler of the gateway learns who is asking, and a user reaches only their kernels.

Enterprise Gateway's handlers authenticate with ``TokenAuthorizationMixin``, which knows one token. The gateway
app passes its handler list through :func:`with_identity`, which puts :class:`IdentifiedHandlerMixin` in front
of every handler that used EG's check (kernels, interrupt/restart, the channels websocket, sessions,
kernelspecs, ``/api``) and in place of that check; our own handlers (``/api/notebookos/*``, ``/metrics``) use
the mixin directly. The mixin

1. establishes the request's :class:`~jupyter_notebookos.gateway.web.identity.Identity` (401 for no or an unknown
   token, 503 when JupyterHub cannot be asked);
2. refuses what the identity may not do (403): the metrics token outside ``/metrics``, a user on an
   admin-only route, and a user on any route with a ``kernel_id`` that belongs to someone else.

A kernel belongs to the user who started it. ``POST /api/kernels`` records the owner in the kernel's own
``KERNEL_*`` environment (:data:`ENV_KERNEL_OWNER`, set by the gateway, never taken from the client), which
EG keeps with the kernel and NotebookOS keeps in the kernel's etcd session record, so a restarted gateway
that re-attaches still knows it. Kernels started with the admin token (and kernels with no owner recorded)
belong to the admin. Listing kernels shows a user their own; the cluster view shows other users' kernels
without their ids or names.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlencode

from enterprise_gateway.mixins import TokenAuthorizationMixin
from enterprise_gateway.services.kernels.handlers import MainKernelHandler
from jupyter_client.jsonutil import date_default
from jupyter_server.utils import ensure_async
from tornado import web

from jupyter_notebookos.gateway.web.identity import Identities, Identity, IdentityError, Role, request_token

log = logging.getLogger(__name__)

ENV_KERNEL_OWNER = "KERNEL_NOTEBOOKOS_OWNER"

SESSIONS_ADMIN_ONLY = (
    "/api/sessions is for the gateway's admin; users start kernels with POST /api/kernels (as Jupyter servers "
    "with --gateway-url do)"
)


def kernel_owner(settings: dict[str, Any], kernel_id: str) -> str | None:
    """The owner of kernel ``kernel_id`` ("" for the admin), or None if the gateway has no such kernel."""
    km = settings.get("kernel_manager")
    if km is not None and kernel_id in km:
        kernel = km.get_kernel(kernel_id)
        env = (getattr(kernel, "_launch_args", None) or {}).get("env") or getattr(kernel, "user_overrides", {})
        return str(env.get(ENV_KERNEL_OWNER, ""))
    platform = settings.get("notebookos_platform")
    record = platform.kernels.get(kernel_id) if platform is not None else None
    if record is not None:  # a NotebookOS kernel still starting: EG lists it once its replicas are up
        return str(record.env.get(ENV_KERNEL_OWNER, ""))
    return None


def scrub_token(uri: str) -> str:
    """``uri`` with the value of any ``token`` query parameter replaced, for logs."""
    path, sep, query = uri.partition("?")
    if not sep:
        return uri
    params = [(k, "[secret]" if k == "token" else v) for k, v in parse_qsl(query, keep_blank_values=True)]
    return f"{path}?{urlencode(params, safe='[]')}"


def stamp_owner(model: Any, identity: Identity) -> Any:
    """The body of ``POST /api/kernels`` with the requester as the kernel's owner.

    A user's kernel gets ``KERNEL_NOTEBOOKOS_OWNER`` and ``KERNEL_USERNAME`` (EG's name for the kernel's user,
    checked against ``authorized_users`` and used for impersonation) set to the user's name, whatever the
    client sent. The admin's kernels carry no owner (they are the admin's); its KERNEL_USERNAME is kept.
    """
    if model is None:
        model = {}
    if not isinstance(model, dict) or not isinstance(model.get("env", {}), dict):
        return model  # EG answers 400 for these
    env = {k: v for k, v in model.get("env", {}).items() if k != ENV_KERNEL_OWNER}
    if not identity.is_admin:
        env[ENV_KERNEL_OWNER] = identity.name
        env["KERNEL_USERNAME"] = identity.name
    return {**model, "env": env}


class IdentifiedHandlerMixin:
    """Authenticates a request as a user, the admin or the metrics reader, and checks kernel ownership."""

    identity: Identity | None = None
    reads_metrics = False  # the metrics token is accepted here (and users are not)
    admin_only = ""  # non-empty: only the admin may use this handler; the message users get
    authorized_origin = ""  # EG's authorized_origin: the client certificate's host name must match

    # Provided by tornado's RequestHandler.
    request: Any
    settings: dict[str, Any]
    path_kwargs: dict[str, Any]
    get_query_argument: Callable[..., Any]

    async def prepare(self) -> None:
        """Identify and authorize, then run the rest of the handler's ``prepare`` chain without EG's check."""
        if self.request.method != "OPTIONS":
            if self.authorized_origin:
                try:
                    ssl.match_hostname(self.request.get_ssl_certificate(), self.authorized_origin)
                except (ssl.SSLCertVerificationError, ValueError):
                    raise web.HTTPError(403, "the client certificate does not match authorized_origin") from None
            self.identity = await self._identify()
            self._authorize(self.identity)
        # EG's TokenAuthorizationMixin knows only the admin token: skip it, keep everything after it.
        parent: Any = super(TokenAuthorizationMixin, self) if isinstance(self, TokenAuthorizationMixin) else super()
        result = parent.prepare()
        if result is not None:
            await result

    def _request_summary(self) -> str:
        """Tornado's "METHOD URI (IP)" for log lines, without the value of a ``?token=`` (it is a credential)."""
        return f"{self.request.method} {scrub_token(self.request.uri)} ({self.request.remote_ip})"

    async def _identify(self) -> Identity:
        identities: Identities = self.settings["notebookos_identities"]
        token = request_token(self.get_query_argument("token", None), self.request.headers.get("Authorization"))
        try:
            return await identities.identify(token)
        except IdentityError as err:
            if err.status == 401:
                log.info("refused %s %s: %s", self.request.method, self.request.path, err)
            raise web.HTTPError(err.status, str(err)) from None

    def _authorize(self, identity: Identity) -> None:
        if identity.role is Role.METRICS:
            if not self.reads_metrics:
                raise web.HTTPError(403, "the metrics token reads /metrics only")
            return
        if self.reads_metrics and not identity.is_admin:
            raise web.HTTPError(403, "/metrics is read with the metrics token or the admin token")
        if self.admin_only and not identity.is_admin:
            raise web.HTTPError(403, self.admin_only)
        kernel_id = self.path_kwargs.get("kernel_id")
        if kernel_id and not identity.is_admin:
            owner = kernel_owner(self.settings, kernel_id)
            if owner is not None and owner != identity.name:
                log.warning(
                    "refused %s %s to %s: the kernel belongs to %s",
                    self.request.method,
                    self.request.path,
                    identity,
                    repr(owner) if owner else "the admin",
                )
                raise web.HTTPError(
                    403,
                    f"kernel {kernel_id} belongs to another user: only its owner or the gateway's admin may use it",
                )


class OwnedMainKernelHandler(IdentifiedHandlerMixin, MainKernelHandler):
    """``/api/kernels``: a user lists their own kernels; a started kernel belongs to whoever started it."""

    def get_json_body(self) -> Any:
        model = super().get_json_body()
        if self.request.method == "POST" and self.identity is not None:
            model = stamp_owner(model, self.identity)
        return model

    async def get(self) -> None:
        identity = self.identity
        if identity is None or identity.is_admin:
            await super().get()
            return
        if not self.settings.get("eg_list_kernels"):
            raise web.HTTPError(403, "Forbidden")  # EG's answer when listing is off
        kernels = await ensure_async(self.kernel_manager.list_kernels())
        own = [k for k in kernels if kernel_owner(self.settings, k["id"]) == identity.name]
        self.finish(json.dumps(own, default=date_default))


def with_identity(handlers: list[tuple], authorized_origin: str = "") -> list[tuple]:
    """Enterprise Gateway's handler list with every token-checked handler identifying users instead."""
    result: list[tuple] = []
    for pattern, cls, *rest in handlers:
        if not isinstance(cls, type) or issubclass(cls, IdentifiedHandlerMixin):
            result.append((pattern, cls, *rest))
            continue
        if cls is MainKernelHandler:
            wrapped: type = OwnedMainKernelHandler
        elif issubclass(cls, TokenAuthorizationMixin):
            attrs = {"admin_only": SESSIONS_ADMIN_ONLY} if "/api/sessions" in pattern else {}
            wrapped = type(cls.__name__, (IdentifiedHandlerMixin, cls), attrs)
        else:  # e.g. EG's catch-all 404 handler: nothing to protect
            result.append((pattern, cls, *rest))
            continue
        if authorized_origin:
            wrapped = type(wrapped.__name__, (wrapped,), {"authorized_origin": authorized_origin})
        result.append((pattern, wrapped, *rest))
    return result


def cluster_view(snapshot: dict[str, Any], identity: Identity, owner_of: Callable[[str], str | None]) -> dict[str, Any]:
    """``GET /api/notebookos/cluster`` as ``identity`` may see it.

    Every kernel gets its ``owner`` (null: the admin's). A user sees their own kernels in full and other users'
    kernels only as load: no kernel id, kernelspec, owner, replica ids, processes or cell ids.
    """
    owners = {k["kernel_id"]: owner_of(k["kernel_id"]) or "" for k in snapshot["kernels"]}
    kernels = [{**k, "owner": owners[k["kernel_id"]] or None} for k in snapshot["kernels"]]
    if identity.is_admin:
        return {**snapshot, "kernels": kernels}
    mine = {kernel_id for kernel_id, owner in owners.items() if owner == identity.name}
    return {
        **snapshot,
        "kernels": [k if k["kernel_id"] in mine else _anonymous(k) for k in kernels],
        "queue": [
            q if q["kernel_id"] in mine else {**q, "kernel_id": None, "cell_id": None} for q in snapshot["queue"]
        ],
        "migrations": [m if m["kernel_id"] in mine else {**m, "kernel_id": None} for m in snapshot["migrations"]],
    }


def _anonymous(kernel: dict[str, Any]) -> dict[str, Any]:
    return {
        "kernel_id": None,
        "kernel_name": None,
        "owner": None,
        "gpus": kernel["gpus"],
        "state": kernel["state"],
        "replicas": [{"host": r["host"], "state": r["state"]} for r in kernel["replicas"]],
        "queued": kernel["queued"],
    }


__all__ = [
    "ENV_KERNEL_OWNER",
    "IdentifiedHandlerMixin",
    "OwnedMainKernelHandler",
    "cluster_view",
    "kernel_owner",
    "scrub_token",
    "stamp_owner",
    "with_identity",
]
