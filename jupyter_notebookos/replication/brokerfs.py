"""A kernel's S3 prefix, reached through URLs the gateway signs: replicas hold no object-store credentials.

On an S3-compatible store the gateway holds the store's keys; a replica gets only its kernel's *object token*
(``NOTEBOOKOS_OBJECT_BROKER_TOKEN``) and the gateway's broker address (``NOTEBOOKOS_OBJECT_BROKER_URL``). For
each read, write, size check or delete it asks the gateway for a presigned URL of one key under its kernel's
prefix (``POST <broker>/<kernel id>/objects``), then talks to the store directly with that URL, so the bytes
never cross the gateway. Listing its own prefix is answered by the gateway (``GET .../objects?prefix=``).
The gateway side is :mod:`jupyter_notebookos.gateway.control.objectbroker`.

This module is an fsspec filesystem, protocol ``notebookos-broker``, whose paths are
``<kernel id>/<key>``; :class:`~jupyter_notebookos.replication.objectstore.ObjectStore` uses it like any other
(``notebookos-broker://<kernel id>``).
"""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar
from urllib.parse import quote

import fsspec
import urllib3
from fsspec.spec import AbstractFileSystem

PROTOCOL = "notebookos-broker"

log = logging.getLogger(__name__)
_BROKER_TIMEOUT = urllib3.Timeout(connect=5.0, read=30.0)
_T = TypeVar("_T")


class BrokerRefused(PermissionError):
    """The gateway refused to sign (a wrong or revoked object token, or a key outside the kernel's prefix)."""


