"""`notebookos up --hub` in a real browser: a real JupyterHub, its real proxy, the real gateway.

Alice and Bob log in with their own passwords, each runs a cell on "Python 3 (NotebookOS)" in their own
JupyterLab, and each server reaches the gateway with its own user's Hub token: Bob's cannot reach Alice's kernel,
the admin sees both. Then what users get wrong or what breaks: a wrong password, a made-up token, a Hub that
stops answering (the gateway says so, kernels keep running, and it asks the Hub again once the Hub is back).
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
from lab_stack import Browser, missing_browser_tools, start_browser
from support import NOTEBOOKOS, REPO, Platform, start_platform, stop_platform, wait_for

from jupyter_notebookos.embedded.hub import ENV_HUB_STATE_DIR, hub_python, proxy_command

pytestmark = pytest.mark.browser

KERNEL_DISPLAY_NAME = "Python 3 (NotebookOS)"
UI_TIMEOUT_S = 240.0  # a loaded 2-core machine: the Hub spawns a JupyterLab, which starts a 3-replica kernel


@pytest.fixture(scope="module")
def hub_platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """`notebookos up --hub --users alice,bob`; the gateway trusts a Hub answer for 2 s only (the Hub-down test)."""
    reason = missing_browser_tools()
    if reason:
        pytest.skip(reason)
    if not hub_python().exists() or proxy_command() is None:
        pytest.skip("JupyterHub's environment or its proxy is missing (scripts/bootstrap.sh installs both)")
    platform = start_platform(
        tmp_path_factory.mktemp("hub") / "state",
        "--hub", "--hub-port", "0", "--users", "alice,bob", "--hosts", "3", "--gpus-per-host", "2",
        "--gateway-option", "NotebookOSGatewayApp.hub_cache_seconds=2",
        timeout=300,
    )  # fmt: skip
    try:
        yield platform
    finally:
        stop_platform(platform)


def runtime(platform: Platform) -> dict[str, Any]:
    return dict(json.loads((platform.state_dir / "runtime.json").read_text()))


def passwords(platform: Platform) -> dict[str, str]:
    return dict(json.loads((platform.state_dir / "hub" / "passwords.json").read_text()))


def server_token(platform: Platform, user: str) -> str:
    """The gateway token that ``user``'s single-user server holds (read from its process, as only root can)."""
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            env = process.environ()
            ours = env.get(ENV_HUB_STATE_DIR) == str(platform.state_dir) and env.get("JUPYTERHUB_USER") == user
            if ours and "jupyterhub.singleuser" in " ".join(process.info["cmdline"] or []):
                return env["JUPYTER_GATEWAY_AUTH_TOKEN"]
    raise AssertionError(f"no single-user server of {user} is running")


def gateway(
    platform: Platform, method: str, path: str, token: str, timeout: float = 60.0, body: Any = None
) -> requests.Response:
    headers = {"Authorization": f"token {token}"}
    return requests.request(method, platform.url + path, headers=headers, timeout=timeout, json=body)


