"""``notebookos up``: the whole platform on one machine, in the foreground.

Starts, in order: a local etcd (1 or 3 members), the NotebookOS gateway, and JupyterLab from ``.venv-lab``
pointed at the gateway with ``--gateway-url`` (or, with ``--hub``, a JupyterHub whose users' servers are that
JupyterLab: see :mod:`jupyter_notebookos.embedded.hub`). Ctrl-C or SIGTERM stops everything it started, in reverse
order; the gateway shuts its kernels (and their replica processes) down first.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil
from rich.console import Console

from jupyter_notebookos.embedded.etcd import EtcdCluster, EtcdClusterError
from jupyter_notebookos.embedded.hub import ENV_HUB_STATE_DIR, EmbeddedHub, HubSetupError
from jupyter_notebookos.embedded.ports import exclude, free_port, is_free
from jupyter_notebookos.launchers.hostnet import HostNetwork, HostNetworkError

RUNTIME_FILE = "runtime.json"
#: JupyterLab's root by default: the user's own notebooks, outside the source tree `make run` starts from.
NOTEBOOK_DIR = Path.home() / "notebooks"
#: A child that exits this many times within the window is not restarted again.
MAX_RESTARTS = 3
RESTART_WINDOW_S = 60.0


class PlatformError(RuntimeError):
    """``notebookos up`` cannot go on; the message is one line that says why and what to do."""


@dataclass
class UpOptions:
    """The options of ``notebookos up``."""

    hosts: int = 4
    gpus_per_host: int = 8
    port: int = 8888
    lab_port: int = 8889
    lab: bool = True
    etcd_members: int = 1
    state_dir: Path = field(default_factory=lambda: Path(".state"))
    notebook_dir: Path = field(default_factory=lambda: NOTEBOOK_DIR)  # JupyterLab's root (created if missing)
    autoscale: bool = False
    provisioning_delay: float = 30.0
    gateway_options: list[str] = field(default_factory=list)
    start_timeout: float = 60.0
    hub: bool = False  # a JupyterHub (with its proxy) instead of one JupyterLab
    hub_port: int = 8000
    users: list[str] = field(default_factory=lambda: ["alice", "bob"])
    cull_idle_servers: float = 0.0  # seconds; 0: no jupyterhub-idle-culler
    etcd_history: str = "10m"  # etcd's auto-compaction retention
    host_network: str = "shared"  # or "netns": each simulated host a network namespace (launchers/hostnet.py)


def lab_python() -> Path:
    """The Python of ``.venv-lab`` (JupyterLab 4 + Notebook 7), beside the gateway's ``.venv``."""
    override = os.environ.get("NOTEBOOKOS_LAB_PYTHON")
    if override:
        return Path(override)
    return Path(sys.prefix).resolve().parent / ".venv-lab" / "bin" / "python"


