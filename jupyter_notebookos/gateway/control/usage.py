"""GPU-seconds per user and day, and per kernel, kept over gateway restarts in etcd.

The routers count the GPU-seconds of their kernel's cells from the gateway's start. The dashboard's history
(:mod:`~jupyter_notebookos.gateway.control.history`) hands each kernel's new GPU-seconds to :class:`GpuUsage` at
every sample, which adds them to the kernel's total and to its owner's total of that day (UTC). The totals are
written to etcd at a modest rate (only those that changed, in one transaction) and read back when a gateway
starts, so a restart loses at most the seconds since the last write. Days older than the retention are dropped
from etcd too; a kernel's total goes when the kernel does.

Keys (``coordination/keys.py``): ``/usage/kernels/{kid}`` and ``/usage/days/{day}/{user}``, each ``{"gpu_seconds": x}``.
"""

from __future__ import annotations

import datetime
import json
import logging
from dataclasses import dataclass
from urllib.parse import quote, unquote

from jupyter_notebookos.coordination.client import Coordinator
from jupyter_notebookos.coordination.txn import Op

log = logging.getLogger(__name__)

#: The admin's kernels (no owner recorded) as a key segment; ``quote`` turns a user's "@" into "%40", so no user
#: name can produce it.
ADMIN_SEGMENT = "@admin"
#: Operations per transaction (etcd refuses more than 128 by default).
MAX_TXN_OPS = 100
#: How the admin is named in the history's JSON (as in the cluster view's ``kernels_per_user``).
ADMIN_NAME = "(admin)"


def utc_day(at: float) -> str:
    """The UTC day (``YYYY-MM-DD``) of Unix time ``at``."""
    return datetime.datetime.fromtimestamp(at, tz=datetime.UTC).strftime("%Y-%m-%d")


def user_segment(user: str) -> str:
    """``user`` (a display name; ``""`` or :data:`ADMIN_NAME`: the admin) as one etcd key segment."""
    return ADMIN_SEGMENT if user in ("", ADMIN_NAME) else quote(user, safe="")


def user_of_segment(segment: str) -> str:
    return ADMIN_NAME if segment == ADMIN_SEGMENT else unquote(segment)


@dataclass(frozen=True)
class UsageFlush:
    """What one write to etcd did."""

    written: int
    deleted: int

    def __str__(self) -> str:
        return f"GPU usage: {self.written} total(s) written, {self.deleted} removed"


