"""What an operator sees, end to end on one platform (real etcd, gateway, kernels): the metric names of
/metrics, the Grafana dashboard's queries against them, the dashboard page's access rules, the events
timeline, and the CLI (status, one kernel, --watch, migrate, and its one-line errors)."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import secrets
import select
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from support import NOTEBOOKOS, REPO, Platform, free_port, kill_the_gateway, start_platform, stop_platform, wait_for

from jupyter_notebookos.cli import main
from jupyter_notebookos.client import GatewayClient

KERNEL = "python3-notebookos"
ALICE = "alice-" + secrets.token_hex(16)
METRICS = "metrics-" + secrets.token_hex(16)
GRAFANA = REPO / "helm" / "notebookos" / "dashboards" / "notebookos.json"
OBSERVABILITY_DOC = REPO / "docs" / "observability.md"


@pytest.fixture(scope="module")
def ops_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """4 hosts x 2 GPUs, a user (alice) in a token file and a metrics token."""
    home = tmp_path_factory.mktemp("ops")
    tokens = home / "tokens.json"
    tokens.write_text(json.dumps({ALICE: "alice"}))
    tokens.chmod(0o600)
    platform = start_platform(
        home / "state",
        "--hosts",
        "4",
        "--gpus-per-host",
        "2",
        "--gateway-option",
        f"NotebookOSGatewayApp.user_tokens_file={tokens}",
        "--gateway-option",
        f"NotebookOSGatewayApp.metrics_token={METRICS}",
        "--gateway-option",
        "ClusterHistory.interval=1",  # the dashboard's history: a sample every second
        "--gateway-option",
        "ClusterHistory.usage_write_interval=1",  # GPU-seconds per user written to etcd every second
    )
    try:
        yield platform
    finally:
        stop_platform(platform)


@pytest.fixture(scope="module")
def kernel(ops_up: Platform) -> Iterator[str]:
    """A NotebookOS kernel of the admin that ran one cell."""
    client = ops_up.client
    kernel_id = client.start_kernel(KERNEL)
    with client.connect(kernel_id) as conn:
        assert conn.execute("x = 41").status == "ok"
    try:
        yield kernel_id
    finally:
        client.shutdown_kernel(kernel_id)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the console script ``notebookos ARGS`` with no gateway in its environment unless ``env`` sets one."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_GATEWAY_", "NOTEBOOKOS_TOKEN"))}
    return subprocess.run(
        [*NOTEBOOKOS, *args], capture_output=True, text=True, timeout=120, cwd=REPO, env={**base, **(env or {})}
    )


@dataclass
class Run:
    """What one command printed, and its exit status."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def notebookos(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., Run]:
    """``notebookos ARGS`` in this process (the console script's own ``main``: cheaper than a new Python on a
    busy CI machine), with no gateway in the environment."""
    for name in ("JUPYTER_GATEWAY_URL", "JUPYTER_GATEWAY_AUTH_TOKEN", "NOTEBOOKOS_TOKEN"):
        monkeypatch.delenv(name, raising=False)

    def run(*args: str) -> Run:
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exit:  # --help, or argparse refusing an option
            code = int(exit.code or 0)
        out, err = capsys.readouterr()
        return Run(code, out, err)

    return run


def at(platform: Platform, token: str = "") -> list[str]:
    """The options that name ``platform``'s gateway (with the admin token unless another is given)."""
    return ["--url", platform.url, "--token", token or platform.token]


def scrape(platform: Platform) -> str:
    """/metrics as Prometheus reads it: with the metrics token as a bearer token."""
    response = requests.get(platform.url + "/metrics", headers={"Authorization": f"Bearer {METRICS}"}, timeout=30)
    assert response.status_code == 200
    return response.text


def exposed_names(text: str) -> dict[str, str]:
    """Every series name a scrape of ``text``'s families can hold (histograms: _bucket, _sum, _count), and its
    family's type; from the ``# TYPE`` lines, so a labelled metric with no series yet still counts."""
    names = {}
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE):
        suffixes = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
        names.update({name + suffix: kind for suffix in suffixes})
    return names


PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are neither functions, aggregation
    clauses, label names, range durations, nor operators."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges, $__rate_interval
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for match in re.finditer(r"(?<![\w$.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?", expr):
        if not match.group(2) and match.group(1) not in PROMQL_WORDS:
            names.add(match.group(1))
    return names


