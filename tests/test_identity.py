"""Users, tokens and kernel ownership, end to end: the real gateway, real kernels, a real JupyterHub."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import websocket
from support import (
    NOTEBOOKOS,
    REPO,
    Platform,
    free_port,
    jupyter_server,
    kill_the_gateway,
    start_platform,
    stop_platform,
    wait_for,
)

from jupyter_notebookos.client import GatewayClient, GatewayError

KERNEL = "python3-notebookos"
ALICE = "alice-" + secrets.token_hex(16)
BOB = "bob-" + secrets.token_hex(16)
METRICS = "metrics-" + secrets.token_hex(16)
REFUSED = "belongs to another user"


def one_gpu_hosts(hosts: int, *gateway_options: str) -> list[str]:
    """``start_platform``'s arguments for ``hosts`` hosts of one GPU each and these ``--gateway-option`` values."""
    args = ["--hosts", str(hosts), "--gpus-per-host", "1"]
    for option in gateway_options:
        args += ["--gateway-option", option]
    return args


def write_tokens(path: Path, tokens: dict[str, str], mode: int = 0o600) -> Path:
    path.write_text(json.dumps(tokens))
    path.chmod(mode)
    return path


@pytest.fixture(scope="module")
def users_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """A platform with two users in a token file and a metrics token."""
    home = tmp_path_factory.mktemp("users")
    tokens = write_tokens(home / "tokens.json", {ALICE: "alice", BOB: "bob"})
    platform = start_platform(
        home / "state",
        *one_gpu_hosts(
            4, f"NotebookOSGatewayApp.user_tokens_file={tokens}", f"NotebookOSGatewayApp.metrics_token={METRICS}"
        ),
    )
    try:
        yield platform
    finally:
        stop_platform(platform)


def status(platform: Platform, method: str, path: str, token: str | None, scheme: str = "token", **kw: Any) -> int:
    headers = {"Authorization": f"{scheme} {token}"} if token else {}
    return requests.request(method, platform.url + path, headers=headers, timeout=60, **kw).status_code


def ws_status(platform: Platform, kernel_id: str, token: str | None, *, query: bool = False) -> int:
    """The HTTP status of a channels websocket handshake (101 when it opened)."""
    url = platform.url.replace("http", "ws", 1) + f"/api/kernels/{kernel_id}/channels"
    headers = []
    if token and query:
        url += f"?token={token}"
    elif token:
        headers = [f"Authorization: token {token}"]
    try:
        websocket.create_connection(url, header=headers, timeout=30).close()
    except websocket.WebSocketBadStatusException as err:
        return int(err.status_code)
    return 101


def test_every_route_enterprise_gateway_guards_identifies_users() -> None:
    """An EG upgrade that adds a token-checked route must not leave it on EG's admin-token-only check."""
    from enterprise_gateway.mixins import TokenAuthorizationMixin

    from jupyter_notebookos.gateway.web.authorization import IdentifiedHandlerMixin
    from jupyter_notebookos.gateway.web.gatewayapp import NotebookOSGatewayApp

    handlers = NotebookOSGatewayApp()._create_request_handlers()
    guarded = [(pattern, cls) for pattern, cls, *_ in handlers if issubclass(cls, TokenAuthorizationMixin)]
    assert len(guarded) >= 10  # kernels, actions, channels, kernelspecs, sessions, /api
    assert [p for p, cls in guarded if not issubclass(cls, IdentifiedHandlerMixin)] == []
    ours = [
        cls
        for pattern, cls, *_ in handlers
        if "/api/notebookos/" in pattern or pattern.endswith(("/metrics", "/notebookos/"))  # API, dashboard page
    ]
    # Every one identifies users, but the object broker's: replicas reach it with their kernel's object token
    # (signing), then with the URL it signed (the data of a store the gateway serves itself).
    assert len(ours) == 11 and [cls.__name__ for cls in ours if not issubclass(cls, IdentifiedHandlerMixin)] == [
        "ObjectBrokerHandler",
        "ObjectDataHandler",
    ]


