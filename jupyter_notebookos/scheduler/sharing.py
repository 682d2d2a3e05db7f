"""Sharing GPUs among users: quota admission and the fair-share order of waiting cells.

:class:`Sharing` is the engine's one door to quotas, usage and fair share. It reads kernels and their running
cells from the model (GPUs in use are never counted twice: a user's GPUs in use are the devices their running
cells hold) and owns the usage ledger (GPU-seconds of finished cells).

**Admission.** A kernel over the user's (or a group's) kernel limit, or asking for more GPUs per cell than the
GPU limit allows at all, is refused at start. A cell whose GPUs would take its user or one of the user's groups
over the GPU limit waits (:class:`~.quotas.QuotaWait`); a cell whose user or group has spent its GPU-hours of
the day or week is refused with the time the limit resets (:class:`~.quotas.QuotaExceeded`). A cell that asks
for no GPU is never held back. A cell that started runs to its end: the hour limits bound what starts.

**Fair share.** When the cluster's kernels belong to more than one user, the kernels whose next cell waits for
GPUs are offered them in the order of their users' decayed GPU-seconds (running cells included) divided by the
users' weights, least first, ties in the order they became ready (weighted fair queueing over decayed usage, as
in Slurm's fair-share factor). A user's own kernels keep the round-robin order among themselves, and with one
user (or none known: kernels without an owner count as one user) the queue is exactly the round-robin queue.

**No cell waits forever.** A cell that has waited ``fair_share_max_wait_s`` goes ahead of every cell that has
not, oldest first; while such a cell needs more GPUs than any host has idle, later cells that could take the
same GPUs wait behind it (new ones too), so GPUs gather for it as running cells end.

**In place first.** In fair-share order, GPUs go first to cells that can run on a replica's host, then (same
order, same round) to cells that need a migration (see ``dispatch``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from .cluster import Cell, ClusterModel, Kernel
from .quotas import Owner, QuotaExceeded, Quotas, QuotaWait
from .settings import SchedulerSettings
from .usage import Account, QuotaClock, UsageLedger, UsageRecord

_ANONYMOUS = ""  # the fair-share account of kernels started without an owner


def accounts(owner: Owner) -> list[Account]:
    """Every account a kernel of ``owner`` counts against: the user, then each group."""
    return [("user", owner.user), *(("group", g) for g in owner.groups)]


@dataclass(frozen=True, slots=True)
class AccountUsage:
    """One user's or group's usage now, with the limits that apply (for the REST view, the simulator, tests)."""

    kind: str
    name: str
    gpus_in_use: int
    kernels: int
    gpu_hours_today: float
    gpu_hours_this_week: float
    decayed_gpu_hours: float
    limits: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class Turn:
    """A ready kernel's place in the fair-share order and why (``aged``: past the wait bound)."""

    kernel_id: str
    why: str
    aged: bool


