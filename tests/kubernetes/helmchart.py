"""The helm chart, rendered offline (helm-python-sdk): what the chart and gateway tests read objects from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

CHART = Path(__file__).resolve().parents[2] / "helm" / "notebookos"


def render(values: dict[str, Any] | None) -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values=values, name="nbos", namespace="notebookos", is_install=True)
    docs = []
    for path, text in manifests.items():
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def gateway_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (config_map,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("gateway-config")]
    return json.loads(config_map["data"]["notebookos_gateway_config.json"])


def kernelspec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The kernel.json of the chart's NotebookOS kernelspec."""
    (config_map,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("kernelspec")]
    return dict(json.loads(config_map["data"]["kernel.json"]))
