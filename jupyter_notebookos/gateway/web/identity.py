"""Who is asking: the user identity behind each request to the gateway.

Enterprise Gateway knows one token, and whoever holds it may do anything. NotebookOS is shared by users who
do not trust each other (see ``docs/security.md``), so every request carries a token that names a user:

- **the admin token**: EG's own ``auth_token`` (``EG_AUTH_TOKEN``). It sees and may do everything;
- **a user token** from the token file (``user_tokens_file``, a JSON object ``{"<token>": "<user name>"}``,
  mode 0600 or stricter). The file is re-read when it changes, so adding a user needs no restart;
- **a JupyterHub API token** (``hub_api_url``): the Hub's ``GET /user`` names the token's owner. Answers are
  cached briefly; a Hub that does not answer makes the request fail with 503, never lets it through;
- **the metrics token** (``metrics_token``): reads ``/metrics`` and nothing else, for Prometheus.

Clients send the token as ``Authorization: token X`` (EG's clients, jupyter_server's ``GatewayClient``),
``Authorization: Bearer X`` (Prometheus, most HTTP tools) or ``?token=X`` (browsers' websockets). With no token
configured at all, the gateway is open as EG is (everyone is the admin), and says so when it starts.

:mod:`jupyter_notebookos.gateway.web.authorization` applies the identity to EG's handlers and ours.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import stat
import time
from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from traitlets import Float, TraitError, Unicode, default, validate
from traitlets.config import Configurable

log = logging.getLogger(__name__)

ENV_USER_TOKENS_FILE = "NOTEBOOKOS_USER_TOKENS_FILE"
ENV_HUB_API_URL = "NOTEBOOKOS_HUB_API_URL"
ENV_METRICS_TOKEN = "NOTEBOOKOS_METRICS_TOKEN"

MIN_TOKEN_LENGTH = 16  # shorter user tokens are guessable; the file is refused
_HUB_CACHE_ENTRIES = 4096  # bounds the memory a stream of made-up tokens can take


class Role(Enum):
    """What an identity may do."""

    ADMIN = "admin"  # everything, every kernel
    USER = "user"  # its own kernels; the cluster without other users' kernel ids
    METRICS = "metrics"  # GET /metrics only


@dataclass(frozen=True)
class Identity:
    """The identity behind one request."""

    name: str  # the user's name ("" for the admin: no user can be called that)
    role: Role
    via: str  # where it came from, for log lines: "admin token", "token file", "JupyterHub", ...

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN

    def __str__(self) -> str:
        return "the admin" if self.is_admin else f"{self.role.value} {self.name!r} ({self.via})"


ADMIN = Identity("", Role.ADMIN, "admin token")
OPEN_ADMIN = Identity("", Role.ADMIN, "no token configured")
METRICS = Identity("", Role.METRICS, "metrics token")


class IdentityError(Exception):
    """A request whose identity could not be established: an HTTP status and a message for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class IdentityConfigError(ValueError):
    """The identity configuration (token file, Hub URL) is unusable; the gateway must not start."""


def request_token(query_token: str | None, authorization: str | None) -> str | None:
    """The token of a request: ``?token=X``, else ``Authorization: token X`` or ``Authorization: Bearer X``."""
    if query_token:
        return query_token
    if authorization:
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() in ("token", "bearer") and value.strip():
            return value.strip()
    return None


def _digest(token: str) -> str:
    # Tokens are looked up by digest: no timing difference tells a prefix, and no token sits in a cache key.
    return hashlib.sha256(token.encode()).hexdigest()


def read_user_tokens(path: str) -> dict[str, str]:
    """Read and check a token file; returns {sha256(token): user name}. Raises IdentityConfigError."""
    try:
        info = os.stat(path)
    except OSError as err:
        raise IdentityConfigError(f"user tokens file {path}: {err.strerror}") from None
    if info.st_mode & 0o077:
        raise IdentityConfigError(
            f"user tokens file {path} is readable or writable by group or others (mode "
            f"{stat.S_IMODE(info.st_mode):04o}): its tokens are credentials; run `chmod 600 {path}` "
            "(on Kubernetes: mount the secret with defaultMode 0400)"
        )
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except OSError as err:
        raise IdentityConfigError(f"user tokens file {path}: {err.strerror}") from None
    except ValueError as err:
        raise IdentityConfigError(
            f'user tokens file {path} is not valid JSON ({err}); write an object {{"<token>": "<user name>"}}'
        ) from None
    if not isinstance(raw, dict):
        raise IdentityConfigError(
            f'user tokens file {path} must hold a JSON object {{"<token>": "<user name>"}}, not a {type(raw).__name__}'
        )
    users: dict[str, str] = {}
    for number, (token, name) in enumerate(raw.items(), start=1):
        if len(token) < MIN_TOKEN_LENGTH or token != token.strip():
            raise IdentityConfigError(
                f"user tokens file {path}: token #{number} (of user {name!r}) is shorter than "
                f"{MIN_TOKEN_LENGTH} characters or has surrounding spaces; use e.g. `openssl rand -hex 24`"
            )
        if not isinstance(name, str) or not name or name != name.strip() or len(name) > 256:
            raise IdentityConfigError(
                f"user tokens file {path}: token #{number} must map to a user name (a non-empty string "
                f"without surrounding spaces), not {name!r}"
            )
        users[_digest(token)] = name
    return users