def wait_http(url: str, *, process: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
    """Wait until ``url`` answers (any HTTP status) or fail with the end of ``log`` if ``process`` died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise PlatformError(f"{log.stem} exited with code {process.returncode}:\n{tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers; auth errors are fine here
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    raise PlatformError(f"{log.stem} did not answer at {url} within {timeout:.0f} s:\n{tail(log)}")


def tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file, indented, for error messages."""
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return "    (no log)"
    return "\n".join("    " + line for line in text)


class EmbeddedPlatform:
    """The processes of one ``notebookos up``, started and stopped together."""

    def __init__(self, options: UpOptions, console: Console | None = None) -> None:
        self.options = options
        self.console = console or Console(highlight=False)
        self.state_dir = options.state_dir.resolve()
        self.token = secrets.token_hex(24)
        self.lab_token = secrets.token_hex(24)
        self.etcd: EtcdCluster | None = None
        self.host_network: HostNetwork | None = None
        self.hub: EmbeddedHub | None = None
        self.children: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._lock: IO[str] | None = None
        self._stopping = False

    # -- lifecycle ----------------------------------------------------------------------------------

    def run(self) -> int:
        """Start everything, wait for a signal or a child's death, stop everything. The exit code."""
        began = time.monotonic()
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            self.start()
            self.console.print(f"[green]NotebookOS is up[/] in {time.monotonic() - began:.1f} s")
            self.print_urls()
            return self.wait()
        except KeyboardInterrupt:
            return 0
        finally:
            self.stop()

    def start(self) -> None:
        """Check the preconditions, then start etcd, the gateway and JupyterLab."""
        opts = self.options
        # Everything this platform writes is its own: the state dir holds tokens, etcd's data and every kernel's
        # files. 0711, not 0700: kernels running as their own users pass through it to their own 0700 directory
        # (they cannot list it, and every file in it is 0600).
        os.umask(0o077)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.chmod(0o711)
        self.etcd_password = self._etcd_root_password()
        self._acquire_lock()
        if opts.hub:
            opts.lab = False  # each Hub user gets their own JupyterLab instead
            if opts.hub_port == 0:
                opts.hub_port = free_port()
            self.hub = EmbeddedHub(
                self.state_dir,
                list(opts.users),
                opts.hub_port,
                self.gateway_url_for(opts.port),
                lab_python(),
                opts.cull_idle_servers,
            )
            try:
                self.hub.check()
            except HubSetupError as err:
                raise PlatformError(str(err)) from None
        exclude(*(port for _, port in self._ports()))  # promised to our services: never etcd's
        for name, port in self._ports():
            # is_free binds with SO_REUSEADDR, as the services will: the last run's connections in TIME_WAIT do
            # not make a port busy (without it, a restart soon after a stop was refused half the time).
            if port and not is_free(port):
                raise PlatformError(
                    f"port {port} ({name}) is already in use on 127.0.0.1; choose another with "
                    f"--{name.replace(' ', '-')} or stop what uses it"
                )
        if opts.lab and not lab_python().exists():
            raise PlatformError(
                f"JupyterLab's environment is missing ({lab_python()}); run `make run` (it bootstraps "
                "it), or use --no-lab"
            )
        if opts.port == 0:
            opts.port = free_port()
            if self.hub is not None:
                self.hub.gateway_url = self.gateway_url
        if opts.lab and opts.lab_port == 0:
            opts.lab_port = free_port()

        extra_ips = []
        if opts.host_network == "netns":
            reason = HostNetwork.unavailable()
            if reason:
                raise PlatformError(f"--host-network netns: {reason}")
            self.host_network = HostNetwork.for_state_dir(self.state_dir)
            try:
                self.host_network.ensure_bridge()
            except HostNetworkError as err:
                raise PlatformError(f"--host-network netns: {err}") from None
            extra_ips.append(self.host_network.bridge_ip)  # replicas reach etcd over the bridge
            self.console.print(
                f"hosts: network namespaces on bridge {self.host_network.bridge} ({self.host_network.subnet})"
            )
        try:
            self.etcd = EtcdCluster(
                self.state_dir / "etcd",
                members=opts.etcd_members,
                extra_client_ips=extra_ips,
                compaction_retention=opts.etcd_history,
            )
            self.console.print(f"etcd: starting a {self.etcd.description}")
            self.etcd.start()
        except EtcdClusterError as err:
            raise PlatformError(str(err)) from err

        gateway_log = self.state_dir / "gateway.log"
        gateway = self._spawn("gateway", self._gateway_command(), self._gateway_env(), gateway_log)
        wait_http(f"{self.gateway_url}/api", process=gateway, timeout=opts.start_timeout, log=gateway_log)
        self.console.print(f"gateway: {self.gateway_url} (log {gateway_log})")

        if opts.lab:
            opts.notebook_dir.mkdir(parents=True, exist_ok=True)
            lab_log = self.state_dir / "jupyterlab.log"
            lab = self._spawn("jupyterlab", self.lab_command(), self._lab_env(), lab_log)
            wait_http(f"{self.lab_url}/api", process=lab, timeout=opts.start_timeout, log=lab_log)
            self.console.print(f"jupyterlab: {self.lab_url} (log {lab_log})")
        if self.hub is not None:
            self.hub.prepare()
            hub_log = self.state_dir / "jupyterhub.log"
            hub = self._spawn("jupyterhub", self.hub.command(), self.hub.env(), hub_log)
            try:
                self.hub.wait_ready(hub, timeout=max(opts.start_timeout, 120.0), log=hub_log)
            except HubSetupError as err:
                raise PlatformError(str(err)) from None
            self.console.print(f"jupyterhub: {self.hub.url} (log {hub_log})")
        self._write_runtime_file()

    def wait(self) -> int:
        """Block until a signal arrives (exit 0). A child or etcd member that dies is restarted (the gateway
        re-attaches to the running kernels, whose replicas are detached; a member rejoins its cluster); one that
        keeps dying ends the platform (exit 1)."""
        restarts: dict[str, list[float]] = {}
        while not self._stopping:
            for index, (name, child) in enumerate(self.children):
                if child.poll() is None or self._stopping:
                    continue
                log = self.state_dir / f"{name}.log"
                recent = [t for t in restarts.get(name, []) if time.monotonic() - t < RESTART_WINDOW_S]
                if len(recent) >= MAX_RESTARTS:
                    self.console.print(
                        f"[red]{name} exited with code {child.returncode} {MAX_RESTARTS} times within "
                        f"{RESTART_WINDOW_S:.0f} s; giving up[/]\n{tail(log)}"
                    )
                    return 1
                restarts[name] = [*recent, time.monotonic()]
                self.console.print(f"[yellow]{name} exited with code {child.returncode}; restarting it[/]")
                self.children[index] = (name, self._restart(name))
            if self.etcd is not None and not self._stopping and not self._restart_etcd_members(restarts):
                return 1
            time.sleep(0.2)
        return 0

    def _restart_etcd_members(self, restarts: dict[str, list[float]]) -> bool:
        """Start again, on the same ports and data, every etcd member that exited (as a crash or an OOM kill would
        end it); the cluster takes it back as a follower. False when one keeps dying (the platform ends)."""
        assert self.etcd is not None
        for index, member in enumerate(self.etcd.members):
            if member.running or member.process is None:
                continue
            name = f"etcd member {member.name}"
            recent = [t for t in restarts.get(name, []) if time.monotonic() - t < RESTART_WINDOW_S]
            if len(recent) >= MAX_RESTARTS:
                self.console.print(
                    f"[red]{name} exited {MAX_RESTARTS} times within {RESTART_WINDOW_S:.0f} s; giving up[/]\n"
                    f"{tail(member.log_path)}"
                )
                return False
            restarts[name] = [*recent, time.monotonic()]
            self.console.print(f"[yellow]{name} exited with code {member.process.returncode}; restarting it[/]")
            try:
                self.etcd.start_member(index, wait=False)
            except (OSError, EtcdClusterError) as err:
                self.console.print(f"[red]{name} could not be started again: {err}[/]")
                return False
        return True

    def _restart(self, name: str) -> subprocess.Popen[bytes]:
        log = self.state_dir / f"{name}.log"
        self.children = [(n, c) for n, c in self.children if n != name]  # _spawn appends the new one
        if name == "gateway":
            child = self._spawn(name, self._gateway_command(), self._gateway_env(), log)
            url = f"{self.gateway_url}/api"
        elif name == "jupyterhub" and self.hub is not None:
            child = self._spawn(name, self.hub.command(), self.hub.env(), log)
            url = ""
        else:
            child = self._spawn(name, self.lab_command(), self._lab_env(), log)
            url = f"{self.lab_url}/api"
        self.children = sorted(self.children, key=lambda item: ["gateway", "jupyterlab", "jupyterhub"].index(item[0]))
        try:
            if url:
                wait_http(url, process=child, timeout=self.options.start_timeout, log=log)
            elif self.hub is not None:
                self.hub.wait_ready(child, timeout=max(self.options.start_timeout, 120.0), log=log)
        except (PlatformError, HubSetupError) as err:
            self.console.print(f"[red]{err}[/]")
        return child

    def stop(self) -> None:
        """Stop everything this platform started, newest first; nothing is left behind."""
        self._stopping = True
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for name, child in reversed(self.children):
            self._terminate(name, child)
        self.children.clear()
        self._stop_leftover_replicas()
        if self.etcd is not None:
            self.etcd.stop()
            self.etcd = None
        if self.host_network is not None:
            self.host_network.remove()
            self.host_network = None
        with contextlib.suppress(FileNotFoundError):
            (self.state_dir / RUNTIME_FILE).unlink()
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def _stop_leftover_replicas(self) -> None:
        """Replicas run in their own sessions (they outlive a gateway crash); a gateway that could not
        shut its kernels down (killed, crashed) leaves them to us."""
        leftovers = []
        for process in psutil.process_iter(["pid", "cmdline"]):
            with contextlib.suppress(psutil.Error):
                # The Hub's proxy and users' servers run in sessions of their own too (JupyterHub starts them
                # so); a Hub that was killed leaves them.
                if process.pid != os.getpid() and process.environ().get(ENV_HUB_STATE_DIR) == str(self.state_dir):
                    process.kill()
                    leftovers.append(process)
                    continue
            if "jupyter_notebookos.kernel" not in (process.info.get("cmdline") or []):
                continue
            with contextlib.suppress(psutil.Error):
                if process.environ().get("NOTEBOOKOS_STATE_DIR") == str(self.state_dir):
                    process.kill()
                    leftovers.append(process)
        psutil.wait_procs(leftovers, timeout=5)

    # -- pieces -------------------------------------------------------------------------------------

    @property
    def gateway_url(self) -> str:
        return self.gateway_url_for(self.options.port)

    @staticmethod
    def gateway_url_for(port: int) -> str:
        return f"http://127.0.0.1:{port}"

    @property
    def lab_url(self) -> str:
        return f"http://127.0.0.1:{self.options.lab_port}"

    def _ports(self) -> list[tuple[str, int]]:
        ports = [("port", self.options.port)]
        if self.options.lab:
            ports.append(("lab port", self.options.lab_port))
        if self.hub is not None:
            ports.append(("hub port", self.options.hub_port))
        return ports

    def _acquire_lock(self) -> None:
        lock = open(self.state_dir / "up.lock", "a+")  # noqa: SIM115 - held for the platform's life
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise PlatformError(
                f"another `notebookos up` is running on state dir {self.state_dir}; stop it first or use --state-dir"
            ) from None
        self._lock = lock

    def _etcd_root_password(self) -> str:
        """etcd's root password: kept in the state dir (0600), since etcd's data (auth on) outlives one run."""
        path = self.state_dir / "etcd-root-password"
        with contextlib.suppress(OSError):
            password = path.read_text().strip()
            if password:
                return password
        password = secrets.token_urlsafe(32)
        _write_private(path, password)
        return password

    def _gateway_command(self) -> list[str]:
        opts = self.options
        return [
            sys.executable,
            "-m",
            "jupyter_notebookos.gateway",
            "--ip=127.0.0.1",
            f"--port={opts.port}",
            "--port_retries=0",
            f"--NotebookOSGatewayApp.simulated_hosts={opts.hosts}",
            f"--NotebookOSGatewayApp.gpus_per_host={opts.gpus_per_host}",
            f"--NotebookOSGatewayApp.state_dir={self.state_dir}",
            f"--NotebookOSGatewayApp.autoscale={opts.autoscale}",
            f"--SimulatedHostProvisioner.provisioning_delay={opts.provisioning_delay}",
            f"--LocalLauncher.host_network={opts.host_network}",
            *(f"--{option}" for option in opts.gateway_options),
        ]

    def _gateway_env(self) -> dict[str, str]:
        assert self.etcd is not None
        env = dict(os.environ)
        env.update(
            EG_AUTH_TOKEN=self.token,
            NOTEBOOKOS_ETCD_PASSWORD=self.etcd_password,
            EG_LIST_KERNELS="True",
            # The embedded platform runs every kernel as the user who runs `notebookos up` (no
            # impersonation), so EG's default refusal of `root` would only stop root from using it.
            EG_UNAUTHORIZED_USERS="",
            NOTEBOOKOS_ETCD_ENDPOINTS=",".join(self.etcd.endpoints),
            NOTEBOOKOS_STATE_DIR=str(self.state_dir),
            PYTHONUNBUFFERED="1",
        )
        if self.hub is not None:
            # Users' servers send their own Hub API tokens; the gateway asks the Hub whose they are.
            env["NOTEBOOKOS_HUB_API_URL"] = self.hub.api_url
        return env

    def lab_command(self) -> list[str]:
        """How JupyterLab is started: from ``.venv-lab``, its root the notebook dir, its kernels the gateway's."""
        opts = self.options
        return [
            str(lab_python()),
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={opts.lab_port}",
            "--port-retries=0",
            f"--ServerApp.root_dir={opts.notebook_dir.resolve()}",
            f"--gateway-url={self.gateway_url}",
            "--GatewayClient.request_timeout=120",
            # The notebook's path goes with its kernel's start: the operator dashboard shows which notebook it is.
            "--GatewayClient.allowed_envs=JPY_SESSION_NAME",
            "--allow-root",
        ]

    def _lab_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONHOME"))}
        env["PYTHONUNBUFFERED"] = "1"
        # Tokens in the environment, never on a command line (any user of the machine can read those).
        env["JUPYTER_TOKEN"] = self.lab_token
        env["JUPYTER_GATEWAY_AUTH_TOKEN"] = self.token
        return env

    def _spawn(self, name: str, command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        out = open(log, "ab")  # noqa: SIM115 - the child keeps it
        try:
            child = subprocess.Popen(
                command,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            out.close()
        self.children.append((name, child))
        return child

    def _terminate(self, name: str, child: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGTERM)
            try:
                child.wait(timeout)
            except subprocess.TimeoutExpired:
                self.console.print(f"{name} did not stop within {timeout:.0f} s: killing it")
        # Whatever the child started in its session (kernels, replicas) goes with it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(5)

    def _write_runtime_file(self) -> None:
        runtime = {
            "gateway_url": self.gateway_url,
            "token": self.token,
            "lab_url": f"{self.lab_url}/lab?token={self.lab_token}" if self.options.lab else None,
            "hub_url": self.hub.url if self.hub is not None else None,
            "hub_api_url": self.hub.api_url if self.hub is not None else None,
            "etcd_endpoints": self.etcd.endpoints if self.etcd else [],
            "pid": os.getpid(),
        }
        _write_private(self.state_dir / RUNTIME_FILE, json.dumps(runtime, indent=2))

    def print_urls(self) -> None:
        """What to open: one line each, never wrapped or cut (a URL with its token must be copyable whole)."""
        rows = [("Gateway", self.gateway_url), ("Gateway token", self.token)]
        if self.etcd is not None:
            rows.append(("etcd", f"{','.join(self.etcd.endpoints)} ({self.etcd.description})"))
        if self.options.lab:
            rows.append(("JupyterLab", f"{self.lab_url}/lab?token={self.lab_token}"))
        if self.hub is not None:
            rows.append(("JupyterHub", f"{self.hub.url}/hub/login"))
            rows += [(f"  user {user}", f"password {password}") for user, password in self.hub.passwords.items()]
        rows.append(("Dashboard", f"{self.gateway_url}/notebookos/?token={self.token}"))  # the admin's
        if self.options.lab:
            rows.append(("Notebooks", str(self.options.notebook_dir.resolve())))
        cli = notebookos_command()
        state = "" if self.state_dir == Path(".state").resolve() else f" --state-dir {self.state_dir}"
        rows.append(("Status", f"{cli} status{state}"))
        rows.append(("Stop", f"Ctrl-C, or {cli} down{state}"))
        for label, value in rows:
            self.console.print(f"[bold]{label + ':':<15}[/] {value}", soft_wrap=True, markup=True, highlight=False)
        if self.hub is not None:
            self.console.print(
                "Open the JupyterHub URL, log in as one of the users above (passwords are kept in "
                f"{self.hub.passwords_file}); new notebooks get the [bold]Python 3 (NotebookOS)[/] kernel (1 GPU per "
                "cell; the kernel picker has 2 and 4). Each user's server reaches the gateway with that user's own "
                "JupyterHub token. Ctrl-C stops all.",
                soft_wrap=True,
            )
        elif self.options.lab:
            self.console.print(
                "Open the JupyterLab URL: new notebooks get the [bold]Python 3 (NotebookOS)[/] kernel (1 GPU per cell; "
                "the kernel picker has 2 and 4). Ctrl-C stops all.",
                soft_wrap=True,
            )
        else:
            self.console.print(
                f"Clients: --gateway-url {self.gateway_url} --GatewayClient.auth_token <token>. Ctrl-C stops all.",
                soft_wrap=True,
            )

    def _on_signal(self, signum: int, frame: object) -> None:
        self._stopping = True


def notebookos_command() -> str:
    """How to run this installation's ``notebookos`` from the directory `notebookos up` was started in: plain
    ``notebookos`` when the PATH finds this one, else the console script beside this Python by a path that works
    as typed (``.venv/bin/notebookos`` from the checkout), else ``python -m`` of the CLI."""
    script = Path(sys.executable).parent / "notebookos"
    if not script.exists():
        return f"{sys.executable} -m jupyter_notebookos.cli"
    found = shutil.which("notebookos")
    if found and Path(found).resolve() == script.resolve():
        return "notebookos"
    with contextlib.suppress(ValueError):
        return str(script.absolute().relative_to(Path.cwd()))
    return str(script.absolute())


def _write_private(path: Path, text: str) -> None:
    """Write ``path`` readable by its owner only, atomically (a reader never sees half of it, or a moment
    when it is readable by others)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
