"""``notebookos up --hub``: a real JupyterHub in front of the embedded gateway.

The Hub (PyPI ``jupyterhub``, from ``.venv-hub``) runs with its real proxy (npm's ``configurable-http-proxy``,
installed by the bootstrap under ``.hub/``). Each user logs in with a password of their own (generated, kept in
``<state dir>/hub/passwords.json`` with mode 0600, printed at start) and gets a single-user server: JupyterLab 4
and Notebook 7 from ``.venv-lab``, a local process started by JupyterHub's ``SimpleLocalProcessSpawner`` with
``--gateway-url``. Each server reaches the gateway with **its own user's** JupyterHub API token (the one the Hub
issues to that server), never a shared one; the gateway checks that token with the Hub's API
(``NOTEBOOKOS_HUB_API_URL``) and so knows the user and enforces kernel ownership.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_notebookos.embedded.ports import free_port

#: JupyterHub's user names are normalised to lower case; keep them plain so they are also fine in paths.
USER_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
ENV_HUB_PYTHON = "NOTEBOOKOS_HUB_PYTHON"
ENV_HUB_PROXY = "NOTEBOOKOS_HUB_PROXY"
#: Set in every single-user server's environment, so a platform can find its leftovers.
ENV_HUB_STATE_DIR = "NOTEBOOKOS_HUB_STATE_DIR"


class HubSetupError(ValueError):
    """The Hub cannot be set up; the message says why and what to do."""


def parse_users(text: str) -> list[str]:
    """``"alice,bob"`` as ``["alice", "bob"]``; HubSetupError for a name JupyterHub would change or refuse."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise HubSetupError("--users needs at least one user name, e.g. --users alice,bob")
    for name in names:
        if not USER_NAME.match(name):
            raise HubSetupError(
                f"user name {name!r} is not usable: lower-case letters, digits, '-' and '_', starting with a "
                "letter, at most 32 characters"
            )
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise HubSetupError(f"user {duplicates[0]!r} is named twice in --users")
    return names


def _repo_root() -> Path:
    """Where ``.venv``, ``.venv-lab``, ``.venv-hub`` and ``.hub`` live: beside the gateway's virtualenv (not
    resolved: a checkout whose ``.venv`` is a link to another's still uses its own ``.venv-hub``)."""
    return Path(sys.prefix).absolute().parent


def hub_python() -> Path:
    """The Python of ``.venv-hub`` (JupyterHub and jupyterhub-idle-culler)."""
    override = os.environ.get(ENV_HUB_PYTHON)
    return Path(override) if override else _repo_root() / ".venv-hub" / "bin" / "python"


def proxy_command() -> Path | None:
    """npm's ``configurable-http-proxy``: the bootstrap's copy under ``.hub/``, else one on PATH."""
    override = os.environ.get(ENV_HUB_PROXY)
    if override:
        return Path(override)
    local = _repo_root() / ".hub" / "node_modules" / ".bin" / "configurable-http-proxy"
    if local.exists():
        return local
    found = shutil.which("configurable-http-proxy")
    return Path(found) if found else None


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


