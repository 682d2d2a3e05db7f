"""The operator dashboard in headless Chromium against `notebookos up`: it shows what the API says.

A kernel holds one GPU with a long cell while the page loads, so the grid has a committed GPU, the kernels per
user and kernels tables a row, and the pending bars numbers above zero. The page's numbers are compared with
``GET /api/notebookos/cluster`` read at the same moment; a screenshot is saved under the test's tmp dir.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab_stack import Browser
from selenium.webdriver.support.ui import Select
from support import Platform, platform_running, wait_for

# The numbers as the page shows them: totals cards, and per host its GPU squares and data attributes.
_PAGE_NUMBERS = """
const totals = {};
for (const node of document.querySelectorAll('[data-total]')) totals[node.dataset.total] = node.textContent;
const hosts = Array.from(document.querySelectorAll('#hosts tbody tr')).map((row) => ({
  name: row.dataset.host,
  gpus: row.querySelectorAll('.gpu').length,
  committed: row.querySelectorAll('.gpu.committed').length,
  idle: row.querySelectorAll('.gpu.idle').length,
  pending: Number(row.querySelector('.pending-count').textContent),
  ratio: row.children[3].textContent,
  replicas: Number(row.children[4].textContent),
}));
const users = Array.from(document.querySelectorAll('#users tbody tr')).map(
  (row) => [row.dataset.user, Number(row.dataset.kernels)]);
const kernels = Array.from(document.querySelectorAll('#kernels tbody tr')).map((row) => row.dataset.kernel);
return {totals, hosts, users, kernels, refreshes: Number(document.body.dataset.refreshes || 0),
        status: document.getElementById('status').textContent};
"""


# The headline cards: the API's totals, and its admission limit (the view's own subscription_ratio).
TOTALS_SHOWN = ("hosts", "gpus", "gpus_idle", "gpus_committed", "gpus_pending", "kernels", "queued_cells")
TOTALS_SHOWN += ("migrations_in_flight",)


class Ratio(float):
    """A ratio the page shows with two decimals: equal to its text there (JavaScript rounds halves up)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and abs(float(other) - self) <= 0.005 + 1e-9

    __hash__ = float.__hash__


def expected_numbers(cluster: dict[str, Any]) -> dict[str, Any]:
    """What the page must show for ``cluster`` (the API's own numbers, formatted as the page formats them)."""
    totals: dict[str, Any] = {k: str(cluster["totals"][k]) for k in TOTALS_SHOWN}
    totals["subscription_ratio"] = Ratio(cluster["totals"]["subscription_ratio"])
    totals["subscription_limit"] = Ratio(cluster["subscription_ratio"])
    hosts = [
        {
            "name": h["name"],
            "gpus": h["gpus"],
            "committed": h["gpus_committed"],
            "idle": h["gpus"] - h["gpus_committed"],
            "pending": h["gpus_pending"],
            "ratio": Ratio(h["subscription_ratio"]),
            "replicas": h["replicas"],
        }
        for h in cluster["hosts"]
    ]
    users = [[u["user"], u["kernels"]] for u in cluster["totals"]["kernels_per_user"]]
    return {"totals": totals, "hosts": hosts, "users": users, "kernels": [k["kernel_id"] for k in cluster["kernels"]]}


def test_dashboard_shows_the_numbers_of_the_cluster_api(shared_up: Platform, browser: Browser, tmp_path: Path) -> None:
    client = shared_up.client
    kernel_id = client.start_kernel("python3-notebookos")
    conn = client.connect(kernel_id)
    try:
        conn.send("shell", "execute_request", {"code": "import time\ntime.sleep(60)", "silent": False})
        wait_for(
            lambda: any(h["gpus_committed"] for h in client.request("GET", "/api/notebookos/cluster")["hosts"]),
            30,
            "the cell to hold a GPU",
        )
        driver: Any = browser.driver
        driver.get(f"{shared_up.url}/notebookos/?token={shared_up.token}&interval=500")
        assert "token=" not in driver.current_url  # the admin token leaves the address bar at once
        wait_for(lambda: driver.execute_script(_PAGE_NUMBERS)["refreshes"] >= 1, 30, "the dashboard's first refresh")

        # Poll both until they agree: a refresh may fall between two reads of the API.
        shown: dict[str, Any] = {}
        expected: dict[str, Any] = {}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            cluster = client.request("GET", "/api/notebookos/cluster")
            page = driver.execute_script(_PAGE_NUMBERS)
            shown = {k: page[k] for k in ("totals", "hosts", "users", "kernels")}
            expected = expected_numbers(cluster)
            if shown == expected:
                break
            time.sleep(0.3)
        assert shown == expected, json.dumps([page["status"], shown, expected], default=str)
        assert kernel_id in shown["kernels"] and ["(admin)", 1] in shown["users"]
        assert sum(h["committed"] for h in shown["hosts"]) == 1 and shown["totals"]["gpus_committed"] == "1"

        screenshot = tmp_path / "dashboard.png"
        assert driver.save_screenshot(str(screenshot)) and screenshot.stat().st_size > 10_000
        print(f"dashboard screenshot: {screenshot}")
    finally:
        conn.close()
        client.shutdown_kernel(kernel_id)


