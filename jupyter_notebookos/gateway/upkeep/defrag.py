"""etcd kept small: its members defragmented when much of their database file is free space, and a full etcd
(the NOSPACE alarm) brought back by itself.

etcd's auto-compaction (embedded mode and the chart turn it on) drops old revisions, but the space they held stays
in the database file until the member is defragmented; the file counts against the backend quota, so a busy
platform would end at "database space exceeded" although little of it is live data. One maintainer per gateway
(it holds etcd's root identity, which defragmentation needs) checks every member each ``interval`` and
defragments, one member at a time and the leader last (a member answers nothing while it defragments), those
whose file is at least ``min_free_fraction`` free space and at least ``min_free_bytes`` of it. When etcd raised
its NOSPACE alarm it compacts at once, defragments every member and clears the alarm, so writes resume without an
operator. A round returns an :class:`EtcdMaintenanceRound` that logs as one line.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from traitlets import Float, Integer
from traitlets.config import LoggingConfigurable

from jupyter_notebookos.coordination.client import Coordinator, EtcdMemberInfo
from jupyter_notebookos.coordination.errors import CoordinationError
from jupyter_notebookos.gateway.upkeep.rounds import PeriodicRounds, RoundOutcome

log = logging.getLogger(__name__)

MIB = 1024 * 1024


@dataclass
class MemberSize:
    """One member's database file: its size and the part of it live data uses."""

    name: str
    db_size: int
    in_use: int
    leader: bool = False

    @property
    def free(self) -> int:
        return max(self.db_size - self.in_use, 0)

    @property
    def free_fraction(self) -> float:
        return self.free / self.db_size if self.db_size else 0.0


@dataclass
class EtcdMaintenanceRound:
    """What one round found and did."""

    members: list[MemberSize] = field(default_factory=list)
    defragmented: list[tuple[str, int, int]] = field(default_factory=list)  # (member, bytes before, after)
    unreachable: list[str] = field(default_factory=list)  # members that did not answer (skipped this round)
    compacted_at: int | None = None  # revision compacted at because etcd was full
    disarmed: int = 0  # NOSPACE alarms cleared

    @property
    def acted(self) -> bool:
        return bool(self.defragmented or self.disarmed or self.compacted_at is not None)

    def __str__(self) -> str:
        parts = []
        if self.compacted_at is not None:
            parts.append(f"etcd was full: compacted at revision {self.compacted_at}")
        for name, before, after in self.defragmented:
            parts.append(f"defragmented {name} {before / MIB:.1f} -> {after / MIB:.1f} MiB")
        if self.disarmed:
            parts.append(f"cleared {self.disarmed} NOSPACE alarm(s): writes accepted again")
        if self.unreachable:
            parts.append(f"could not reach {', '.join(self.unreachable)}")
        if not self.acted:
            largest = max(self.members, key=lambda m: m.db_size, default=None)
            if largest is None:
                parts.insert(0, "no member answered")
            else:
                parts.insert(
                    0,
                    f"no action: largest database {largest.name} {largest.db_size / MIB:.1f} MiB, "
                    f"{largest.free_fraction:.0%} free",
                )
        return "etcd maintenance: " + "; ".join(parts)


#: Connects to one etcd member (its client URL), with the identity and TLS of the gateway.
MemberConnector = Callable[[str], Awaitable[Coordinator]]


