"""Start a gateway, JupyterLab (from .venv-lab) and headless Chromium for the browser tests.

Everything binds 127.0.0.1 on free ports, lives in temporary directories and runs in its own process
group, so teardown can kill a whole tree. Also usable from a shell to compare gateways by hand:

    .venv/bin/python tests/browser/lab_stack.py --gateway stock      # Enterprise Gateway 3.3 as released
    .venv/bin/python tests/browser/lab_stack.py --gateway notebookos # our channels handler
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import requests

from jupyter_notebookos.embedded.runner import free_port

REPO = Path(__file__).resolve().parents[2]
GATEWAY_PYTHON = REPO / ".venv" / "bin" / "python"
LAB_JUPYTER = REPO / ".venv-lab" / "bin" / "jupyter"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
LAUNCHER = Path(__file__).resolve().parent / "gateway_launcher.py"


def missing_browser_tools() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    for path, what in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromedriver")):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return f"{what} not found (install Debian's chromium and chromium-driver)"
    if not LAB_JUPYTER.exists():
        return f"JupyterLab environment missing: {LAB_JUPYTER} (run scripts/bootstrap.sh --browser)"
    return None


@dataclass
class Service:
    """A process group we started, with its log file."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    url: str = ""
    token: str = ""

    def log_text(self) -> str:
        """The process's combined stdout and stderr so far."""
        return self.log_path.read_text(errors="replace")

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left after `grace` seconds."""
        descendants = _descendants(self.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace)
        _kill_survivors(descendants, grace)


def _descendants(pid: int) -> list[psutil.Process]:
    """All processes below `pid`, including those in other process groups (EG gives kernels their own)."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _kill_survivors(processes: list[psutil.Process], grace: float) -> None:
    """SIGKILL those of `processes` that are still running (psutil checks they are the same processes)."""
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(processes, timeout=grace)