@dataclass
class EmbeddedHub:
    """The files, command and environment of the Hub of one ``notebookos up --hub``."""

    state_dir: Path
    users: list[str]
    port: int
    gateway_url: str
    lab_python: Path
    cull_idle_servers: float = 0.0  # seconds; 0: jupyterhub-idle-culler is not started
    api_port: int = field(default_factory=free_port)
    proxy_api_port: int = field(default_factory=free_port)
    passwords: dict[str, str] = field(default_factory=dict)

    @property
    def dir(self) -> Path:
        return self.state_dir / "hub"

    @property
    def url(self) -> str:
        """The Hub's public URL (its proxy): what users open."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        """The Hub's own API, where the gateway checks users' tokens."""
        return f"http://127.0.0.1:{self.api_port}/hub/api"

    @property
    def passwords_file(self) -> Path:
        return self.dir / "passwords.json"

    def check(self) -> None:
        """HubSetupError when something the Hub needs is missing."""
        if not hub_python().exists():
            raise HubSetupError(
                f"JupyterHub's environment is missing ({hub_python()}); run `make run ARGS=--hub` (it bootstraps it)"
            )
        proxy = proxy_command()
        if proxy is None or not proxy.exists():
            raise HubSetupError(
                "JupyterHub's proxy (npm's configurable-http-proxy) is missing; run `make run ARGS=--hub` "
                f"(the bootstrap installs it under {_repo_root() / '.hub'}) or set {ENV_HUB_PROXY}"
                + (f" (it names {proxy}, which does not exist)" if proxy is not None else "")
            )
        if not self.lab_python.exists():
            raise HubSetupError(
                f"JupyterLab's environment is missing ({self.lab_python}); run `make run ARGS=--hub` (it bootstraps it)"
            )
        probe = subprocess.run(
            [str(self.lab_python), "-c", "import jupyterhub.singleuser"], capture_output=True, timeout=120
        )
        if probe.returncode != 0:
            raise HubSetupError(
                f"JupyterLab's environment ({self.lab_python}) lacks jupyterhub, which runs each user's server; "
                "run `make run ARGS=--hub` (the bootstrap installs requirements/lab.txt)"
            )

    def prepare(self) -> None:
        """Write the Hub's directory: passwords (kept across runs, new users get new ones) and its config."""
        self.dir.mkdir(mode=0o700, exist_ok=True)
        (self.dir / "home").mkdir(mode=0o700, exist_ok=True)
        kept: dict[str, str] = {}
        try:
            loaded = json.loads(self.passwords_file.read_text())
            if isinstance(loaded, dict):
                kept = {str(k): str(v) for k, v in loaded.items()}
        except (OSError, ValueError):
            pass
        self.passwords = {user: kept.get(user) or secrets.token_urlsafe(12) for user in self.users}
        _write_private(self.passwords_file, json.dumps(self.passwords, indent=2))
        _write_private(self.dir / "jupyterhub_config.py", self.config_text())

    def config_text(self) -> str:
        """``jupyterhub_config.py`` for this platform (rewritten at every start)."""
        proxy = proxy_command()
        server_args = [
            f"--gateway-url={self.gateway_url}",
            "--GatewayClient.request_timeout=120",
            "--GatewayClient.allowed_envs=JPY_SESSION_NAME",  # the notebook's path, for the operator dashboard
        ]
        if os.geteuid() == 0:
            server_args.append("--allow-root")
        lines = [
            "# Written by `notebookos up --hub` at every start: edit jupyter_notebookos/embedded/hub.py instead.",
            "c = get_config()  # noqa: F821",
            f"c.JupyterHub.bind_url = {self.url!r}",
            f"c.JupyterHub.hub_bind_url = 'http://127.0.0.1:{self.api_port}'",
            f"c.JupyterHub.db_url = {'sqlite:///' + str(self.dir / 'jupyterhub.sqlite')!r}",
            f"c.JupyterHub.cookie_secret_file = {str(self.dir / 'jupyterhub_cookie_secret')!r}",
            f"c.ConfigurableHTTPProxy.command = [{str(proxy)!r}]",
            f"c.ConfigurableHTTPProxy.api_url = 'http://127.0.0.1:{self.proxy_api_port}'",
            f"c.ConfigurableHTTPProxy.pid_file = {str(self.dir / 'proxy.pid')!r}",
            "c.JupyterHub.authenticator_class = 'jupyter_notebookos.embedded.hub_auth.PasswordFileAuthenticator'",
            f"c.PasswordFileAuthenticator.passwords_file = {str(self.passwords_file)!r}",
            f"c.Authenticator.allowed_users = {set(self.users)!r}",
            "c.JupyterHub.spawner_class = 'simple'",
            f"c.SimpleLocalProcessSpawner.home_dir_template = {str(self.dir / 'home' / '{username}')!r}",
            f"c.Spawner.cmd = [{str(self.lab_python)!r}, '-m', 'jupyterhub.singleuser']",
            f"c.Spawner.args = {server_args!r}",
            "c.Spawner.default_url = '/lab'",
            # Each server's own Hub API token is its gateway token: the gateway asks the Hub whose it is.
            "c.Spawner.environment = {",
            "    'JUPYTER_GATEWAY_AUTH_TOKEN': lambda spawner: spawner.api_token,",
            f"    {ENV_HUB_STATE_DIR!r}: {str(self.state_dir)!r},",
            "}",
            "c.Spawner.start_timeout = 180",
            "c.Spawner.http_timeout = 180",
            # A server's port from below the ephemeral range, as the platform's own (embedded/ports.py): the
            # Spawner's own pick binds port 0, and another process binding port 0 (a replica's ZMQ socket) can
            # take that port before the server, still importing, binds it.
            "from jupyter_notebookos.embedded.ports import free_port",
            "c.Spawner.pre_spawn_hook = lambda spawner: setattr(spawner, 'port', free_port(spawner.ip or '127.0.0.1'))",
        ]
        # The gateway, known to the Hub by name. It needs no Hub token of its own: it checks each user's token by
        # calling GET /hub/api/user with that token, as JupyterHub's HubAuth does.
        services: list[dict[str, object]] = [
            {
                "name": "notebookos-gateway",
                "display": False,
                "info": {"description": "NotebookOS gateway: every user's kernels", "url": self.gateway_url},
            }
        ]
        if self.cull_idle_servers > 0:
            every = max(10, int(self.cull_idle_servers // 4))
            culler = [
                str(hub_python()),
                "-m",
                "jupyterhub_idle_culler",
                f"--timeout={int(self.cull_idle_servers)}",
                f"--cull-every={every}",
            ]
            services.append({"name": "idle-culler", "command": culler})
            lines += [
                "c.JupyterHub.load_roles = [{'name': 'idle-culler', 'services': ['idle-culler'], 'scopes': "
                "['list:users', 'read:users:activity', 'read:servers', 'delete:servers']}]",
            ]
        lines.append(f"c.JupyterHub.services = {services!r}")
        return "\n".join(lines) + "\n"

    def command(self) -> list[str]:
        return [str(hub_python()), "-m", "jupyterhub", "-f", str(self.dir / "jupyterhub_config.py")]

    def env(self) -> dict[str, str]:
        """The Hub's environment: this package importable (for the authenticator), no other venv's variables."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONHOME"))}
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        env[ENV_HUB_STATE_DIR] = str(self.state_dir)  # the proxy and services inherit it: leftovers are found
        # The proxy's API token: the Hub hands it to the proxy it starts.
        env["CONFIGPROXY_AUTH_TOKEN"] = secrets.token_hex(24)
        return env

    def wait_ready(self, process: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
        """Wait until the Hub answers through its proxy; HubSetupError with the end of its log otherwise."""
        from jupyter_notebookos.embedded.platform import tail

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise HubSetupError(f"jupyterhub exited with code {process.returncode}:\n{tail(log)}")
            try:
                with urllib.request.urlopen(f"{self.url}/hub/api", timeout=5) as response:
                    if "version" in json.loads(response.read()):
                        return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.25)
        raise HubSetupError(f"jupyterhub did not answer at {self.url}/hub/api within {timeout:.0f} s:\n{tail(log)}")
