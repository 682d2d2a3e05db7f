"""Usage accounting: GPU-seconds per user and per group, for the hour quotas and for fair share.

Two measures per account (a user, or a group: its members together), both charged when a cell releases its
GPUs (the running cells' share so far is added by whoever asks, from the cells themselves):

* **GPU-seconds in the current day and week**, for ``gpu_hours_per_day`` and ``gpu_hours_per_week``. Windows
  are calendar ones: a day starts at midnight and a week on Monday at midnight, in UTC shifted by
  ``quota_reset_utc_offset_h``, so a refusal can say when its limit resets. A cell that runs across midnight
  counts in each day for the part it ran in it. The scheduler's time is not Unix time in the gateway (it is
  monotonic): ``quota_clock_offset_s`` is what to add to it to get Unix time.
* **Decayed GPU-seconds** for fair share: every GPU-second counts ``2 ** (-age / half_life)``, so an hour-old
  burst weighs half as much as one now (with a half-life of an hour). A half-life of 0 keeps everything.

Pure: time is passed in. :meth:`UsageLedger.records` and the ledger's ``records`` argument carry the state
through a gateway restart (in Unix time, so a new monotonic clock does not matter).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

DAY_S = 86400.0
WEEK_S = 7 * DAY_S
_LN2 = math.log(2.0)

#: An account: ``("user", name)`` or ``("group", name)``.
Account = tuple[str, str]


@dataclass(frozen=True, slots=True)
class QuotaClock:
    """How the scheduler's time maps to calendar windows."""

    offset_s: float = 0.0  # add to the scheduler's time to get Unix time
    utc_offset_h: float = 0.0  # windows start at midnight of this UTC offset

    def _shift(self) -> float:
        return self.offset_s + self.utc_offset_h * 3600.0

    def window(self, now: float, period: str) -> tuple[float, float]:
        """The ``"day"`` or ``"week"`` containing ``now``: (start, end) in the scheduler's time."""
        local = now + self._shift()
        day = math.floor(local / DAY_S)
        if period == "day":
            start_day, length = day, DAY_S
        else:
            start_day, length = 7 * math.floor((day + 3) / 7) - 3, WEEK_S  # 1970-01-01 was a Thursday
        start = start_day * DAY_S - self._shift()
        return start, start + length


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """One account's usage, in Unix time: what the gateway keeps in etcd across restarts."""

    kind: str  # "user" or "group"
    name: str
    day_start: float
    day_gpu_s: float
    week_start: float
    week_gpu_s: float
    decayed_gpu_s: float
    decayed_at: float


class _Usage:
    __slots__ = ("day_gpu_s", "day_start", "decayed", "decayed_at", "week_gpu_s", "week_start")

    def __init__(self) -> None:
        self.decayed = 0.0
        self.decayed_at = 0.0
        self.day_start = -math.inf
        self.day_gpu_s = 0.0
        self.week_start = -math.inf
        self.week_gpu_s = 0.0


class UsageLedger:
    """GPU-seconds of finished cells per account (see the module)."""

    def __init__(self, half_life_s: float, clock: QuotaClock, records: Iterable[UsageRecord] = ()) -> None:
        self.half_life_s = half_life_s
        self.clock = clock
        self._accounts: dict[Account, _Usage] = {}
        for r in records:
            usage = self._accounts.setdefault((r.kind, r.name), _Usage())
            shift = clock.offset_s
            usage.day_start, usage.day_gpu_s = r.day_start - shift, r.day_gpu_s
            usage.week_start, usage.week_gpu_s = r.week_start - shift, r.week_gpu_s
            usage.decayed, usage.decayed_at = r.decayed_gpu_s, r.decayed_at - shift

    # --- decayed usage ----------------------------------------------------------------------------------

    def _decay(self, usage: _Usage, now: float) -> float:
        if self.half_life_s <= 0 or now <= usage.decayed_at:
            return usage.decayed
        return usage.decayed * 2.0 ** (-(now - usage.decayed_at) / self.half_life_s)

    def decayed(self, account: Account, now: float) -> float:
        """Decayed GPU-seconds of the account's finished cells, as of ``now``."""
        usage = self._accounts.get(account)
        return 0.0 if usage is None else self._decay(usage, now)

    def decayed_run(self, gpus: int, start: float, end: float, now: float) -> float:
        """What ``gpus`` GPUs held from ``start`` to ``end`` weigh at ``now``, decayed."""
        if end <= start:
            return 0.0
        if self.half_life_s <= 0:
            return gpus * (end - start)
        h = self.half_life_s
        return gpus * h / _LN2 * (2.0 ** (-(now - end) / h) - 2.0 ** (-(now - start) / h))

    # --- calendar windows -------------------------------------------------------------------------------

    def spent(self, account: Account, period: str, now: float) -> float:
        """GPU-seconds of the account's finished cells in the ``period`` (``"day"``/``"week"``) of ``now``."""
        usage = self._accounts.get(account)
        if usage is None:
            return 0.0
        start, _ = self.clock.window(now, period)
        if period == "day":
            return usage.day_gpu_s if usage.day_start == start else 0.0
        return usage.week_gpu_s if usage.week_start == start else 0.0

    # --- charging ---------------------------------------------------------------------------------------

    def charge(self, accounts: Iterable[Account], gpus: int, start: float, end: float) -> None:
        """A cell held ``gpus`` GPUs from ``start`` to ``end`` (now): charge every account it counts against."""
        if gpus <= 0 or end <= start:
            return
        day, _ = self.clock.window(end, "day")
        week, _ = self.clock.window(end, "week")
        run = self.decayed_run(gpus, start, end, end)
        for account in accounts:
            usage = self._accounts.setdefault(account, _Usage())
            usage.decayed = self._decay(usage, end) + run
            usage.decayed_at = end
            if usage.day_start != day:
                usage.day_start, usage.day_gpu_s = day, 0.0
            usage.day_gpu_s += gpus * (end - max(start, day))
            if usage.week_start != week:
                usage.week_start, usage.week_gpu_s = week, 0.0
            usage.week_gpu_s += gpus * (end - max(start, week))

    def records(self) -> tuple[UsageRecord, ...]:
        """Every account's usage in Unix time (see :class:`UsageRecord`)."""
        shift = self.clock.offset_s
        return tuple(
            UsageRecord(
                kind,
                name,
                u.day_start + shift,
                u.day_gpu_s,
                u.week_start + shift,
                u.week_gpu_s,
                u.decayed,
                u.decayed_at + shift,
            )
            for (kind, name), u in sorted(self._accounts.items())
        )