class Sharing:
    """Quotas, usage and the fair-share order over one cluster model (see the module)."""

    def __init__(self, model: ClusterModel, settings: SchedulerSettings, records: Iterable[UsageRecord] = ()) -> None:
        self.model = model
        self.settings = settings
        clock = QuotaClock(settings.quota_clock_offset_s, settings.quota_reset_utc_offset_h)
        self.ledger = UsageLedger(settings.fair_share_half_life_s, clock, records)
        self._kernels: dict[Account, dict[str, None]] = {}  # an index of Kernel.owner
        self._users = 0  # users with kernels, kernels without an owner counting as one
        self._anonymous = 0  # kernels without an owner

    def configure(self, settings: SchedulerSettings) -> None:
        """Knobs changed at runtime (quotas, half-life, clock)."""
        self.settings = settings
        self.ledger.half_life_s = settings.fair_share_half_life_s
        self.ledger.clock = QuotaClock(settings.quota_clock_offset_s, settings.quota_reset_utc_offset_h)

    @property
    def quotas(self) -> Quotas:
        """The quotas in force."""
        return self.settings.quotas

    # --- kernels ----------------------------------------------------------------------------------------

    def kernel_added(self, kernel: Kernel) -> None:
        """Index a kernel under its owner's accounts."""
        if kernel.owner is None:
            self._anonymous += 1
            self._users += self._anonymous == 1
            return
        for account in accounts(kernel.owner):
            owned = self._kernels.setdefault(account, {})
            owned[kernel.kernel_id] = None
            self._users += account[0] == "user" and len(owned) == 1

    def kernel_removed(self, kernel: Kernel) -> None:
        """Forget a kernel (its cells' usage stays charged)."""
        if kernel.owner is None:
            self._anonymous -= 1
            self._users -= self._anonymous == 0
            return
        for account in accounts(kernel.owner):
            owned = self._kernels.get(account)
            if owned is not None and kernel.kernel_id in owned:
                del owned[kernel.kernel_id]
                if not owned:
                    del self._kernels[account]
                    self._users -= account[0] == "user"

    def admit_kernel(self, owner: Owner | None, gpus: int) -> QuotaExceeded | None:
        """Why a new kernel of ``owner`` asking ``gpus`` GPUs per cell is refused, or None."""
        if owner is None or self.quotas.empty:
            return None
        for account, limit, group in self._limits(owner, "kernels"):
            have = len(self._kernels.get(account, ()))
            if have + 1 > limit:
                return QuotaExceeded("kernels", have, limit, 1, group)
        return self._too_many_gpus(owner, gpus)

    def _too_many_gpus(self, owner: Owner, gpus: int) -> QuotaExceeded | None:
        for _, limit, group in self._limits(owner, "gpus"):
            if gpus > limit:
                return QuotaExceeded("gpus", 0, limit, gpus, group)
        return None

    def _limits(self, owner: Owner, name: str) -> list[tuple[Account, float, str | None]]:
        """The finite limits ``name`` that apply to ``owner``: the user's own, then each group's total."""
        found: list[tuple[Account, float, str | None]] = []
        own = self.quotas.resolve(owner, name)
        if not math.isinf(own):
            found.append((("user", owner.user), own, None))
        for group, limit in self.quotas.group_totals(owner, name):
            found.append((("group", group), limit, group))
        return found

    # --- cells ------------------------------------------------------------------------------------------

    def gate(self, kernel: Kernel, gpus: int, now: float) -> QuotaWait | QuotaExceeded | None:
        """Whether a cell of ``kernel`` asking ``gpus`` GPUs may start now as far as quotas go: None, a wait
        (a GPU limit), or a refusal (GPU-hours spent, or more GPUs than the limit itself)."""
        owner = kernel.owner
        if owner is None or gpus <= 0 or self.quotas.empty:
            return None
        too_many = self._too_many_gpus(owner, gpus)
        if too_many is not None:
            return too_many
        for name, period in (("gpu_hours_per_day", "day"), ("gpu_hours_per_week", "week")):
            for account, limit, group in self._limits(owner, name):
                spent = self.spent(account, period, now) / 3600.0
                if spent >= limit:
                    _, end = self.ledger.clock.window(now, period)
                    return QuotaExceeded(name, spent, limit, gpus, group, end, end - now)
        for account, limit, group in self._limits(owner, "gpus"):
            used = self.in_use(account)
            if used + gpus > limit:
                return QuotaWait("gpus", used, limit, gpus, group)
        return None

    def cell_released(self, kernel: Kernel, cell: Cell, now: float) -> None:
        """A cell gave its GPUs back: charge what it ran to its owner's accounts."""
        if kernel.owner is not None and cell.started_at is not None:
            self.ledger.charge(accounts(kernel.owner), len(cell.device_ids), cell.started_at, now)

    def _running(self, account: Account) -> list[Cell]:
        kernels = self.model.kernels
        return [
            cell for kernel_id in self._kernels.get(account, ()) if (cell := kernels[kernel_id].running) is not None
        ]

    def in_use(self, account: Account) -> int:
        """GPUs the account's running cells hold (those waiting for their migration included)."""
        return sum(len(cell.device_ids) for cell in self._running(account))

    def spent(self, account: Account, period: str, now: float) -> float:
        """GPU-seconds the account used in the current ``period``, running cells included."""
        start, _ = self.ledger.clock.window(now, period)
        total = self.ledger.spent(account, period, now)
        for cell in self._running(account):
            if cell.started_at is not None:
                total += len(cell.device_ids) * max(0.0, now - max(cell.started_at, start))
        return total

    def decayed(self, account: Account, now: float) -> float:
        """Decayed GPU-seconds of the account, running cells included."""
        total = self.ledger.decayed(account, now)
        for cell in self._running(account):
            if cell.started_at is not None:
                total += self.ledger.decayed_run(len(cell.device_ids), cell.started_at, now, now)
        return total

    # --- fair share -------------------------------------------------------------------------------------

    def order(self, ready: list[str], ready_since: Callable[[str], float], now: float) -> list[Turn] | None:
        """The fair-share order of the ready kernels, or None when it is the round-robin order (fair share
        off, or the cluster's kernels all belong to one user, or to nobody known)."""
        if not self.settings.fair_share or not ready or self._users < 2:
            return None
        kernels = self.model.kernels
        bound = self.settings.fair_share_max_wait_s
        priority: dict[str, float] = {}
        for kernel_id in ready:
            owner = kernels[kernel_id].owner
            user = self._user(kernels[kernel_id])
            if user not in priority:
                usage = self.decayed(("user", user), now) if owner is not None else 0.0
                priority[user] = usage / self.quotas.weight(owner)
        ranked = sorted(priority, key=lambda u: priority[u])
        rank = {u: i for i, u in enumerate(ranked)}
        keyed: list[tuple[tuple[float, float, int], Turn]] = []
        for position, kernel_id in enumerate(ready):
            since = ready_since(kernel_id)
            waited = now - since
            user = self._user(kernels[kernel_id])
            if bound > 0 and waited >= bound:
                why = f"waited {waited:.0f} s, past the fair-share bound of {bound:.0f} s"
                keyed.append(((0, since, position), Turn(kernel_id, why, True)))
                continue
            others = ", ".join(f"{u or 'nobody'} {priority[u] / 3600.0:.2f}" for u in ranked[:4])
            why = (
                f"fair share: {user or 'nobody'} ranks {rank[user] + 1} of {len(ranked)} users waiting by decayed "
                f"GPU-hours / weight ({others})"
            )
            keyed.append(((1, priority[user], position), Turn(kernel_id, why, False)))
        keyed.sort(key=lambda item: item[0])
        return [turn for _, turn in keyed]

    @staticmethod
    def _user(kernel: Kernel) -> str:
        return kernel.owner.user if kernel.owner is not None else _ANONYMOUS

    # --- views ------------------------------------------------------------------------------------------

    def _owner_of(self, user: str) -> Owner:
        """The user with the groups of one of their kernels (without kernels: no groups known)."""
        for kernel_id in self._kernels.get(("user", user), ()):
            owner = self.model.kernels[kernel_id].owner
            if owner is not None:
                return owner
        return Owner(user)

    def usage(self, now: float) -> tuple[AccountUsage, ...]:
        """Every account with kernels or usage, users first, by name."""
        known = set(self._kernels) | {(r.kind, r.name) for r in self.ledger.records()}
        out = []
        for kind, name in sorted(known, key=lambda a: (a[0] != "user", a[1])):
            account = (kind, name)
            if kind == "user":
                owner = self._owner_of(name)
                limits = {n: self.quotas.resolve(owner, n) for n in ("gpus", "kernels", *_HOURS)}
            else:
                quota = self.quotas.groups.get(name)
                limits = {
                    n: value
                    for n in ("gpus", "kernels", *_HOURS)
                    if quota is not None and (value := quota.total.get(n)) is not None
                }
            out.append(
                AccountUsage(
                    kind,
                    name,
                    self.in_use(account),
                    len(self._kernels.get(account, ())),
                    round(self.spent(account, "day", now) / 3600.0, 4),
                    round(self.spent(account, "week", now) / 3600.0, 4),
                    round(self.decayed(account, now) / 3600.0, 4),
                    {n: v for n, v in limits.items() if not math.isinf(v)},
                )
            )
        return tuple(out)


_HOURS = ("gpu_hours_per_day", "gpu_hours_per_week")
