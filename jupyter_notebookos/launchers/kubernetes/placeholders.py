"""Scaling on Kubernetes: the autoscaler's host count becomes placeholder pods.

The gateway never creates nodes. To scale out it creates placeholder pods, each a pause container asking for
a whole GPU node at the lowest priority; the cluster autoscaler (or Karpenter) provisions a node for each one
that is Pending. To scale in, after the scheduler has drained a host by migration, it deletes that host's
placeholder, and the autoscaler removes the then-empty node. :meth:`PlaceholderPool.scale_to` is one round
of that loop and returns a :class:`PlaceholderScaling` that logs as one line.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from traitlets import Any as AnyTrait
from traitlets import Dict, Integer, List, Unicode
from traitlets.config import LoggingConfigurable

from jupyter_notebookos.launchers.base import LaunchError
from jupyter_notebookos.launchers.kubernetes import objects, ownership
from jupyter_notebookos.launchers.kubernetes.api import api_error, load_core_api
from jupyter_notebookos.launchers.kubernetes.reflector import to_dict


@dataclass(frozen=True)
class Placeholder:
    """One placeholder pod: on a node (holding it) or Pending (waiting for the autoscaler)."""

    name: str
    node: str | None
    phase: str

    @property
    def pending(self) -> bool:
        """No node yet: the autoscaler is (or should be) adding one."""
        return self.node is None


@dataclass(frozen=True)
class PlaceholderScaling:
    """What one scaling round did; ``str()`` is the one line the gateway logs."""

    before: int
    desired: int
    created: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    pending: int = 0
    errors: tuple[str, ...] = field(default=())

    def __str__(self) -> str:
        if not self.created and not self.deleted and not self.errors:
            return f"placeholders: no action, {self.before} present ({self.pending} waiting for a node)"
        parts = [f"placeholders: {self.before} -> {self.desired}"]
        if self.created:
            parts.append(f"created {', '.join(self.created)}")
        if self.deleted:
            parts.append(f"deleted {', '.join(self.deleted)}")
        if self.errors:
            parts.append(f"failed: {'; '.join(self.errors)}")
        return "; ".join(parts)


class PlaceholderPool(LoggingConfigurable):
    """Creates and deletes placeholder pods so that their number matches the autoscaler's target."""

    namespace = Unicode("default", config=True, help="Namespace of placeholder pods (the kernel namespace).")
    gpus_per_node = Integer(
        8, config=True, help="GPUs a placeholder requests: those of one whole node of the GPU node pool."
    )
    priority_class_name = Unicode(
        "notebookos-placeholder",
        config=True,
        help="The lowest-priority PriorityClass (created by the chart).",
    )
    image = Unicode("registry.k8s.io/pause:3.10", config=True, help="Image of the placeholder container.")
    node_selector = Dict(
        {"nvidia.com/gpu.present": "true"}, config=True, help="Node selector of the GPU node pool to grow."
    )
    tolerations = List(
        Dict(),
        [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        config=True,
        help="Tolerations for tainted GPU nodes.",
    )
    instance = Unicode("notebookos", config=True, help="app.kubernetes.io/instance label (the helm release).")
    max_placeholders = Integer(64, config=True, help="Upper bound of placeholders, whatever the target says.")
    owner_config_map = Unicode(
        "",
        config=True,
        help="Name of the ConfigMap in the namespace that owns placeholder pods (the chart creates it), so "
        "uninstalling the release deletes them and frees their GPU nodes. Empty: no ownerReferences.",
    )

    core_api = AnyTrait(None, allow_none=True, help="A kubernetes CoreV1Api (tests pass a fake).")
    scheduling_api = AnyTrait(None, allow_none=True, help="A kubernetes SchedulingV1Api (tests pass a fake).")

    _owner: dict[str, str] | None = None

    def settings(self) -> objects.PlaceholderSettings:
        """The traitlets as the pure builder's settings."""
        return objects.PlaceholderSettings(
            owner=dict(self._owner or {}),
            namespace=self.namespace,
            gpus_per_node=self.gpus_per_node,
            priority_class_name=self.priority_class_name,
            image=self.image,
            node_selector=dict(self.node_selector),
            tolerations=tuple(self.tolerations),
            instance=self.instance,
        )

    async def _core(self) -> Any:
        if self.core_api is None:
            self.core_api = await asyncio.to_thread(load_core_api)
        return self.core_api

    async def check_priority_class(self) -> None:
        """Fail with a clear message if the placeholder PriorityClass is missing (the chart creates it)."""
        if self.scheduling_api is None:
            from kubernetes import client

            await self._core()  # loads the configuration
            self.scheduling_api = client.SchedulingV1Api()
        try:
            await asyncio.to_thread(self.scheduling_api.read_priority_class, self.priority_class_name)
        except Exception as err:
            if getattr(err, "status", None) == 404:
                raise LaunchError(
                    f"PriorityClass {self.priority_class_name!r} does not exist, so placeholder pods cannot "
                    "be created; install the chart with placeholders.enabled=true or create it"
                ) from None
            raise api_error(err, f"read PriorityClass {self.priority_class_name}", self.namespace) from None

    async def list(self) -> list[Placeholder]:
        """The placeholder pods that exist now (finished or terminating ones excluded)."""
        core = await self._core()
        try:
            result = to_dict(
                await asyncio.to_thread(
                    core.list_namespaced_pod, self.namespace, label_selector=objects.placeholder_selector()
                )
            )
        except Exception as err:
            raise api_error(err, "list placeholder pods", self.namespace) from None
        found = []
        for pod in result.get("items") or []:
            pod = to_dict(pod)
            meta, pod_status = pod.get("metadata") or {}, pod.get("status") or {}
            if meta.get("deletionTimestamp") or pod_status.get("phase") in ("Succeeded", "Failed"):
                continue
            node = (pod.get("spec") or {}).get("nodeName") or None
            found.append(
                Placeholder(name=str(meta.get("name")), node=node, phase=str(pod_status.get("phase") or "Pending"))
            )
        return sorted(found, key=lambda p: p.name)

    async def scale_to(
        self, desired: int, *, release_nodes: Sequence[str] = (), avoid_nodes: Sequence[str] = ()
    ) -> PlaceholderScaling:
        """Create or delete placeholders until ``desired`` exist.

        New placeholders stay off ``avoid_nodes`` (the nodes that are hosts already), so each one that is
        Pending asks for a new node.

        Scale-in deletes, in order: placeholders on ``release_nodes`` (hosts the scheduler has drained), then
        Pending ones (a node not yet provisioned is the cheapest to give up), then by name.
        """
        if desired < 0:
            raise ValueError(f"desired placeholder count must be 0 or more, not {desired}")
        target = min(desired, self.max_placeholders)
        current = await self.list()
        core = await self._core()
        created: list[str] = []
        deleted: list[str] = []
        errors: list[str] = []
        if len(current) < target:
            if self.owner_config_map and self._owner is None:
                self._owner = await ownership.read_owner(core, self.owner_config_map, self.namespace)
                if self._owner is None:
                    self.log.warning(
                        "owner ConfigMap %s/%s does not exist: placeholders get no ownerReferences",
                        self.namespace,
                        self.owner_config_map,
                    )
            settings = self.settings()
            for _ in range(target - len(current)):
                name = f"notebookos-placeholder-{secrets.token_hex(3)}"
                pod = objects.make_placeholder_pod(name, settings, avoid_nodes)
                try:
                    await asyncio.to_thread(core.create_namespaced_pod, self.namespace, pod)
                    created.append(name)
                except Exception as err:
                    errors.append(str(api_error(err, f"create placeholder {name}", self.namespace)))
                    break
        elif len(current) > target:
            released = set(release_nodes)
            order = sorted(
                current,
                key=lambda p: (p.node not in released, not p.pending, p.name),
            )
            for placeholder in order[: len(current) - target]:
                try:
                    await asyncio.to_thread(
                        core.delete_namespaced_pod, placeholder.name, self.namespace, grace_period_seconds=0
                    )
                    deleted.append(placeholder.name)
                except Exception as err:
                    if getattr(err, "status", None) == 404:
                        deleted.append(placeholder.name)
                        continue
                    errors.append(str(api_error(err, f"delete placeholder {placeholder.name}", self.namespace)))
        pending = sum(p.pending for p in current if p.name not in deleted) + len(created)
        decision = PlaceholderScaling(
            before=len(current),
            desired=target,
            created=tuple(created),
            deleted=tuple(deleted),
            pending=pending,
            errors=tuple(errors),
        )
        self.log.info("%s", decision)
        return decision
