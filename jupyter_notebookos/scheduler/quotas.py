"""Quotas: who owns a kernel, what each user and group may use, and why a cell waits or is refused.

A kernel's :class:`Owner` (its user and the user's groups, from the identity that started it) is given at
``start_kernel``. The deployer's :class:`Quotas` hold limits (:class:`Limits`) for everyone (``default``), per
user and per group, on four things: GPUs in use at once, kernels, and GPU-hours per day and per week.

Which limits apply to a user:

* **The user's own limits**, field by field: the user's entry where it sets the field; else the **most generous**
  ``per_member`` value of the user's groups (joining a group never takes anything away); else the default; else
  unlimited. The fair-share ``weight`` resolves the same way (default 1).
* **Every group's total** on top: a group's top-level limits bound its members together (like a Kubernetes
  ResourceQuota on a namespace, or Slurm's GrpTRES), and a user in several groups counts against each of them,
  so the tightest one binds.

A limit set to ``"unlimited"`` lifts a default for that user or group; ``null`` or absent means "not set here".

The config form (a traitlet ``c.Scheduler.quotas``, a JSON document in etcd, ``--quotas FILE`` of the simulator)::

    {"default": {"gpus": 4, "kernels": 8, "gpu_hours_per_day": 24},
     "users": {"alice": {"gpus": 6}, "carol": {"gpus": "unlimited"}},
     "groups": {"ml": {"gpus": 16, "weight": 2, "per_member": {"gpus": 8}}}}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

#: The limits a quota may set, in the order they are checked.
LIMITS = ("gpus", "kernels", "gpu_hours_per_day", "gpu_hours_per_week")
UNLIMITED = math.inf


@dataclass(frozen=True, slots=True)
class Owner:
    """Who a kernel belongs to: its user and the user's groups (JupyterHub's, or the token file's)."""

    user: str
    groups: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.user