def grafana_queries(dashboard: dict[str, object]) -> list[str]:
    """Every PromQL expression of the dashboard, rows' nested panels included."""
    queries = []
    stack = list(dashboard["panels"])  # type: ignore[call-overload]
    while stack:
        panel = stack.pop()
        stack.extend(panel.get("panels", []))
        queries.extend(t["expr"] for t in panel.get("targets", []))
    return queries


def test_promql_name_extraction_sees_through_functions_labels_and_ranges() -> None:
    expr = 'histogram_quantile(0.95, sum by (le) (rate(a_bucket{state="x y"}[5m]))) / on(host) b_total offset 5m'
    assert promql_metric_names(expr) == {"a_bucket", "b_total"}


def test_metric_names_follow_prometheus_conventions_and_are_documented(ops_up: Platform, kernel: str) -> None:
    text = scrape(ops_up)
    families = {f.name: f.type for f in text_string_to_metric_families(text) if f.name.startswith("notebookos_")}
    assert len(families) >= 14
    exposed = exposed_names(text)
    for name, kind in exposed.items():
        if not name.startswith("notebookos_"):
            continue
        assert not re.search(r"milli|micro|_ms\b|minutes|hours|bytes_k", name), f"{name}: use base units"
        if kind == "counter":
            assert name.endswith("_total"), f"counter {name} must end in _total"
        else:
            assert not name.endswith("_total"), f"{kind} {name} must not end in _total"
    assert "notebookos_cell_queued_seconds_bucket" in exposed  # a cell ran: its delay is in seconds
    documented = set(re.findall(r"`(notebookos_\w+)`", OBSERVABILITY_DOC.read_text()))
    ours = {n for n in re.findall(r"^# TYPE (notebookos_\S+)", text, re.MULTILINE)}
    assert ours <= documented, f"not in docs/observability.md: {sorted(ours - documented)}"


def test_grafana_dashboard_queries_only_metrics_the_gateway_exposes(ops_up: Platform) -> None:
    dashboard = json.loads(GRAFANA.read_text())
    exposed = exposed_names(scrape(ops_up))
    queries = grafana_queries(dashboard)
    assert len(queries) >= 15
    read: set[str] = set()
    for expr in queries:
        names = promql_metric_names(expr)
        assert names, f"no metric in {expr!r}"
        assert names <= set(exposed), f"{expr!r} reads {sorted(names - set(exposed))}, which /metrics does not expose"
        read |= names
    # And every family of the gateway has a panel (a new metric belongs on the dashboard too).
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in exposed if n.startswith("notebookos_")}
    shown = {re.sub(r"_(bucket|sum|count)$", "", n) for n in read}
    assert families <= shown, f"no panel reads {sorted(families - shown)}"


def test_the_dashboard_page_is_the_admins(ops_up: Platform) -> None:
    page = ops_up.url + "/notebookos/"
    # A browser without the token gets a page that asks for it (not JSON), with the reason; the same for a user.
    refused = requests.get(page, timeout=30)
    assert refused.status_code == 401 and refused.headers["Content-Type"].startswith("text/html")
    assert "needs a token" in refused.text and 'type="password"' in refused.text
    assert (
        'src="/notebookos/static/login.js"' in refused.text
        and "script-src 'self'" in refused.headers["Content-Security-Policy"]
    )
    user = requests.get(page, headers={"Authorization": f"token {ALICE}"}, timeout=30)
    assert user.status_code == 403 and "for the gateway&#x27;s admin" in user.text and 'type="password"' in user.text
    assert "<script>" not in requests.get(f"{page}?token=<script>", timeout=30).text  # the reason is escaped
    assert requests.get(page, headers={"Authorization": f"Bearer {METRICS}"}, timeout=30).status_code == 403
    admin = requests.get(f"{page}?token={ops_up.token}", timeout=30)
    assert admin.status_code == 200 and admin.headers["Content-Type"].startswith("text/html")
    assert "script-src 'self'" in admin.headers["Content-Security-Policy"]
    assert 'src="/notebookos/static/dashboard.js"' in admin.text
    script = requests.get(ops_up.url + "/notebookos/static/dashboard.js", timeout=30)
    assert script.status_code == 200 and "api/notebookos/cluster" in script.text
    moved = requests.get(f"{ops_up.url}/notebookos?token=x", allow_redirects=False, timeout=30)
    assert moved.status_code in (301, 302) and moved.headers["Location"] == "/notebookos/?token=x"