def _spawn(name: str, argv: list[str], env: dict[str, str], workdir: Path) -> Service:
    log_path = workdir / f"{name}.log"
    log = open(log_path, "wb")  # noqa: SIM115 - the child owns it; closed when we return
    try:
        proc = subprocess.Popen(
            argv, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    finally:
        log.close()
    return Service(name=name, proc=proc, log_path=log_path)


def _wait_http(service: Service, url: str, timeout: float, headers: dict[str, str] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if service.proc.poll() is not None:
            raise RuntimeError(f"{service.name} exited with {service.proc.returncode}:\n{service.log_text()}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(url, headers=headers, timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{service.name} did not answer {url} within {timeout} s:\n{service.log_text()}")


def isolated_env(home: Path) -> dict[str, str]:
    """Environment with Jupyter's config, data and runtime dirs inside `home`."""
    env = dict(os.environ)
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        path = home / var.lower()
        path.mkdir(parents=True, exist_ok=True)
        env[var] = str(path)
    env.pop("JUPYTER_PATH", None)
    env.pop("JUPYTER_CONFIG_PATH", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start_gateway(
    workdir: Path,
    kind: str = "notebookos",
    token: str | None = None,
    extra_env: dict[str, str] | None = None,
    extra_args: list[str] | None = None,
) -> Service:
    """Start a gateway on a free port; `kind` is one of gateway_launcher.KINDS; `extra_args` go to the app
    (e.g. ``--NotebookOSGatewayApp.simulated_hosts=3``)."""
    token = secrets.token_hex(16) if token is None else token
    port = free_port()
    env = isolated_env(workdir / "gateway-home")
    # EG refuses kernels for root by default; list kernels so the tests can see them.
    env["EG_UNAUTHORIZED_USERS"] = "nobody-at-all"
    env["EG_LIST_KERNELS"] = "True"
    argv = [str(GATEWAY_PYTHON), str(LAUNCHER), "--gateway", kind]
    env["EG_AUTH_TOKEN"] = token
    env.update(extra_env or {})
    argv += ["--ip=127.0.0.1", f"--port={port}", "--port_retries=0", *(extra_args or [])]
    service = _spawn(f"gateway-{kind}", argv, env, workdir)
    service.url, service.token = f"http://127.0.0.1:{port}", token
    try:
        _wait_http(service, f"{service.url}/api/kernelspecs", 60, {"Authorization": f"token {token}"})
    except BaseException:
        service.stop()
        raise
    return service


def start_lab(workdir: Path, gateway: Service) -> Service:
    """Start JupyterLab from .venv-lab on a free port, pointed at `gateway` with --gateway-url."""
    token = secrets.token_hex(16)
    port = free_port()
    env = isolated_env(workdir / "lab-home")
    root = workdir / "notebooks"
    root.mkdir(exist_ok=True)
    argv = [
        str(LAB_JUPYTER), "lab", "--no-browser", "--allow-root", "--ip=127.0.0.1", f"--port={port}",
        "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        f"--gateway-url={gateway.url}", f"--GatewayClient.auth_token={gateway.token}",
        "--LabApp.expose_app_in_browser=True", "--JupyterNotebookApp.expose_app_in_browser=True",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]  # fmt: skip
    service = _spawn("lab", argv, env, workdir)
    service.url, service.token = f"http://127.0.0.1:{port}", token
    try:
        _wait_http(service, f"{service.url}/api/status?token={token}", 90)
    except BaseException:
        service.stop()
        raise
    return service


@dataclass
class Browser:
    """A headless Chromium driven by chromedriver, each in its own process group."""

    driver: object
    chromedriver: subprocess.Popen[bytes] | None = None
    profile: Path = field(default_factory=Path)

    def quit(self) -> None:
        """Close Chromium and chromedriver, and kill anything they left behind."""
        descendants = _descendants(self.chromedriver.pid) if self.chromedriver is not None else []
        with contextlib.suppress(Exception):
            self.driver.quit()  # type: ignore[attr-defined]
        if self.chromedriver is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.chromedriver.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.chromedriver.wait(timeout=5)
        _kill_survivors(descendants, 5)


def start_browser(workdir: Path) -> Browser:
    """Headless Chromium (flags that work as root), driven through chromedriver on a free port."""
    from selenium import webdriver

    profile = workdir / "chromium-profile"
    profile.mkdir(parents=True, exist_ok=True)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", "--window-size=1400,1000", f"--user-data-dir={profile}",
    ):  # fmt: skip
        options.add_argument(flag)
    port = free_port()
    # chromedriver in its own session: Chromium is its child, so killpg reaps both.
    driver_proc = subprocess.Popen(
        [CHROMEDRIVER, f"--port={port}"],
        stdout=open(workdir / "chromedriver.log", "wb"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if time.monotonic() > deadline or driver_proc.poll() is not None:
                raise RuntimeError("chromedriver did not start")
            time.sleep(0.1)
        driver = webdriver.Remote(command_executor=f"http://127.0.0.1:{port}", options=options)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver_proc.pid, signal.SIGKILL)
        driver_proc.wait(timeout=5)
        raise
    driver.set_script_timeout(60)
    return Browser(driver=driver, chromedriver=driver_proc, profile=profile)


# JavaScript run in the page. Lab commands do the clicking; the output is read from the DOM.
# WAIT_FOR_LAB: until Lab (or Notebook 7) has restored its layout and can make notebooks.
WAIT_FOR_LAB = """
const done = arguments[arguments.length - 1];
const started = Date.now();
(function poll() {
  const app = window.jupyterapp;
  if (app && app.commands.hasCommand('notebook:create-new')) {
    app.restored.then(() => done(true), (e) => done('restore failed: ' + e));
  } else if (Date.now() - started > 55000) {
    done('window.jupyterapp never appeared');
  } else {
    setTimeout(poll, 100);
  }
})();
"""

_OPEN_NOTEBOOK_AND_RUN = """
const [kernelName, source] = [arguments[0], arguments[1]];
const done = arguments[arguments.length - 1];
const app = window.jupyterapp;
window.__nbosOpened = performance.now();
app.commands.execute('notebook:create-new', {kernelName: kernelName}).then(async (panel) => {
  window.__nbosPanel = panel;
  await panel.context.ready;
  // The session and its kernel exist (they may still be connecting: Lab queues the request until then).
  // Running earlier can race Lab's own kernel swap when a new notebook opens, which drops the request in
  // the browser; no user types a cell that fast.
  await panel.sessionContext.ready;
  window.__nbosKernelAtRun = panel.sessionContext.session && panel.sessionContext.session.kernel.id;
  const cell = panel.content.activeCell;
  cell.model.sharedModel.setSource(source);
  panel.content.activate();
  // Same as Shift+Enter on the active cell. Its promise settles only when the cell has run, which is
  // what we time from Python, so do not wait for it here.
  app.commands.execute('notebook:run-cell');
  done(true);
}, (e) => done('could not open a notebook: ' + e));
"""

_PAGE_STATE = """
const app = window.jupyterapp;
const widget = app.shell.currentWidget;
const panel = window.__nbosPanel;
return {
  current: widget ? widget.title.label : null,
  notebook: panel ? panel.title.label : null,
  kernel: panel ? panel.sessionContext.kernelDisplayStatus : null,
  kernelId: panel && panel.sessionContext.session ? panel.sessionContext.session.kernel.id : null,
  kernelAtRun: window.__nbosKernelAtRun,
  cells: panel ? panel.content.widgets.map((c) => [c.model.sharedModel.getSource(), c.model.executionCount]) : null,
  prompts: Array.from(document.querySelectorAll('.jp-InputPrompt')).map((e) => e.innerText),
};
"""

_OUTPUT_TEXTS = """
return Array.from(document.querySelectorAll(
  '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell .jp-OutputArea-output'
)).map((e) => e.innerText.trim());
"""


def time_first_output(browser: Browser, lab: Service, expected: str = "2", timeout: float = 60.0) -> float:
    """Open a new python3 notebook in Lab, run `print(1+1)`, and return the seconds until `expected`
    shows in the cell's output area (measured from the moment the notebook is asked for)."""
    driver = browser.driver
    # A fresh, empty workspace: nothing restored from an earlier run competes with the new notebook.
    workspace = f"nbos-{secrets.token_hex(4)}"
    driver.get(f"{lab.url}/lab/workspaces/{workspace}?reset&token={lab.token}")  # type: ignore[attr-defined]
    ready = driver.execute_async_script(WAIT_FOR_LAB)  # type: ignore[attr-defined]
    if ready is not True:
        raise RuntimeError(f"JupyterLab did not start in the browser: {ready}")
    started = time.monotonic()
    opened = driver.execute_async_script(_OPEN_NOTEBOOK_AND_RUN, "python3", "print(1+1)")  # type: ignore[attr-defined]
    if opened is not True:
        raise RuntimeError(str(opened))
    while time.monotonic() - started < timeout:
        if expected in driver.execute_script(_OUTPUT_TEXTS):  # type: ignore[attr-defined]
            return time.monotonic() - started
        time.sleep(0.05)
    state = driver.execute_script(_PAGE_STATE)  # type: ignore[attr-defined]
    raise TimeoutError(f"no output {expected!r} within {timeout} s; page: {state}")


def main() -> int:
    """Measure the time to first output in a browser against one gateway, printing the logs' tails."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateway", choices=("stock", "handler", "notebookos"), default="handler")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the output")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="nbos-lab-"))
    services: list[Service] = []
    browser = None
    try:
        gateway = start_gateway(workdir, args.gateway)
        services.append(gateway)
        lab = start_lab(workdir, gateway)
        services.append(lab)
        for run in range(args.runs):
            browser = start_browser(workdir / f"run{run}")
            print(
                f"{args.gateway}: first output after {time_first_output(browser, lab, timeout=args.timeout):.1f} s",
                flush=True,
            )
            browser.quit()
            browser = None
    finally:
        if browser is not None:
            browser.quit()
        for service in reversed(services):
            service.stop()
        print(f"logs in {workdir}" if args.keep else "", file=sys.stderr)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