def log_in(browser: Browser, hub_url: str, user: str, password: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver: Any = browser.driver
    driver.get(f"{hub_url}/hub/login")
    WebDriverWait(driver, UI_TIMEOUT_S).until(ec.element_to_be_clickable((By.ID, "username_input")))
    driver.find_element(By.ID, "username_input").send_keys(user)
    driver.find_element(By.ID, "password_input").send_keys(password)
    driver.find_element(By.ID, "login_submit").click()


def run_cell_in_new_notebook(browser: Browser, user: str, source: str, expected: str) -> None:
    """From the Hub's log-in, through the spawn page, to JupyterLab's launcher: a new "Python 3 (NotebookOS)"
    notebook, one cell typed and run with Shift+Enter, and ``expected`` in its output."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver: Any = browser.driver
    wait = WebDriverWait(driver, UI_TIMEOUT_S, poll_frequency=0.5)
    wait.until(lambda d: f"/user/{user}/lab" in d.current_url)
    card = wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, f'.jp-LauncherCard[title="{KERNEL_DISPLAY_NAME}"]')))
    card.click()
    editor = wait.until(
        ec.element_to_be_clickable((By.CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell .cm-content"))
    )
    # Type once the kernel is up ("Python 3 (NotebookOS) | Idle" in the status bar), as a user would: a cell run
    # while Lab is still swapping in the new notebook's kernel is dropped in the browser.
    wait.until(
        lambda d: f"{KERNEL_DISPLAY_NAME} | Idle" in d.find_element(By.ID, "jp-main-statusbar").text,
        "the notebook's kernel to become idle",
    )
    # And the NotebookOS kernel item lists the replicas: Lab has settled on this kernel (through the Hub's proxy,
    # the user's server and the gateway), as a user would see before typing.
    wait.until(
        lambda d: "host-" in d.find_element(By.ID, "jp-main-statusbar").text,
        "the NotebookOS kernel item to list the kernel's replicas",
    )
    editor.click()
    editor.send_keys(source)
    editor.send_keys(Keys.SHIFT, Keys.ENTER)
    outputs = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell .jp-OutputArea-output"

    def shown(d: Any) -> bool:
        return any(expected in e.text for e in d.find_elements(By.CSS_SELECTOR, outputs))

    # A run request Lab sends while it is still settling the new notebook's kernel connection can be lost in the
    # browser (seen under load: the cell never ran, no execution count). A user would run it again: so does the
    # test, in place (Ctrl+Enter on the first cell), at most twice more. A cell that ran and printed something
    # else still fails.
    for attempt in range(3):
        try:
            WebDriverWait(driver, UI_TIMEOUT_S / 3, poll_frequency=0.5).until(shown)
            return
        except Exception:
            ran = [e.text for e in driver.find_elements(By.CSS_SELECTOR, outputs)]
            if ran or attempt == 2:
                raise AssertionError(f"{user}: no {expected!r} in the outputs {ran} at {driver.current_url}") from None
            first = driver.find_element(By.CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell .cm-content")
            first.click()
            first.send_keys(Keys.CONTROL, Keys.ENTER)


def kernels_of(platform: Platform) -> dict[str, str]:
    """Every kernel the admin sees: kernel id -> owner (``notebookos status --json``, the admin's view)."""
    status = subprocess.run(
        [*NOTEBOOKOS, "status", "--state-dir", str(platform.state_dir), "--json"],
        capture_output=True, text=True, timeout=60, cwd=REPO, check=True,
    )  # fmt: skip
    return {k["kernel_id"]: k["owner"] for k in json.loads(status.stdout)["kernels"]}


def what_the_logs_say(platform: Platform, user: str) -> str:
    """What the gateway, the Hub (with the user's server) and the user's replicas logged about the user's kernels:
    a failure in CI says where a cell was lost."""
    kernels = [k for k, owner in kernels_of(platform).items() if owner == user]
    gateway_log = (platform.state_dir / "gateway.log").read_text(errors="replace").splitlines()
    hub_log = (platform.state_dir / "jupyterhub.log").read_text(errors="replace").splitlines()
    parts = [f"--- {user}'s kernels: {kernels}", "--- gateway.log about them, and its warnings:"]

    def flagged(line: str) -> bool:
        return any(k in line for k in kernels) or "[W " in line or "[E " in line

    parts += [line[:400] for line in gateway_log if flagged(line)][-60:]
    parts.append(f"--- jupyterhub.log (with {user}'s server), warnings and kernel lines:")
    parts += [line[:400] for line in hub_log if flagged(line) and "extra_template_paths" not in line][-40:]
    for kernel in kernels:
        for log in sorted((platform.state_dir / "replicas" / kernel).glob("*.log")):
            parts.append(f"--- {log.relative_to(platform.state_dir)} (end):")
            parts += log.read_text(errors="replace").splitlines()[-8:]
    return "\n".join(parts)


def test_each_user_runs_their_own_kernel_and_cannot_reach_the_others(hub_platform: Platform, tmp_path: Path) -> None:
    hub_url = runtime(hub_platform)["hub_url"]
    pw = passwords(hub_platform)
    # One after the other: side by side they halved this test's time but, on a loaded 2-core machine, a Lab lost
    # bob's run requests three times in a row (CI, 2026-12-03).
    for user, source, expected in (("alice", "print(6 * 7)", "42"), ("bob", "print('bob', 2 + 3)", "bob 5")):
        browser = start_browser(tmp_path / user)
        try:
            log_in(browser, hub_url, user, pw[user])
            try:
                run_cell_in_new_notebook(browser, user, source, expected)
            except AssertionError as err:
                raise AssertionError(f"{err}\n{what_the_logs_say(hub_platform, user)}") from None
        finally:
            browser.quit()

    def both() -> dict[str, str] | None:
        seen = kernels_of(hub_platform)
        return seen if sorted(seen.values()) == ["alice", "bob"] else None

    owners = wait_for(both, 60, "the admin to see alice's and bob's kernels", interval=1.0)
    alice_kernel = next(k for k, owner in owners.items() if owner == "alice")
    bob_kernel = next(k for k, owner in owners.items() if owner == "bob")

    alice_token, bob_token = server_token(hub_platform, "alice"), server_token(hub_platform, "bob")
    assert len({alice_token, bob_token, hub_platform.token}) == 3, "servers must not share a gateway token"
    # Bob's own server token: his kernel only.
    listed = gateway(hub_platform, "GET", "/api/kernels", bob_token)
    assert listed.status_code == 200 and [k["id"] for k in listed.json()] == [bob_kernel]
    for method, path in (
        ("GET", f"/api/kernels/{alice_kernel}"),
        ("GET", f"/api/notebookos/kernels/{alice_kernel}"),
        ("POST", f"/api/kernels/{alice_kernel}/interrupt"),
        ("DELETE", f"/api/kernels/{alice_kernel}"),
    ):
        refused = gateway(hub_platform, method, path, bob_token)
        assert refused.status_code in (403, 404), (method, path, refused.status_code, refused.text)
    assert gateway(hub_platform, "GET", f"/api/notebookos/kernels/{bob_kernel}", bob_token).status_code == 200
    # Alice's kernel survived all of that.
    assert gateway(hub_platform, "GET", f"/api/kernels/{alice_kernel}", alice_token).status_code == 200
    assert set(kernels_of(hub_platform)) == {alice_kernel, bob_kernel}


def test_wrong_password_unknown_token_and_a_hub_that_stops_answering(hub_platform: Platform, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    hub_url = runtime(hub_platform)["hub_url"]
    browser = start_browser(tmp_path / "wrong")
    try:
        log_in(browser, hub_url, "alice", passwords(hub_platform)["alice"] + "-wrong")
        error = WebDriverWait(browser.driver, UI_TIMEOUT_S).until(
            ec.visibility_of_element_located((By.CSS_SELECTOR, ".login_error"))
        )
        assert "Invalid username or password" in error.text
        assert "/hub/login" in browser.driver.current_url  # type: ignore[attr-defined]
    finally:
        browser.quit()

    made_up = gateway(hub_platform, "GET", "/api/kernels", "f" * 40)
    assert made_up.status_code == 401 and "unknown token" in made_up.json()["message"]

    # A kernel of bob's, started through the gateway with his token, to watch while the Hub is down.
    bob_token = server_token(hub_platform, "bob")
    started = gateway(hub_platform, "POST", "/api/kernels", bob_token, timeout=180, body={"name": "python3-notebookos"})
    assert started.status_code == 201, started.text
    kernel_id = started.json()["id"]
    hub_process = next(
        p for p in psutil.Process(hub_platform.process.pid).children(recursive=True) if "jupyterhub" in p.cmdline()[2:3]
    )
    hub_process.send_signal(signal.SIGSTOP)
    try:
        down = wait_for(
            lambda: (r := gateway(hub_platform, "GET", "/api/kernels", bob_token)).status_code == 503 and r.json(),
            120,
            "the gateway to report the Hub as unreachable",
            interval=1.0,
        )
        assert "could not check your token with JupyterHub" in down["message"]
        # The kernel keeps running: the admin (no Hub needed) still sees it and its replicas.
        info = hub_platform.client.notebookos_kernel(kernel_id)
        assert len(info["replicas"]) == 3 and all(psutil.pid_exists(r["pid"]) for r in info["replicas"])
    finally:
        hub_process.send_signal(signal.SIGCONT)
    # The gateway never cached the failure: the Hub answers again, so does the gateway.
    wait_for(
        lambda: gateway(hub_platform, "GET", f"/api/kernels/{kernel_id}", bob_token).status_code == 200,
        120,
        "bob's token to work again once the Hub is back",
        interval=1.0,
    )
    assert gateway(hub_platform, "DELETE", f"/api/kernels/{kernel_id}", bob_token).status_code == 204
    wait_for(lambda: kernel_id not in kernels_of(hub_platform), 60, "bob's kernel to go", interval=1.0)
