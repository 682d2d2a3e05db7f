"""The helm chart, offline: lints in strict mode, renders, and every object validates for Kubernetes 1.30."""

from __future__ import annotations

import base64
import fnmatch
import json
import tomllib
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from cryptography import x509
from fakekube import KUBE_VERSION, restricted_violations, validate_strict
from helmchart import CHART, by_kind, gateway_config, render
from jupyter_client.kernelspec import KernelSpecManager

from jupyter_notebookos.launchers.base import ReplicaSpec
from jupyter_notebookos.launchers.kubernetes.launcher import KubernetesLauncher
from jupyter_notebookos.launchers.kubernetes.placeholders import PlaceholderPool

REPO_KERNELSPECS = CHART.parents[1] / "kernelspecs"
GPU_VALUES = yaml.safe_load((CHART / "values-gpu-cluster.yaml").read_text())
EXTERNAL_PLAIN = {"etcd": {"enabled": False, "external": {"endpoints": ["etcd.infra:2379"]}}}
SEPARATE_NAMESPACES = {
    "kernelNamespace": "notebookos-kernels",
    "kernel": {"allowedNamespaces": ["team-a"]},
    "objectStore": {"type": "s3", "s3": {"url": "s3://bucket/x", "credentialsSecret": "s3"}},
    "etcd": {"antiAffinity": "preferred"},
    "placeholders": {"enabled": False},
}
VALUE_SETS = {
    "default": None,
    "gpu-cluster": GPU_VALUES,
    "external-etcd": EXTERNAL_PLAIN,
    "separate-namespaces": SEPARATE_NAMESPACES,
}


@pytest.mark.parametrize("values", [None, GPU_VALUES], ids=["default", "gpu-cluster"])
def test_chart_lints_clean_in_strict_mode(values: dict[str, Any] | None) -> None:
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}.0", namespace="notebookos")
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    assert problems == [], problems
    assert report["total_charts_linted"] == 1


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_rendered_object_validates_for_kubernetes_1_30(values: dict[str, Any] | None) -> None:
    docs = render(values)
    assert len(docs) >= 8
    for doc in docs:
        validate_strict(doc)


