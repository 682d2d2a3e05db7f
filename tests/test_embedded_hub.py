"""`notebookos up --hub` without a browser: its set-up and bad input, a Hub token that expires, idle servers culled.

Real JupyterHub (``.venv-hub``), its real proxy and the real gateway; the browser half is tests/browser/test_hub.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
from support import NOTEBOOKOS, REPO, Platform, start_platform, stop_platform, wait_for

from jupyter_notebookos.embedded import ports
from jupyter_notebookos.embedded.hub import ENV_HUB_STATE_DIR, EmbeddedHub, hub_python, parse_users, proxy_command
from jupyter_notebookos.embedded.platform import lab_python

HUB_READY = hub_python().exists() and proxy_command() is not None
needs_hub = pytest.mark.skipif(not HUB_READY, reason="JupyterHub's environment or proxy is missing (bootstrap)")


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*NOTEBOOKOS, *args], capture_output=True, text=True, timeout=120, cwd=REPO, env=env)


@pytest.mark.parametrize(
    ("users", "expected"),
    [
        ("Alice", "user name 'Alice' is not usable"),
        ("alice,,bob,alice", "user 'alice' is named twice in --users"),
        (" , ", "--users needs at least one user name"),
        ("bob/../x", "user name 'bob/../x' is not usable"),
    ],
)
def test_bad_user_names_are_refused_clearly(users: str, expected: str) -> None:
    result = run_cli("up", "--hub", "--users", users)
    assert result.returncode == 2 and expected in result.stderr
    assert parse_users("alice, bob") == ["alice", "bob"]


def test_a_missing_proxy_is_a_clear_error(tmp_path: Path) -> None:
    env = {**os.environ, "NOTEBOOKOS_HUB_PROXY": str(tmp_path / "no-such-proxy")}
    result = run_cli("up", "--hub", "--state-dir", str(tmp_path / "state"), "--port", "0", "--hub-port", "0", env=env)
    assert result.returncode == 1
    assert "JupyterHub's proxy (npm's configurable-http-proxy) is missing" in result.stderr
    assert "no-such-proxy" in result.stderr and "Traceback" not in result.stderr


def test_passwords_are_private_kept_across_starts_and_checked_by_the_hubs_authenticator(tmp_path: Path) -> None:
    hub = EmbeddedHub(tmp_path, ["alice", "bob"], 8000, "http://127.0.0.1:8888", lab_python())
    hub.prepare()
    first = dict(hub.passwords)
    assert set(first) == {"alice", "bob"} and first["alice"] != first["bob"]
    assert stat.S_IMODE(hub.passwords_file.stat().st_mode) == 0o600
    again = EmbeddedHub(tmp_path, ["alice", "carol"], 8000, "http://127.0.0.1:8888", lab_python())
    again.prepare()
    assert again.passwords["alice"] == first["alice"] and "bob" not in again.passwords
    config = (tmp_path / "hub" / "jupyterhub_config.py").read_text()
    assert "'JUPYTER_GATEWAY_AUTH_TOKEN': lambda spawner: spawner.api_token" in config
    assert "--gateway-url=http://127.0.0.1:8888" in config
    if not hub_python().exists():
        pytest.skip("JupyterHub's environment is missing")
    # The authenticator, in the Hub's own environment, as the Hub calls it.
    check = f"""
import asyncio, logging
logging.basicConfig()
from jupyter_notebookos.embedded.hub_auth import PasswordFileAuthenticator
auth = PasswordFileAuthenticator(passwords_file={str(again.passwords_file)!r})
for user, password in [("alice", {first["alice"]!r}), ("alice", "wrong"), ("carol", {first["alice"]!r}), ("eve", "x")]:
    print(asyncio.run(auth.authenticate(None, {{"username": user, "password": password}})))