def test_without_a_token_the_page_asks_for_it_and_a_reload_keeps_the_dashboard(
    shared_up: Platform, browser: Browser
) -> None:
    """A new user opens /notebookos/ as a link without its token: a page says why and asks for it (not the API's
    JSON). The token given there opens the dashboard, which takes it out of the address; a reload keeps it open."""
    driver: Any = browser.driver
    driver.get(f"{shared_up.url}/notebookos/")
    assert "needs a token" in driver.find_element("id", "reason").text
    assert "{" not in driver.find_element("tag name", "body").text[:1]  # a page, not JSON
    driver.find_element("id", "token").send_keys(shared_up.token + "\n")
    wait_for(lambda: driver.execute_script(_PAGE_NUMBERS)["refreshes"] >= 1, 30, "the dashboard after the token")
    assert "token=" not in driver.current_url
    driver.refresh()
    wait_for(lambda: driver.execute_script(_PAGE_NUMBERS)["refreshes"] >= 1, 30, "the dashboard after a reload")
    assert "token=" not in driver.current_url and driver.find_elements("id", "totals")

    driver.execute_script("sessionStorage.clear()")
    driver.get(f"{shared_up.url}/notebookos/?token=not-the-token")
    assert "unknown token" in driver.find_element("id", "reason").text.lower()


# -- history charts, what each kernel and host holds, and the admin's actions ------------------------------------

# Each chart's structure: axes with ticks and unit labels, and what it drew (points per series, their extent).
_CHARTS = """
const charts = {};
for (const svg of document.querySelectorAll('svg.chart')) {
  const series = {};
  for (const path of svg.querySelectorAll('path.series')) {
    series[path.dataset.series] = {points: Number(path.dataset.points), height: path.getBBox().height};
  }
  charts[svg.dataset.chart] = {
    x_ticks: Array.from(svg.querySelectorAll('.axis.x .tick')).map((n) => n.textContent),
    y_ticks: Array.from(svg.querySelectorAll('.axis.y .tick')).map((n) => n.textContent),
    labels: Array.from(svg.querySelectorAll('.axis-label')).map((n) => n.textContent),
    series: series,
    bars: Array.from(svg.querySelectorAll('rect.bar')).map((b) => [b.dataset.key, Number(b.dataset.value)]),
    events: svg.querySelectorAll('circle.event').length,
    width: svg.getBoundingClientRect().width,
  };
}
return charts;
"""

NOTHING = "\u2013"  # what the page shows for a value it does not have (an en dash)

_ROWS = """
const cells = (row) => Object.fromEntries(
  Array.from(row.closest('table').querySelectorAll('thead th')).map((th, i) => [th.textContent, row.children[i]]));
const kernels = Array.from(document.querySelectorAll('#kernels tbody tr')).map((row) => {
  const c = cells(row);
  return {id: row.dataset.kernel, notebook: c.notebook.textContent, notebook_title: c.notebook.title,
          idle: c.idle.textContent, residency: c.residency.textContent, memory: c.memory.textContent,
          replicas: Array.from(row.querySelectorAll('button.replica')).map((b) => b.textContent)};
});
const hosts = Array.from(document.querySelectorAll('#hosts tbody tr')).map((row) => {
  const c = cells(row);
  return {name: row.dataset.host, memory: c.memory.textContent, health: c.health.textContent,
          gpu_use: c['GPU use'].textContent, action: row.querySelector('td:last-child button').textContent};
});
const users = Array.from(document.querySelectorAll('#users thead th')).map((th) => [th.textContent, th.title]);
const terms = Array.from(document.querySelectorAll('.terms dt')).map((dt) => dt.textContent);
const cards = Object.fromEntries(Array.from(document.querySelectorAll('.card')).map(
  (card) => [card.querySelector('.label').textContent, card.title]));
return {kernels, hosts, users, terms, cards, result: document.getElementById('action-result').textContent};
"""


