"""Hashing of large buffers: a fast change checksum and a content digest, both chunked and parallel.

Two different hashes, for two different jobs:

- :func:`buffer_checksum` answers "did this buffer change since the last cell?" where the kernel cannot tell
  us (see writetrack.py, the primary method). It runs over every byte of such buffers after every cell, so
  it must run at memory speed: XXH3-128 per 4 MiB chunk (about 8.5 GB/s per core here, against 1.9 GB/s
  for zlib's CRC-32; one thread: the binding keeps the GIL). A random change goes unnoticed with
  probability 2**-128 per chunk. Fine for change detection, not for naming content (not collision
  resistant against an adversary).
- :func:`content_digest` names a buffer in the object store (content addressing, deduplication, integrity
  check on read), so it must be collision resistant: SHA-256 over the concatenated SHA-256 digests of the
  4 MiB chunks (a one-level hash tree, so chunks hash in parallel; hashlib also releases the GIL).

A torch storage on a GPU gets :func:`device_checksum` instead of either: computed on its device, so that telling
whether a model that stays on the GPU changed costs a pass over device memory, not a copy to the host.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import xxhash

CHUNK_BYTES = 4 * 1024 * 1024
# Below this size a thread hop costs more than it saves.
_PARALLEL_MIN_BYTES = 2 * CHUNK_BYTES

_T = TypeVar("_T")
_pool: ThreadPoolExecutor | None = None


def _workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def _map_chunks(func: Callable[[memoryview], _T], view: memoryview) -> list[_T]:
    """Apply ``func`` to each CHUNK_BYTES slice of ``view`` (a flat byte view), in parallel when large."""
    chunks = [view[i : i + CHUNK_BYTES] for i in range(0, len(view), CHUNK_BYTES)] or [view]
    if len(view) < _PARALLEL_MIN_BYTES or _workers() == 1:
        return [func(c) for c in chunks]
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=_workers(), thread_name_prefix="notebookos-hash")
    return list(_pool.map(func, chunks))


def as_bytes_view(data: bytes | bytearray | memoryview) -> memoryview:
    """A flat, byte-format view of ``data`` without copying (``data`` must be contiguous)."""
    view = data if isinstance(data, memoryview) else memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def buffer_checksum(data: bytes | bytearray | memoryview) -> bytes:
    """A fast change checksum of ``data``: its length and one XXH3-128 per 4 MiB chunk, packed."""
    view = as_bytes_view(data)
    # Serially: the xxhash binding keeps the GIL, so a thread pool only adds overhead (measured: 0.45 s per
    # GB through the pool, 0.21 s per GB in one thread, on a busy 2-core machine).
    digests = [xxhash.xxh3_128_digest(view[i : i + CHUNK_BYTES]) for i in range(0, len(view), CHUNK_BYTES)]
    return struct.pack("<Q", len(view)) + b"".join(digests or [xxhash.xxh3_128_digest(view)])


def _sha256_digest(chunk: memoryview) -> bytes:
    return hashlib.sha256(chunk).digest()


def content_digest(data: bytes | bytearray | memoryview) -> str:
    """The content digest used as an object-store key: hex SHA-256 of the chunk SHA-256 digests."""
    view = as_bytes_view(data)
    return hashlib.sha256(b"".join(_map_chunks(_sha256_digest, view))).hexdigest()


#: :func:`device_checksum` works in rows of this many 32-bit words (4 MiB) ...
DEVICE_ROW_WORDS = 1 << 20
#: ... this many rows per step: one multiply and two sums over 64 MiB of device memory, with a 128 MiB temporary.
DEVICE_STEP_ROWS = 16


def _row_weights(torch: Any, device: Any, count: int) -> Any:
    """The weights of the first ``count`` words of a row: distinct odd numbers below 2**31 in a scrambled order,
    made on ``device`` for each checksum (kept, they would hold device memory after the replica released its GPU).
    ``i`` goes through bijections of the 30-bit numbers (multiplications by odd constants, xor-shifts), so no two
    words of a row weigh the same and neighbouring weights are unrelated (with weights linear in ``i``, a change of
    +k, -2k, +k to three neighbouring words would cancel)."""
    mask = (1 << 30) - 1
    x = torch.arange(count, dtype=torch.int64, device=device) * 0x2545F491 & mask
    x ^= x >> 15
    x = x * 0x1B873593 & mask
    x ^= x >> 13
    return x * 2 + 1


def device_checksum(torch: Any, storage: Any) -> bytes:
    """A change checksum of a torch storage's bytes, computed on the storage's device (a GPU's memory bandwidth).

    The bytes are read as 32-bit words in rows of :data:`DEVICE_ROW_WORDS`. Each row gives two int64 sums: of its
    words, and of its words times distinct odd weights below 2**31 (:func:`_row_weights`; no product overflows).
    So any change to one or two words of a row (a swap, two sign flips) changes a sum. A change to three or more
    words of one row goes unnoticed only when both sums of the differences cancel exactly: for random differences
    about one chance in 2**60, for a small pattern over three given words about one in 2**30 (weaker than the
    host's XXH3-128). The sums (16 bytes per 4 MiB) come to the host in one copy and are hashed there with the
    storage's size; the words past the last whole row, and the last 1-3 bytes, are summed the same way. Integer
    sums do not depend on the order of addition, so any device gives the same checksum for the same bytes.
    """
    nbytes = storage.nbytes()
    data = torch.empty(0, dtype=torch.uint8, device=storage.device)
    if nbytes:
        data.set_(storage, 0, (nbytes,), (1,))
    words = data[: nbytes // 4 * 4].view(torch.int32)
    weights = _row_weights(torch, storage.device, min(words.numel(), DEVICE_ROW_WORDS))
    sums: list[Any] = []
    rows = words.numel() // DEVICE_ROW_WORDS
    step = DEVICE_STEP_ROWS
    with torch.no_grad():
        for first in range(0, rows, step):
            block = words[first * DEVICE_ROW_WORDS : min(rows, first + step) * DEVICE_ROW_WORDS]
            block = block.view(-1, DEVICE_ROW_WORDS)
            sums.append(torch.mul(block, weights).sum(dim=1))
            sums.append(block.sum(dim=1, dtype=torch.int64))
        rest = words[rows * DEVICE_ROW_WORDS :]
        if rest.numel():
            sums.append(torch.mul(rest, weights[: rest.numel()]).sum().view(1))
            sums.append(rest.sum(dtype=torch.int64).view(1))
        tail = data[nbytes // 4 * 4 :]
        if tail.numel():
            sums.append(tail.to(torch.int64))
        host = torch.cat(sums).cpu() if sums else torch.empty(0, dtype=torch.int64)
    digest = hashlib.blake2b(host.numpy().tobytes(), digest_size=16).digest()
    return struct.pack("<Q", nbytes) + digest
