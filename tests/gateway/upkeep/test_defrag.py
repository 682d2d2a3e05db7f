"""The gateway's etcd maintenance on a real 3-member etcd with auth on: members whose database file is mostly
free space are defragmented (the leader last), and an etcd that filled its quota takes writes again by itself."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from jupyter_notebookos.coordination import Coordinator
from jupyter_notebookos.coordination.auth import ensure_auth_enabled
from jupyter_notebookos.coordination.client import EtcdCredentials
from jupyter_notebookos.coordination.errors import EtcdFull
from jupyter_notebookos.embedded.etcd import EtcdBinaryMissing, EtcdCluster, find_etcd_binary
from jupyter_notebookos.gateway.upkeep.defrag import MIB, EtcdMaintenance

QUOTA = 24 * MIB
VALUE = b"x" * (MIB - 4096)  # under etcd's 1.5 MiB request limit


@pytest_asyncio.fixture
async def root(tmp_path: Path) -> AsyncIterator[tuple[EtcdCluster, Coordinator, EtcdCredentials]]:
    try:
        find_etcd_binary()
    except EtcdBinaryMissing as exc:
        pytest.skip(str(exc))
    cluster = EtcdCluster(tmp_path / "etcd", 3, quota_backend_bytes=QUOTA).start()
    credentials = EtcdCredentials("root", secrets.token_urlsafe(16))
    try:
        plain = await Coordinator.connect(cluster.endpoints, timeout=5.0)
        await ensure_auth_enabled(plain, credentials)
        await plain.close()
        coordinator = await Coordinator.connect(cluster.endpoints, timeout=10.0, credentials=credentials)
        try:
            yield cluster, coordinator, credentials
        finally:
            await coordinator.close()
    finally:
        cluster.stop()


def maintenance(coordinator: Coordinator, credentials: EtcdCredentials) -> EtcdMaintenance:
    async def connect(url: str) -> Coordinator:
        return await Coordinator.connect([url], timeout=10.0, credentials=credentials)

    return EtcdMaintenance(coordinator, connect, min_free_bytes=2 * MIB, min_free_fraction=0.5)


async def wait_until_fragmented(cluster: EtcdCluster, credentials: EtcdCredentials) -> None:
    """Until every member counts most of its file as free (bbolt frees a compacted page a commit or two later)."""
    deadline = time.monotonic() + 30
    for endpoint in cluster.endpoints:
        member = await Coordinator.connect([endpoint], timeout=10.0, credentials=credentials)
        try:
            while (status := await member.status())["db_size_in_use"] * 2 > status["db_size"]:
                assert time.monotonic() < deadline, f"{endpoint} did not free its compacted pages: {status}"
                await member.put("/notebook/tick", b"t")  # a commit, which frees the pages
                await asyncio.sleep(0.3)
        finally:
            await member.close()


@pytest.mark.asyncio
async def test_fragmented_members_are_defragmented_leader_last_and_a_full_etcd_recovers(root) -> None:  # type: ignore[no-untyped-def]
    cluster, co, credentials = root
    maintainer = maintenance(co, credentials)

    # Small databases are left alone.
    first = await maintainer.run_round()
    assert not first.acted and len(first.members) == 3 and "no action" in str(first), first

    # 8 MiB of history on one key, compacted away: the files keep their size, little of them is live.
    for _ in range(8):
        revision = await co.put("/notebook/big", VALUE)
    await co.compact(revision, physical=True)
    await wait_until_fragmented(cluster, credentials)
    fragmented = await maintainer.run_round()
    assert [name for name, _, _ in fragmented.defragmented] and len(fragmented.defragmented) == 3, fragmented
    leader = next(m.name for m in fragmented.members if m.leader)
    assert fragmented.defragmented[-1][0] == leader, f"the leader {leader} must go last: {fragmented}"
    for name, before, after in fragmented.defragmented:
        assert after < before / 2, f"{name}: {before} -> {after}"
    assert "defragmented" in str(fragmented)
    assert not (await maintainer.run_round()).acted  # nothing left to give back

    # Fill etcd to its quota: writes are refused with a clear error, reads still work.
    with pytest.raises(EtcdFull, match="is full"):
        for _ in range(2 * QUOTA // MIB):
            await co.put("/notebook/big", VALUE)
    assert await co.get("/notebook/big") is not None
    assert {kind for _, kind in await co.alarms()} == {"NOSPACE"}

    recovered = await maintainer.run_round()
    assert recovered.compacted_at is not None and recovered.disarmed >= 1, recovered
    assert len(recovered.defragmented) == 3 and "writes accepted again" in str(recovered)
    assert await co.alarms() == []
    await co.put("/notebook/after", b"written again")
    assert (await co.get("/notebook/after")).value == b"written again"  # type: ignore[union-attr]