class EtcdMaintenance(PeriodicRounds, LoggingConfigurable):
    """Defragments etcd's members when their database file is mostly free space, and recovers a full etcd."""

    interval = Float(
        600.0,
        config=True,
        help="Seconds between two checks of etcd's members (database size, free space, NOSPACE alarm). 0: off.",
    )
    min_free_fraction = Float(
        0.5,
        config=True,
        help="Defragment a member when at least this fraction of its database file is free space ...",
    )
    min_free_bytes = Integer(
        64 * MIB,
        config=True,
        help="... and at least this many bytes of it (small files are not worth a pause of the member).",
    )
    activity = "etcd maintenance"

    defragment_timeout = Float(
        120.0,
        config=True,
        help="Seconds one member's defragmentation may take (it copies the live data into a new file).",
    )

    def __init__(
        self, coordinator: Coordinator | None = None, connect_member: MemberConnector | None = None, **kwargs: object
    ) -> None:
        """``coordinator``: the gateway's (etcd root) connection; ``connect_member``: opens one to a single member.
        Both are needed to run rounds; without them the object only carries its configuration."""
        super().__init__(**kwargs)
        self.coordinator = coordinator
        self.connect_member = connect_member

    def worth_telling(self, outcome: RoundOutcome) -> bool:
        """A member that did not answer is worth a warning even when nothing was done."""
        return outcome.acted or (isinstance(outcome, EtcdMaintenanceRound) and bool(outcome.unreachable))

    def wants_defragment(self, member: MemberSize) -> bool:
        """Whether ``member``'s file holds enough free space to be worth defragmenting."""
        return member.free >= self.min_free_bytes and member.free_fraction >= self.min_free_fraction

    async def run_round(self) -> EtcdMaintenanceRound:
        """Check every member once; defragment those that need it (the leader last); recover from NOSPACE."""
        outcome = EtcdMaintenanceRound()
        co = self.coordinator
        if co is None or self.connect_member is None:
            raise RuntimeError("EtcdMaintenance needs the gateway's etcd connection to run")
        nospace = [(member, kind) for member, kind in await co.alarms() if kind == "NOSPACE"]
        if nospace:
            # A full etcd takes reads, deletes and compactions only: drop the history now (auto-compaction may be
            # minutes away), so that defragmentation has something to give back.
            revision = (await co.status())["revision"]
            with contextlib.suppress(CoordinationError):  # already compacted there: nothing to drop
                await co.compact(revision, physical=True)
            outcome.compacted_at = revision
        connections: list[tuple[EtcdMemberInfo, Coordinator, MemberSize]] = []
        try:
            for info in await co.members():
                member = await self._open(info, outcome)
                if member is not None:
                    connections.append(member)
            # Followers first: a defragmenting leader stalls every write, a follower only its own clients.
            connections.sort(key=lambda c: c[2].leader)
            for info, member_co, size in connections:
                if not nospace and not self.wants_defragment(size):
                    continue
                try:
                    await member_co.defragment(timeout=self.defragment_timeout)
                    after = await member_co.status()
                except CoordinationError as err:
                    log.warning("etcd maintenance: defragmenting %s failed: %s", info.name, err)
                    outcome.unreachable.append(info.name)
                    continue
                outcome.defragmented.append((info.name, size.db_size, after["db_size"]))
        finally:
            for _, member_co, _ in connections:
                await member_co.close()
        if nospace and not outcome.unreachable:
            for member_id, kind in nospace:
                await co.disarm(member_id, kind)
                outcome.disarmed += 1
        return outcome

    async def _open(
        self, info: EtcdMemberInfo, outcome: EtcdMaintenanceRound
    ) -> tuple[EtcdMemberInfo, Coordinator, MemberSize] | None:
        """A connection to one member and its database size, or None (recorded) when it does not answer."""
        name = info.name or f"{info.member_id:x}"
        if not info.client_urls:
            outcome.unreachable.append(name)
            return None
        assert self.connect_member is not None
        try:
            member_co = await self.connect_member(info.client_urls[0])
        except CoordinationError:
            outcome.unreachable.append(name)
            return None
        try:
            status = await member_co.status()
        except CoordinationError:
            await member_co.close()
            outcome.unreachable.append(name)
            return None
        size = MemberSize(name, status["db_size"], status["db_size_in_use"], status["leader"] == info.member_id)
        outcome.members.append(size)
        return info, member_co, size
