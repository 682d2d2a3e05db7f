"""`notebookos up` and `notebookos status` end to end: real etcd, real gateway, real kernels."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import requests
from support import NOTEBOOKOS, REPO, Platform, free_port, processes_of, start_platform, stop_platform, wait_for

from jupyter_notebookos.client import GatewayClient, GatewayError


def run_cli(*args: str, timeout: float = 60.0, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*NOTEBOOKOS, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


def test_cluster_lists_the_configured_hosts_and_gpus(tmp_path: Path) -> None:
    platform = start_platform(tmp_path / "state", "--hosts", "3", "--gpus-per-host", "2")
    try:
        cluster = platform.client.request("GET", "/api/notebookos/cluster")
        assert [h["name"] for h in cluster["hosts"]] == ["host-0", "host-1", "host-2"]
        assert all(h["gpus"] == 2 and h["simulated"] and h["gpus_committed"] == 0 for h in cluster["hosts"])
        assert cluster["kernels"] == []
        # The same token guards our API and EG's; without it both refuse.
        assert requests.get(platform.url + "/api/notebookos/cluster", timeout=10).status_code == 401
        assert requests.get(platform.url + "/api/kernelspecs", timeout=10).status_code == 401
        metrics = platform.client.http.get(platform.url + "/metrics", timeout=10).text
        assert 'notebookos_gpus{host="host-2",state="idle"} 2.0' in metrics
        assert "notebookos_hosts 3.0" in metrics

        status = run_cli("status", "--state-dir", str(platform.state_dir))
        assert status.returncode == 0, status.stderr
        assert "host-2" in status.stdout and "simulated" in status.stdout
        as_json = json.loads(run_cli("status", "--state-dir", str(platform.state_dir), "--json").stdout)
        assert len(as_json["hosts"]) == 3
    finally:
        stop_platform(platform)


def test_the_notebookos_kernel_is_the_default_and_comes_in_1_2_and_4_gpus(shared_up: Platform) -> None:
    """Clients preselect the gateway's default kernel (JupyterLab's kernel picker, a new notebook): NotebookOS's.
    Each GPU count is a kernelspec of its own, with a logo, so a user picks it from the UI."""
    client = shared_up.client
    specs = client.request("GET", "/api/kernelspecs")
    assert specs["default"] == "python3-notebookos"
    for name, gpus, display in (
        ("python3-notebookos", 1, "Python 3 (NotebookOS)"),
        ("python3-notebookos-2gpus", 2, "Python 3 (NotebookOS, 2 GPUs)"),
        ("python3-notebookos-4gpus", 4, "Python 3 (NotebookOS, 4 GPUs)"),
    ):
        spec = specs["kernelspecs"][name]
        assert spec["spec"]["display_name"] == display
        assert {"logo-32x32", "logo-64x64", "logo-svg"} <= set(spec["resources"]), spec["resources"]
        logo = client.http.get(shared_up.url + spec["resources"]["logo-64x64"], timeout=10)
        assert logo.status_code == 200 and logo.content[:4] == b"\x89PNG"
        if gpus > 2:  # this platform's hosts have 2 GPUs: the refusal names what the kernelspec asked for
            with pytest.raises(GatewayError, match=f"asks for {gpus} GPUs but the largest host has 2"):
                client.start_kernel(name)
            continue
        kernel_id = client.start_kernel(name)
        try:
            assert client.notebookos_kernel(kernel_id)["gpus"] == gpus
        finally:
            client.shutdown_kernel(kernel_id)


def test_plain_kernel_runs_through_rest_and_websocket(shared_up: Platform) -> None:
    client = shared_up.client
    specs = client.request("GET", "/api/kernelspecs")["kernelspecs"]
    assert "python3" in specs and specs["python3-notebookos"]["spec"]["display_name"] == "Python 3 (NotebookOS)"
    kernel_id = client.start_kernel("python3")
    try:
        with client.connect(kernel_id) as conn:
            result = conn.execute("1+1")
            assert result.status == "ok"
            assert result.result_text() == "2"
            printed = conn.execute("print('hello from a plain kernel')")
            assert printed.stdout == "hello from a plain kernel\n"
    finally:
        client.shutdown_kernel(kernel_id)


def test_down_stops_everything_up_started(tmp_path: Path) -> None:
    platform = start_platform(tmp_path / "state", "--etcd-members", "3")
    client = platform.client
    kernel_id = client.start_kernel("python3")
    with client.connect(kernel_id) as conn:
        assert conn.execute("2*21").result_text() == "42"
    started = platform.descendants() + processes_of(platform.state_dir)
    assert any("etcd" in " ".join(p.cmdline()) for p in started)
    assert any("ipykernel" in " ".join(p.cmdline()) for p in started)
    down = run_cli("down", "--state-dir", str(platform.state_dir))  # SIGTERM to `notebookos up`, then waits
    assert down.returncode == 0, down.stderr
    assert f"stopped `notebookos up` (pid {platform.process.pid}" in down.stdout
    assert platform.process.wait(10) == 0
    _, alive = psutil.wait_procs(started, timeout=10)
    assert alive == [], f"left behind: {[p.cmdline() for p in alive]}"
    assert not (platform.state_dir / "runtime.json").exists()
    again = run_cli("down", "--state-dir", str(platform.state_dir))
    assert again.returncode == 1 and "no running `notebookos up`" in again.stderr


def test_second_up_on_the_same_state_dir_and_a_taken_port_fail_clearly(up: Platform) -> None:
    second = run_cli("up", "--no-lab", "--state-dir", str(up.state_dir), "--port", str(free_port()))
    assert second.returncode == 1
    assert "another `notebookos up` is running on state dir" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1

    taken = up.url.rsplit(":", 1)[1]
    other = run_cli("up", "--no-lab", "--state-dir", str(up.state_dir.parent / "other"), "--port", taken)
    assert other.returncode == 1
    assert f"port {taken} (port) is already in use" in other.stderr
    assert len(other.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["up", "--bogus"], "unrecognized arguments: --bogus"),
        (["up", "--hosts", "0"], "argument --hosts: must be at least 1, not 0"),
        (["up", "--hosts", "many"], "argument --hosts: 'many' is not a whole number"),
        (["up", "--gpus-per-host", "-1"], "argument --gpus-per-host: must be 0 or more, not -1"),
        (["up", "--etcd-members", "2"], "argument --etcd-members: invalid choice: 2"),
        (["up", "--port", "70000"], "70000 is not a TCP port"),
        (["up", "--no-lab", "--lab-port", "9999"], "not allowed with argument"),
    ],
)
def test_bad_cli_input_is_refused_clearly(args: list[str], expected: str) -> None:
    result = run_cli(*args)
    assert result.returncode == 2
    assert expected in result.stderr


def test_missing_etcd_binary_is_a_clear_error(tmp_path: Path) -> None:
    env = dict(os.environ, NOTEBOOKOS_ETCD_BINARY=str(tmp_path / "no-etcd-here"))
    result = run_cli("up", "--no-lab", "--state-dir", str(tmp_path / "s"), "--port", str(free_port()), env=env)
    assert result.returncode == 1
    assert "etcd" in result.stderr and "etcd-server" in result.stderr
    assert "Traceback" not in result.stderr


def test_invalid_gateway_config_is_refused(tmp_path: Path) -> None:
    env = dict(os.environ, NOTEBOOKOS_ETCD_ENDPOINTS="127.0.0.1:1")
    result = subprocess.run(
        [
            *NOTEBOOKOS[:1],
            "-m",
            "jupyter_notebookos.gateway",
            "--port",
            str(free_port()),
            "--NotebookOSGatewayApp.gpus_per_host=-3",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode != 0
    assert "gpus_per_host must be 0 or more, not -3" in result.stderr


def _gateway_alone(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run the gateway by itself (no `notebookos up`) until it exits."""
    return subprocess.run(
        [*NOTEBOOKOS[:1], "-m", "jupyter_notebookos.gateway", "--port", str(free_port()), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(env, NOTEBOOKOS_STATE_DIR=str(tmp_path)),
        cwd=tmp_path,
    )


def test_gateway_without_etcd_exits_with_a_clear_message(tmp_path: Path) -> None:
    dead = free_port()
    began = time.monotonic()
    env = dict(os.environ, NOTEBOOKOS_ETCD_ENDPOINTS=f"127.0.0.1:{dead}", NOTEBOOKOS_ETCD_PASSWORD="unchecked")
    result = _gateway_alone(tmp_path, env, "--NotebookOSGatewayApp.etcd_timeout=2")
    assert result.returncode == 1
    assert "NotebookOS could not start" in result.stderr and f"127.0.0.1:{dead}" in result.stderr
    assert "Traceback" not in result.stderr
    assert time.monotonic() - began < 30


def test_gateway_without_an_etcd_password_says_how_to_give_one(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTEBOOKOS_ETCD_")}
    result = _gateway_alone(tmp_path, dict(env, NOTEBOOKOS_ETCD_ENDPOINTS=f"127.0.0.1:{free_port()}"))
    assert result.returncode == 1
    assert "NotebookOS could not start" in result.stderr and "NOTEBOOKOS_ETCD_PASSWORD" in result.stderr
    assert "Traceback" not in result.stderr


def test_status_without_a_platform_says_so(tmp_path: Path) -> None:
    result = run_cli("status", "--state-dir", str(tmp_path))
    assert result.returncode == 1
    assert "no running `notebookos up`" in result.stderr
    unreachable = run_cli("status", "--url", f"http://127.0.0.1:{free_port()}")
    assert unreachable.returncode == 1 and "cannot reach the gateway" in unreachable.stderr


def test_the_startup_output_gives_commands_and_urls_that_work_as_printed(shared_up: Platform) -> None:
    """What `notebookos up` prints is what a new user copies: each command runs as printed from the directory
    `up` was started in (its console script is not on the PATH: .venv/bin), and the dashboard's URL opens it."""
    said = wait_for(lambda: "Dashboard:" in (text := shared_up.log.read_text()) and text, 30, "the URLs")
    printed = dict(re.findall(r"^(\w[\w ]*?): +(.+)$", said, re.MULTILINE))
    status = subprocess.run(printed["Status"], shell=True, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert status.returncode == 0 and "host-3" in status.stdout, (printed["Status"], status.stderr)
    assert printed["Stop"].startswith("Ctrl-C, or ") and printed["Stop"].split("or ", 1)[1].endswith(
        f"down --state-dir {shared_up.state_dir}"
    )
    dashboard = requests.get(printed["Dashboard"], timeout=30)
    assert printed["Dashboard"] == f"{shared_up.url}/notebookos/?token={shared_up.token}"
    assert dashboard.status_code == 200 and "NotebookOS cluster" in dashboard.text


def test_jupyterlab_opens_a_notebooks_directory_outside_the_source_tree(tmp_path: Path) -> None:
    """Notebooks a user makes land in ~/notebooks (created), never in the repository `make run` runs from."""
    from jupyter_notebookos.cli import build_parser
    from jupyter_notebookos.embedded.platform import EmbeddedPlatform, UpOptions

    assert build_parser().parse_args(["up"]).notebook_dir is None  # so `up` takes UpOptions' own
    assert UpOptions().notebook_dir == Path.home() / "notebooks"
    assert "~/notebooks" in subprocess.run([*NOTEBOOKOS, "up", "--help"], capture_output=True, text=True).stdout
    command = EmbeddedPlatform(UpOptions(notebook_dir=tmp_path / "mine")).lab_command()
    assert f"--ServerApp.root_dir={tmp_path / 'mine'}" in command


def test_the_readme_usage_names_every_option_of_up() -> None:
    """The README's usage block is where a new user looks (the Hub docs rely on --gateway-option): every option of
    `notebookos up` is in it, and nothing that is not one."""
    from jupyter_notebookos.cli import build_parser

    readme = (REPO / "README.md").read_text()
    block = readme.split("## Using it", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    up_lines = block.split(".venv/bin/notebookos status", 1)[0]
    shown = set(re.findall(r"--[a-z][a-z-]*", up_lines))
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    options = {o for a in sub.choices["up"]._actions for o in a.option_strings if o.startswith("--")} - {"--help"}
    assert shown == options, (sorted(options - shown), sorted(shown - options))


def test_gateway_client_reports_http_errors(shared_up: Platform) -> None:
    bad = GatewayClient(shared_up.url, "wrong-token")
    with pytest.raises(Exception, match="HTTP 401"):
        bad.request("GET", "/api/notebookos/cluster")