def test_the_admins_actions_and_the_history_are_refused_to_users(ops_up: Platform, kernel: str) -> None:
    """Draining a host, putting it back and the cluster's history (every user's GPU-hours) are the admin's; a user
    may not migrate or delete the admin's kernel either. Each refusal is a 403 that says why, and changes nothing."""
    url = ops_up.url
    as_alice = {"Authorization": f"token {ALICE}"}
    for method, path, why in [
        ("POST", "/api/notebookos/hosts/host-0/drain", "draining a host"),
        ("POST", "/api/notebookos/hosts/host-0/undrain", "draining a host"),
        ("GET", "/api/notebookos/history", "history"),
        ("POST", f"/api/notebookos/kernels/{kernel}/replicas/0/migrate", "belongs to another user"),
        ("DELETE", f"/api/kernels/{kernel}", "belongs to another user"),
    ]:
        refused = requests.request(method, url + path, headers=as_alice, timeout=30)
        assert refused.status_code == 403 and why in refused.json()["message"], (path, refused.text)
        metrics_token = requests.request(method, url + path, headers={"Authorization": f"Bearer {METRICS}"}, timeout=30)
        assert metrics_token.status_code == 403, path
    cluster = ops_up.client.request("GET", "/api/notebookos/cluster")
    assert not any(h["draining"] for h in cluster["hosts"]) and kernel in [k["kernel_id"] for k in cluster["kernels"]]
    unknown = requests.post(f"{url}/api/notebookos/hosts/no-such-host/drain", headers=_admin(ops_up), timeout=30)
    assert unknown.status_code == 404 and "no host 'no-such-host' (hosts: host-0, host-1" in unknown.json()["message"]


def test_history_counts_a_users_gpu_hours_and_the_kernel_views_say_what_they_hold(ops_up: Platform) -> None:
    """alice runs a cell holding one GPU for about a second: the history counts it under her name today, the
    cluster view shows her kernel's notebook, idle time, replica memory and GPU-seconds, and the admin's
    history has samples with the committed GPU."""
    alice = GatewayClient(ops_up.url, ALICE)
    notebook = "/home/alice/project/train.ipynb"  # as JupyterLab sends it (GatewayClient.allowed_envs)
    kernel_id = alice.start_kernel(KERNEL, env={"JPY_SESSION_NAME": notebook})
    try:
        with alice.connect(kernel_id) as conn:
            assert conn.execute("import time; time.sleep(1.2)").status == "ok"
        admin = ops_up.client

        def alices_hours() -> float:
            days = admin.request("GET", "/api/notebookos/history")["gpu_hours_per_user_per_day"]
            return sum(d["gpu_hours"] for d in days if d["user"] == "alice")

        wait_for(lambda: alices_hours() * 3600 >= 1.1, 30, "alice's GPU-seconds in the history")
        history = admin.request("GET", "/api/notebookos/history")
        assert history["interval"] == 1.0 and history["capacity"] == 6 * 3600
        samples = history["samples"]
        assert any(s["gpus_committed"] >= 1 for s in samples) and all(s["gpus"] == 8 for s in samples)
        assert sum(s["gpu_seconds_by_user"].get("alice", 0.0) for s in samples) >= 1.1
        assert any(s["cells_started"] >= 1 and s["queue_wait_seconds"]["p50"] is not None for s in samples)
        later = admin.request("GET", f"/api/notebookos/history?since={samples[-1]['at']}")["samples"]
        assert all(s["at"] > samples[-1]["at"] for s in later)

        # alice sees her own kernel in full, the admin sees it too; neither view invents what it cannot know.
        mine = next(k for k in alice.request("GET", "/api/notebookos/cluster")["kernels"] if k["kernel_id"])
        assert mine["kernel_id"] == kernel_id and mine["notebook"] == notebook and mine["residency"] == "resident"
        assert mine["idle_seconds"] is not None and mine["gpu_seconds_total"] >= 1.1
        assert mine["memory_bytes"] > 3 * 10_000_000 and all(r["memory_bytes"] for r in mine["replicas"])
        hosts = admin.request("GET", "/api/notebookos/cluster")["hosts"]
        assert all(h["health"] == "ok" and h["shares_machine_memory"] for h in hosts)
        assert all("gpu_readings" not in h for h in hosts)  # simulated GPUs: no NVML readings, no invented ones
        assert sum(h["memory_bytes"] for h in hosts) >= mine["memory_bytes"]
        one = alice.notebookos_kernel(kernel_id)
        assert one["notebook"] == notebook and one["gpu_seconds_total"] >= 1.1
        others = alice.request("GET", "/api/notebookos/cluster")["kernels"]
        assert all("notebook" not in k and "memory_bytes" not in k for k in others if k["kernel_id"] is None)
    finally:
        alice.shutdown_kernel(kernel_id)


