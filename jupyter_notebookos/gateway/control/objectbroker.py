"""Object-store access per kernel on S3-compatible stores: the gateway signs, replicas hold no store keys.

The gateway holds the store's credentials (the environment's ``AWS_*`` variables, or the pod's identity). A
replica holds only its kernel's *object token*, a random secret recorded with the kernel (like its etcd
password). With it the replica asks ``POST /api/notebookos/kernels/<kernel id>/objects`` with
``{"op": "get" | "put" | "head" | "delete", "key": "<key>"}`` and gets a URL presigned for that one operation on
``<store>/kernels/<kernel id>/<key>``, valid for ``ObjectBroker.expires`` seconds; ``GET`` on the same path with
``?prefix=`` lists the kernel's own keys. The bytes go between the replica and the store directly, never through
the gateway. A token opens only its own kernel's prefix; a key that climbs out of it is refused.

Why signing rather than per-kernel store users or STS session policies (docs/security.md): it needs no right to
create identities in the store, works the same on AWS S3, MinIO, Ceph RGW and other S3-compatible stores, ends
with the kernel (its token is gone with its record), and a leaked URL opens one key for one operation for a few
minutes. The replica side is :mod:`jupyter_notebookos.replication.brokerfs`.

A ``file://`` store the gateway mounts (a Kubernetes volume claim that kernels in another namespace cannot mount)
can be brokered too (``NotebookOSGatewayApp.object_store_access = "broker"``): :class:`LocalObjectBroker` signs
URLs of the gateway's own ``.../objects/data/<key>`` endpoint (:class:`ObjectDataHandler`, an HMAC over the
operation, kernel, key and expiry with a secret of this gateway process), and the bytes then pass through the
gateway, streamed to and from the volume.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from email.utils import formatdate
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, TypeVar
from urllib.parse import quote

import fsspec
from tornado import web

log = logging.getLogger(__name__)

#: Keys a replica may name: the object store's own layout (buffers/xx/<digest>, checkpoints/<seq>.ckpt, deltas).
_KEY = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
_OPS = {"get": ("GET", "get_object"), "put": ("PUT", "put_object"), "head": ("HEAD", "head_object"),
        "delete": ("DELETE", "delete_object")}  # fmt: skip
#: Stores whose URLs the broker can sign (fsspec protocols of s3fs).
SIGNABLE = ("s3", "s3a")
#: Threads of a brokered file:// store's data endpoint (reads and writes of objects in flight at once).
IO_THREADS = 8

_T = TypeVar("_T")


class ObjectBrokerError(ValueError):
    """The object store cannot be brokered (not an S3 URL, s3fs missing)."""


def brokered(object_store_url: str) -> bool:
    """Whether replicas reach this store through the broker (S3-compatible stores) rather than directly."""
    return object_store_url.split("://", 1)[0].lower() in SIGNABLE if "://" in object_store_url else False


def valid_key(key: str) -> bool:
    """A key relative to a kernel's prefix, with no way out of it (no ``..``, no leading ``/``)."""
    return bool(_KEY.match(key)) and ".." not in key.split("/") and len(key) <= 512


class ObjectBroker:
    """Signs one kernel's object operations with the gateway's store credentials."""

    def __init__(self, object_store_url: str, expires: int = 900, storage_options: dict[str, Any] | None = None):
        if not brokered(object_store_url):
            raise ObjectBrokerError(f"only S3-compatible stores are brokered, not {object_store_url!r}")
        try:
            # Its own filesystem object: fsspec's instance cache may hold one made with other credentials.
            options = {"skip_instance_cache": True, **(storage_options or {})}
            fs, root = fsspec.core.url_to_fs(object_store_url, **options)
        except ImportError as err:
            raise ObjectBrokerError(
                f"the object store {object_store_url} needs s3fs in the gateway's environment (pip install "
                f"'jupyter_notebookos[s3]'): {err}"
            ) from None
        self.fs = fs
        self.root = root.rstrip("/")
        self.expires = expires

    def _path(self, kernel_id: str, key: str = "") -> str:
        base = f"{self.root}/kernels/{kernel_id}"
        return f"{base}/{key}" if key else base

    async def sign(self, kernel_id: str, op: str, key: str) -> tuple[str, str]:
        """(HTTP method, presigned URL) for ``op`` on the kernel's ``key`` (both already validated)."""
        method, client_method = _OPS[op]
        url = await asyncio.to_thread(
            self.fs.url, self._path(kernel_id, key), expires=self.expires, client_method=client_method
        )
        return method, str(url)

    async def list(self, kernel_id: str, prefix: str) -> list[dict[str, Any]]:
        """The kernel's objects whose key starts with ``prefix``: key, size, modified (epoch seconds)."""
        base = self._path(kernel_id)

        def find() -> dict[str, Any]:
            self.fs.invalidate_cache(base)
            try:
                return dict(self.fs.find(f"{base}/{prefix}" if prefix.endswith("/") else base, detail=True))
            except FileNotFoundError:
                return {}

        found = await asyncio.to_thread(find)
        objects = []
        for path, info in sorted(found.items()):
            key = path[len(base) + 1 :]
            if info.get("type") == "directory" or not key.startswith(prefix):
                continue
            modified = info.get("LastModified")
            objects.append(
                {"key": key, "size": int(info.get("size", 0)), "modified": modified.timestamp() if modified else None}
            )
        return objects


