"""A small fake of the kubernetes client's CoreV1Api, SchedulingV1Api and watch.Watch.

Objects are API-shaped dicts. Every call is recorded in ``calls``; every change is pushed to the watch
streams that select the object, like the API server does. Tests drive the "cluster" with helpers
(``set_pod_status``, ``add_event``, ``add_node``...).
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import itertools
import json
import queue
import re
import threading
from typing import Any

import kubernetes_validate
from kubernetes.client.rest import ApiException

KUBE_VERSION = "1.30"
NAMESPACE = "notebookos-kernels"
IMAGE = "registry.example.com/notebookos/kernel:0.1.0"


def validate_strict(obj: dict[str, Any]) -> None:
    """Validate one object against the Kubernetes 1.30 schemas, unknown fields rejected."""
    kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What Pod Security Standard "restricted" (Kubernetes 1.30) would refuse in ``pod`` (a Pod, or a workload's
    pod template spec as ``{"spec": ...}``)."""
    spec_ = pod["spec"]
    problems = []
    pod_security = spec_.get("securityContext") or {}
    allowed_volumes = {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
    for volume in spec_.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= allowed_volumes:
            problems.append(f"volume {volume['name']}: {kinds}")
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec_.get(key):
            problems.append(key)
    for container in spec_["containers"]:
        security = container.get("securityContext") or {}
        if security.get("privileged"):
            problems.append("privileged")
        if security.get("allowPrivilegeEscalation") is not False:
            problems.append("allowPrivilegeEscalation")
        if "ALL" not in (security.get("capabilities") or {}).get("drop", []):
            problems.append("capabilities.drop ALL")
        if set((security.get("capabilities") or {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append("capabilities.add")
        if not (security.get("runAsNonRoot") or pod_security.get("runAsNonRoot")):
            problems.append("runAsNonRoot")
        if 0 in (security.get("runAsUser"), pod_security.get("runAsUser")):
            problems.append("runAsUser 0")
        seccomp = (security.get("seccompProfile") or pod_security.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append("seccompProfile")
        if any(p.get("hostPort") for p in container.get("ports") or []):
            problems.append("hostPort")
    return problems


async def until(predicate: Any, timeout: float = 5.0) -> Any:
    """Wait until ``predicate()`` is truthy (the watch threads deliver asynchronously)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def _api_error(status: int, message: str) -> ApiException:
    err = ApiException(status=status, reason=message)
    err.body = json.dumps({"kind": "Status", "message": message})
    return err


def matches_labels(selector: str | None, labels: dict[str, str]) -> bool:
    """Equality (``a=b``), set (``a in (x,y)``) and existence selectors, comma-joined."""
    if not selector:
        return True
    for term in re.split(r",(?![^(]*\))", selector):
        term = term.strip()
        if m := re.match(r"^([\w./-]+)\s+in\s+\(([^)]*)\)$", term):
            if labels.get(m[1]) not in {v.strip() for v in m[2].split(",")}:
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.rstrip("=")) != value.lstrip("="):
                return False
        elif term not in labels:
            return False
    return True


def matches_fields(selector: str | None, obj: dict[str, Any]) -> bool:
    """Field selectors like ``involvedObject.kind=Pod``."""
    if not selector:
        return True
    for term in selector.split(","):
        path, value = term.split("=", 1)
        node: Any = obj
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if str(node) != value:
            return False
    return True


class _Stream:
    def __init__(self, resource: str, namespace: str | None, labels: str | None, fields: str | None) -> None:
        self.resource, self.namespace, self.labels, self.fields = resource, namespace, labels, fields
        self.queue: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def wants(self, resource: str, obj: dict[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        return (
            resource == self.resource
            and (self.namespace is None or meta.get("namespace") == self.namespace)
            and matches_labels(self.labels, meta.get("labels") or {})
            and matches_fields(self.fields, obj)
        )


class FakeCluster:
    """Holds the objects and the open watch streams; hands out the fake API objects."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.objects: dict[str, dict[str, dict[str, Any]]] = {
            "pods": {},
            "events": {},
            "nodes": {},
            "secrets": {},
            "configmaps": {},
        }
        self.priority_classes: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.streams: list[_Stream] = []
        self.version = itertools.count(100)
        self.last_version = 99
        # (version, resource, type, object): lets a watch resume from a listing's resourceVersion.
        self.history: list[tuple[int, str, str, dict[str, Any]]] = []
        self.clock_offset = 0.0
        self.core = FakeCoreV1Api(self)
        self.scheduling = FakeSchedulingV1Api(self)

    # --- storage ----------------------------------------------------------------------------------------------

    @staticmethod
    def key(obj: dict[str, Any]) -> str:
        meta = obj["metadata"]
        return f"{meta.get('namespace', '')}/{meta['name']}"

    def record(self, method: str, **kwargs: Any) -> None:
        with self.lock:
            self.calls.append((method, kwargs))

    def called(self, method: str) -> list[dict[str, Any]]:
        """The recorded kwargs of every call of ``method``."""
        with self.lock:
            return [kw for name, kw in self.calls if name == method]

    def put(self, resource: str, obj: dict[str, Any], kind: str) -> dict[str, Any]:
        with self.lock:
            obj = copy.deepcopy(obj)
            self.last_version = next(self.version)
            obj.setdefault("metadata", {})["resourceVersion"] = str(self.last_version)
            self.history.append((self.last_version, resource, kind, copy.deepcopy(obj)))
            if kind == "DELETED":
                self.objects[resource].pop(self.key(obj), None)
            else:
                self.objects[resource][self.key(obj)] = obj
            for stream in self.streams:
                if stream.wants(resource, obj):
                    stream.queue.put({"type": kind, "object": copy.deepcopy(obj), "raw_object": copy.deepcopy(obj)})
            return copy.deepcopy(obj)

    def listing(self, resource: str, namespace: str | None, labels: str | None, fields: str | None) -> dict[str, Any]:
        with self.lock:
            probe = _Stream(resource, namespace, labels, fields)
            items = [copy.deepcopy(o) for o in self.objects[resource].values() if probe.wants(resource, o)]
            return {"items": items, "metadata": {"resourceVersion": str(self.last_version)}}

    # --- what the cluster does (test helpers) -----------------------------------------------------------------

    def now(self) -> str:
        """The API server's clock, as creationTimestamp has it (tests move it with ``age``)."""
        moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=self.clock_offset)
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")

    def age(self, seconds: float) -> None:
        """Make every object created so far ``seconds`` older (watches see the change)."""
        with self.lock:
            for resource, objects in self.objects.items():
                for obj in list(objects.values()):
                    meta = obj.get("metadata") or {}
                    if "creationTimestamp" in meta:
                        created = datetime.datetime.fromisoformat(meta["creationTimestamp"].replace("Z", "+00:00"))
                        moved = created - datetime.timedelta(seconds=seconds)
                        aged = copy.deepcopy(obj)
                        aged["metadata"]["creationTimestamp"] = moved.strftime("%Y-%m-%dT%H:%M:%SZ")
                        self.put(resource, aged, "MODIFIED")

    def add_config_map(self, namespace: str, name: str) -> dict[str, Any]:
        """A ConfigMap (the chart's owner object), with a uid as the API server gives it."""
        config_map = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{next(self.version)}"},
        }
        return self.put("configmaps", config_map, "ADDED")

    def secrets(self, selector: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [
                copy.deepcopy(s)
                for s in self.objects["secrets"].values()
                if matches_labels(selector, s["metadata"].get("labels") or {})
            ]

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self.objects["pods"][f"{namespace}/{name}"])

    def pods(self, selector: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [
                copy.deepcopy(p)
                for p in self.objects["pods"].values()
                if matches_labels(selector, p["metadata"].get("labels") or {})
            ]

    def set_pod_status(self, namespace: str, name: str, status: dict[str, Any], node: str | None = None) -> None:
        """Replace a pod's status (and bind it to ``node``), as the scheduler and kubelet would."""
        pod = self.pod(namespace, name)
        pod["status"] = status
        if node:
            pod["spec"]["nodeName"] = node
        self.put("pods", pod, "MODIFIED")

    def run_pod(self, namespace: str, name: str, node: str) -> None:
        """The pod was scheduled on ``node`` and its container started."""
        self.set_pod_status(
            namespace,
            name,
            {
                "phase": "Running",
                "podIP": "10.0.0.7",
                "containerStatuses": [{"name": "replica", "ready": True, "state": {"running": {}}}],
            },
            node=node,
        )

    def add_event(self, namespace: str, pod: str, reason: str, message: str, type_: str = "Warning") -> None:
        """An event about a pod, as the scheduler, kubelet or cluster autoscaler emits it."""
        name = f"{pod}.{next(self.version)}"
        self.put(
            "events",
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": namespace},
                "involvedObject": {"kind": "Pod", "name": pod, "namespace": namespace},
                "reason": reason,
                "message": message,
                "type": type_,
            },
            "ADDED",
        )

    def node_object(
        self,
        name: str,
        gpus: int = 8,
        ready: bool = True,
        unschedulable: bool = False,
        labels: dict[str, str] | None = None,
        taints: list[dict[str, str]] | None = None,
    ) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"nvidia.com/gpu.present": "true", "kubernetes.io/hostname": name, **(labels or {})},
            },
            "spec": {"unschedulable": unschedulable, "taints": taints or []},
            "status": {
                "allocatable": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": str(gpus)},
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        }

    def add_node(self, name: str, **kwargs: Any) -> None:
        self.put("nodes", self.node_object(name, **kwargs), "ADDED")

    def modify_node(self, name: str, **kwargs: Any) -> None:
        current = self.objects["nodes"][f"/{name}"]
        labels = {k: v for k, v in current["metadata"]["labels"].items() if k != "kubernetes.io/hostname"}
        self.put("nodes", self.node_object(name, **{"labels": labels, **kwargs}), "MODIFIED")

    def delete_node(self, name: str) -> None:
        self.put("nodes", self.objects["nodes"][f"/{name}"], "DELETED")

    def close_streams(self) -> None:
        with self.lock:
            for stream in self.streams:
                stream.queue.put(None)
            self.streams.clear()

    def watch(self) -> FakeWatch:
        return FakeWatch(self)


