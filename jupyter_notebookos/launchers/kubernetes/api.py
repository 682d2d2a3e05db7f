"""The two things every caller of the Kubernetes API here needs: a client, and errors that say what to do."""

from __future__ import annotations

import json
from typing import Any

from jupyter_notebookos.launchers.base import LaunchError


def load_core_api() -> Any:
    """A ``CoreV1Api`` from the in-cluster service account, else from ``~/.kube/config``."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as err:
            raise LaunchError(
                f"no Kubernetes credentials: not running in a pod and no usable kubeconfig ({err}); run the "
                "gateway in the cluster (helm chart) or point KUBECONFIG at a cluster"
            ) from None
    return client.CoreV1Api()


def api_error(err: Exception, action: str, namespace: str) -> LaunchError:
    """A kubernetes-client error as a :class:`LaunchError` that says what happened and what to do."""
    code = getattr(err, "status", None)
    message = str(err)
    body = getattr(err, "body", None)
    if body:
        try:
            message = json.loads(body).get("message") or message
        except (ValueError, AttributeError, TypeError):
            message = str(body)
    hints = {
        401: "the gateway's Kubernetes credentials were rejected; check its service account token",
        403: f"the gateway's service account may not do this in namespace {namespace!r}; check the chart's "
        "RBAC (Role notebookos-kernels) and KubernetesLauncher.namespace",
        404: f"namespace {namespace!r} (or the object) does not exist; create it or fix KERNEL_NAMESPACE",
        409: "an object with that name exists already; retry the launch",
        422: "the API server rejected the pod; fix the kernelspec or KERNEL_* value it names",
    }
    hint = hints.get(code or 0, "check that the API server is reachable from the gateway")
    return LaunchError(f"could not {action}: {message} (HTTP {code}); {hint}")