def test_default_install_runs_a_three_member_etcd_that_survives_a_drain() -> None:
    docs = render(None)
    (statefulset,) = by_kind(docs, "StatefulSet")
    assert statefulset["spec"]["replicas"] == 3
    assert statefulset["spec"]["volumeClaimTemplates"][0]["spec"]["accessModes"] == ["ReadWriteOnce"]
    anti = statefulset["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert anti["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"] == "kubernetes.io/hostname"
    command = statefulset["spec"]["template"]["spec"]["containers"][0]["command"]
    cluster_flag = next(c for c in command if c.startswith("--initial-cluster="))
    assert cluster_flag.count("=https://") == 3  # peers speak TLS
    (pdb,) = by_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == statefulset["spec"]["selector"]["matchLabels"]
    endpoints = gateway_config(docs)["KubernetesLauncher"]["etcd_endpoints"].split(",")
    assert endpoints == [f"nbos-notebookos-etcd-{i}.nbos-notebookos-etcd-peer.notebookos.svc:2379" for i in range(3)]


def test_rbac_is_least_privilege() -> None:
    docs = render(SEPARATE_NAMESPACES)
    roles = by_kind(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["notebookos-kernels", "team-a"]
    for role in roles:
        rules = {tuple(r["resources"]): sorted(r["verbs"]) for r in role["rules"]}
        assert rules == {
            ("pods",): ["create", "delete", "get", "list", "watch"],
            ("events",): ["get", "list", "watch"],
            ("secrets",): ["create", "delete", "list", "update"],  # kernels' own credentials
            ("configmaps",): ["get"],
        }
        (owner_rule,) = [r for r in role["rules"] if r["resources"] == ["configmaps"]]
        assert owner_rule["resourceNames"] == ["nbos-notebookos-kernel-owner"]  # that one only
    (cluster_role,) = by_kind(docs, "ClusterRole")
    for rule in cluster_role["rules"]:
        assert sorted(rule["verbs"]) == ["get", "list", "watch"]
        assert rule["resources"] in (["nodes"], ["priorityclasses"])
    for doc in [*roles, cluster_role]:
        assert "*" not in json.dumps(doc["rules"])
    bindings = by_kind(docs, "RoleBinding") + by_kind(docs, "ClusterRoleBinding")
    assert {b["subjects"][0]["name"] for b in bindings} == {"nbos-notebookos-gateway"}


def test_scheduler_values_reach_the_scheduler_traitlets() -> None:
    from jupyter_notebookos.scheduler.engine import Scheduler

    config = gateway_config(render(GPU_VALUES))
    traits = set(Scheduler.class_trait_names(config=True))
    assert set(config["Scheduler"]) <= traits, set(config["Scheduler"]) - traits
    assert config["Scheduler"]["subscription_ratio_cap"] == 4.0
    Scheduler(**config["Scheduler"])  # every value has the trait's type
    launcher = KubernetesLauncher(**config["KubernetesLauncher"], core_api=object())
    PlaceholderPool(**config["PlaceholderPool"])
    # The launcher configured by the chart builds valid replica pods in the chart's namespace.
    pod = launcher.build_pod(ReplicaSpec("k-1", "r0", "gpu-a", "python3-notebookos"), suffix="abc123")
    validate_strict(pod)
    assert pod["metadata"]["namespace"] == "notebookos-kernels"  # S3 store: kernels in a namespace of their own
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    assert {"name": "notebookos-etcd-tls", "secret": {"secretName": "notebookos-etcd-client-tls"}} in pod["spec"][
        "volumes"
    ]
    # S3: replicas never get the store's keys; the gateway signs their object operations (its object broker).
    assert "envFrom" not in pod["spec"]["containers"][0]
    assert config["NotebookOSGatewayApp"]["object_broker_url"] == (
        "http://nbos-notebookos-gateway.notebookos.svc:8888/api/notebookos/kernels"
    )


def test_the_chart_ships_every_notebookos_kernelspec_of_the_repository_with_its_logos() -> None:
    """kernelspecs/python3-notebookos, -2gpus and -4gpus, each a ConfigMap mounted at share/kernels/<name>: the same
    display name, GPUs per cell and process proxy as the repository's kernel.json, and its logos byte for byte."""
    docs = render(None)
    maps = {
        d["metadata"]["labels"]["notebookos.io/kernelspec"]: d
        for d in by_kind(docs, "ConfigMap")
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "kernelspec"
    }
    repository = sorted(p.parent for p in REPO_KERNELSPECS.glob("*/kernel.json"))
    assert (
        sorted(maps)
        == [d.name for d in repository]
        == [
            "python3-notebookos",
            "python3-notebookos-2gpus",
            "python3-notebookos-4gpus",
        ]
    )
    (deployment,) = by_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for directory in repository:
        ours, config_map = json.loads((directory / "kernel.json").read_text()), maps[directory.name]
        spec = json.loads(config_map["data"]["kernel.json"])
        assert spec["display_name"] == ours["display_name"]
        assert spec["env"]["KERNEL_GPUS"] == ours["env"].get("KERNEL_GPUS", "1")  # 1: the default per cell
        assert spec["metadata"]["process_proxy"]["class_name"] == ours["metadata"]["process_proxy"]["class_name"]
        assert spec["metadata"]["process_proxy"]["config"]["replicas"] == 3
        assert spec["metadata"]["process_proxy"]["config"]["image_name"].endswith("/notebookos/kernel:0.1.0")
        for logo in ("logo-32x32.png", "logo-64x64.png", "logo-svg.svg"):
            assert base64.b64decode(config_map["binaryData"][logo]) == (directory / logo).read_bytes(), logo
        (volume,) = [
            n for n, v in volumes.items() if v.get("configMap", {}).get("name") == config_map["metadata"]["name"]
        ]
        assert mounts[volume] == {
            "name": volume,
            "mountPath": f"/etc/notebookos/share/kernels/{directory.name}",
            "readOnly": True,
        }


def test_the_gateway_offers_exactly_the_charts_kernelspecs_and_their_logos(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ConfigMaps written out as the gateway's pod mounts them, and EG_ALLOWED_KERNELS as the chart sets it: the
    gateway offers the three NotebookOS kernelspecs with their logos, and not the image's plain python3 (which would
    run inside the gateway's pod: Enterprise Gateway 3.3 itself ignores the variable)."""
    from jupyter_notebookos.gateway.web.gatewayapp import NotebookOSGatewayApp

    docs = render(None)
    (deployment,) = by_kind(docs, "Deployment")
    env = _env(deployment["spec"]["template"]["spec"]["containers"][0])
    for config_map in by_kind(docs, "ConfigMap"):
        if config_map["metadata"]["labels"].get("app.kubernetes.io/component") != "kernelspec":
            continue
        directory = tmp_path / "share" / "kernels" / config_map["metadata"]["labels"]["notebookos.io/kernelspec"]
        directory.mkdir(parents=True)
        for name, text in config_map["data"].items():
            (directory / name).write_text(text)
        for name, data in config_map["binaryData"].items():
            (directory / name).write_bytes(base64.b64decode(data))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "share"))
    monkeypatch.setenv("EG_ALLOWED_KERNELS", env["EG_ALLOWED_KERNELS"])
    monkeypatch.setenv("NOTEBOOKOS_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("NOTEBOOKOS_ETCD_AUTH", "0")
    monkeypatch.setenv("NOTEBOOKOS_ETCD_ENDPOINTS", "127.0.0.1:2379")  # never dialled: the platform is not started
    app = NotebookOSGatewayApp()
    app.init_configurables()
    specs = app.kernel_spec_manager.get_all_specs()
    assert sorted(specs) == ["python3-notebookos", "python3-notebookos-2gpus", "python3-notebookos-4gpus"]
    assert "python3" in KernelSpecManager().find_kernel_specs()  # installed, and not offered
    assert specs["python3-notebookos-4gpus"]["spec"]["display_name"] == "Python 3 (NotebookOS, 4 GPUs)"
    assert all(Path(s["resource_dir"], "logo-64x64.png").is_file() for s in specs.values())
    assert app.default_kernel_name == "python3-notebookos"


def test_more_gpu_kernelspecs_can_be_left_out_or_renamed() -> None:
    only = render({"kernelspec": {"moreGpus": []}})
    (deployment,) = by_kind(only, "Deployment")
    assert _env(deployment["spec"]["template"]["spec"]["containers"][0])["EG_ALLOWED_KERNELS"] == "python3-notebookos"
    assert [d["metadata"]["name"] for d in by_kind(only, "ConfigMap") if "kernelspec" in d["metadata"]["name"]] == [
        "nbos-notebookos-kernelspec"
    ]
    eight = render({"kernelspec": {"moreGpus": [{"name": "py-8", "displayName": "Python (8 GPUs)", "gpus": 8}]}})
    (config_map,) = [d for d in by_kind(eight, "ConfigMap") if d["metadata"]["name"].endswith("kernelspec-py-8")]
    assert json.loads(config_map["data"]["kernel.json"])["env"] == {"KERNEL_GPUS": "8"}
    assert config_map["binaryData"]["logo-64x64.png"]  # a name with no logos of its own gets NotebookOS's


def test_object_store_is_a_claim_or_s3_with_a_secret() -> None:
    # By default kernels run in a namespace of their own: the claim is the gateway's alone (in the release
    # namespace), and replicas reach their objects through the gateway's object broker.
    docs = render(None)
    (claim,) = by_kind(docs, "PersistentVolumeClaim")
    assert claim["metadata"]["namespace"] == "notebookos" and claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    config = gateway_config(docs)
    assert config["NotebookOSGatewayApp"]["object_store_access"] == "broker"
    assert config["KubernetesLauncher"]["object_store_claim"] == ""
    assert config["KubernetesLauncher"]["namespace"] == "notebookos-kernels"
    # Kernels in the release namespace mount the claim themselves: it must be ReadWriteMany.
    shared = render({"kernelNamespace": "notebookos"})
    (claim,) = by_kind(shared, "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    config = gateway_config(shared)
    assert "object_store_access" not in config["NotebookOSGatewayApp"]
    assert config["KubernetesLauncher"]["object_store_claim"] == "nbos-notebookos-object-store"
    docs = render(GPU_VALUES)
    assert by_kind(docs, "PersistentVolumeClaim") == [] and by_kind(docs, "StatefulSet") == []
    container = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"] == [{"secretRef": {"name": "notebookos-s3-credentials"}}]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NOTEBOOKOS_OBJECT_STORE_URL"] == "s3://notebookos-state/prod"
    assert env["NOTEBOOKOS_ETCD_CA_CERT"] == "/etc/notebookos/etcd-tls/ca.crt"


def test_placeholder_priority_class_triggers_scale_up() -> None:
    (priority_class,) = by_kind(render(None), "PriorityClass")
    assert priority_class["value"] == -10 and priority_class["preemptionPolicy"] == "Never"
    assert by_kind(render(SEPARATE_NAMESPACES), "PriorityClass") == []


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"etcd": {"enabled": False}}, "etcd.external.endpoints is required"),
        ({"objectStore": {"type": "s3"}}, "objectStore.s3.url is required"),
        ({"kernelspec": {"moreGpus": [{"name": "py-0", "displayName": "P", "gpus": 0}]}}, "py-0 asks for 0 GPUs"),
        ({"kernelspec": {"moreGpus": [{"gpus": 2}]}}, "each entry needs a name and a displayName"),
    ],
)
def test_inconsistent_values_fail_with_a_message(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError, match=message):
        render(values)