@dataclass(frozen=True, slots=True)
class Limits:
    """Limits of one user, one group or everyone; ``None``: not set here, ``math.inf``: unlimited.

    ``gpus``: GPUs held at once by running cells; ``kernels``: kernels at once; ``gpu_hours_per_day`` and
    ``gpu_hours_per_week``: GPU-hours of cells run in the current day and week (see ``usage``). ``weight`` is
    not a limit: the user's fair-share weight (a user with weight 2 may use twice the GPU-seconds of one with
    weight 1 for the same priority).
    """

    gpus: float | None = None
    kernels: float | None = None
    gpu_hours_per_day: float | None = None
    gpu_hours_per_week: float | None = None
    weight: float | None = None

    def get(self, name: str) -> float | None:
        """One field by name."""
        value: float | None = getattr(self, name)
        return value

    @property
    def empty(self) -> bool:
        """Whether no field is set."""
        return all(getattr(self, f.name) is None for f in fields(self))

    @staticmethod
    def from_config(value: Mapping[str, Any] | None, where: str, allowed: tuple[str, ...] = ()) -> Limits:
        """Read limits from a config mapping; ``where`` names it in errors, ``allowed`` are other keys the
        caller reads itself."""
        if value is None:
            return Limits()
        if not isinstance(value, Mapping):
            raise ValueError(f"quotas: {where} must be a mapping of limits, got {value!r}")
        known = {f.name for f in fields(Limits)}
        unknown = sorted(set(value) - known - set(allowed))
        if unknown:
            raise ValueError(
                f"quotas: {where} has unknown keys {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        read: dict[str, float | None] = {}
        for name in known:
            raw = value.get(name)
            read[name] = None if raw is None else _number(raw, f"{where}.{name}", name == "weight")
        return Limits(**read)

    def to_config(self) -> dict[str, Any]:
        """The config mapping of these limits (unset fields left out)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = "unlimited" if math.isinf(value) else value
        return out


def _number(raw: Any, where: str, positive: bool) -> float:
    if isinstance(raw, str) and raw.strip().lower() == "unlimited":
        if positive:
            raise ValueError(f"quotas: {where} must be a number > 0, got 'unlimited'")
        return UNLIMITED
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ValueError(f"quotas: {where} must be a number or 'unlimited', got {raw!r}")
    value = float(raw)
    if math.isnan(value) or value < 0 or (positive and value <= 0):
        raise ValueError(f"quotas: {where} must be {'> 0' if positive else '>= 0'}, got {raw!r}")
    return value


@dataclass(frozen=True, slots=True)
class GroupQuota:
    """A group's limits: ``total`` for its members together, ``per_member`` for each member (see the module)."""

    total: Limits = Limits()
    per_member: Limits = Limits()


@dataclass(frozen=True)
class Quotas:
    """Every quota: the default for everyone, per user, per group. Empty: nothing is limited."""

    default: Limits = Limits()
    users: Mapping[str, Limits] = field(default_factory=dict)
    groups: Mapping[str, GroupQuota] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """Whether no limit or weight is set anywhere."""
        return (
            self.default.empty
            and all(q.empty for q in self.users.values())
            and all(g.total.empty and g.per_member.empty for g in self.groups.values())
        )

    def resolve(self, owner: Owner, name: str) -> float:
        """One of the user's own limits (or ``weight``), resolved as the module says."""
        own = self.users.get(owner.user)
        mine = own.get(name) if own is not None else None
        if mine is not None:
            return mine
        from_groups = [
            value
            for g in owner.groups
            if g in self.groups and (value := self.groups[g].per_member.get(name)) is not None
        ]
        if from_groups:
            return max(from_groups)
        value = self.default.get(name)
        if value is not None:
            return value
        return 1.0 if name == "weight" else UNLIMITED

    def weight(self, owner: Owner | None) -> float:
        """The owner's fair-share weight (1 without one)."""
        return 1.0 if owner is None else self.resolve(owner, "weight")

    def group_totals(self, owner: Owner, name: str) -> list[tuple[str, float]]:
        """The totals of the owner's groups that set limit ``name``: (group, limit)."""
        out = []
        for g in owner.groups:
            quota = self.groups.get(g)
            value = quota.total.get(name) if quota is not None else None
            if value is not None and not math.isinf(value):
                out.append((g, value))
        return out

    @staticmethod
    def from_config(value: Mapping[str, Any] | None) -> Quotas:
        """Read the config form (see the module); raises ``ValueError`` naming the bad entry."""
        if not value:
            return Quotas()
        if not isinstance(value, Mapping):
            raise ValueError(f"quotas must be a mapping with default, users and groups, got {value!r}")
        unknown = sorted(set(value) - {"default", "users", "groups"})
        if unknown:
            raise ValueError(f"quotas: unknown keys {', '.join(unknown)}; known: default, users, groups")
        users = _entries(value.get("users"), "users")
        groups = _entries(value.get("groups"), "groups")
        read_groups = {}
        for name, entry in groups.items():
            where = f"groups.{name}"
            total = Limits.from_config(entry, where, allowed=("per_member",))
            per_member = Limits.from_config(entry.get("per_member"), f"{where}.per_member")
            if total.weight is not None:  # a group's weight is its members' weight
                per_member = Limits(**{**_as_dict(per_member), "weight": per_member.weight or total.weight})
                total = Limits(**{**_as_dict(total), "weight": None})
            read_groups[name] = GroupQuota(total, per_member)
        return Quotas(
            Limits.from_config(value.get("default"), "default"),
            {name: Limits.from_config(entry, f"users.{name}") for name, entry in users.items()},
            read_groups,
        )

    def changes(self, new: Quotas) -> tuple[str, ...]:
        """What differs from these quotas in ``new``, one readable item per entry (``users.alice: gpus 4 -> 6``)."""
        before, after = self.to_config(), new.to_config()
        out: list[str] = []
        for section in ("default", "users", "groups"):
            old_entries, new_entries = before[section], after[section]
            if section == "default":
                old_entries, new_entries = {"": old_entries}, {"": new_entries}
            for name in sorted(set(old_entries) | set(new_entries)):
                old, cur = old_entries.get(name, {}), new_entries.get(name, {})
                diff = [
                    f"{k} {old.get(k, 'unset')} -> {cur.get(k, 'unset')}"
                    for k in sorted(set(old) | set(cur))
                    if old.get(k) != cur.get(k)
                ]
                if diff:
                    out.append(f"{section}{'.' + name if name else ''}: {', '.join(diff)}")
        return tuple(out)

    def to_config(self) -> dict[str, Any]:
        """The config form of these quotas (what ``from_config`` reads back)."""
        groups: dict[str, Any] = {}
        for name, quota in sorted(self.groups.items()):
            entry = quota.total.to_config()
            member = quota.per_member.to_config()
            if member:
                entry["per_member"] = member
            groups[name] = entry
        return {
            "default": self.default.to_config(),
            "users": {name: limits.to_config() for name, limits in sorted(self.users.items())},
            "groups": groups,
        }


def _entries(value: Any, where: str) -> dict[str, Mapping[str, Any]]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and k for k in value):
        raise ValueError(f"quotas: {where} must map names to limits, got {value!r}")
    return dict(value)


