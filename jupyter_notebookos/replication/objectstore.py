"""The object store: large state buffers and checkpoints, on any fsspec filesystem.

etcd holds metadata only (DESIGN.md section 3), so the bulk of a kernel's state lives here: out-of-band
pickle buffers above the inline threshold, addressed by their content digest (so an unchanged array that is
re-sent costs one existence check, not one upload), and namespace checkpoints, addressed by the log sequence
they cover. Layout under the store's URL::

    buffers/<first two hex digits>/<digest>     one out-of-band buffer
    checkpoints/<seq, 20 digits>.ckpt           one checkpoint record (see records.py)

Writes are atomic: on a local filesystem the data goes to a temporary name in the same directory and is then
renamed; object stores (s3, gcs, ...) make each put atomic themselves. Every read of a buffer checks its size
and digest, so damaged or missing data raises :class:`BufferMissingError` / :class:`BufferCorruptError`
naming the buffer, instead of silently becoming a wrong value in the user's namespace.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.spec import AbstractFileSystem

from jupyter_notebookos.replication import brokerfs  # noqa: F401  (registers the notebookos-broker:// store)
from jupyter_notebookos.replication.digest import as_bytes_view, content_digest

_CHECKPOINT_NAME = re.compile(r"^(\d{20})\.ckpt$")


class ObjectStoreError(RuntimeError):
    """Base class of object-store failures; the message says what happened and what to do."""


class ObjectStoreUnreachable(ObjectStoreError):
    """The store's filesystem cannot be reached or written (bad URL, missing credentials, network)."""


class BufferMissingError(ObjectStoreError):
    """A record points at a buffer that is not in the store (deleted too early, or a different store)."""


class BufferCorruptError(ObjectStoreError):
    """A buffer's size or content digest does not match the pointer that names it."""


@dataclass(frozen=True)
class BufferRef:
    """A pointer to one out-of-band buffer: its store key, its size in bytes and its content digest."""

    key: str
    size: int
    digest: str