class UserTokenFile:
    """The token file's users, re-read (at most every ``recheck`` seconds) when the file changes."""

    def __init__(self, path: str, recheck: float = 2.0) -> None:
        self.path = path
        self.recheck = recheck
        self.users = read_user_tokens(path)  # a bad file stops the gateway's start here
        self._signature = self._stat()
        self._checked = time.monotonic()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return (info.st_ino, info.st_mtime_ns, info.st_size)

    def user(self, token: str) -> str | None:
        """The user name of ``token``, or None."""
        now = time.monotonic()
        if now - self._checked >= self.recheck:
            self._checked = now
            signature = self._stat()
            if signature != self._signature:
                self._signature = signature
                try:
                    self.users = read_user_tokens(self.path)
                    log.info("user tokens file %s re-read: %d token(s)", self.path, len(self.users))
                except IdentityConfigError as err:
                    # Keep serving the users we had: a half-written file must not lock everyone out.
                    log.error("%s; still using the %d token(s) read before", err, len(self.users))
        return self.users.get(_digest(token))


class HubUnavailable(Exception):
    """JupyterHub did not give a usable answer (down, timing out, or an unexpected status)."""


class HubTokens:
    """JupyterHub API tokens, checked with the Hub's ``GET {hub_api_url}/user`` and cached briefly."""

    def __init__(self, api_url: str, *, cache_seconds: float, unknown_cache_seconds: float, timeout: float) -> None:
        self.api_url = api_url.rstrip("/")
        self.cache_seconds = cache_seconds
        self.unknown_cache_seconds = unknown_cache_seconds
        self.timeout = timeout
        self._cache: OrderedDict[str, tuple[float, str | None]] = OrderedDict()
        self._asking: dict[str, asyncio.Future[str | None]] = {}

    async def user(self, token: str) -> str | None:
        """The name of the Hub user who owns ``token``, or None if the Hub does not know it.

        Raises HubUnavailable when the Hub cannot answer; that answer is never cached.
        """
        key = _digest(token)
        cached = self._cache.get(key)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        asking = self._asking.get(key)
        if asking is not None:  # one question to the Hub per token, however many requests wait on it
            return await asyncio.shield(asking)
        future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._asking[key] = future
        try:
            name = await self._ask(token)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as err:
            future.set_exception(err)
            future.exception()  # retrieved: no "never retrieved" warning when nobody else waited
            raise
        finally:
            self._asking.pop(key, None)
        future.set_result(name)
        ttl = self.cache_seconds if name is not None else self.unknown_cache_seconds
        if ttl > 0:
            self._cache[key] = (time.monotonic() + ttl, name)
            self._cache.move_to_end(key)
            while len(self._cache) > _HUB_CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return name

    async def _ask(self, token: str) -> str | None:
        request = HTTPRequest(
            f"{self.api_url}/user",
            headers={"Authorization": f"token {token}", "Accept": "application/json"},
            connect_timeout=self.timeout,
            request_timeout=self.timeout,
            follow_redirects=False,
        )
        client = AsyncHTTPClient()
        for attempt in (1, 2):  # one quick retry: a Hub restarting or a dropped connection
            try:
                response = await client.fetch(request, raise_error=True)
                break
            except HTTPClientError as err:
                if err.code in (401, 403, 404):
                    return None  # the Hub does not know this token
                if err.code == 599 and attempt == 1:  # no connection or timed out
                    await asyncio.sleep(0.2)
                    continue
                raise HubUnavailable(f"HTTP {err.code} {err.message}") from None
            except OSError as err:
                if attempt == 1:
                    await asyncio.sleep(0.2)
                    continue
                raise HubUnavailable(str(err) or type(err).__name__) from None
        try:
            model = json.loads(response.body)
        except ValueError:
            raise HubUnavailable("its answer is not JSON") from None
        if not isinstance(model, dict) or not isinstance(model.get("name"), str) or not model["name"]:
            raise HubUnavailable("its answer names no user")
        if model.get("kind", "user") != "user":
            log.info(
                "JupyterHub token of %s %r refused: only users' tokens name gateway users",
                model["kind"],
                model["name"],
            )
            return None
        return str(model["name"])


