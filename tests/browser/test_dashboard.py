"""The operator dashboard in headless Chromium against `notebookos up`: it shows what the API says.

A kernel holds one GPU with a long cell while the page loads, so the grid has a committed GPU, the kernels per
user and kernels tables a row, and the pending bars numbers above zero. The page's numbers are compared with
``GET /api/notebookos/cluster`` read at the same moment; a screenshot is saved under the test's tmp dir.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from lab_stack import Browser
from support import Platform, wait_for

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
