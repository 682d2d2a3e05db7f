"""The NotebookOS JupyterLab extension in Chromium, and the router's waiting notice, against a real platform.

One small platform serves the module: 3 hosts x 1 simulated GPU, so three other kernels holding a cell each are
enough to make every GPU busy. Their cells run until the test releases them (a file per host), so no test depends
on a sleep being long enough on a loaded machine. One JupyterLab and one Chromium serve every browser test.

Screenshots go to ``$NOTEBOOKOS_SCREENSHOTS`` (default ``build/screenshots``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest
from lab_stack import (
    REPO,
    WAIT_FOR_LAB,
    Browser,
    Service,
    missing_browser_tools,
    start_browser,
    start_gateway,
    start_lab,
)
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionComplete

from jupyter_notebookos.client import GatewayClient, KernelConnection
from jupyter_notebookos.embedded.etcd import EtcdCluster
from jupyter_notebookos.gateway.router.waitnotice import WAIT_MIME

KERNEL = "python3-notebookos"
HOSTS = 3
SCREENSHOTS = Path(os.environ.get("NOTEBOOKOS_SCREENSHOTS", REPO / "build" / "screenshots"))


@pytest.fixture(scope="module")
def notebookos_gateway(workdir: Path, etcd: EtcdCluster) -> Iterator[Service]:
    """Our gateway on a small cluster: 3 hosts x 1 GPU (overrides conftest's default-sized one)."""
    env = {
        "NOTEBOOKOS_ETCD_ENDPOINTS": ",".join(etcd.endpoints),
        "NOTEBOOKOS_STATE_DIR": str(workdir / "state"),
        "NOTEBOOKOS_ETCD_PASSWORD": secrets.token_urlsafe(24),
    }
    args = [f"--NotebookOSGatewayApp.simulated_hosts={HOSTS}", "--NotebookOSGatewayApp.gpus_per_host=1"]
    gateway = start_gateway(workdir, "notebookos", extra_env=env, extra_args=args)
    try:
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture(scope="module")
def client(notebookos_gateway: Service) -> GatewayClient:
    """A REST client of the gateway, with its admin token."""
    return GatewayClient(notebookos_gateway.url, notebookos_gateway.token)


@dataclass
class Blockers:
    """Three kernels that can hold every host's GPU with a cell that runs until its host is released."""

    client: GatewayClient
    on_host: dict[str, tuple[KernelConnection, str]]  # host -> (a kernel's websocket, its replica there)
    flags: Path

    def committed(self) -> set[str]:
        hosts = self.client.request("GET", "/api/notebookos/cluster")["hosts"]
        return {h["name"] for h in hosts if h["gpus_committed"]}

    @contextlib.contextmanager
    def holding(self) -> Iterator[Callable[[], str]]:
        """Hold every GPU; yields a function that releases one host's GPU (and returns the host)."""
        for flag in self.flags.glob("release-*"):
            flag.unlink()
        sent: dict[str, str] = {}
        for host, (conn, replica) in self.on_host.items():
            flag = self.flags / f"release-{host}"
            code = f"import os, time\nwhile not os.path.exists({str(flag)!r}):\n    time.sleep(0.02)"
            content = {"code": code, "silent": False}
            sent[host] = conn.send("shell", "execute_request", content, metadata={"notebookos": {"replica": replica}})
        left = sorted(sent)

        def release_one() -> str:
            host = left.pop(0)
            (self.flags / f"release-{host}").touch()
            return host

        try:
            wait_until(lambda: self.committed() == set(sent), 30, "the blockers to hold every GPU")
            yield release_one
        finally:
            for host in sent:
                (self.flags / f"release-{host}").touch()
            for host, msg_id in sent.items():
                self.on_host[host][0].reply(msg_id, timeout=30)


def wait_until(
    check: Callable[[], Any], timeout: float, what: str, interval: float = 0.05, seen: Callable[[], Any] | None = None
) -> Any:
    """Poll ``check`` until it returns something true; fail saying ``what`` was awaited (and what ``seen`` says)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; seen: {seen() if seen else '-'}")
        time.sleep(interval)


@pytest.fixture(scope="module")
def lab_and_page(workdir: Path, notebookos_gateway: Service) -> Iterator[Future[tuple[Service, Browser] | str]]:
    """JupyterLab and one Chromium with Lab open on a new NotebookOS notebook, started in the background (while
    the kernels start): a future of both, or of the reason they cannot run here."""

    def start() -> tuple[Service, Browser] | str:
        reason = missing_browser_tools()
        if reason:
            return reason
        lab = start_lab(workdir, notebookos_gateway)
        try:
            chromium = start_browser(workdir / "chromium")
        except BaseException:
            lab.stop()
            raise
        try:
            driver: Any = chromium.driver
            driver.get(f"{lab.url}/lab/workspaces/nbos-ext?reset&token={lab.token}")
            assert driver.execute_async_script(WAIT_FOR_LAB) is True
            assert driver.execute_async_script(_OPEN_NOTEBOOK, KERNEL) is True
        except BaseException:
            chromium.quit()
            lab.stop()
            raise
        return lab, chromium

    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(start)
        try:
            yield future
        finally:
            with contextlib.suppress(BaseException):
                started = future.result()
                if not isinstance(started, str):
                    started[1].quit()
                    started[0].stop()


@pytest.fixture(scope="module")
def kernels(
    client: GatewayClient, workdir: Path, lab_and_page: Future[tuple[Service, Browser] | str]
) -> Iterator[tuple[Blockers, KernelConnection]]:
    """Three blocker kernels and one more whose cells the tests make wait, started in parallel (and while
    JupyterLab starts)."""
    with ThreadPoolExecutor(4) as pool:
        ids = list(pool.map(lambda _: client.start_kernel(KERNEL), range(HOSTS + 1)))
    conns = [client.connect(kernel_id) for kernel_id in ids]
    try:
        on_host: dict[str, tuple[KernelConnection, str]] = {}
        for kernel_id, conn in zip(ids[:HOSTS], conns[:HOSTS], strict=True):
            free = [r for r in client.notebookos_kernel(kernel_id)["replicas"] if r["host"] not in on_host]
            on_host[free[0]["host"]] = (conn, free[0]["replica_id"])
        flags = workdir / "flags"
        flags.mkdir(exist_ok=True)
        yield Blockers(client, on_host, flags), conns[HOSTS]
    finally:
        for kernel_id, conn in zip(ids, conns, strict=True):
            conn.close()
            with contextlib.suppress(Exception):
                client.shutdown_kernel(kernel_id)


def test_a_waiting_cell_gets_a_live_notice_cleared_before_its_output(
    kernels: tuple[Blockers, KernelConnection],
) -> None:
    """Plain Jupyter messages: display_data, update_display_data, then clear_output before the cell's output;
    nbclient (a client without the extension) ends with only the cell's own output."""
    blockers, conn = kernels
    seen: list[dict[str, Any]] = []

    def read_for(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                seen.append(conn.receive(left))
            except Exception:  # the websocket's timeout: nothing more arrived
                return

    with blockers.holding() as release_one:
        msg_id = conn.send("shell", "execute_request", {"code": "print('ran after the wait')", "silent": False})
        read_for(2.8)
        mine = [m for m in seen if m["parent_header"].get("msg_id") == msg_id]
        kinds = [m["msg_type"] for m in mine]
        assert "display_data" in kinds and "update_display_data" in kinds, kinds
        assert "execute_input" not in kinds and "stream" not in kinds, "the cell ran although every GPU was held"
        shown = next(m for m in mine if m["msg_type"] == "display_data")["content"]
        notice = shown["data"][WAIT_MIME]
        assert notice["gpus"] == 1 and notice["position"] == 1
        assert shown["data"]["text/plain"].startswith("NotebookOS: waiting for 1 GPU, 1st in queue, ")
        display_id = shown["transient"]["display_id"]
        updates = [m["content"] for m in mine if m["msg_type"] == "update_display_data"]
        assert all(u["transient"]["display_id"] == display_id for u in updates)
        assert updates[-1]["data"][WAIT_MIME]["waited_s"] > notice["waited_s"]
        release_one()
        reply = conn.reply(msg_id, timeout=30)
        seen.extend(conn.pending)  # what arrived before the reply, in order
        conn.pending.clear()
        read_for(0.3)  # iopub's last messages (idle) may trail the reply
    assert reply["content"]["status"] == "ok"
    assert reply["metadata"]["notebookos"]["queued_ms"] > 2500
    mine = [m for m in seen if m["parent_header"].get("msg_id") == msg_id and m["channel"] == "iopub"]
    kinds = [m["msg_type"] for m in mine]
    cleared = kinds.index("clear_output")
    assert mine[cleared]["content"] == {"wait": False}
    assert cleared < kinds.index("stream") and "update_display_data" not in kinds[cleared:], kinds

    # nbclient, as papermill runs it, applies the same messages to a cell: only the cell's own output stays.
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('ran after the wait')")])
    runner = NotebookClient(notebook, record_timing=False)
    runner.reset_execution_trackers()  # what execute() and execute_cell() set up before the messages come
    runner.clear_before_next_output = False
    cell = notebook.cells[0]
    for msg in mine:
        with contextlib.suppress(CellExecutionComplete):
            runner.process_message(msg, cell, 0)
    assert [(o["output_type"], o.get("text")) for o in cell.outputs] == [("stream", "ran after the wait\n")]


# -- in JupyterLab ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lab(lab_and_page: Future[tuple[Service, Browser] | str]) -> Service:
    """JupyterLab from .venv-lab on this module's gateway (overrides conftest's: it starts in the background)."""
    started = lab_and_page.result()
    if isinstance(started, str):
        pytest.skip(started)
    return started[0]


@pytest.fixture(scope="module")
def page(lab_and_page: Future[tuple[Service, Browser] | str]) -> Browser:
    """The module's Chromium, with JupyterLab open on a new NotebookOS notebook."""
    started = lab_and_page.result()
    if isinstance(started, str):
        pytest.skip(started)
    return started[1]


def screenshot(browser: Browser, name: str) -> None:
    """Save what the browser shows as ``SCREENSHOTS/name.png``."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    browser.driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))  # type: ignore[attr-defined]


def run_cell(browser: Browser, source: str) -> int:
    """Put ``source`` in a new cell at the end of the notebook, run it (as Shift+Enter), return its index."""
    index = browser.driver.execute_async_script(_RUN_CELL, source)  # type: ignore[attr-defined]
    assert isinstance(index, int), index
    return index


def cell_state(browser: Browser, index: int) -> dict[str, Any]:
    """What the cell at ``index`` shows: outputs, the waiting notice, the footer; and the replies seen."""
    state: dict[str, Any] = browser.driver.execute_script(_CELL_STATE, index)  # type: ignore[attr-defined]
    return state


@pytest.mark.browser
def test_lab_preselects_the_notebookos_kernel_and_shows_its_logo(lab: Service, workdir: Path) -> None:
    """File > New > Notebook starts "Python 3 (NotebookOS)" (the gateway's default kernel) without asking where Lab
    used to ask with "Python 3 (ipykernel)" selected; the kernel picker offers the 2- and 4-GPU kernels too, and the
    launcher puts NotebookOS first, with its logo rather than a letter."""
    chromium = start_browser(workdir / "chromium-picker")
    try:
        driver: Any = chromium.driver
        driver.get(f"{lab.url}/lab/workspaces/nbos-picker?reset&token={lab.token}")
        assert driver.execute_async_script(WAIT_FOR_LAB) is True
        driver.execute_script("window.jupyterapp.commands.execute('launcher:create')")
        cards = wait_until(lambda: driver.execute_script(_LAUNCHER_CARDS), 20, "the launcher's cards")
        notebooks = [c for c in cards if c["category"] == "Notebook"]
        assert notebooks[0]["label"] == "Python 3 (NotebookOS)", cards
        ours = [c for c in notebooks if "NotebookOS" in c["label"]]
        assert len(ours) == 3 and all(c["logo"] and "/logo-" in c["logo"] for c in ours), cards
        wait_until(lambda: all(driver.execute_script(_LAUNCHER_LOGOS_LOADED)), 10, "the logos to load")
        screenshot(chromium, "lab-launcher-notebookos-kernels")
        started = driver.execute_async_script(_NEW_NOTEBOOK_AND_ITS_PICKER)
        assert started["dialogOnCreate"] is None and started["kernel"] == KERNEL, started
        assert started["selected"] == {"id": started["kernelId"]}, started  # the picker marks the kernel it runs
        assert {"Python 3 (NotebookOS, 2 GPUs)", "Python 3 (NotebookOS, 4 GPUs)"} <= set(started["options"]), started
    finally:
        chromium.quit()


def status_item(browser: Browser) -> dict[str, Any] | None:
    """The kernel item as shown (its text and replicas), or None while it is empty."""
    shown: dict[str, Any] | None = browser.driver.execute_script(_STATUS_ITEM)  # type: ignore[attr-defined]
    return shown


@pytest.mark.browser
def test_the_status_item_shows_a_new_kernel_before_its_first_cell(page: Browser) -> None:
    """A notebook just opened on a NotebookOS kernel: its replicas are there before the user runs anything."""
    ran = page.driver.execute_script(  # type: ignore[attr-defined]
        "return window.__nbosPanel.content.widgets.map((c) => c.model.executionCount)"
    )
    assert ran == [None], "a cell ran already: this test must come first"
    status = wait_until(
        lambda: (s := status_item(page)) and len(s["replicas"]) == 3 and s,
        20,
        "the status bar to list the new kernel's 3 replicas",
        seen=lambda: page.driver.execute_script(_STATUS_ITEM_DEBUG),  # type: ignore[attr-defined]
    )
    assert status["text"].startswith("NotebookOS") and "executor" in status["text"]


@pytest.mark.browser
def test_cell_footer_and_status_bar_show_where_the_cell_ran(page: Browser, client: GatewayClient) -> None:
    index = run_cell(page, "print(6 * 7)")
    state = wait_until(
        lambda: (s := cell_state(page, index))["footer"] and s["reply"] and "42" in s["outputs"] and s,
        30,
        "the cell's output and footer",
    )
    meta = state["reply"]["notebookos"]
    footer = state["footer"]
    assert (footer["replica"], footer["host"]) == (meta["replica"], meta["host"])
    assert float(footer["queuedMs"]) == meta["queued_ms"]
    assert f"replica r{meta['replica']} on {meta['host']}" in footer["text"] and "queued" in footer["text"]
    assert footer["text"].startswith(f"1 GPU (device {meta['gpus'][0]})")

    summary = client.notebookos_kernel(state["kernelId"])
    expected = sorted((r["replica_id"], r["host"]) for r in summary["replicas"])
    executor = f"executor r{meta['replica']}"

    def item() -> dict[str, Any] | None:
        shown: dict[str, Any] | None = page.driver.execute_script(_STATUS_ITEM)  # type: ignore[attr-defined]
        if not shown or len(shown["replicas"]) != 3 or executor not in shown["text"]:
            return None
        # Followers apply the cell's state record shortly after the reply: then all three are up to date.
        return shown if all(r["upToDate"] == "true" for r in shown["replicas"]) else None

    status = wait_until(item, 20, f"the status bar to list 3 replicas, all up to date, and {executor}")
    assert sorted((r["replica"], r["host"]) for r in status["replicas"]) == expected
    assert "GPU·s" in status["text"]
    screenshot(page, "lab-cell-footer-and-status-bar")


@pytest.mark.browser
def test_a_cell_waiting_for_gpus_shows_the_notice_then_its_output(
    page: Browser, kernels: tuple[Blockers, KernelConnection]
) -> None:
    blockers, _ = kernels
    with blockers.holding() as release_one:
        index = run_cell(page, "print('my turn')")
        first = wait_until(
            lambda: cell_state(page, index)["notice"],
            20,
            "the waiting notice",
            seen=lambda: (cell_state(page, index), page.driver.execute_script(_DEBUG), blockers.committed()),  # type: ignore[attr-defined]
        )
        assert first.startswith("waiting for 1 GPU, 1st in queue, ")
        # Live: the router updates it (the seconds count up) while the cell waits.
        state = wait_until(
            lambda: (s := cell_state(page, index))["notice"] not in (None, first) and s, 5, "the notice to update"
        )
        assert state["notice"].startswith("waiting for 1 GPU, 1st in queue, ")
        assert state["outputs"] == [state["notice"]], "the notice is the cell's only output while it waits"
        screenshot(page, "lab-cell-waiting-for-gpus")
        host = release_one()
        state = wait_until(
            lambda: (s := cell_state(page, index))["footer"] and "my turn" in s["outputs"] and s, 30, "the cell to run"
        )
    assert state["outputs"] == ["my turn"] and state["notice"] is None
    assert state["footer"]["host"] == host and float(state["footer"]["queuedMs"]) > 1000
    screenshot(page, "lab-cell-after-waiting")


def interrupt(browser: Browser) -> None:
    """Kernel > Interrupt, as Lab's menu does it."""
    done = browser.driver.execute_async_script(_KERNEL_ACTION, "interrupt")  # type: ignore[attr-defined]
    assert done is True, done


@pytest.mark.browser
def test_an_interrupted_waiting_cell_and_the_one_aborted_behind_it_claim_no_replica(
    page: Browser, kernels: tuple[Blockers, KernelConnection]
) -> None:
    """Neither reached a replica: the interrupted one says it did not run and how long it waited, the aborted one
    shows no footer (as a plain kernel shows nothing for it)."""
    blockers, _ = kernels
    with blockers.holding():
        waiting = run_cell(page, "print('never')")
        wait_until(lambda: cell_state(page, waiting)["notice"], 20, "the waiting notice")
        behind = run_cell(page, "print('never either')")
        interrupt(page)
        first = wait_until(lambda: (s := cell_state(page, waiting))["reply"] and s, 30, "the interrupted cell's reply")
        second = wait_until(lambda: (s := cell_state(page, behind))["reply"] and s, 30, "the aborted cell's reply")
    assert first["reply"]["notebookos"]["replica"] is None and second["reply"]["notebookos"]["aborted"] is True
    footer = first["footer"]
    assert footer is not None and footer["ran"] == "false", first
    assert footer["text"].startswith("did not run · queued ") and "?" not in footer["text"], footer
    assert float(footer["queuedMs"]) == first["reply"]["notebookos"]["queued_ms"]
    assert second["footer"] is None, second
    assert first["notice"] is None and "never" not in " ".join(first["outputs"] + second["outputs"])


@pytest.mark.browser
def test_a_running_cell_shows_where_it_runs(page: Browser, client: GatewayClient, workdir: Path) -> None:
    flag = workdir / "flags" / f"release-running-{secrets.token_hex(4)}"
    index = run_cell(page, f"import os, time\nwhile not os.path.exists({str(flag)!r}):\n    time.sleep(0.02)")
    try:
        running = wait_until(
            lambda: (
                (s := cell_state(page, index))["footer"]
                and s["footer"].get("running")
                and " on " in s["footer"]["text"]
                and s
            ),
            20,
            "the running cell's footer to name its replica and host",
            seen=lambda: cell_state(page, index),
        )
        summary = client.notebookos_kernel(running["kernelId"])
        assert summary["state"] == "running"
        host = next(r["host"] for r in summary["replicas"] if r["replica_id"] == summary["executor"])
        assert running["footer"]["text"] == f"running · 1 GPU · replica r{summary['executor']} on {host}"
    finally:
        flag.touch()
    done = wait_until(lambda: (s := cell_state(page, index))["reply"] and s["footer"] and s, 30, "the cell's reply")
    assert "running" not in done["footer"] and done["footer"]["text"].startswith("1 GPU (device ")


@pytest.mark.browser
def test_the_status_item_comes_back_after_a_kernel_restart(page: Browser) -> None:
    """The kernel keeps its id through a restart, while the gateway briefly answers 404 for it (its replicas are
    started again). The page stretches that 404 to 3 s past the restart, longer than a poll of the item, so the
    item surely sees it; it must show the kernel again once the gateway does."""
    driver: Any = page.driver
    wait_until(lambda: status_item(page), 20, "the status item before the restart")
    kernel_id = driver.execute_script("return window.__nbosPanel.sessionContext.session.kernel.id")
    driver.execute_script(_GATEWAY_FORGETS_THE_KERNEL, kernel_id)
    try:
        assert driver.execute_async_script(_KERNEL_ACTION, "restart") is True
        wait_until(lambda: driver.execute_script("return window.__nbosForgotten > 0"), 10, "the item to see a 404")
        wait_until(lambda: not status_item(page), 10, "the item to hide while the kernel is unknown")
    finally:
        driver.execute_script("window.__nbosForget = Date.now() + 3000")
    assert driver.execute_script("return window.__nbosPanel.sessionContext.session.kernel.id") == kernel_id
    time.sleep(3)
    status = wait_until(
        lambda: (s := status_item(page)) and len(s["replicas"]) == 3 and s,
        20,
        "the status item to show the restarted kernel again",
        seen=lambda: driver.execute_script(_STATUS_ITEM_DEBUG),
    )
    assert status["text"].startswith("NotebookOS")
    index = run_cell(page, "print('after the restart')")
    wait_until(
        lambda: (s := cell_state(page, index))["footer"] and "after the restart" in s["outputs"], 30, "a cell to run"
    )


@pytest.mark.browser
def test_notebook7_shows_the_footer_and_the_kernel_item(page: Browser, lab: Service) -> None:
    """Notebook 7 (same server, /notebooks/...) has no status bar: the kernel item sits in the toolbar."""
    driver: Any = page.driver
    path = driver.execute_script("return window.__nbosPanel.context.path")
    driver.execute_async_script("window.__nbosPanel.context.save().then(() => arguments[0](true))")
    driver.get(f"{lab.url}/notebooks/{path}?token={lab.token}")
    assert driver.execute_async_script(_WAIT_FOR_NOTEBOOK7) is True
    index = run_cell(page, "print('in notebook 7')")
    state = wait_until(
        lambda: (s := cell_state(page, index))["footer"] and "in notebook 7" in s["outputs"] and s,
        30,
        "the output and footer in Notebook 7",
    )
    assert state["footer"]["replica"] == state["reply"]["notebookos"]["replica"]
    status = wait_until(
        lambda: (s := driver.execute_script(_STATUS_ITEM)) and len(s["replicas"]) == 3 and s,
        15,
        "the toolbar's kernel item to list 3 replicas",
    )
    assert status["text"].startswith("NotebookOS")
    screenshot(page, "notebook7-footer-and-kernel-item")


# JavaScript run in the page (Lab's and Notebook 7's commands do the clicking; the results are read from the DOM).
# _WATCH_REPLIES records every execute_reply's metadata, independently of the extension.
_WATCH_REPLIES = """
window.__nbosReplies = {};
panel.sessionContext.session.kernel.anyMessage.connect((_, {msg, direction}) => {
  if (direction === 'recv' && msg.header.msg_type === 'execute_reply') {
    window.__nbosReplies[msg.parent_header.msg_id] = msg.metadata;
  } else if (direction === 'send' && msg.header.msg_type === 'execute_request') {
    window.__nbosRequests = {...(window.__nbosRequests || {}), [msg.metadata.cellId]: msg.header.msg_id};
  }
});
"""

_OPEN_NOTEBOOK = (
    """
const done = arguments[arguments.length - 1];
const app = window.jupyterapp;
app.commands.execute('notebook:create-new', {kernelName: arguments[0]}).then(async (panel) => {
  window.__nbosPanel = panel;
  await panel.context.ready;
  await panel.sessionContext.ready;
"""
    + _WATCH_REPLIES
    + """
  done(true);
}, (e) => done('could not open a notebook: ' + e));
"""
)

_WAIT_FOR_NOTEBOOK7 = (
    """
const done = arguments[arguments.length - 1];
const started = Date.now();
(async function poll() {
  const app = window.jupyterapp;
  const panel = app && app.shell.currentWidget;
  if (panel && panel.sessionContext) {
    await app.restored;
    await panel.context.ready;
    await panel.sessionContext.ready;
    window.__nbosPanel = panel;
"""
    + _WATCH_REPLIES
    + """
    done(true);
  } else if (Date.now() - started > 55000) {
    done('Notebook 7 never showed the notebook');
  } else {
    setTimeout(poll, 100);
  }
})();
"""
)

_RUN_CELL = """
const done = arguments[arguments.length - 1];
const app = window.jupyterapp;
const notebook = window.__nbosPanel.content;
(async () => {
  let cell = notebook.widgets[notebook.widgets.length - 1];
  if (cell.model.sharedModel.getSource() !== '') {
    notebook.activeCellIndex = notebook.widgets.length - 1;
    await app.commands.execute('notebook:insert-cell-below');
    cell = notebook.activeCell;
  }
  cell.model.sharedModel.setSource(arguments[0]);
  notebook.activeCellIndex = notebook.widgets.indexOf(cell);
  notebook.activate();
  app.commands.execute('notebook:run-cell');
  done(notebook.widgets.indexOf(cell));
})().catch((e) => done('could not run the cell: ' + e));
"""

_CELL_STATE = """
const panel = window.__nbosPanel;
const cell = panel.content.widgets[arguments[0]];
const footer = cell.node.querySelector('.jp-nbos-CellFooter');
const notice = cell.node.querySelector('.jp-nbos-WaitNotice');
const requested = (window.__nbosRequests || {})[cell.model.id];
return {
  kernelId: panel.sessionContext.session.kernel.id,
  outputs: Array.from(cell.node.querySelectorAll('.jp-OutputArea-output')).map((e) => e.innerText.trim()),
  notice: notice ? notice.innerText.trim() : null,
  footer: footer && footer.innerText.trim() ? {text: footer.innerText.trim(), ...footer.dataset} : null,
  reply: requested ? (window.__nbosReplies[requested] || null) : null,
};
"""

_STATUS_ITEM = """
const item = document.querySelector('.jp-nbos-KernelStatus');
if (!item || !item.innerText.trim()) return null;
return {
  text: item.innerText.trim(),
  replicas: Array.from(item.querySelectorAll('.jp-nbos-replica')).map((e) => ({...e.dataset})),
};
"""

# What the notebook looks like, for a failure message.
_DEBUG = """
const panel = window.__nbosPanel;
return {
  requests: window.__nbosRequests, replies: Object.keys(window.__nbosReplies || {}),
  status: panel.sessionContext.kernelDisplayStatus,
  cells: panel.content.widgets.map((c) => [c.model.sharedModel.getSource(), c.model.executionCount, c.model.id]),
  outputs: panel.content.widgets.map((c) => (c.node.querySelector('.jp-OutputArea') || {}).innerHTML),
};
"""

# File > New > Notebook (no kernel named): the kernel it starts, or the dialog that asks instead; then Kernel >
# Change Kernel: what its picker selects (its option's value) and offers (cancelled). The notebook's kernel is shut
# down at the end.
_NEW_NOTEBOOK_AND_ITS_PICKER = """
const done = arguments[arguments.length - 1];
const app = window.jupyterapp;
const dialogSelect = () => document.querySelector('.jp-Dialog select');
const until = (check) => new Promise((resolve) => {
  const started = Date.now();
  (function poll() {
    const value = check();
    if (value || Date.now() - started > 30000) resolve(value);
    else setTimeout(poll, 100);
  })();
});
(async () => {
  const panel = await app.commands.execute('notebook:create-new');
  const result = {};
  const first = await until(() => dialogSelect() || (panel.sessionContext.session?.kernel && 'kernel'));
  if (first !== 'kernel') {
    result.dialogOnCreate = first ? first.options[first.selectedIndex].text : 'nothing within 30 s';
    document.querySelector('.jp-Dialog .jp-mod-reject')?.click();
    return done(result);
  }
  result.dialogOnCreate = null;
  result.kernel = panel.sessionContext.session.kernel.name;
  await panel.sessionContext.ready;
  await app.serviceManager.kernels.refreshRunning();  // (the picker marks the running kernel from this list)
  app.commands.execute('kernelmenu:change');
  const select = await until(dialogSelect);
  result.selected = select ? JSON.parse(select.value) : null;
  result.kernelId = panel.sessionContext.session.kernel.id;
  result.options = select ? Array.from(select.options).map((o) => o.text) : [];
  document.querySelector('.jp-Dialog .jp-mod-reject')?.click();
  await panel.sessionContext.shutdown();
  panel.dispose();
  done(result);
})().catch((e) => done({error: String(e)}));
"""

# The launcher's cards: section, label and logo.
_LAUNCHER_CARDS = """
return Array.from(document.querySelectorAll('.jp-Launcher-section')).flatMap((section) => {
  const category = section.querySelector('.jp-Launcher-sectionTitle').innerText.trim();
  return Array.from(section.querySelectorAll('.jp-LauncherCard')).map((card) => {
    const img = card.querySelector('img');
    return {category, label: card.querySelector('.jp-LauncherCard-label').innerText.trim(),
            logo: img ? img.getAttribute('src') : null};
  });
});
"""

# Whether each launcher card's logo image has loaded (a letter is shown where a kernelspec has none).
_LAUNCHER_LOGOS_LOADED = """
return Array.from(document.querySelectorAll('.jp-LauncherCard img')).map((img) => img.complete && img.naturalWidth > 0);
"""

# Lab's Kernel menu: interrupt or restart (without the confirmation dialog) the notebook's kernel.
_KERNEL_ACTION = """
const done = arguments[arguments.length - 1];
const kernel = window.__nbosPanel.sessionContext.session.kernel;
(arguments[0] === 'restart' ? kernel.restart() : kernel.interrupt()).then(() => done(true), (e) => done(String(e)));
"""

# The gateway during a restart, slowed down: GET /notebookos/kernels/<id> answers 404 from now until
# window.__nbosForget (a time; until then: for good), counted in window.__nbosForgotten.
_GATEWAY_FORGETS_THE_KERNEL = """
const kernelId = arguments[0];
const fetchBefore = window.fetch;
window.__nbosForget = Infinity;
window.__nbosForgotten = 0;
window.fetch = (input, init) => {
  const url = typeof input === 'string' ? input : input.url;
  if (url.includes('/notebookos/kernels/' + kernelId) && Date.now() < window.__nbosForget) {
    window.__nbosForgotten += 1;
    return Promise.resolve(new Response('{"message": "no NotebookOS kernel"}', {status: 404}));
  }
  return fetchBefore(input, init);
};
"""

# Why the kernel item is empty, for a failure message.
_STATUS_ITEM_DEBUG = """
const panel = window.__nbosPanel;
const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
const item = document.querySelector('.jp-nbos-KernelStatus');
return {
  kernel: kernel && [kernel.id, kernel.name, kernel.status, kernel.connectionStatus],
  item: item ? item.outerHTML : null, hidden: document.hidden,
};
"""
