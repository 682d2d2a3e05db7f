"""The chart's Prometheus and Grafana objects, offline: scrape annotations, the metrics token, the optional
ServiceMonitor and Grafana dashboard ConfigMap (both off by default)."""

from __future__ import annotations

import base64
import json
from typing import Any

import helm_python as helm
import pytest
from fakekube import KUBE_VERSION, validate_strict
from helmchart import CHART, by_kind, render

MONITORING = {
    "metrics": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "grafanaDashboard": {"enabled": True, "namespace": "monitoring"},
    }
}


@pytest.fixture(scope="module")
def monitored() -> list[dict[str, Any]]:
    """The chart rendered with the ServiceMonitor and the Grafana dashboard on."""
    return render(MONITORING)


def _gateway(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    (deployment,) = by_kind(docs, "Deployment")
    (service,) = [s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("-gateway")]
    return deployment, service


def _metrics_secret_ref(deployment: dict[str, Any]) -> dict[str, Any]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    (env,) = [e for e in container["env"] if e["name"] == "NOTEBOOKOS_METRICS_TOKEN"]
    return dict(env["valueFrom"]["secretKeyRef"])


def test_default_install_has_scrape_annotations_and_a_metrics_token_but_no_operator_objects() -> None:
    docs = render(None)
    deployment, service = _gateway(docs)
    scrape = {"prometheus.io/scrape": "true", "prometheus.io/path": "/metrics"}
    pod_annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert scrape.items() <= pod_annotations.items() and pod_annotations["prometheus.io/port"] == "8888"
    assert scrape.items() <= service["metadata"]["annotations"].items()
    # /metrics needs a token: the gateway gets a generated read-only one.
    ref = _metrics_secret_ref(deployment)
    assert ref == {"name": "nbos-notebookos-metrics-token", "key": "token"}
    (secret,) = [s for s in by_kind(docs, "Secret") if s["metadata"]["name"] == ref["name"]]
    assert len(base64.b64decode(secret["data"]["token"])) >= 32
    assert not by_kind(docs, "ServiceMonitor")
    assert not [c for c in by_kind(docs, "ConfigMap") if "grafana" in c["metadata"]["name"]]
    # Annotations off: none on the Service (its own annotations stay).
    off = render({"metrics": {"scrapeAnnotations": False}, "gateway": {"service": {"annotations": {"a": "b"}}}})
    _, service = _gateway(off)
    assert service["metadata"]["annotations"] == {"a": "b"}


def test_service_monitor_scrapes_the_gateway_with_the_metrics_token(monitored: list[dict[str, Any]]) -> None:
    docs = monitored
    deployment, service = _gateway(docs)
    (monitor,) = by_kind(docs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # It selects the gateway's Service, on a port the Service has, in the Secret's namespace.
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]} and endpoint["path"] == "/metrics"
    credentials = endpoint["authorization"]["credentials"]
    assert endpoint["authorization"]["type"] == "Bearer"
    assert credentials == _metrics_secret_ref(deployment)  # the token Prometheus sends is the one the gateway takes
    assert monitor["metadata"]["namespace"] == "notebookos"
    # A Secret given by the deployer is used by both, and none is generated.
    docs = render({**MONITORING, "metrics": {**MONITORING["metrics"], "tokenSecret": "prom-reader"}})
    (monitor,) = by_kind(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["authorization"]["credentials"]["name"] == "prom-reader"
    assert _metrics_secret_ref(_gateway(docs)[0])["name"] == "prom-reader"
    assert "nbos-notebookos-metrics-token" not in {s["metadata"]["name"] for s in by_kind(docs, "Secret")}


def test_grafana_dashboard_config_map_carries_the_sidecar_label_and_the_dashboard(
    monitored: list[dict[str, Any]],
) -> None:
    docs = monitored
    (config_map,) = [c for c in by_kind(docs, "ConfigMap") if "grafana" in c["metadata"]["name"]]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "monitoring"
    shipped = json.loads((CHART / "dashboards" / "notebookos.json").read_text())
    assert json.loads(config_map["data"]["notebookos.json"]) == shipped
    for doc in docs:  # everything but the Prometheus Operator's own kind validates for Kubernetes
        if doc["kind"] != "ServiceMonitor":
            validate_strict(doc)


def test_chart_with_monitoring_lints_clean_in_strict_mode() -> None:
    report = helm.lint(CHART, MONITORING, strict=True, kube_version=f"v{KUBE_VERSION}.0", namespace="notebookos")
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    assert problems == [], problems