class Identities:
    """Turns a request's token into an :class:`Identity` (or an :class:`IdentityError`)."""

    def __init__(
        self,
        admin_token: str,
        *,
        metrics_token: str = "",
        token_file: UserTokenFile | None = None,
        hub: HubTokens | None = None,
    ) -> None:
        self.admin_token = admin_token
        self.metrics_token = metrics_token
        self.token_file = token_file
        self.hub = hub

    @property
    def open(self) -> bool:
        """No token of any kind is configured: everyone is the admin (Enterprise Gateway's behaviour)."""
        return not (self.admin_token or self.metrics_token or self.token_file or self.hub)

    async def identify(self, token: str | None) -> Identity:
        """The identity of a request carrying ``token`` (None: no token)."""
        if self.open:
            return OPEN_ADMIN
        if not token:
            raise IdentityError(
                401,
                "this gateway needs a token: send 'Authorization: token <token>' (or 'Bearer <token>', "
                "or ?token=<token>)",
            )
        if self.admin_token and hmac.compare_digest(token.encode(), self.admin_token.encode()):
            return ADMIN
        if self.metrics_token and hmac.compare_digest(token.encode(), self.metrics_token.encode()):
            return METRICS
        if self.token_file is not None:
            name = self.token_file.user(token)
            if name is not None:
                return Identity(name, Role.USER, "token file")
        if self.hub is not None:
            try:
                name = await self.hub.user(token)
            except HubUnavailable as err:
                log.warning("JupyterHub at %s could not check a token: %s", self.hub.api_url, err)
                raise IdentityError(
                    503,
                    f"could not check your token with JupyterHub at {self.hub.api_url} ({err}); try again in a moment",
                ) from None
            if name is not None:
                return Identity(name, Role.USER, "JupyterHub")
        raise IdentityError(401, "unknown token: it names no user of this gateway")


class IdentityConfig(Configurable):
    """The gateway's identity options (a base class of the gateway app, as EG's own config mixin is)."""

    user_tokens_file = Unicode(
        config=True,
        help='JSON file of per-user tokens, {"<token>": "<user name>"}, mode 0600 or stricter (the gateway '
        "refuses to start otherwise). Re-read when it changes. Env: NOTEBOOKOS_USER_TOKENS_FILE.",
    )

    @default("user_tokens_file")
    def _user_tokens_file_default(self) -> str:
        return os.environ.get(ENV_USER_TOKENS_FILE, "")

    hub_api_url = Unicode(
        config=True,
        help="JupyterHub's API URL, e.g. http://hub:8081/hub/api: users' Hub API tokens are checked with "
        "GET {hub_api_url}/user. Empty: no Hub. Env: NOTEBOOKOS_HUB_API_URL.",
    )

    @default("hub_api_url")
    def _hub_api_url_default(self) -> str:
        return os.environ.get(ENV_HUB_API_URL, "")

    @validate("hub_api_url")
    def _validate_hub_api_url(self, proposal: Any) -> str:
        url = str(proposal["value"]).strip()
        if url and not url.startswith(("http://", "https://")):
            raise TraitError(f"hub_api_url {url!r} must be an http:// or https:// URL, e.g. http://hub:8081/hub/api")
        return url.rstrip("/")

    hub_cache_seconds = Float(
        60.0, config=True, help="Seconds a token JupyterHub confirmed stays valid without asking the Hub again."
    )
    hub_unknown_cache_seconds = Float(
        5.0, config=True, help="Seconds a token JupyterHub did not know is refused without asking the Hub again."
    )
    hub_timeout = Float(5.0, config=True, help="Seconds to wait for JupyterHub's answer before failing with 503.")

    metrics_token = Unicode(
        config=True,
        help="Token that reads /metrics and nothing else (Prometheus sends it as 'Authorization: Bearer ...'). "
        "The admin token reads /metrics too. Env: NOTEBOOKOS_METRICS_TOKEN.",
    )

    @default("metrics_token")
    def _metrics_token_default(self) -> str:
        return os.environ.get(ENV_METRICS_TOKEN, "")

    def build_identities(self, admin_token: str) -> Identities:
        """The :class:`Identities` these options describe. Raises IdentityConfigError when they are unusable."""
        token_file = UserTokenFile(self.user_tokens_file) if self.user_tokens_file else None
        if token_file is not None:
            for token, what in ((admin_token, "admin"), (self.metrics_token, "metrics")):
                if token and _digest(token) in token_file.users:
                    raise IdentityConfigError(
                        f"user tokens file {self.user_tokens_file} holds the {what} token; give users their own"
                    )
        for what in ("hub_cache_seconds", "hub_unknown_cache_seconds"):
            if getattr(self, what) < 0:
                raise IdentityConfigError(f"{what} must be 0 or more, not {getattr(self, what):g}")
        if self.hub_timeout <= 0:
            raise IdentityConfigError(f"hub_timeout must be more than 0 seconds, not {self.hub_timeout:g}")
        hub = (
            HubTokens(
                self.hub_api_url,
                cache_seconds=self.hub_cache_seconds,
                unknown_cache_seconds=self.hub_unknown_cache_seconds,
                timeout=self.hub_timeout,
            )
            if self.hub_api_url
            else None
        )
        return Identities(admin_token, metrics_token=self.metrics_token, token_file=token_file, hub=hub)


__all__ = [
    "ADMIN",
    "ENV_HUB_API_URL",
    "ENV_METRICS_TOKEN",
    "ENV_USER_TOKENS_FILE",
    "HubTokens",
    "HubUnavailable",
    "Identities",
    "Identity",
    "IdentityConfig",
    "IdentityConfigError",
    "IdentityError",
    "Role",
    "UserTokenFile",
    "read_user_tokens",
    "request_token",
]