"""
    out = subprocess.run([str(hub_python()), "-c", check], capture_output=True, text=True, timeout=120, env=hub.env())
    assert out.stdout.split() == ["alice", "None", "None", "None"], out.stderr
    again.passwords_file.chmod(0o644)  # readable by others: refused, and the Hub's log says why
    out = subprocess.run([str(hub_python()), "-c", check], capture_output=True, text=True, timeout=120, env=hub.env())
    assert out.stdout.split() == ["None"] * 4 and "readable by other users" in out.stderr


@pytest.fixture(scope="module")
def hub_platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    if not HUB_READY:
        pytest.skip("JupyterHub's environment or proxy is missing (bootstrap)")
    platform = start_platform(
        tmp_path_factory.mktemp("hub-rest") / "state",
        "--hub", "--hub-port", "0", "--users", "alice", "--hosts", "3", "--gpus-per-host", "1",
        "--cull-idle-servers", "20",
        "--gateway-option", "NotebookOSGatewayApp.hub_cache_seconds=1",
        timeout=300,
    )  # fmt: skip
    try:
        yield platform
    finally:
        stop_platform(platform)


def hub_session(platform: Platform, user: str) -> tuple[requests.Session, str]:
    """A browser-like session logged in to the Hub as ``user``; also the Hub's URL."""
    state = platform.state_dir
    hub_url = json.loads((state / "runtime.json").read_text())["hub_url"]
    password = json.loads((state / "hub" / "passwords.json").read_text())[user]
    session = requests.Session()
    session.get(f"{hub_url}/hub/login", timeout=60)
    form = {"username": user, "password": password, "_xsrf": session.cookies.get("_xsrf", "")}
    assert session.post(f"{hub_url}/hub/login", data=form, timeout=60, allow_redirects=False).status_code == 302
    session.headers["X-XSRFToken"] = session.cookies.get("_xsrf", "")
    return session, hub_url


def servers_of(platform: Platform, user: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            env = process.environ()
            ours = env.get(ENV_HUB_STATE_DIR) == str(platform.state_dir) and env.get("JUPYTERHUB_USER") == user
            if ours and "jupyterhub.singleuser" in " ".join(process.info["cmdline"] or []):
                found.append(process)
    return found


def gateway(platform: Platform, token: str, path: str = "/api/kernels") -> requests.Response:
    return requests.get(platform.url + path, headers={"Authorization": f"token {token}"}, timeout=60)


@needs_hub
def test_a_hub_token_works_until_it_expires(hub_platform: Platform) -> None:
    session, hub_url = hub_session(hub_platform, "alice")
    # The gateway is registered with the Hub (as an external service: the Hub runs nothing for it).
    assert "Adding external service notebookos-gateway" in (hub_platform.state_dir / "jupyterhub.log").read_text()
    made = session.post(f"{hub_url}/hub/api/users/alice/tokens", json={"expires_in": 3, "note": "test"}, timeout=60)
    assert made.status_code == 201, made.text
    token: str = made.json()["token"]
    assert gateway(hub_platform, token).status_code == 200
    expired: Any = wait_for(
        lambda: (r := gateway(hub_platform, token)).status_code == 401 and r.json(), 60, "the token to expire", 1.0
    )
    assert "unknown token" in expired["message"]


@needs_hub
def test_an_idle_server_is_culled_by_jupyterhub_idle_culler(hub_platform: Platform) -> None:
    session, hub_url = hub_session(hub_platform, "alice")
    session.get(f"{hub_url}/hub/spawn/alice", timeout=120)
    server = wait_for(lambda: servers_of(hub_platform, "alice"), 240, "alice's server to start", interval=1.0)[0]
    # Its port is one the platform picked below the ephemeral range, not the Spawner's own port-0 pick.
    listening = wait_for(
        lambda: {c.laddr.port for c in server.net_connections("tcp") if c.status == psutil.CONN_LISTEN},
        60,
        "alice's server to listen",
        interval=0.5,
    )
    low, high = ports.pick_range()
    kernels = ports.kernel_range()
    top = kernels[0] - 1 if kernels is not None else high  # (a service port: never in the kernels' part)
    assert all(low <= port <= top for port in listening), (listening, low, top)
    wait_for(lambda: not servers_of(hub_platform, "alice"), 240, "the idle culler to stop alice's server", 1.0)
    assert "Culling server alice" in (hub_platform.state_dir / "jupyterhub.log").read_text()