@pytest.fixture(scope="module")
def history_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """5 hosts x 2 GPUs, the history sampled every second."""
    state = tmp_path_factory.mktemp("dashboard-history") / "state"
    with platform_running(
        state, "--hosts", "5", "--gpus-per-host", "2", "--gateway-option", "ClusterHistory.interval=1"
    ) as platform:
        yield platform


def _click(driver: Any, selector: str) -> None:
    """Click the element the page shows at ``selector`` now (the page redraws its tables at every refresh, so an
    element found earlier may be gone)."""
    wait_for(
        lambda: driver.execute_script(
            "const node = document.querySelector(arguments[0]); if (node) node.click(); return Boolean(node);", selector
        ),
        10,
        selector,
    )


def _confirm(driver: Any, choice: str | None = None) -> str:
    """Answer the page's confirmation dialog (picking ``choice`` in its list); returns its question."""
    wait_for(lambda: driver.find_element("id", "confirm").get_attribute("open") is not None, 10, "the dialog")
    question = str(driver.find_element("id", "confirm-title").text)
    if choice is not None:
        Select(driver.find_element("id", "confirm-select")).select_by_value(choice)
    driver.find_element("id", "confirm-ok").click()
    return question


def _result(driver: Any, start: str, timeout: float = 60) -> str:
    """The page's answer to an action, once it starts with ``start``."""
    return str(
        wait_for(
            lambda: (text := driver.find_element("id", "action-result").text).startswith(start) and text,
            timeout,
            f"the page to say {start!r}",
        )
    )


