"""One source of truth for defaults: the example configuration (etc/jupyter/notebookos_config.py) is a commented copy
of the traitlets' defaults, so a line that differs from the default it names is a bug in one of them."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
from jupyter_server.services.kernels.kernelmanager import MappingKernelManager
from traitlets.config import Configurable

from jupyter_notebookos.gateway.control.history import ClusterHistory
from jupyter_notebookos.gateway.upkeep.defrag import EtcdMaintenance
from jupyter_notebookos.gateway.web.gatewayapp import NotebookOSGatewayApp
from jupyter_notebookos.launchers.kubernetes import KubernetesLauncher
from jupyter_notebookos.launchers.local import LocalLauncher
from jupyter_notebookos.scheduler import Scheduler

EXAMPLE = Path(__file__).resolve().parents[1] / "etc" / "jupyter" / "notebookos_config.py"
CLASSES: dict[str, type[Configurable]] = {
    c.__name__: c
    for c in (
        NotebookOSGatewayApp,
        Scheduler,
        LocalLauncher,
        KubernetesLauncher,
        MappingKernelManager,
        EtcdMaintenance,
        ClusterHistory,
    )
}
# Defaults computed from where the gateway runs: the example shows their shape, not their value.
ILLUSTRATIVE = {
    ("NotebookOSGatewayApp", "state_dir"): "'.state' under the working directory",
    ("NotebookOSGatewayApp", "object_store_url"): "file:// under state_dir",
}
_LINE = re.compile(r"^#\s*c\.(\w+)\.(\w+)\s*=\s*(.+?)\s*(?:#.*)?$")


def example_settings() -> list[tuple[str, str, Any]]:
    """Every ``# c.Class.trait = value`` line of the example configuration, the value parsed."""
    found = []
    for line in EXAMPLE.read_text().splitlines():
        match = _LINE.match(line)
        if match:
            found.append((match[1], match[2], ast.literal_eval(match[3])))
    return found


def test_the_example_config_names_real_traitlets() -> None:
    settings = example_settings()
    assert len(settings) >= 30
    for cls_name, name, _ in settings:
        assert cls_name in CLASSES, cls_name
        assert name in CLASSES[cls_name].class_trait_names(config=True), f"c.{cls_name}.{name} is not a traitlet"


def test_the_example_config_shows_every_scheduler_knob() -> None:
    shown = {name for cls_name, name, _ in example_settings() if cls_name == "Scheduler"}
    assert set(Scheduler.class_trait_names(config=True)) <= shown


@pytest.mark.parametrize(("cls_name", "name", "value"), example_settings(), ids=lambda v: str(v)[:40])
def test_every_example_line_is_the_traitlets_default(
    cls_name: str, name: str, value: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if (cls_name, name) in ILLUSTRATIVE:
        pytest.skip(ILLUSTRATIVE[(cls_name, name)])
    for variable in ("NOTEBOOKOS_ETCD_ENDPOINTS", "NOTEBOOKOS_KERNEL_NAMESPACE", "EG_LIST_KERNELS"):
        monkeypatch.delenv(variable, raising=False)
    cls = CLASSES[cls_name]
    try:
        default = getattr(cls(), name)
    except TypeError:  # built with its collaborators (ClusterHistory): its traitlets' defaults are static
        default = cls.class_traits()[name].default_value
    if isinstance(default, set):
        value = set(value)
    assert value == default, (
        f"etc/jupyter/notebookos_config.py says c.{cls_name}.{name} = {value!r}, default {default!r}"
    )