class FakeCoreV1Api:
    """The CoreV1Api calls NotebookOS makes."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster

    def list_namespaced_pod(
        self, namespace: str, label_selector: str | None = None, field_selector: str | None = None, **kw: Any
    ) -> dict[str, Any]:
        self.cluster.record("list_namespaced_pod", namespace=namespace, label_selector=label_selector)
        return self.cluster.listing("pods", namespace, label_selector, field_selector)

    def list_namespaced_event(
        self, namespace: str, label_selector: str | None = None, field_selector: str | None = None, **kw: Any
    ) -> dict[str, Any]:
        self.cluster.record("list_namespaced_event", namespace=namespace, field_selector=field_selector)
        return self.cluster.listing("events", namespace, label_selector, field_selector)

    def list_node(self, label_selector: str | None = None, field_selector: str | None = None, **kw: Any) -> dict:
        self.cluster.record("list_node", label_selector=label_selector)
        return self.cluster.listing("nodes", None, label_selector, field_selector)

    def create_namespaced_pod(self, namespace: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        self.cluster.record("create_namespaced_pod", namespace=namespace, body=copy.deepcopy(body))
        if namespace == "forbidden":
            raise _api_error(403, f'pods is forbidden: cannot create resource "pods" in namespace "{namespace}"')
        if f"{namespace}/{body['metadata']['name']}" in self.cluster.objects["pods"]:
            raise _api_error(409, f'pods "{body["metadata"]["name"]}" already exists')
        pod = copy.deepcopy(body)
        pod["metadata"]["uid"] = f"uid-{next(self.cluster.version)}"
        pod["metadata"]["creationTimestamp"] = self.cluster.now()
        pod["status"] = {"phase": "Pending"}
        return self.cluster.put("pods", pod, "ADDED")

    def create_namespaced_secret(self, namespace: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        self.cluster.record("create_namespaced_secret", namespace=namespace, body=copy.deepcopy(body))
        if f"{namespace}/{body['metadata']['name']}" in self.cluster.objects["secrets"]:
            raise _api_error(409, f'secrets "{body["metadata"]["name"]}" already exists')
        secret = copy.deepcopy(body)
        secret["metadata"].update(uid=f"uid-{next(self.cluster.version)}", creationTimestamp=self.cluster.now())
        return self.cluster.put("secrets", secret, "ADDED")

    def replace_namespaced_secret(self, name: str, namespace: str, body: dict[str, Any], **kw: Any) -> dict:
        self.cluster.record("replace_namespaced_secret", name=name, namespace=namespace, body=copy.deepcopy(body))
        if f"{namespace}/{name}" not in self.cluster.objects["secrets"]:
            raise _api_error(404, f'secrets "{name}" not found')
        secret = copy.deepcopy(body)
        secret["metadata"]["creationTimestamp"] = self.cluster.now()
        return self.cluster.put("secrets", secret, "MODIFIED")

    def delete_namespaced_secret(self, name: str, namespace: str, **kw: Any) -> dict[str, Any]:
        self.cluster.record("delete_namespaced_secret", name=name, namespace=namespace)
        secret = self.cluster.objects["secrets"].get(f"{namespace}/{name}")
        if secret is None:
            raise _api_error(404, f'secrets "{name}" not found')
        return self.cluster.put("secrets", secret, "DELETED")

    def list_namespaced_secret(self, namespace: str, label_selector: str | None = None, **kw: Any) -> dict:
        self.cluster.record("list_namespaced_secret", namespace=namespace, label_selector=label_selector)
        return self.cluster.listing("secrets", namespace, label_selector, None)

    def read_namespaced_config_map(self, name: str, namespace: str, **kw: Any) -> dict[str, Any]:
        self.cluster.record("read_namespaced_config_map", name=name, namespace=namespace)
        found = self.cluster.objects["configmaps"].get(f"{namespace}/{name}")
        if found is None:
            raise _api_error(404, f'configmaps "{name}" not found')
        return copy.deepcopy(found)

    def read_namespaced_pod(self, name: str, namespace: str, **kw: Any) -> dict[str, Any]:
        self.cluster.record("read_namespaced_pod", name=name, namespace=namespace)
        try:
            return self.cluster.pod(namespace, name)
        except KeyError:
            raise _api_error(404, f'pods "{name}" not found') from None

    def delete_namespaced_pod(
        self, name: str, namespace: str, grace_period_seconds: int | None = None, **kw: Any
    ) -> dict[str, Any]:
        self.cluster.record(
            "delete_namespaced_pod", name=name, namespace=namespace, grace_period_seconds=grace_period_seconds
        )
        try:
            pod = self.cluster.pod(namespace, name)
        except KeyError:
            raise _api_error(404, f'pods "{name}" not found') from None
        return self.cluster.put("pods", pod, "DELETED")


class FakeSchedulingV1Api:
    """``read_priority_class`` only."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster

    def read_priority_class(self, name: str, **kw: Any) -> dict[str, Any]:
        self.cluster.record("read_priority_class", name=name)
        if name not in self.cluster.priority_classes:
            raise _api_error(404, f'priorityclasses.scheduling.k8s.io "{name}" not found')
        return self.cluster.priority_classes[name]


class FakeWatch:
    """``kubernetes.watch.Watch``: ``stream(list_func, **kwargs)`` yields the changes after the listing."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self._stream: _Stream | None = None
        self._stopped = False

    def stream(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        resource = {"list_namespaced_pod": "pods", "list_namespaced_event": "events", "list_node": "nodes"}[
            func.__name__
        ]
        stream = _Stream(resource, kwargs.get("namespace"), kwargs.get("label_selector"), kwargs.get("field_selector"))
        since = int(kwargs.get("resource_version") or 0)
        with self.cluster.lock:  # replay what changed since the listing, then go live
            for version, kind_of, type_, obj in self.cluster.history:
                if version > since and stream.wants(kind_of, obj):
                    stream.queue.put({"type": type_, "object": copy.deepcopy(obj), "raw_object": copy.deepcopy(obj)})
            self.cluster.streams.append(stream)
        self._stream = stream
        if self._stopped:
            return
        while True:
            event = stream.queue.get()
            if event is None:
                return
            yield event

    def stop(self) -> None:
        self._stopped = True
        if self._stream is not None:
            self._stream.queue.put(None)