def _admin(platform: Platform) -> dict[str, str]:
    return {"Authorization": f"token {platform.token}"}


def test_migrate_from_the_cli_shows_in_status_and_in_the_timeline(
    ops_up: Platform, kernel: str, notebookos: Callable[..., Run]
) -> None:
    before = json.loads(notebookos("status", kernel, "--json", *at(ops_up)).stdout)
    moving = before["replicas"][0]
    taken = {r["host"] for r in before["replicas"]}
    (free,) = {f"host-{i}" for i in range(4)} - taken
    moved = notebookos("migrate", kernel[:8], moving["replica_id"], "--host", free, *at(ops_up))
    assert moved.returncode == 0, moved.stderr
    assert f"moved from {moving['host']} to {free}" in moved.stdout

    shown = notebookos("status", kernel[:8], *at(ops_up))
    assert shown.returncode == 0, shown.stderr
    assert free in shown.stdout and moving["host"] not in shown.stdout
    assert "GPU-seconds:" in shown.stdout and "a reservation would have held" in shown.stdout

    events = ops_up.client.request("GET", "/api/notebookos/events")["events"]
    migration = [e for e in events if e["kind"] == "migration"]
    assert [e["action"] for e in migration] == ["started", "ok"]
    assert all(e["kernel_id"] == kernel and e["target"] == free and e["reason"] == "request" for e in migration)
    assert all(e["replica_id"] == moving["replica_id"] for e in migration)  # the id the REST API and CLI use
    # Another user sees that a replica moved, not whose kernel it was.
    theirs = requests.get(
        ops_up.url + "/api/notebookos/events?since=0", headers={"Authorization": f"token {ALICE}"}, timeout=30
    ).json()["events"]
    assert [e["action"] for e in theirs if e["kind"] == "migration"] == ["started", "ok"]
    assert all(e["kernel_id"] is None and kernel not in json.dumps(e) for e in theirs)
    newer = ops_up.client.request("GET", f"/api/notebookos/events?since={events[-1]['seq']}")
    assert newer == {"events": [], "last": events[-1]["seq"]}


