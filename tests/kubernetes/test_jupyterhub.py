"""The Zero to JupyterHub example (helm/zero-to-jupyterhub/config.yaml) and the NotebookOS values that go with it
(helm/notebookos/values-jupyterhub.yaml): every key the wiring needs is set, and set consistently with what the
NotebookOS chart renders (Service name and port, gateway pod labels, namespace)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlparse

import yaml
from fakekube import validate_strict
from test_chart import by_kind, gateway_config, render
from traitlets.config import Config

from jupyter_notebookos.gateway.web.gatewayapp import NotebookOSGatewayApp

REPO = Path(__file__).resolve().parents[2]
Z2JH = yaml.safe_load((REPO / "helm" / "zero-to-jupyterhub" / "config.yaml").read_text())
NOTEBOOKOS_VALUES = yaml.safe_load((REPO / "helm" / "notebookos" / "values-jupyterhub.yaml").read_text())
NAMESPACE = "notebookos"  # the NotebookOS release's namespace in the examples' install commands


def rendered() -> list[dict[str, Any]]:
    return render(NOTEBOOKOS_VALUES)


def gateway_pod_labels(docs: list[dict[str, Any]]) -> dict[str, str]:
    (deployment,) = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("-gateway")]
    return dict(deployment["spec"]["template"]["metadata"]["labels"])


def allows_gateway(peers: list[dict[str, Any]], labels: dict[str, str]) -> bool:
    """Whether one of the NetworkPolicy peers selects the gateway's pods in the NotebookOS namespace."""
    for peer in peers:
        namespace = peer.get("namespaceSelector", {}).get("matchLabels", {})
        pods = peer.get("podSelector", {}).get("matchLabels", {})
        if namespace == {"kubernetes.io/metadata.name": NAMESPACE} and pods and pods.items() <= labels.items():
            return True
    return False


def test_each_users_server_reaches_the_gateway_with_its_own_hub_token() -> None:
    """The per-user wiring: the Hub config snippet gives each server its own API token as its gateway token."""
    snippet = Z2JH["hub"]["extraConfig"]["notebookos"]
    c = Config()
    exec(compile(snippet, "hub.extraConfig.notebookos", "exec"), {"c": c})  # as z2jh's jupyterhub_config.py does
    environment = c.KubeSpawner.environment.get_value({"OTHER": "kept"})
    assert environment["OTHER"] == "kept"  # singleuser.extraEnv and the like are added to, not replaced
    alice, bob = SimpleNamespace(api_token="alice-token"), SimpleNamespace(api_token="bob-token")
    wire = environment["JUPYTER_GATEWAY_AUTH_TOKEN"]
    assert (wire(alice), wire(bob)) == ("alice-token", "bob-token")
    # ... and no shared gateway token anywhere in the single-user servers' environment.
    assert "JUPYTER_GATEWAY_AUTH_TOKEN" not in Z2JH["singleuser"].get("extraEnv", {})
    assert "notebookos-gateway-token" not in yaml.safe_dump(Z2JH)


def test_single_user_servers_point_at_the_gateway_service_and_may_reach_it() -> None:
    docs = rendered()
    (service,) = [s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("-gateway")]
    port = service["spec"]["ports"][0]["port"]
    url = urlparse(Z2JH["singleuser"]["extraEnv"]["JUPYTER_GATEWAY_URL"])
    assert url.hostname == f"{service['metadata']['name']}.{NAMESPACE}.svc" and url.port == port
    assert int(Z2JH["singleuser"]["extraEnv"]["JUPYTER_GATEWAY_REQUEST_TIMEOUT"]) >= 300  # 3 replica pods to start
    labels = gateway_pod_labels(docs)
    egress = Z2JH["singleuser"]["networkPolicy"]["egress"]
    assert any(
        allows_gateway(rule["to"], labels) and {"port": 8888, "protocol": "TCP"} in rule["ports"] for rule in egress
    )


def test_the_gateway_is_a_hub_service_that_checks_tokens_with_the_hub_api() -> None:
    assert "notebookos-gateway" in Z2JH["hub"]["services"]
    docs = rendered()
    config = gateway_config(docs)
    hub_api = urlparse(config["NotebookOSGatewayApp"]["hub_api_url"])
    # z2jh's Service "hub" answers its API on 8081, and lets in only the pods its network policy names.
    assert hub_api.hostname == "hub.jhub.svc" and hub_api.port == 8081 and hub_api.path == "/hub/api"
    ingress = Z2JH["hub"]["networkPolicy"]["ingress"]
    labels = gateway_pod_labels(docs)
    assert any(
        allows_gateway(rule["from"], labels) and {"port": 8081, "protocol": "TCP"} in rule["ports"] for rule in ingress
    )
    # The gateway app takes the rendered config as it is (the trait validates the URL).
    app = NotebookOSGatewayApp(config=Config(config))
    assert app.hub_api_url == "http://hub.jhub.svc:8081/hub/api"
    for doc in docs:
        validate_strict(doc)


def test_idle_servers_and_idle_kernels_are_culled() -> None:
    assert Z2JH["cull"]["enabled"] is True and Z2JH["cull"]["timeout"] > 0
    kernels = gateway_config(rendered())["MappingKernelManager"]
    # An idle NotebookOS kernel holds no GPU: its timeout may be far longer than the servers'.
    assert kernels["cull_idle_timeout"] >= Z2JH["cull"]["timeout"] and kernels["cull_interval"] > 0
    assert gateway_config(render(None))["MappingKernelManager"]["cull_idle_timeout"] == 0  # off by default