def test_a_users_kernel_is_theirs_alone(users_up: Platform) -> None:
    alice, bob, admin = (GatewayClient(users_up.url, t) for t in (ALICE, BOB, users_up.token))
    # Whatever a client claims in the kernel's environment, the kernel belongs to whoever started it.
    kernel_id = alice.start_kernel(KERNEL, env={"KERNEL_NOTEBOOKOS_OWNER": "bob", "KERNEL_USERNAME": "bob"})
    plain = alice.start_kernel("python3")
    try:
        assert {k["id"] for k in alice.request("GET", "/api/kernels")} == {kernel_id, plain}
        assert bob.request("GET", "/api/kernels") == []
        assert {kernel_id, plain} <= {k["id"] for k in admin.request("GET", "/api/kernels")}

        base = f"/api/kernels/{kernel_id}"
        replica = alice.notebookos_kernel(kernel_id)["replicas"][0]["replica_id"]
        migrate = f"/api/notebookos/kernels/{kernel_id}/replicas/{replica}/migrate"
        for method, path in [
            ("GET", base),
            ("POST", f"{base}/interrupt"),
            ("POST", f"{base}/restart"),
            ("POST", f"/api/kernels/{plain}/restart"),
            ("DELETE", base),
            ("DELETE", f"/api/kernels/{plain}"),
            ("GET", f"/api/notebookos/kernels/{kernel_id}"),
            ("POST", migrate),
        ]:
            with pytest.raises(GatewayError, match=REFUSED) as refused:
                bob.request(method, path)
            assert "HTTP 403" in str(refused.value), (method, path)
        assert ws_status(users_up, kernel_id, BOB) == 403
        assert ws_status(users_up, kernel_id, BOB, query=True) == 403

        # Bob sees the load of alice's kernel on the cluster, not which kernel it is.
        seen = bob.request("GET", "/api/notebookos/cluster")
        assert kernel_id not in json.dumps(seen) and "alice" not in json.dumps(seen)
        others = [k for k in seen["kernels"] if k["kernel_id"] is None]
        assert len(others) == 1 and others[0]["gpus"] == 1 and len(others[0]["replicas"]) == 3
        assert all(set(r) == {"host", "state"} for r in others[0]["replicas"])
        shown = subprocess.run(
            [*NOTEBOOKOS, "status", "--url", users_up.url, "--token", BOB],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert shown.returncode == 0 and "(another user's)" in shown.stdout and kernel_id not in shown.stdout

        # Nothing bob tried touched the kernel: alice's state is there, her own calls work.
        info = alice.notebookos_kernel(kernel_id)
        assert info["owner"] == "alice" and len(info["replicas"]) == 3
        with alice.connect(kernel_id) as conn:
            result = conn.execute("import os\nos.environ['KERNEL_NOTEBOOKOS_OWNER'], os.environ['KERNEL_USERNAME']")
            assert result.result_text() == "('alice', 'alice')"
        alice.interrupt_kernel(kernel_id)
        assert [k["owner"] for k in alice.request("GET", "/api/notebookos/cluster")["kernels"]] == ["alice"]

        # The admin sees and may do everything.
        assert admin.request("GET", base)["id"] == kernel_id
        assert [k["owner"] for k in admin.request("GET", "/api/notebookos/cluster")["kernels"]] == ["alice"]
        with admin.connect(kernel_id) as conn:
            assert conn.execute("6 * 7").result_text() == "42"
        admin.interrupt_kernel(kernel_id)
        admin.request("POST", f"/api/kernels/{plain}/restart")
        replica_host = next(r["host"] for r in info["replicas"] if r["replica_id"] == replica)
        moved = admin.request("POST", migrate)
        assert moved["previous_replica_id"] == replica and moved["from"] == replica_host
        assert moved["to"] not in {r["host"] for r in info["replicas"]}
        with alice.connect(kernel_id) as conn:
            assert conn.execute("'after the move'").result_text() == "'after the move'"
        admin.shutdown_kernel(plain)
        admin.shutdown_kernel(kernel_id)
        assert not {kernel_id, plain} & {k["id"] for k in admin.request("GET", "/api/kernels")}
    finally:
        for kid in (kernel_id, plain):
            with contextlib.suppress(GatewayError):
                admin.shutdown_kernel(kid)


def test_the_admins_kernels_are_the_admins(users_up: Platform) -> None:
    admin, bob = users_up.client, GatewayClient(users_up.url, BOB)
    kernel_id = admin.start_kernel("python3")
    try:
        assert bob.request("GET", "/api/kernels") == []
        with pytest.raises(GatewayError, match=REFUSED):
            bob.request("GET", f"/api/kernels/{kernel_id}")
        assert admin.request("GET", f"/api/kernels/{kernel_id}")["id"] == kernel_id
    finally:
        admin.shutdown_kernel(kernel_id)


def test_an_unknown_token_gets_nowhere(users_up: Platform) -> None:
    admin = users_up.client
    kernel_id = admin.start_kernel("python3")
    try:
        routes = [
            ("GET", "/api"),
            ("GET", "/api/kernels"),
            ("POST", "/api/kernels"),
            ("GET", f"/api/kernels/{kernel_id}"),
            ("POST", f"/api/kernels/{kernel_id}/interrupt"),
            ("POST", f"/api/kernels/{kernel_id}/restart"),
            ("DELETE", f"/api/kernels/{kernel_id}"),
            ("GET", "/api/kernelspecs"),
            ("GET", f"/api/kernelspecs/{KERNEL}"),
            ("GET", "/api/sessions"),
            ("GET", "/api/notebookos/cluster"),
            ("GET", f"/api/notebookos/kernels/{kernel_id}"),
            ("POST", f"/api/notebookos/kernels/{kernel_id}/replicas/0/migrate"),
            ("GET", "/metrics"),
        ]
        for method, path in routes:
            for token, scheme in [("nope-" + secrets.token_hex(8), "token"), ("nope", "Bearer"), (None, "token")]:
                assert status(users_up, method, path, token, scheme) == 401, (method, path, token, scheme)
            assert status(users_up, method, path + "?token=nope", None) == 401, (method, path)
        assert ws_status(users_up, kernel_id, "nope") == 401
        assert ws_status(users_up, kernel_id, None) == 401
        body = requests.get(users_up.url + "/api/kernels", headers={"Authorization": "token nope"}, timeout=10).json()
        assert body["message"] == "unknown token: it names no user of this gateway"
        # ...and the kernel it tried to delete is still there.
        assert admin.request("GET", f"/api/kernels/{kernel_id}")["id"] == kernel_id
        # Every way of sending a good token works.
        for scheme in ("token", "Bearer", "bearer"):
            assert status(users_up, "GET", "/api/kernels", ALICE, scheme) == 200
        assert status(users_up, "GET", f"/api/kernelspecs?token={ALICE}", None) == 200
        assert status(users_up, "GET", f"/api/kernels/{kernel_id}?token={BOB}", None) == 403
        # Tokens in URLs stay out of the gateway's log.
        log = (Path(users_up.state_dir) / "gateway.log").read_text()
        assert "/api/kernels?token=[secret]" in log and ALICE not in log and BOB not in log
    finally:
        admin.shutdown_kernel(kernel_id)


def test_metrics_take_prometheus_bearer_tokens(users_up: Platform) -> None:
    scrape = requests.get(users_up.url + "/metrics", headers={"Authorization": f"Bearer {METRICS}"}, timeout=10)
    assert scrape.status_code == 200 and "notebookos_hosts" in scrape.text
    assert status(users_up, "GET", "/metrics", users_up.token, "Bearer") == 200
    assert status(users_up, "GET", "/metrics", BOB, "Bearer") == 403  # users do not read the whole cluster's metrics
    # The metrics token is read-only: it reaches nothing else.
    for method, path in [("GET", "/api/kernels"), ("POST", "/api/kernels"), ("GET", "/api/notebookos/cluster")]:
        assert status(users_up, method, path, METRICS, "Bearer") == 403


def test_sessions_are_the_admins(users_up: Platform) -> None:
    refused = requests.get(users_up.url + "/api/sessions", headers={"Authorization": f"token {BOB}"}, timeout=10)
    assert refused.status_code == 403 and "POST /api/kernels" in refused.json()["message"]
    assert users_up.client.request("GET", "/api/sessions") == []


def test_the_token_file_is_reread_when_it_changes(users_up: Platform, tmp_path: Path) -> None:
    tokens = Path(users_up.state_dir).parent / "tokens.json"
    carol = "carol-" + secrets.token_hex(16)
    try:
        write_tokens(tokens, {ALICE: "alice", BOB: "bob", carol: "carol"})
        wait_for(lambda: status(users_up, "GET", "/api/kernels", carol) == 200, 10, "carol's token to be accepted")
        # A broken rewrite keeps the users read before (the log says why); it does not lock everyone out.
        tokens.write_text("{not json")
        time.sleep(2.5)
        assert status(users_up, "GET", "/api/kernels", carol) == 200
        assert "is not valid JSON" in (Path(users_up.state_dir) / "gateway.log").read_text()
    finally:
        write_tokens(tokens, {ALICE: "alice", BOB: "bob"})
    wait_for(lambda: status(users_up, "GET", "/api/kernels", carol) == 401, 10, "carol's token to be refused")


def test_a_request_on_the_control_channel_does_not_bypass_the_router(users_up: Platform, tmp_path: Path) -> None:
    alice = GatewayClient(users_up.url, ALICE)
    kernel_id = alice.start_kernel(KERNEL)
    marker = tmp_path / "ran"
    try:
        with alice.connect(kernel_id) as conn:
            conn.send("control", "execute_request", {"code": f"open({str(marker)!r}, 'w').write('x')", "silent": False})
            info = conn.request("control", "kernel_info_request", {}, timeout=30)
            assert info["msg_type"] == "kernel_info_reply"
            # The shell channel is the way in: this cell runs, the one sent on control never did.
            assert conn.execute("'shell works'").result_text() == "'shell works'"
            time.sleep(1)
            assert not marker.exists()
            assert conn.execute("'cells' if 'ran' not in dir() else 'bad'").status == "ok"
        log = (Path(users_up.state_dir) / "gateway.log").read_text()
        assert f"kernel {kernel_id}: dropped execute_request that arrived on the control channel" in log
    finally:
        alice.shutdown_kernel(kernel_id)


@pytest.mark.parametrize(
    ("content", "mode", "expected"),
    [
        ('{"' + "t" * 20 + '": "alice"}', 0o644, "chmod 600"),
        ("{not json", 0o600, "is not valid JSON"),
        ('["a list"]', 0o600, "must hold a JSON object"),
        ('{"short": "alice"}', 0o600, "shorter than 16 characters"),
        ('{"' + "t" * 20 + '": ""}', 0o600, "must map to a user name"),
    ],
)
def test_a_bad_token_file_stops_the_gateway_clearly(tmp_path: Path, content: str, mode: int, expected: str) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(content)
    tokens.chmod(mode)
    with pytest.raises(AssertionError, match=expected):
        platform = start_platform(
            tmp_path / "state",
            *one_gpu_hosts(3, f"NotebookOSGatewayApp.user_tokens_file={tokens}", "LocalLauncher.warm_replicas=0"),
            timeout=60,
        )
        stop_platform(platform)


def test_a_restarted_gateway_still_knows_who_owns_each_kernel(tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path / "tokens.json", {ALICE: "alice", BOB: "bob"})
    platform = start_platform(tmp_path / "state", *one_gpu_hosts(3, f"NotebookOSGatewayApp.user_tokens_file={tokens}"))
    try:
        alice, bob = GatewayClient(platform.url, ALICE), GatewayClient(platform.url, BOB)
        kernel_id = alice.start_kernel(KERNEL)
        with alice.connect(kernel_id) as conn:
            conn.execute("kept = 'mine'")
        kill_the_gateway(platform, alice, kernel_id)
        assert bob.request("GET", "/api/kernels") == []
        with pytest.raises(GatewayError, match=REFUSED):
            bob.request("GET", f"/api/notebookos/kernels/{kernel_id}")
        assert ws_status(platform, kernel_id, BOB) == 403
        assert alice.notebookos_kernel(kernel_id)["owner"] == "alice"
        with alice.connect(kernel_id) as conn:
            assert conn.execute("kept", timeout=60).result_text() == "'mine'"
        alice.shutdown_kernel(kernel_id)
    finally:
        stop_platform(platform)


# -- JupyterHub ------------------------------------------------------------------------------------------------

HUB_VENV = REPO / ".venv-hub"
HUB_CONFIG = """
from jupyterhub.proxy import Proxy


class NoProxy(Proxy):
    # The gateway needs only the Hub's API: no configurable-http-proxy process.
    should_start = False

    async def start(self):
        pass

    async def stop(self):
        pass

    async def add_route(self, routespec, target, data):
        pass

    async def delete_route(self, routespec):
        pass

    async def get_all_routes(self):
        return {{}}


c = get_config()  # noqa: F821
c.JupyterHub.proxy_class = NoProxy
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {port}
c.JupyterHub.db_url = "sqlite:///{home}/hub.sqlite"
c.JupyterHub.cookie_secret_file = "{home}/cookie_secret"
c.JupyterHub.authenticator_class = "dummy"
c.JupyterHub.cleanup_servers = False
c.JupyterHub.services = [{{"name": "gateway-tests", "api_token": "{service_token}"}}]
c.JupyterHub.load_roles = [
    {{"name": "gateway-tests", "scopes": ["admin:users", "tokens"], "services": ["gateway-tests"]}}
]
"""


class Hub:
    """A real JupyterHub (its API only) in its own process group."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/hub/api"
        self.service_token = secrets.token_hex(24)
        (home / "jupyterhub_config.py").write_text(
            HUB_CONFIG.format(port=self.port, home=home, service_token=self.service_token)
        )
        self.log = home / "hub.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [str(HUB_VENV / "bin" / "jupyterhub"), "-f", str(self.home / "jupyterhub_config.py")],
                cwd=self.home,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},  # its log counts the Hub's answers
            )
        wait_for(self._answers, 60, f"JupyterHub to answer (log {self.log})", interval=0.2)

    def _answers(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"JupyterHub exited:\n{self.log.read_text()[-3000:]}")
        try:
            return requests.get(f"{self.api_url}/", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        self.process = None

    def user_token(self, name: str) -> str:
        """A new API token of Hub user ``name`` (created if needed), as JupyterHub issues them."""
        headers = {"Authorization": f"token {self.service_token}"}
        created = requests.post(f"{self.api_url}/users/{name}", headers=headers, timeout=10)
        assert created.status_code in (201, 409), created.text
        issued = requests.post(
            f"{self.api_url}/users/{name}/tokens", headers=headers, json={"note": "gateway tests"}, timeout=10
        )
        assert issued.status_code == 201, issued.text
        return str(issued.json()["token"])

    def user_requests(self) -> int:
        """How many ``GET /hub/api/user`` the Hub has answered, once its log is quiet for 0.3 s.

        The Hub logs a request just after answering it, so the count is read only when it stops changing.
        """
        count, quiet_since = -1, 0.0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            now_count = self.log.read_text().count("GET /hub/api/user ")
            if now_count != count:
                count, quiet_since = now_count, time.monotonic()
            elif time.monotonic() - quiet_since >= 0.3:
                break
            time.sleep(0.05)
        return count


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    if not (HUB_VENV / "bin" / "jupyterhub").exists():
        pytest.skip(
            ".venv-hub is missing (run the bootstrap, or: python3 -m venv .venv-hub && "
            ".venv-hub/bin/pip install -r requirements/hub.txt)"
        )
    running = Hub(tmp_path_factory.mktemp("hub"))
    running.start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def hub_up(hub: Hub, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    platform = start_platform(
        tmp_path_factory.mktemp("hub-gateway") / "state",
        *one_gpu_hosts(
            3,
            f"NotebookOSGatewayApp.hub_api_url={hub.api_url}",
            "NotebookOSGatewayApp.hub_unknown_cache_seconds=3",
            "NotebookOSGatewayApp.hub_timeout=2",
        ),
    )
    try:
        yield platform
    finally:
        stop_platform(platform)


def test_jupyterhub_tokens_name_their_users(hub: Hub, hub_up: Platform) -> None:
    alice_token, bob_token = hub.user_token("alice"), hub.user_token("bob")
    alice, bob = GatewayClient(hub_up.url, alice_token), GatewayClient(hub_up.url, bob_token)
    kernel_id = alice.start_kernel(KERNEL)
    try:
        assert alice.notebookos_kernel(kernel_id)["owner"] == "alice"
        assert [k["id"] for k in alice.request("GET", "/api/kernels")] == [kernel_id]
        assert bob.request("GET", "/api/kernels") == []
        with pytest.raises(GatewayError, match=REFUSED):
            bob.request("DELETE", f"/api/kernels/{kernel_id}")
        # Valid answers are cached: many requests, no new question to the Hub.
        asked = hub.user_requests()
        for _ in range(5):
            alice.request("GET", "/api/kernels")
        assert hub.user_requests() == asked
    finally:
        hub_up.client.shutdown_kernel(kernel_id)


def test_tokens_jupyterhub_does_not_know_are_refused(hub: Hub, hub_up: Platform) -> None:
    # A service's token names no user.
    assert status(hub_up, "GET", "/api/kernels", hub.service_token) == 401
    made_up = secrets.token_hex(16)
    asked = hub.user_requests()
    assert status(hub_up, "GET", "/api/kernels", made_up) == 401
    # Unknown answers are cached briefly (3 s here), then the Hub is asked again.
    assert status(hub_up, "GET", "/api/kernels", made_up) == 401
    assert hub.user_requests() == asked + 1
    time.sleep(3)
    assert status(hub_up, "GET", "/api/kernels", made_up) == 401
    assert hub.user_requests() == asked + 2


def test_a_hub_that_is_down_fails_requests_clearly_and_is_asked_again(hub: Hub, hub_up: Platform) -> None:
    fresh, known = hub.user_token("carol"), hub.user_token("dave")
    assert status(hub_up, "GET", "/api/kernels", known) == 200
    hub.stop()
    try:
        # A token the Hub confirmed within hub_cache_seconds keeps working; a new one cannot be checked.
        assert status(hub_up, "GET", "/api/kernels", known) == 200
        began = time.monotonic()
        down = requests.get(hub_up.url + "/api/kernels", headers={"Authorization": f"token {fresh}"}, timeout=30)
        assert down.status_code == 503, down.text
        message = down.json()["message"]
        assert hub.api_url in message and "try again" in message
        assert time.monotonic() - began < 10
        assert status(hub_up, "GET", "/metrics", fresh, "Bearer") == 503  # never let through
    finally:
        hub.start()
    assert status(hub_up, "GET", "/api/kernels", fresh) == 200


def test_a_hub_users_jupyter_server_reaches_only_that_users_kernels(hub: Hub, hub_up: Platform, tmp_path: Path) -> None:
    """As JupyterHub deploys it: a single-user Jupyter server with --gateway-url and its user's own Hub token."""
    erin_token, frank = hub.user_token("erin"), GatewayClient(hub_up.url, hub.user_token("frank"))
    with jupyter_server(hub_up.url, erin_token, tmp_path) as erin:
        kernel_id = erin.start_kernel(KERNEL)
        with erin.connect(kernel_id) as conn:
            assert conn.execute("import os\nos.environ['KERNEL_NOTEBOOKOS_OWNER']").result_text() == "'erin'"
        assert hub_up.client.notebookos_kernel(kernel_id)["owner"] == "erin"
        assert frank.request("GET", "/api/kernels") == []
        with pytest.raises(GatewayError, match=REFUSED):
            frank.request("POST", f"/api/kernels/{kernel_id}/interrupt")
        erin.shutdown_kernel(kernel_id)