class GpuUsage:
    """GPU-seconds per (day, user) and per kernel: the gateway's one record of them, mirrored in etcd.

    ``retention_days``: days kept (today included); older days are dropped in memory and in etcd.
    """

    def __init__(self, retention_days: int = 90) -> None:
        if retention_days < 1:
            raise ValueError(f"retention_days must be at least 1, not {retention_days}")
        self.retention_days = retention_days
        self._days: dict[tuple[str, str], float] = {}  # (day, user) -> GPU-seconds
        self._kernels: dict[str, float] = {}
        self._dirty_days: set[tuple[str, str]] = set()
        self._dirty_kernels: set[str] = set()
        self._gone_kernels: set[str] = set()
        self._gone_days: set[tuple[str, str]] = set()

    # -- reading ------------------------------------------------------------------------------------

    def kernel_total(self, kernel_id: str) -> float:
        """GPU-seconds the kernel used, over gateway restarts (as of the last sample)."""
        return self._kernels.get(kernel_id, 0.0)

    def per_user_per_day(self) -> list[dict[str, object]]:
        """``[{"day", "user", "gpu_hours"}]``, by day then user, the days kept only."""
        return [
            {"day": day, "user": user, "gpu_hours": round(seconds / 3600.0, 6)}
            for (day, user), seconds in sorted(self._days.items())
        ]

    # -- changing -----------------------------------------------------------------------------------

    def add(self, kernel_id: str, user: str, gpu_seconds: float, at: float) -> None:
        """``kernel_id`` of ``user`` (``""``: the admin) used ``gpu_seconds`` more, counted on the UTC day of ``at``."""
        if gpu_seconds <= 0:
            return
        day = (utc_day(at), ADMIN_NAME if user in ("", ADMIN_NAME) else user)
        self._days[day] = self._days.get(day, 0.0) + gpu_seconds
        self._dirty_days.add(day)
        self._gone_days.discard(day)
        self._kernels[kernel_id] = self._kernels.get(kernel_id, 0.0) + gpu_seconds
        self._dirty_kernels.add(kernel_id)
        self._gone_kernels.discard(kernel_id)

    def forget_kernel(self, kernel_id: str) -> None:
        """The kernel is gone: its total goes (its user's days keep what it used)."""
        if self._kernels.pop(kernel_id, None) is not None:
            self._gone_kernels.add(kernel_id)
        self._dirty_kernels.discard(kernel_id)

    def keep_only(self, kernel_ids: set[str]) -> None:
        """Forget the totals of every kernel not in ``kernel_ids`` (at start: those that ended meanwhile)."""
        for kernel_id in [k for k in self._kernels if k not in kernel_ids]:
            self.forget_kernel(kernel_id)

    def prune(self, now: float) -> None:
        """Drop the days that fell out of the retention."""
        oldest = utc_day(now - (self.retention_days - 1) * 86400.0)
        for day in [d for d in self._days if d[0] < oldest]:
            del self._days[day]
            self._dirty_days.discard(day)
            self._gone_days.add(day)

    # -- etcd ---------------------------------------------------------------------------------------

    async def load(self, coordinator: Coordinator) -> int:
        """Read the totals a previous gateway wrote (added to what this one counted so far); how many."""
        keys = coordinator.keys
        loaded = 0
        for kv in await coordinator.get_prefix(keys.usage_kernels_prefix()):
            seconds = _seconds(kv.key, kv.value)
            if seconds is not None:
                kernel_id = keys.last_segment(kv.key)
                self._kernels[kernel_id] = self._kernels.get(kernel_id, 0.0) + seconds
                loaded += 1
        prefix = keys.usage_days_prefix()
        for kv in await coordinator.get_prefix(prefix):
            seconds = _seconds(kv.key, kv.value)
            day, _, segment = kv.key[len(prefix) :].partition("/")
            if seconds is None or not segment:
                continue
            slot = (day, user_of_segment(segment))
            self._days[slot] = self._days.get(slot, 0.0) + seconds
            loaded += 1
        return loaded

    async def flush(self, coordinator: Coordinator) -> UsageFlush:
        """Write the totals that changed and remove those that went, in one transaction."""
        keys = coordinator.keys
        ops = [
            Op.put(keys.usage_kernel(k), json.dumps({"gpu_seconds": round(self._kernels[k], 3)}))
            for k in sorted(self._dirty_kernels)
            if k in self._kernels
        ]
        ops += [
            Op.put(keys.usage_day(day, user_segment(user)), json.dumps({"gpu_seconds": round(self._days[d], 3)}))
            for d in sorted(self._dirty_days)
            for day, user in [d]
        ]
        written = len(ops)
        ops += [Op.delete(keys.usage_kernel(k)) for k in sorted(self._gone_kernels)]
        ops += [Op.delete(keys.usage_day(day, user_segment(user))) for day, user in sorted(self._gone_days)]
        for start in range(0, len(ops), MAX_TXN_OPS):
            await coordinator.txn([], ops[start : start + MAX_TXN_OPS])
        done = UsageFlush(written, len(ops) - written)
        self._dirty_kernels.clear()
        self._dirty_days.clear()
        self._gone_kernels.clear()
        self._gone_days.clear()
        return done


def _seconds(key: str, value: bytes) -> float | None:
    try:
        seconds = float(json.loads(value)["gpu_seconds"])
    except (ValueError, KeyError, TypeError):
        log.warning("ignoring a malformed GPU-usage total at %s: %r", key, value[:80])
        return None
    return seconds if seconds >= 0 else None


__all__ = ["ADMIN_NAME", "GpuUsage", "UsageFlush", "user_segment", "utc_day"]