def test_charts_kernel_details_and_the_admins_actions(history_up: Platform, browser: Browser, tmp_path: Path) -> None:
    """After a few cells the history charts have labelled axes and drawn series; each kernel shows its notebook,
    idle time, residency and replica memory, each host its memory and health; the admin moves a replica, drains a
    host, puts it back and deletes a kernel from the page, each after a confirmation, and the API agrees."""
    client = history_up.client
    notebook = str(tmp_path / "analysis.ipynb")
    kernel_id = client.start_kernel("python3-notebookos", env={"JPY_SESSION_NAME": notebook})
    other = client.start_kernel("python3-notebookos")
    try:
        with client.connect(kernel_id) as conn:
            for _ in range(3):
                assert conn.execute("import time; time.sleep(1.2)").status == "ok"
        wait_for(
            lambda: len(client.request("GET", "/api/notebookos/history")["samples"]) >= 4, 30, "four history samples"
        )
        driver: Any = browser.driver
        driver.get(f"{history_up.url}/notebookos/?token={history_up.token}&interval=500")

        def drawn() -> dict[str, Any] | None:
            charts = driver.execute_script(_CHARTS)
            ready = (
                charts.get("gpus", {}).get("series", {}).get("committed", {}).get("points", 0) >= 3
                and charts.get("usage", {}).get("bars")
                and charts.get("wait", {}).get("series", {}).get("p50", {}).get("points", 0) >= 1
            )
            return charts if ready else None

        charts = wait_for(drawn, 30, "the history charts")
        for name, unit in [("gpus", "GPUs"), ("queue", "cells"), ("wait", "seconds"), ("usage", "GPU-hours")]:
            chart = charts[name]
            assert len(chart["x_ticks"]) >= 1 and len(chart["y_ticks"]) >= 2, (name, chart)
            assert unit in chart["labels"] and chart["width"] > 200, (name, chart)
        assert any(":" in t for t in charts["gpus"]["x_ticks"])  # clock times
        assert charts["gpus"]["series"]["committed"]["height"] > 0  # it rose to the committed GPU and back
        assert charts["gpus"]["series"]["gpus"]["points"] >= 3 and charts["queue"]["series"]["queued"]["points"] >= 3
        assert "day (UTC)" in charts["usage"]["labels"]
        assert [user for user, hours in charts["usage"]["bars"]] == ["(admin)"] and charts["usage"]["bars"][0][1] > 0
        assert charts["timeline"]["y_ticks"] == ["migrations", "scaling", "hosts"] and charts["timeline"]["x_ticks"]

        def tables() -> dict[str, Any] | None:
            rows = driver.execute_script(_ROWS)
            return rows if len(rows["kernels"]) == 2 and rows["hosts"] else None

        rows = wait_for(tables, 30, "the kernels and hosts tables")
        mine = next(k for k in rows["kernels"] if k["id"] == kernel_id)
        assert mine["notebook"] == "analysis.ipynb" and mine["notebook_title"] == notebook
        assert mine["residency"] == "resident" and mine["idle"].endswith((" s", " min")), mine
        assert mine["memory"].endswith(("MiB", "GiB")) and len(mine["replicas"]) == 3, mine
        assert next(k for k in rows["kernels"] if k["id"] == other)["notebook"] == NOTHING  # not sent: not invented
        assert all(h["memory"].endswith(("B", "KiB", "MiB", "GiB")) and h["health"] == "ok" for h in rows["hosts"])
        assert all(h["gpu_use"] == NOTHING for h in rows["hosts"])  # simulated GPUs: nothing to read
        # Terms explained in place; the users' GPU column named for what it sums.
        assert {"committed", "pending", "subscription ratio", "admission limit"} <= set(rows["terms"])
        assert "pending GPUs / GPUs / replicas per kernel" in rows["cards"]["Subscription ratio"]
        assert "subscription ratio a host may reach" in rows["cards"]["Admission limit"]
        assert "oversubscribed" in rows["cards"]["Pending"]
        assert [h for h, _ in rows["users"] if "GPU" in h] == ["GPUs requested per cell (sum)"]
        assert "sum over the user's kernels" in dict(rows["users"])["GPUs requested per cell (sum)"]

        # Move a replica of the kernel to a host none of its replicas is on, picked in the dialog.
        summary = client.notebookos_kernel(kernel_id)
        used = {r["host"] for r in summary["replicas"]}
        # The last of the two hosts free of it: the scheduler, left to choose, takes the first of equals.
        free = [h["name"] for h in client.request("GET", "/api/notebookos/cluster")["hosts"] if h["name"] not in used][
            -1
        ]
        first = summary["replicas"][0]
        _click(driver, f"#kernels tr[data-kernel='{kernel_id}'] button.replica[data-replica='{first['replica_id']}']")
        assert _confirm(driver, free).startswith(f"Move replica {first['replica_id']} of kernel {kernel_id[:8]}")
        assert f"{first['host']} → {free}" in _result(driver, "moved replica")
        assert free in {r["host"] for r in client.notebookos_kernel(kernel_id)["replicas"]}

        # Drain a host of the kernel: its replicas move, and the host takes none until it is back in service.
        source = next(r["host"] for r in client.notebookos_kernel(kernel_id)["replicas"] if r["host"] != free)
        _click(driver, f"#hosts tr[data-host='{source}'] button.drain")
        assert _confirm(driver) == f"Drain {source}?"
        said = _result(driver, f"drained {source}")
        assert "replica(s) moved" in said and "it holds no replica now" in said, said
        host = next(h for h in client.request("GET", "/api/notebookos/cluster")["hosts"] if h["name"] == source)
        assert host["draining"] and host["replicas"] == 0
        wait_for(lambda: driver.execute_script(_CHARTS)["timeline"]["events"] >= 3, 30, "the moves on the timeline")
        _click(driver, f"#hosts tr[data-host='{source}'] button.undrain")
        assert _confirm(driver) == f"Put {source} back in service?"
        assert f"host {source} back in service" in _result(driver, f"host {source}")
        assert not next(h for h in client.request("GET", "/api/notebookos/cluster")["hosts"] if h["name"] == source)[
            "draining"
        ]

        screenshot = tmp_path / "dashboard-history.png"
        driver.set_window_size(1400, 2200)
        assert driver.save_screenshot(str(screenshot)) and screenshot.stat().st_size > 10_000
        print(f"dashboard screenshot: {screenshot}")

        # Delete the other kernel; a cancelled confirmation first changes nothing.
        delete = f"#kernels tr[data-kernel='{other}'] button.delete"
        _click(driver, delete)
        wait_for(lambda: driver.find_element("id", "confirm").get_attribute("open") is not None, 10, "the dialog")
        driver.find_element("id", "confirm-cancel").click()
        assert other in {k["id"] for k in client.request("GET", "/api/kernels")}
        _click(driver, delete)
        assert _confirm(driver).startswith(f"Delete kernel {other[:8]}")
        assert _result(driver, "deleted kernel") == f"deleted kernel {other}"
        assert other not in {k["id"] for k in client.request("GET", "/api/kernels")}
    finally:
        for kid in (kernel_id, other):
            with contextlib.suppress(Exception):
                client.shutdown_kernel(kid)