class LocalObjectBroker:
    """Signs one kernel's object operations on a ``file://`` store as URLs of this gateway's data endpoint."""

    def __init__(self, object_store_url: str, public_url: str, expires: int = 900) -> None:
        if not object_store_url.startswith("file://"):
            raise ObjectBrokerError(f"the gateway serves file:// stores itself, not {object_store_url!r}")
        if not public_url:
            raise ObjectBrokerError("set NotebookOSGatewayApp.object_broker_url: replicas reach the store through it")
        self.root = Path(object_store_url[len("file://") :])
        self.public_url = public_url.rstrip("/")
        self.expires = expires
        self._secret = secrets.token_bytes(32)  # this process's: a URL is used at once, never across a restart
        # The data endpoint's file I/O: threads of its own, so that many transfers at once do not hold up the
        # loop's other work in the default executor (ObjectDataHandler).
        self._io = ThreadPoolExecutor(max_workers=IO_THREADS, thread_name_prefix="notebookos-objects")

    async def run_io(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` in the data endpoint's I/O threads."""
        return await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

    def submit_io(self, fn: Callable[[], object]) -> None:
        """``fn()`` in the I/O threads, not waited for; a failure is logged."""
        self._io.submit(fn).add_done_callback(_log_io_failure)

    def path(self, kernel_id: str, key: str = "") -> Path:
        base = self.root / "kernels" / kernel_id
        return base / key if key else base

    def signature(self, method: str, kernel_id: str, key: str, expires: int) -> str:
        message = f"{method}\n{kernel_id}\n{key}\n{expires}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def verify(self, method: str, kernel_id: str, key: str, expires: str, signature: str) -> bool:
        """Whether a data request carries this gateway's signature for exactly this operation, still valid."""
        if not expires.isdigit() or int(expires) < time.time():
            return False
        return hmac.compare_digest(signature.encode(), self.signature(method, kernel_id, key, int(expires)).encode())

    async def sign(self, kernel_id: str, op: str, key: str) -> tuple[str, str]:
        method = _OPS[op][0]
        expires = int(time.time()) + self.expires
        query = f"expires={expires}&signature={self.signature(method, kernel_id, key, expires)}"
        return method, f"{self.public_url}/{quote(kernel_id, safe='')}/objects/data/{quote(key)}?{query}"

    async def list(self, kernel_id: str, prefix: str) -> list[dict[str, Any]]:
        base = self.path(kernel_id)

        def walk() -> list[dict[str, Any]]:
            found = []
            for folder, _, files in os.walk(base):
                for name in files:
                    path = Path(folder) / name
                    key = path.relative_to(base).as_posix()
                    if not key.startswith(prefix) or ".tmp-" in name:
                        continue
                    try:
                        stat = path.stat()
                    except FileNotFoundError:
                        continue
                    found.append({"key": key, "size": stat.st_size, "modified": stat.st_mtime})
            return sorted(found, key=lambda o: str(o["key"]))

        return await asyncio.to_thread(walk)


def _log_io_failure(future: Future[object]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("object data endpoint: cleaning up an unfinished upload failed: %s", future.exception())


def wants_broker(access: str, object_store_url: str) -> bool:
    """Whether replicas reach the store through the gateway: ``broker``, ``direct``, or ``auto`` (S3 stores)."""
    return access == "broker" or (access == "auto" and brokered(object_store_url))


def make_broker(object_store_url: str, public_url: str, expires: int) -> ObjectBroker | LocalObjectBroker:
    """The broker for this store: presigned S3 URLs, or the gateway's own data endpoint for a ``file://`` store."""
    if brokered(object_store_url):
        return ObjectBroker(object_store_url, expires=expires)
    return LocalObjectBroker(object_store_url, public_url, expires=expires)


class ObjectBrokerHandler(web.RequestHandler):
    """``/api/notebookos/kernels/<kernel id>/objects``: sign (POST) and list (GET) for a kernel's replicas.

    Authenticated by the kernel's object token only (``Authorization: token <token>``): neither users' tokens
    nor the admin's open it, so nothing here widens what a user could already do."""

    kernel_id = ""

    @property
    def platform(self) -> Any:
        return self.settings["notebookos_platform"]

    def check_xsrf_cookie(self) -> None:
        """A token in a header, no cookie: nothing to forge."""

    def prepare(self) -> None:
        ready = getattr(self.platform, "ready", None)
        if ready is not None and not ready.is_set():
            # Starting: not yet re-attached to its kernels, so it would refuse their tokens. Replicas ask again.
            raise web.HTTPError(503, "the gateway is starting; ask again in a moment")
        broker: ObjectBroker | LocalObjectBroker | None = getattr(self.platform, "object_broker", None)
        if broker is None:
            raise web.HTTPError(404, "this gateway does not broker object-store access (its store is not S3)")
        self.broker = broker

    def _authorize(self, kernel_id: str) -> None:
        header = self.request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() not in ("token", "bearer") or not token.strip():
            raise web.HTTPError(401, "send the kernel's object token: 'Authorization: token <token>'")
        record = self.platform.kernels.get(kernel_id)
        expected = getattr(getattr(record, "access", None), "object_token", "")
        # One answer for an unknown kernel and a wrong token: a token cannot be used to probe for kernel ids.
        if not expected or not hmac.compare_digest(token.strip().encode(), expected.encode()):
            log.warning("object broker: refused a token for kernel %s (%s)", kernel_id, self.request.remote_ip)
            raise web.HTTPError(403, f"this token does not open the objects of kernel {kernel_id}")

    async def post(self, kernel_id: str) -> None:
        self._authorize(kernel_id)
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            raise web.HTTPError(400, 'the body must be JSON: {"op": "get", "key": "buffers/ab/..."}') from None
        op, key = (body.get("op"), body.get("key")) if isinstance(body, dict) else (None, None)
        if op not in _OPS:
            raise web.HTTPError(400, f"op must be one of {sorted(_OPS)}, not {op!r}")
        if not isinstance(key, str) or not valid_key(key):
            raise web.HTTPError(400, f"key {key!r} is not a key of this kernel's objects (relative, no '..')")
        try:
            method, url = await self.broker.sign(kernel_id, op, key)
        except Exception as err:  # the gateway's store configuration (credentials, endpoint): say so
            log.error("object broker: cannot sign for kernel %s: %s: %s", kernel_id, type(err).__name__, err)
            raise web.HTTPError(500, f"the gateway cannot sign for its object store: {type(err).__name__}") from None
        self._json({"method": method, "url": url, "expires_in": self.broker.expires})

    async def get(self, kernel_id: str) -> None:
        self._authorize(kernel_id)
        prefix = self.get_query_argument("prefix", "")
        if prefix and not valid_key(prefix.rstrip("/")):
            raise web.HTTPError(400, f"prefix {prefix!r} is not a key prefix of this kernel's objects")
        try:
            objects = await self.broker.list(kernel_id, prefix)
        except Exception as err:  # the store did not answer the gateway, or refused its credentials
            log.error("object broker: cannot list for kernel %s: %s: %s", kernel_id, type(err).__name__, err)
            raise web.HTTPError(502, f"the object store did not answer the gateway: {type(err).__name__}") from None
        self._json({"objects": objects})

    def _json(self, payload: object) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(payload))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        reason = self._reason
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, web.HTTPError) and exc.log_message:
            reason = exc.log_message % exc.args if exc.args else exc.log_message
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": reason, "reason": self._reason}))


_MAX_OBJECT = 64 << 30  # what one PUT of the data endpoint may carry (a checkpoint of a large notebook)
#: What a PUT gathers before one write in an I/O thread (one hop per 4 MiB, not per 64 KiB body chunk), and
#: what a GET reads per hop.
_GATHER_BYTES = 4 << 20
_READ_BYTES = 4 << 20


class _Upload:
    """One PUT's temporary file, written in the broker's I/O threads and renamed into place at the end. Its
    methods run in those threads, one at a time (a lock: a discard waits for a write still running)."""

    def __init__(self, target: Path) -> None:
        self.target = target
        self.path = target.with_name(f"{target.name}.tmp-{uuid.uuid4().hex}")
        self._file: BinaryIO | None = None
        self._done = False
        self._lock = threading.Lock()

    @property
    def settled(self) -> bool:
        """In place, or discarded: nothing left to clean up."""
        return self._done

    def write(self, data: bytearray) -> None:
        with self._lock:
            self._write(data)

    def finish(self, data: bytearray) -> None:
        """Write the rest and put the object in place: it appears whole or not at all."""
        with self._lock:
            self._write(data)
            assert self._file is not None
            self._file.close()
            os.replace(self.path, self.target)
            self._done = True

    def _write(self, data: bytearray) -> None:
        if self._done:
            raise OSError(f"the upload of {self.target.name} was discarded")
        if self._file is None:  # opened at the first write: a small object costs one hop in all
            self.target.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "wb")  # noqa: SIM115 (closed in finish or discard)
        self._file.write(data)

    def discard(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            if self._file is not None:
                try:
                    self._file.close()
                finally:
                    self.path.unlink(missing_ok=True)


def _open_object(path: Path) -> tuple[BinaryIO, os.stat_result]:
    try:
        file = open(path, "rb")  # noqa: SIM115 (closed by the caller)
    except FileNotFoundError:
        raise web.HTTPError(404, "no such object") from None
    return file, os.fstat(file.fileno())


def _stat_object(path: Path) -> os.stat_result:
    try:
        return path.stat()
    except FileNotFoundError:
        raise web.HTTPError(404, "no such object") from None


@web.stream_request_body
class ObjectDataHandler(web.RequestHandler):
    """``/api/notebookos/kernels/<id>/objects/data/<key>?expires=&signature=``: one object of a ``file://`` store
    the gateway brokers, for a URL :class:`LocalObjectBroker` signed (GET, HEAD, PUT, DELETE). A PUT is
    streamed to a temporary file and renamed into place: the object appears whole or not at all.

    Every file operation runs in the broker's I/O threads, never on the gateway's event loop: the store is often a
    network volume, where a write, a close or a stat can take seconds, and every other user's cells wait while the
    loop does."""

    _upload: _Upload | None = None
    _gathered: bytearray

    def check_xsrf_cookie(self) -> None:
        """The signature in the URL is the credential: nothing to forge."""

    def prepare(self) -> None:
        broker = getattr(self.settings["notebookos_platform"], "object_broker", None)
        if not isinstance(broker, LocalObjectBroker):
            raise web.HTTPError(404, "this gateway serves no object store itself")
        kernel_id, key = self.path_kwargs["kernel_id"], self.path_kwargs["key"]
        if not valid_key(key):
            raise web.HTTPError(400, f"key {key!r} is not a key of a kernel's objects")
        expires, signature = self.get_query_argument("expires", ""), self.get_query_argument("signature", "")
        if not broker.verify(self.request.method or "", kernel_id, key, expires, signature):
            raise web.HTTPError(403, "this URL is not signed for this operation, or it expired: ask for a new one")
        self.broker = broker
        self.target = broker.path(kernel_id, key)
        if self.request.method == "PUT":
            connection: Any = self.request.connection  # an HTTP1Connection while the body streams in
            connection.set_max_body_size(_MAX_OBJECT)
            self._upload = _Upload(self.target)
            self._gathered = bytearray()

    async def data_received(self, chunk: bytes) -> None:
        if self._upload is None:
            return
        self._gathered += chunk
        if len(self._gathered) >= _GATHER_BYTES:
            gathered, self._gathered = self._gathered, bytearray()
            await self.broker.run_io(self._upload.write, gathered)  # tornado reads on when it is written

    async def put(self, kernel_id: str, key: str) -> None:
        assert self._upload is not None
        await self.broker.run_io(self._upload.finish, self._gathered)
        self.set_status(200)

    async def head(self, kernel_id: str, key: str) -> None:
        stat = await self.broker.run_io(_stat_object, self.target)
        self.set_header("Content-Length", str(stat.st_size))
        self.set_header("Last-Modified", formatdate(stat.st_mtime, usegmt=True))

    async def get(self, kernel_id: str, key: str) -> None:
        file, stat = await self.broker.run_io(_open_object, self.target)
        try:
            self.set_header("Content-Type", "application/octet-stream")
            self.set_header("Content-Length", str(stat.st_size))
            self.set_header("Last-Modified", formatdate(stat.st_mtime, usegmt=True))
            while chunk := await self.broker.run_io(file.read, _READ_BYTES):
                self.write(chunk)
                await self.flush()
        finally:
            await self.broker.run_io(file.close)

    async def delete(self, kernel_id: str, key: str) -> None:
        await self.broker.run_io(partial(self.target.unlink, missing_ok=True))
        self.set_status(204)

    def on_finish(self) -> None:
        self._discard()

    def on_connection_close(self) -> None:
        self._discard()

    def _discard(self) -> None:
        """An upload that did not finish leaves nothing behind (in the background: a write may still run)."""
        upload, self._upload = self._upload, None
        if upload is not None and not upload.settled:
            self.broker.submit_io(upload.discard)


def broker_handlers() -> list[tuple[str, type]]:
    """The broker's URL patterns (relative to ``base_url``)."""
    return [
        (r"/api/notebookos/kernels/(?P<kernel_id>[^/]+)/objects", ObjectBrokerHandler),
        (r"/api/notebookos/kernels/(?P<kernel_id>[^/]+)/objects/data/(?P<key>.+)", ObjectDataHandler),
    ]