def test_gateway_config_and_env_select_the_kubernetes_platform() -> None:
    from traitlets.config import Config

    from jupyter_notebookos.gateway.web.gatewayapp import NotebookOSGatewayApp
    from jupyter_notebookos.launchers.kubernetes import KubernetesLauncher, NodeInventory, PlaceholderPool

    docs = render(None)
    config = Config(gateway_config(docs))
    app = NotebookOSGatewayApp(config=config)
    assert app.launcher == "kubernetes" and app.autoscale is True
    assert app.etcd_endpoints == [e for e in config.NotebookOSGatewayApp.etcd_endpoints]
    assert app.object_store_url == config.NotebookOSGatewayApp.object_store_url
    # Every key the chart writes is a traitlet of the class it configures (a typo would be ignored silently).
    for cls in (NotebookOSGatewayApp, KubernetesLauncher, NodeInventory, PlaceholderPool):
        unknown = set(config[cls.__name__]) - set(cls.class_trait_names(config=True))
        assert not unknown, f"{cls.__name__}: {unknown}"
    (deployment,) = by_kind(docs, "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["NOTEBOOKOS_LAUNCHER"] == "kubernetes"
    assert env["NOTEBOOKOS_ETCD_ENDPOINTS"] == ",".join(app.etcd_endpoints)
    assert env["NOTEBOOKOS_OBJECT_STORE_URL"] == app.object_store_url
    assert not (gateway_config(render({"placeholders": {"enabled": False}}))["NotebookOSGatewayApp"]["autoscale"])


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _secret(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (secret,) = [d for d in by_kind(docs, "Secret") if d["metadata"]["name"] == name]
    return secret


def test_default_install_is_closed_a_generated_token_and_only_the_notebookos_kernelspec() -> None:
    docs = render(None)
    (deployment,) = by_kind(docs, "Deployment")
    env = _env(deployment["spec"]["template"]["spec"]["containers"][0])
    assert env["EG_AUTH_TOKEN"] == {"secretKeyRef": {"name": "nbos-notebookos-gateway-token", "key": "token"}}
    token = base64.b64decode(_secret(docs, "nbos-notebookos-gateway-token")["data"]["token"])
    assert len(token) >= 32
    assert env["EG_ALLOWED_KERNELS"] == "python3-notebookos,python3-notebookos-2gpus,python3-notebookos-4gpus"
    # A token given by the deployer is used, and none is generated.
    docs = render({"gateway": {"authTokenSecret": "mine"}})
    assert "nbos-notebookos-gateway-token" not in {d["metadata"]["name"] for d in by_kind(docs, "Secret")}
    env = _env(by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0])
    assert env["EG_AUTH_TOKEN"]["secretKeyRef"]["name"] == "mine"


def test_default_etcd_speaks_tls_to_clients_and_peers_and_the_gateway_is_its_root_user() -> None:
    docs = render(None)
    (statefulset,) = by_kind(docs, "StatefulSet")
    pod = statefulset["spec"]["template"]["spec"]
    command = pod["containers"][0]["command"]
    for flag in (
        "--listen-client-urls=https://0.0.0.0:2379",
        "--listen-peer-urls=https://0.0.0.0:2380",
        "--cert-file=/etc/etcd/tls/tls.crt",
        "--peer-trusted-ca-file=/etc/etcd/tls/ca.crt",
        "--peer-client-cert-auth=true",
    ):
        assert flag in command
    assert not any("http://0.0.0.0:2379" in c or "http://0.0.0.0:2380" in c for c in command)
    tls = _secret(docs, "nbos-notebookos-etcd-server-tls")
    certificate = x509.load_pem_x509_certificate(base64.b64decode(tls["data"]["tls.crt"]))
    ca = x509.load_pem_x509_certificate(base64.b64decode(tls["data"]["ca.crt"]))
    assert certificate.issuer == ca.subject
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns = names.get_values_for_type(x509.DNSName)
    for endpoint in gateway_config(docs)["KubernetesLauncher"]["etcd_endpoints"].split(","):
        host = endpoint.rsplit(":", 1)[0]
        assert any(fnmatch.fnmatchcase(host, pattern) for pattern in dns), (host, dns)
    (deployment,) = by_kind(docs, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = _env(container)
    assert env["NOTEBOOKOS_ETCD_USER"] == "root"
    assert env["NOTEBOOKOS_ETCD_PASSWORD"] == {"secretKeyRef": {"name": "nbos-notebookos-etcd-root", "key": "password"}}
    assert len(base64.b64decode(_secret(docs, "nbos-notebookos-etcd-root")["data"]["password"])) >= 32
    assert env["NOTEBOOKOS_ETCD_CA_CERT"] == "/etc/notebookos/etcd-tls/ca.crt"
    (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "etcd-tls"]
    assert volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]  # never etcd's private key
    # etcd auth off (a single trusted user) must be said explicitly.
    env = _env(
        by_kind(render({"etcd": {"auth": {"enabled": False}}}), "Deployment")[0]["spec"]["template"]["spec"][
            "containers"
        ][0]
    )
    assert env["NOTEBOOKOS_ETCD_AUTH"] == "0" and "NOTEBOOKOS_ETCD_PASSWORD" not in env


def test_cert_manager_issues_etcds_certificates_when_asked() -> None:
    docs = render({"etcd": {"tls": {"certManager": True}}})
    certificates = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Certificate"}
    assert certificates["nbos-notebookos-etcd-ca"]["spec"]["isCA"] is True
    server = certificates["nbos-notebookos-etcd-server-tls"]["spec"]
    assert server["secretName"] == "nbos-notebookos-etcd-server-tls"
    assert server["issuerRef"] == {"name": "nbos-notebookos-etcd-ca", "kind": "Issuer"}
    assert "*.nbos-notebookos-etcd-peer.notebookos.svc" in server["dnsNames"]
    assert "nbos-notebookos-etcd-server-tls" not in {d["metadata"]["name"] for d in by_kind(docs, "Secret")}
    for doc in docs:
        if not doc["apiVersion"].startswith("cert-manager.io/"):
            validate_strict(doc)


def test_network_policies_let_only_the_gateway_reach_replicas_and_only_ours_reach_etcd() -> None:
    docs = render(SEPARATE_NAMESPACES | {"etcd": {"antiAffinity": "preferred"}})
    policies = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in by_kind(docs, "NetworkPolicy")}
    gateway = {
        "app.kubernetes.io/name": "notebookos",
        "app.kubernetes.io/instance": "nbos",
        "app.kubernetes.io/component": "gateway",
    }
    for namespace in ("notebookos-kernels", "team-a"):
        replicas = policies[(namespace, "nbos-notebookos-replicas")]["spec"]
        assert replicas["podSelector"]["matchLabels"]["component"] == "notebookos-replica"
        (rule,) = replicas["ingress"]
        (source,) = rule["from"]
        assert source["podSelector"]["matchLabels"] == gateway
        assert source["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "notebookos"}
        assert policies[(namespace, "nbos-notebookos-placeholders")]["spec"]["ingress"] == []
    etcd = policies[("notebookos", "nbos-notebookos-etcd")]["spec"]
    clients, peers = etcd["ingress"]
    assert clients["ports"] == [{"port": 2379, "protocol": "TCP"}]
    assert clients["from"][0] == {"podSelector": {"matchLabels": gateway}}
    assert {f["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for f in clients["from"][1:]} == {
        "notebookos-kernels",
        "team-a",
    }
    assert all(f["podSelector"]["matchLabels"]["component"] == "notebookos-replica" for f in clients["from"][1:])
    assert peers["ports"] == [{"port": 2380, "protocol": "TCP"}]
    assert peers["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "etcd"


def test_kernels_get_a_namespace_of_their_own_enforcing_pod_security_restricted() -> None:
    docs = render(GPU_VALUES)
    (namespace,) = by_kind(docs, "Namespace")
    assert namespace["metadata"]["name"] == "notebookos-kernels"
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert labels["pod-security.kubernetes.io/enforce-version"] == "v1.30"
    config = gateway_config(docs)
    assert config["KubernetesLauncher"]["namespace"] == "notebookos-kernels"
    assert config["KubernetesLauncher"]["owner_config_map"] == config["PlaceholderPool"]["owner_config_map"]
    owners = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == "nbos-notebookos-kernel-owner"]
    assert [o["metadata"]["namespace"] for o in owners] == ["notebookos-kernels"]
    # The S3 endpoint and keys are the gateway's only: replicas reach their objects through URLs it signs.
    assert "object_store_endpoint_url" not in config["KubernetesLauncher"]
    assert "object_store_secret" not in config["KubernetesLauncher"]


@pytest.mark.parametrize("values", [None, GPU_VALUES], ids=["default", "gpu-cluster"])
def test_the_charts_own_pods_meet_the_restricted_pod_security_standard(values: dict[str, Any] | None) -> None:
    for workload in by_kind(render(values), "Deployment") + by_kind(render(values), "StatefulSet"):
        assert restricted_violations(workload["spec"]["template"]) == [], workload["metadata"]["name"]


# What a release necessarily sets for itself (names, addresses, the image it installs), with why; every other value
# the chart writes must be the traitlet's own default, so the chart and the code never disagree silently.
RELEASE_SPECIFIC = {
    ("NotebookOSGatewayApp", "launcher"): "the chart runs the Kubernetes platform",
    ("NotebookOSGatewayApp", "autoscale"): "placeholders.enabled: the chart scales GPU nodes by default",
    ("NotebookOSGatewayApp", "etcd_endpoints"): "the release's etcd",
    ("NotebookOSGatewayApp", "object_store_url"): "the release's store",
    ("KubernetesLauncher", "etcd_endpoints"): "the release's etcd",
    ("KubernetesLauncher", "object_store_url"): "the release's store",
    ("KubernetesLauncher", "object_store_claim"): "the release's claim",
    ("NotebookOSGatewayApp", "object_broker_url"): "the release's gateway Service: replicas ask it to sign",
    ("NotebookOSGatewayApp", "object_store_access"): "kernels in their own namespace cannot mount the claim",
    ("KubernetesLauncher", "image"): "the release's kernel image",
    ("KubernetesLauncher", "namespace"): "the release's kernel namespace",
    ("KubernetesLauncher", "service_account"): "the release's replica service account",
    ("KubernetesLauncher", "instance"): "the release's name",
    ("KubernetesLauncher", "owner_config_map"): "the release's owner object",
    ("PlaceholderPool", "namespace"): "the release's kernel namespace",
    ("PlaceholderPool", "instance"): "the release's name",
    ("PlaceholderPool", "owner_config_map"): "the release's owner object",
}


def test_every_default_value_the_chart_writes_is_the_traitlets_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_notebookos.gateway.web.gatewayapp import NotebookOSGatewayApp
    from jupyter_notebookos.launchers.kubernetes import NodeInventory
    from jupyter_notebookos.scheduler.engine import Scheduler

    for variable in ("NOTEBOOKOS_ETCD_ENDPOINTS", "NOTEBOOKOS_KERNEL_NAMESPACE", "NOTEBOOKOS_KERNEL_IMAGE"):
        monkeypatch.delenv(variable, raising=False)
    config = gateway_config(render(None))
    checked = 0
    for cls in (NotebookOSGatewayApp, Scheduler, KubernetesLauncher, NodeInventory, PlaceholderPool):
        instance = cls(core_api=object()) if cls is KubernetesLauncher else cls()
        for name, value in config[cls.__name__].items():
            if (cls.__name__, name) in RELEASE_SPECIFIC:
                continue
            default = getattr(instance, name)
            assert value == default, (
                f"chart writes {cls.__name__}.{name} = {value!r}; the traitlet's default is {default!r}"
            )
            checked += 1
    assert checked >= 40
    # Every scheduler knob is a chart value.
    assert set(config["Scheduler"]) == set(Scheduler.class_trait_names(config=True))


@pytest.mark.parametrize("dockerfile", ["kernel.Dockerfile", "gateway.Dockerfile"])
def test_both_images_can_reach_an_s3_object_store(dockerfile: str) -> None:
    root = CHART.parents[1]
    text = (root / "docker" / dockerfile).read_text()
    assert '".[s3]"' in text  # the package's s3 extra: s3fs
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(requirement.startswith("s3fs") for requirement in extras["s3"])