def test_status_finds_the_gateway_as_jupyter_servers_do(
    ops_up: Platform,
    kernel: str,
    tmp_path: Path,
    notebookos: Callable[..., Run],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {"JUPYTER_GATEWAY_URL": ops_up.url, "JUPYTER_GATEWAY_AUTH_TOKEN": ops_up.token}
    shown = cli("status", "--state-dir", str(tmp_path), env=env)  # the console script itself, once
    assert shown.returncode == 0, shown.stderr
    assert kernel in shown.stdout and "host-3" in shown.stdout
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cluster = json.loads(notebookos("status", "--json").stdout)
    assert cluster["totals"]["kernels"] == 1 and cluster["totals"]["hosts"] == 4
    # The URL from the environment wins over the state dir's, whose admin token is never sent elsewhere.
    monkeypatch.delenv("JUPYTER_GATEWAY_AUTH_TOKEN")
    refused = notebookos("status")
    assert refused.returncode == 1 and "HTTP 401" in refused.stderr and "JUPYTER_GATEWAY_AUTH_TOKEN" in refused.stderr


def test_watch_redraws_until_ctrl_c(ops_up: Platform) -> None:
    primary, secondary = pty.openpty()  # a terminal: rich redraws in place
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER_GATEWAY_")}
    watcher = subprocess.Popen(
        [*NOTEBOOKOS, "status", "--watch", "--interval", "0.3", *at(ops_up)],
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        cwd=REPO,
        env={**env, "TERM": "xterm", "COLUMNS": "120"},
    )
    os.close(secondary)
    screen = b""
    deadline = time.monotonic() + 30
    try:
        while screen.count(b"Hosts") < 3 and time.monotonic() < deadline:
            if select.select([primary], [], [], 0.5)[0]:
                screen += os.read(primary, 65536)
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(30) == 0
    finally:
        if watcher.poll() is None:
            watcher.kill()
        os.close(primary)
    assert screen.count(b"Hosts") >= 3, screen[-2000:]
    assert b"Traceback" not in screen


def test_watch_piped_prints_each_redraw_and_stops_on_sigterm(ops_up: Platform) -> None:
    """`notebookos status --watch | tee log`, stopped as a service manager stops it: every redraw is in the log."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER_GATEWAY_")}
    watcher = subprocess.Popen(
        [*NOTEBOOKOS, "status", "--watch", "--interval", "0.3", *at(ops_up)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env=env,
    )
    try:
        assert watcher.stdout is not None
        # Each redraw reaches the pipe as it is drawn, not when the watch ends.
        ready = select.select([watcher.stdout], [], [], 30)[0]
        first = os.read(watcher.stdout.fileno(), 65536) if ready else b""
        time.sleep(1.0)
        watcher.send_signal(signal.SIGTERM)
        out, err = watcher.communicate(timeout=30)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert first, "nothing reached the pipe before SIGTERM"
    text = first.decode() + out.decode()
    assert watcher.returncode == 0, (watcher.returncode, err)
    assert text.count("Hosts") >= 2 and "host-3" in text, text[-2000:]
    assert b"Traceback" not in err


def _a_cluster(kernels: int) -> dict[str, object]:
    """The body of GET /api/notebookos/cluster with ``kernels`` NotebookOS kernels of alice, one cell queued."""
    ids = [f"{n:08x}-5a1e-4c3b-9d2e-{n:012x}" for n in range(1, kernels + 1)]
    hosts = [
        {"name": f"host-{i}", "gpus": 8, "gpus_committed": 1, "gpus_pending": 3, "replicas": 3, "simulated": True}
        for i in range(4)
    ]
    replicas = [{"replica_id": str(r), "host": f"host-{r}", "state": "ready"} for r in range(3)]
    return {
        "hosts": hosts,
        "subscription_ratio": 6.0,
        "totals": {"subscription_ratio": 0.25},
        "kernels": [
            {
                "kernel_id": k,
                "owner": "alice",
                "replicas": replicas,
                "executor": "1",
                "gpus": 1,
                "state": "running",
                "cells": 12,
            }
            for k in ids
        ],
        "queue": [{"kernel_id": ids[0], "cell_id": "c" * 32, "gpus": 1, "waiting_ms": 1500.0}],
        "migrations": [],
    }


@pytest.mark.parametrize("columns", [80, 90, 100, 110, 120, 200])
def test_status_tables_fit_the_terminal_without_cutting_a_column(columns: int) -> None:
    """At 80 columns every header and value shows whole; kernel ids that do not fit are shortened to unique starts
    (which `notebookos status KERNEL` takes), never the other columns."""
    import io

    from rich.console import Console

    from jupyter_notebookos.statusview import cluster_view

    cluster = _a_cluster(2)
    screen = io.StringIO()
    console = Console(file=screen, width=columns, color_system=None)
    console.print(cluster_view(cluster, columns))
    text = screen.getvalue()
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= columns, text
    for word in ("owner", "replicas", "executor", "GPUs/cell", "state", "cells", "alice", "running", "2@host-2"):
        assert word in text, (word, text)
    ids = [k["kernel_id"] for k in cluster["kernels"]]  # type: ignore[index]
    whole = all(k in text for k in ids)
    assert whole or (all(k[:8] in text for k in ids) and "`notebookos status <id>`" in text), text
    assert whole == (columns >= 120) or 80 < columns < 120, (columns, text)


ADMIN = ["--url", "{url}", "--token", "{token}"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["status", "no-such-kernel", *ADMIN], "no NotebookOS kernel 'no-such-kernel'"),
        (["migrate", "{kernel}", "9", *ADMIN], "HTTP 404: kernel {kernel} has no replica 9"),
        (["migrate", "{kernel}", "{replica}", "--host", "host-99", *ADMIN], "HTTP 404: no host 'host-99'"),
        (["status", "--url", "{url}", "--token", "not-a-token-of-this-gateway"], "HTTP 401: unknown token"),
        (["status", "{kernel}", "--url", "{url}", "--token", ALICE], "HTTP 403: kernel {kernel} belongs to another"),
        (["status", "--url", "{url}", "--token", METRICS], "HTTP 403: the metrics token reads /metrics only"),
        (["status", "--url", "http://127.0.0.1:{port}"], "cannot reach the gateway at http://127.0.0.1:{port}"),
        (["status", "--url", "127.0.0.1:8888"], "is not a gateway URL"),
        (["down", "--state-dir", "/nonexistent-state"], "no running `notebookos up` in /nonexistent-state"),
    ],
)
def test_wrong_input_gets_one_clear_line_and_exit_1(
    ops_up: Platform, kernel: str, notebookos: Callable[..., Run], args: list[str], expected: str
) -> None:
    replica = ops_up.client.notebookos_kernel(kernel)["replicas"][0]["replica_id"]
    fill = {"kernel": kernel, "replica": replica, "port": str(free_port()), "url": ops_up.url, "token": ops_up.token}
    result = notebookos(*(a.format(**fill) for a in args))
    assert result.returncode == 1, result
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"notebookos {args[0]}: "), result.stderr
    assert expected.format(**fill) in result.stderr
    assert "Traceback" not in result.stderr


def test_help_shows_the_defaults(notebookos: Callable[..., Run]) -> None:
    status = notebookos("status", "--help").stdout
    assert "(default: 2.0)" in status and "$JUPYTER_GATEWAY_URL" in status and "$JUPYTER_GATEWAY_AUTH_TOKEN" in status
    assert "(default: .state)" in status
    up = notebookos("up", "--help").stdout
    assert "(default: 4)" in up and "(default: 8888)" in up
    assert "--host" in notebookos("migrate", "--help").stdout
    both = notebookos("status", "--json", "--watch")
    assert both.returncode == 2 and "--json and --watch do not go together" in both.stderr


def test_gpu_seconds_and_the_notebook_survive_a_gateway_restart(ops_up: Platform) -> None:
    """Last in this module: it kills the gateway (`notebookos up` starts another, which re-attaches the kernels).
    A user's GPU-hours per day and their kernel's GPU-seconds were in etcd; the new gateway's routers count from 0,
    and the views add what the previous one wrote. The notebook's path comes back with the kernel's session."""
    alice = GatewayClient(ops_up.url, ALICE)
    notebook = "/home/alice/project/restart.ipynb"
    kernel_id = alice.start_kernel(KERNEL, env={"JPY_SESSION_NAME": notebook})
    try:
        with alice.connect(kernel_id) as conn:
            assert conn.execute("import time; time.sleep(1.5)").status == "ok"
        admin = ops_up.client

        def totals() -> tuple[float, float]:
            days = admin.request("GET", "/api/notebookos/history")["gpu_hours_per_user_per_day"]
            return sum(d["gpu_hours"] for d in days if d["user"] == "alice") * 3600, admin.notebookos_kernel(kernel_id)[
                "gpu_seconds_total"
            ]

        def at_least(seconds: float) -> Callable[[], tuple[float, float] | None]:
            def check() -> tuple[float, float] | None:
                now = totals()
                return now if min(now) >= seconds else None

            return check

        before = wait_for(at_least(1.4), 30, "alice's GPU-seconds counted")
        time.sleep(2.5)  # a write to etcd (usage_write_interval is 1 s here)
        kill_the_gateway(ops_up, admin, kernel_id)
        after = wait_for(at_least(min(before) - 0.01), 30, "the GPU-seconds read back by the new gateway")
        assert after[0] >= before[0] - 0.01, (before, after)  # alice's day, as the previous gateway wrote it
        again = admin.notebookos_kernel(kernel_id)
        assert again["gpu_seconds_used"] == 0.0  # this gateway's router counted nothing yet
        assert again["notebook"] == notebook
    finally:
        with contextlib.suppress(Exception):
            alice.shutdown_kernel(kernel_id)