def _as_dict(limits: Limits) -> dict[str, float | None]:
    return {f.name: getattr(limits, f.name) for f in fields(limits)}


# --- why a cell waits or is refused ---------------------------------------------------------------------


def _amount(limit: str, value: float) -> str:
    if limit == "gpus":
        return f"{value:g} GPU" if value == 1 else f"{value:g} GPUs"
    if limit == "kernels":
        return f"{value:g} kernel" if value == 1 else f"{value:g} kernels"
    return f"{value:.1f} GPU-hours"


@dataclass(frozen=True, slots=True)
class QuotaWait:
    """A cell waits because a GPU limit is reached; it clears when the user's (or group's) cells end.

    ``limit`` is ``"gpus"``; ``used`` and ``allowed`` the numbers (``as_tuple()`` gives ``("gpus", used,
    allowed)``); ``group`` the group whose total binds, or None for the user's own limit.
    """

    limit: str
    used: float
    allowed: float
    asked: int
    group: str | None = None

    def as_tuple(self) -> tuple[str, float, float]:
        """``(limit, used, allowed)``, e.g. ``("gpus", 4, 4)``."""
        return (self.limit, self.used, self.allowed)

    def __str__(self) -> str:
        whose = f"your group {self.group} is using" if self.group else "you are using"
        of = "its" if self.group else "your"
        text = f"{whose} {self.used:g} of {of} {_amount(self.limit, self.allowed)}"
        if self.used + self.asked > self.allowed and self.used < self.allowed:
            text += f" and this cell asks for {_amount(self.limit, self.asked)}"
        return text


@dataclass(frozen=True, slots=True)
class QuotaExceeded:
    """A limit that waiting cannot clear: GPU-hours spent (until ``resets_at``, in the scheduler's time), a cell
    larger than the GPU limit itself, or the kernel limit at kernel start."""

    limit: str
    used: float
    allowed: float
    asked: float
    group: str | None = None
    resets_at: float | None = None
    resets_in_s: float | None = None

    def __str__(self) -> str:
        whose = f"your group {self.group}" if self.group else "you"
        of = "its" if self.group else "your"
        if self.limit == "kernels":
            has = "has" if self.group else "have"
            return f"{whose} {has} {_amount('kernels', self.used)} of {of} {self.allowed:g}; stop one to start another"
        if self.limit == "gpus":
            quota = f"your group {self.group}'s quota" if self.group else "your quota"
            return (
                f"this kernel asks for {_amount('gpus', self.asked)} per cell but {quota} allows "
                f"{_amount('gpus', self.allowed)} at once"
            )
        period = "day" if self.limit == "gpu_hours_per_day" else "week"
        has = "has used" if self.group else "have used"
        reset = ""
        if self.resets_in_s is not None:
            reset = f"; the limit resets in {_duration(self.resets_in_s)}"
        return f"{whose} {has} {self.used:.1f} of {of} {self.allowed:g} GPU-hours this {period}{reset}"


def _duration(seconds: float) -> str:
    minutes = max(1, math.ceil(seconds / 60.0))
    days, rest = divmod(minutes, 1440)
    hours, mins = divmod(rest, 60)
    parts = [f"{days} d"] if days else []
    if hours:
        parts.append(f"{hours} h")
    if mins or not parts:
        parts.append(f"{mins} min")
    return " ".join(parts)