class BrokeredFileSystem(AbstractFileSystem):
    """One kernel's objects, through the gateway's signed URLs (see the module's doc)."""

    protocol = PROTOCOL
    root_marker = ""
    cachable = False

    def __init__(
        self, broker: str, token: str, timeout: float = 120.0, broker_wait: float = 180.0, **kwargs: Any
    ) -> None:
        """``broker_wait``: how long to keep asking a gateway that does not answer (restarting, or starting and
        not yet re-attached to its kernels) before an operation fails. A gateway restart is routine, and a
        record whose upload fails loses what its cell defined, so the wait covers one."""
        super().__init__(**kwargs)
        if not broker or not token:
            raise ValueError(f"the {PROTOCOL} store needs the gateway's broker URL and the kernel's object token")
        self.broker = broker.rstrip("/")
        self.broker_wait = float(broker_wait)
        self._headers = {"Authorization": f"token {token}", "Content-Type": "application/json"}
        # The store's own hiccups: a few quick retries. An answer (403, 404...) is not retried.
        retries = urllib3.Retry(total=3, connect=3, read=1, status=0, backoff_factor=0.2, allowed_methods=None)
        self._http = urllib3.PoolManager(retries=retries, timeout=urllib3.Timeout(connect=10.0, read=timeout))

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if path.startswith(f"{PROTOCOL}://"):
            path = path[len(PROTOCOL) + 3 :]
        return path.strip("/")

    # -- the gateway ------------------------------------------------------------------------------------

    @staticmethod
    def _split(path: str) -> tuple[str, str]:
        kernel_id, _, key = path.strip("/").partition("/")
        return kernel_id, key

    def _objects_url(self, kernel_id: str) -> str:
        return f"{self.broker}/{quote(kernel_id, safe='')}/objects"

    def _ask(self, method: str, url: str, body: Any = None) -> Any:
        """The gateway's JSON answer; a gateway that is down or starting (no answer, 502-504) is asked again
        for up to ``broker_wait`` seconds."""

        def attempt() -> tuple[urllib3.BaseHTTPResponse | None, str]:
            try:
                answer = self._http.request(
                    method,
                    url,
                    headers=self._headers,
                    body=None if body is None else json.dumps(body).encode(),
                    retries=False,
                    timeout=_BROKER_TIMEOUT,  # signing takes milliseconds: a hung gateway is asked again
                )
            except urllib3.exceptions.HTTPError as err:
                return None, str(err)
            return (None, f"HTTP {answer.status}") if answer.status in (502, 503, 504) else (answer, "")

        answer = self._until_done(
            attempt,
            f"the gateway's object broker at {self.broker} did not answer",
            "the gateway's object broker does not answer; asking again",
        )
        try:
            payload = json.loads(answer.data or b"{}")
        except ValueError:
            payload = {}
        if answer.status in (401, 403):
            raise BrokerRefused(f"the gateway refused: {payload.get('message') or answer.status}")
        if answer.status >= 400:
            raise OSError(f"the gateway's object broker answered {answer.status}: {payload.get('message', '')}")
        return payload

    def _signed(self, path: str, op: str) -> tuple[str, str]:
        """(HTTP method, presigned URL) for ``op`` (get, put, head, delete) on ``path``."""
        kernel_id, key = self._split(path)
        if not key:
            raise IsADirectoryError(path)
        answer = self._ask("POST", self._objects_url(kernel_id), {"op": op, "key": key})
        return str(answer["method"]), str(answer["url"])

    def _store(self, method: str, url: str, **kwargs: Any) -> urllib3.BaseHTTPResponse:
        try:
            return self._http.request(method, url, **kwargs)
        except urllib3.exceptions.HTTPError as err:
            raise ConnectionError(f"the object store cannot be reached: {err}") from err

    def _operate(self, path: str, op: str, **kwargs: Any) -> urllib3.BaseHTTPResponse:
        """Sign ``op`` on ``path`` and carry it out. When the data path fails (no answer, 502-504), or a URL is
        refused right after it was signed (a store the gateway serves itself, restarted in between: its new
        process signs with a new secret), sign again and retry, for up to ``broker_wait`` seconds."""
        refused_once = False

        def attempt() -> tuple[urllib3.BaseHTTPResponse | None, str]:
            nonlocal refused_once
            method, url = self._signed(path, op)
            try:
                response = self._store(method, url, **kwargs)
            except ConnectionError as err:
                return None, str(err)
            if response.status not in (502, 503, 504) and (response.status != 403 or refused_once):
                return response, ""
            refused_once = refused_once or response.status == 403
            if not kwargs.get("preload_content", True):
                response.drain_conn()
                response.release_conn()
            return None, f"HTTP {response.status}"

        return self._until_done(attempt, f"could not {op} {path}", f"{op} {path} failed; signing again")

    def _until_done(self, attempt: Callable[[], tuple[_T | None, str]], giving_up: str, retrying: str) -> _T:
        """``attempt()`` until it gives a result (with ``(None, why)`` it failed), pausing 0.25 s, doubling up to
        5 s, between tries; after ``broker_wait`` seconds, ``ConnectionError("<giving_up> for N s: <why>")``."""
        deadline = time.monotonic() + self.broker_wait
        pause = 0.25
        while True:
            result, why = attempt()
            if result is not None:
                return result
            if time.monotonic() + pause > deadline:
                raise ConnectionError(f"{giving_up} for {self.broker_wait:.0f} s: {why}")
            log.warning("%s (%s) in %.1f s", retrying, why, pause)
            time.sleep(pause)
            pause = min(pause * 2, 5.0)

    @staticmethod
    def _failed(what: str, path: str, response: urllib3.BaseHTTPResponse) -> OSError:
        if response.status == 404:
            return FileNotFoundError(path)
        detail = (response.data or b"")[:300].decode("utf-8", "replace") if response.status >= 400 else ""
        return OSError(f"the object store refused to {what} {path}: HTTP {response.status} {detail}".rstrip())

    # -- fsspec ---------------------------------------------------------------------------------------

    def _listing(self, path: str) -> list[dict[str, Any]]:
        kernel_id, key = self._split(path)
        prefix = f"{key}/" if key else ""
        answer = self._ask("GET", f"{self._objects_url(kernel_id)}?prefix={quote(prefix, safe='')}")
        return [
            {"name": f"{kernel_id}/{o['key']}", "size": int(o["size"]), "type": "file", "modified": o.get("modified")}
            for o in answer.get("objects", [])
        ]

    def _head(self, path: str) -> dict[str, Any] | None:
        """The object's info, or None when there is no object at ``path``."""
        response = self._operate(path, "head")
        if response.status == 404:
            return None
        if response.status != 200:
            raise self._failed("look up", path, response)
        modified = response.headers.get("Last-Modified")
        return {
            "name": path,
            "size": int(response.headers.get("Content-Length", 0)),
            "type": "file",
            "modified": parsedate_to_datetime(modified) if modified else None,
        }

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        found = self._head(path)
        if found is not None:
            return found
        if self._listing(path):
            return {"name": path, "size": 0, "type": "directory"}
        raise FileNotFoundError(path)

    def exists(self, path: str, **kwargs: Any) -> bool:
        """Whether an object is at ``path`` (one signed HEAD; the store's keys are objects, not directories).
        A failure is raised: fsspec's default would read any error as "absent"."""
        return self._head(self._strip_protocol(path)) is not None

    def modified(self, path: str) -> datetime:
        modified = self.info(path).get("modified")
        if modified is None:
            raise NotImplementedError("the store did not say when the object was written")
        return modified

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)
        children: dict[str, dict[str, Any]] = {}
        for entry in self._listing(path):
            rest = entry["name"][len(path) + 1 :]
            child, _, deeper = rest.partition("/")
            name = f"{path}/{child}"
            children[name] = {"name": name, "size": 0, "type": "directory"} if deeper else entry
        if not children and not self.exists(path):
            raise FileNotFoundError(path)
        entries = sorted(children.values(), key=lambda e: str(e["name"]))
        return entries if detail else [e["name"] for e in entries]

    def find(
        self, path: str, maxdepth: int | None = None, withdirs: bool = False, detail: bool = False, **kwargs: Any
    ) -> Any:
        path = self._strip_protocol(path)
        found = {e["name"]: e for e in self._listing(path)}
        return found if detail else sorted(found)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        path = self._strip_protocol(path)
        headers = {}
        if start is not None or end is not None:
            headers["Range"] = f"bytes={start or 0}-{'' if end is None else end - 1}"
        response = self._operate(path, "get", headers=headers)
        if response.status not in (200, 206):
            raise self._failed("read", path, response)
        return bytes(response.data)

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        path = self._strip_protocol(path)
        if mode == "rb":
            response = self._operate(path, "get", preload_content=False)
            if response.status != 200:
                response.read()
                response.release_conn()
                raise self._failed("read", path, response)
            return io.BufferedReader(_Download(response), buffer_size=1 << 20)
        if mode == "wb":
            return _Upload(self, path)
        raise ValueError(f"the {PROTOCOL} store opens objects for 'rb' or 'wb', not {mode!r}")

    def rm_file(self, path: str) -> None:
        path = self._strip_protocol(path)
        response = self._operate(path, "delete")
        if response.status not in (200, 204, 404):
            raise self._failed("delete", path, response)

    def _rm(self, path: str) -> None:
        self.rm_file(path)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """Object stores have no directories: nothing to make."""

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        """Object stores have no directories: nothing to make."""

    def put_object(self, path: str, chunks: list[memoryview]) -> None:
        """Write ``chunks`` as the object at ``path``, in one PUT (an object appears whole or not at all)."""
        body: Any = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        response = self._operate(path, "put", body=body, headers={"Content-Length": str(len(body))})
        if response.status not in (200, 201, 204):
            raise self._failed("write", path, response)


class _Download(io.RawIOBase):
    """The body of a GET, read straight into the caller's buffer (no copy of a large buffer)."""

    def __init__(self, response: urllib3.BaseHTTPResponse) -> None:
        self._response = response

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return int(self._response.readinto(buffer))

    def close(self) -> None:
        if not self.closed:
            self._response.release_conn()
        super().close()


class _Upload(io.RawIOBase):
    """What is written, PUT in one request on close. A single write (the usual case: one buffer) is sent as
    the caller's own memory, without a copy; it must stay unchanged until the file is closed."""

    def __init__(self, fs: BrokeredFileSystem, path: str) -> None:
        self._fs = fs
        self._path = path
        self._chunks: list[memoryview] = []

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._chunks.append(view)
        return len(view)

    def close(self) -> None:
        if not self.closed:
            try:
                self._fs.put_object(self._path, self._chunks or [memoryview(b"")])
            finally:
                self._chunks = []
                super().close()

    def __iter__(self) -> Iterator[bytes]:
        raise io.UnsupportedOperation("write-only")


fsspec.register_implementation(PROTOCOL, BrokeredFileSystem, clobber=True)