class ObjectStore:
    """Content-addressed buffers and sequence-numbered checkpoints under one fsspec URL.

    ``url`` is any fsspec URL (``file:///var/lib/notebookos/k1/objects``, ``memory://k1``, ``s3://bucket/k1``);
    ``storage_options`` go to the filesystem (credentials, endpoint). With ``verify`` (the default) every
    buffer read is checked against its digest.
    """

    def __init__(self, url: str, *, verify: bool = True, storage_options: dict[str, Any] | None = None):
        self.url = url
        self.verify = verify
        try:
            fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        except (ImportError, ValueError) as exc:
            raise ObjectStoreUnreachable(
                f"cannot open the object store at {url!r}: {exc}. Check the URL "
                "(ReplicationConfig.object_store_url) and that the filesystem's package is installed."
            ) from exc
        self.fs: AbstractFileSystem = fs
        self.root = root.rstrip("/")
        self._local = "file" in _protocols(fs)
        try:
            self.fs.makedirs(self._path("buffers"), exist_ok=True)
            self.fs.makedirs(self._path("checkpoints"), exist_ok=True)
        except Exception as exc:
            raise self._unreachable("create its directories", exc) from exc

    def __repr__(self) -> str:
        return f"ObjectStore({self.url!r})"

    # -- buffers ---------------------------------------------------------------------------------------

    @staticmethod
    def buffer_key(digest: str) -> str:
        """The store key of the buffer whose content digest is ``digest``."""
        return f"buffers/{digest[:2]}/{digest}"

    def put_buffer(self, data: bytes | bytearray | memoryview, digest: str | None = None) -> BufferRef:
        """Store ``data`` (unless identical content is already there) and return its pointer."""
        view = as_bytes_view(data)
        digest = digest or content_digest(view)
        ref = BufferRef(key=self.buffer_key(digest), size=len(view), digest=digest)
        if not self.exists(ref.key):
            self._write_atomic(ref.key, view)
        return ref

    def get_buffer(self, ref: BufferRef) -> bytearray:
        """Read a buffer into a new writable ``bytearray`` (numpy arrays built on it stay writable)."""
        out = bytearray(ref.size)
        self.get_buffer_into(ref, memoryview(out))
        return out

    def get_buffer_into(self, ref: BufferRef, out: memoryview) -> None:
        """Read a buffer into ``out`` (writable, exactly ``ref.size`` bytes), with the checks of get_buffer.

        For large buffers: ``bytearray(size)`` zero-fills while holding the GIL (seconds per GB on a busy
        machine, long enough for a replica to miss its etcd lease); ``out`` can be memory that is not
        touched until ``readinto`` fills it with the GIL released (``numpy.empty``)."""
        path = self._path(ref.key)
        if len(out) != ref.size:
            raise ValueError(f"buffer {ref.key} has {ref.size} bytes; the target has {len(out)}")
        try:
            with self.fs.open(path, "rb") as f:
                got = f.readinto(out) if hasattr(f, "readinto") else _read_into(f, out)  # type: ignore[arg-type]
                extra = f.read(1)
        except FileNotFoundError as exc:
            raise BufferMissingError(
                f"buffer {ref.key} ({ref.size} bytes) is missing from the object store {self.url}: the "
                "state that refers to it cannot be restored. It was deleted while still referenced, or this "
                "replica is configured with a different object store than the executor."
            ) from exc
        except Exception as exc:
            raise self._unreachable(f"read buffer {ref.key}", exc) from exc
        if got != ref.size or extra:
            raise BufferCorruptError(
                f"buffer {ref.key} in {self.url} has the wrong size (expected {ref.size} bytes): it is damaged."
            )
        if self.verify and content_digest(out) != ref.digest:
            raise BufferCorruptError(f"buffer {ref.key} in {self.url} does not match its digest: it is damaged.")

    def exists(self, key: str) -> bool:
        """Whether ``key`` is in the store."""
        try:
            return bool(self.fs.exists(self._path(key)))
        except Exception as exc:
            raise self._unreachable(f"look up {key}", exc) from exc

    def delete(self, key: str) -> None:
        """Remove ``key`` (a buffer or a checkpoint); a key that is already gone is not an error."""
        try:
            self.fs.rm_file(self._path(key))
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise self._unreachable(f"delete {key}", exc) from exc

    def buffer_keys(self) -> Iterator[str]:
        """Every buffer key in the store."""
        base = self._path("buffers")
        try:
            paths = self.fs.find(base)
        except FileNotFoundError:
            return
        except Exception as exc:
            raise self._unreachable("list buffers", exc) from exc
        for path in paths:
            rel = path[len(self.root) + 1 :] if path.startswith(self.root + "/") else path
            if rel.startswith("buffers/") and ".tmp-" not in rel:
                yield rel

    def age_seconds(self, key: str) -> float | None:
        """Seconds since ``key`` was written, or None when the filesystem does not say."""
        try:
            modified = self.fs.modified(self._path(key))
        except (NotImplementedError, AttributeError, KeyError):
            return None
        except FileNotFoundError:
            return None
        return time.time() - modified.timestamp()

    # -- checkpoints -----------------------------------------------------------------------------------

    @staticmethod
    def checkpoint_key(seq: int) -> str:
        """The store key of the checkpoint that covers the log up to and including record ``seq``."""
        return f"checkpoints/{seq:020d}.ckpt"

    def put_checkpoint(self, seq: int, data: bytes) -> str:
        """Store a checkpoint record covering the log up to ``seq``; returns its key."""
        key = self.checkpoint_key(seq)
        self._write_atomic(key, as_bytes_view(data))
        return key

    def get_checkpoint(self, seq: int) -> bytes:
        """The checkpoint record for ``seq``."""
        key = self.checkpoint_key(seq)
        try:
            return bytes(self.fs.cat_file(self._path(key)))
        except FileNotFoundError as exc:
            raise BufferMissingError(f"checkpoint {key} is missing from the object store {self.url}.") from exc
        except Exception as exc:
            raise self._unreachable(f"read checkpoint {key}", exc) from exc

    def checkpoint_seqs(self) -> list[int]:
        """The sequence numbers of the stored checkpoints, oldest first."""
        try:
            names = [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self._path("checkpoints"), detail=False)]
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise self._unreachable("list checkpoints", exc) from exc
        return sorted(int(m.group(1)) for n in names if (m := _CHECKPOINT_NAME.match(n)))

    def latest_checkpoint(self) -> tuple[int, bytes] | None:
        """``(seq, record bytes)`` of the newest checkpoint, or None when there is none yet."""
        seqs = self.checkpoint_seqs()
        return (seqs[-1], self.get_checkpoint(seqs[-1])) if seqs else None

    # -- internals -------------------------------------------------------------------------------------

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def _write_atomic(self, key: str, view: memoryview) -> None:
        path = self._path(key)
        try:
            parent = path.rsplit("/", 1)[0]
            self.fs.makedirs(parent, exist_ok=True)
            if not self._local:
                # Object stores publish a put all at once.
                with self.fs.open(path, "wb") as f:
                    f.write(view)
                return
            tmp = f"{path}.tmp-{uuid.uuid4().hex}"
            try:
                with self.fs.open(tmp, "wb") as f:
                    f.write(view)
                self.fs.mv(tmp, path)
            finally:
                if self.fs.exists(tmp):
                    self.fs.rm_file(tmp)
        except ObjectStoreError:
            raise
        except Exception as exc:
            raise self._unreachable(f"write {key}", exc) from exc

    def _unreachable(self, what: str, exc: BaseException) -> ObjectStoreUnreachable:
        return ObjectStoreUnreachable(
            f"the object store at {self.url} is unreachable: could not {what} ({type(exc).__name__}: {exc}). "
            "Kernel state cannot be replicated until it is back; check the URL, permissions and free space."
        )


def _protocols(fs: AbstractFileSystem) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)


def _read_into(f: Any, out: bytearray) -> int:
    data = f.read(len(out))
    out[: len(data)] = data
    return len(data)
