"""Who owns what NotebookOS creates on Kubernetes, and what is left when nobody does.

- **The release's owner object**: the chart creates one ConfigMap per kernel namespace; replica pods, placeholder
  pods and kernels' credential Secrets carry an ownerReference to it, so ``helm uninstall`` (which deletes it)
  makes Kubernetes' garbage collector delete them too, and no placeholder keeps a GPU node up afterwards.
- **A kernel's credentials**: one Secret per kernel (:func:`objects.make_kernel_secret`), created before its first
  replica pod, referenced by every replica pod, deleted with the kernel.
- **Orphans**: a gateway that crashed between creating a kernel's pods (or Secret) and recording the kernel
  leaves objects no kernel owns. :func:`find_orphans` names them, for the launcher's periodic sweep.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from jupyter_notebookos.launchers.kubernetes import objects
from jupyter_notebookos.launchers.kubernetes.api import api_error
from jupyter_notebookos.launchers.kubernetes.reflector import to_dict


async def read_owner(core: Any, name: str, namespace: str) -> dict[str, str] | None:
    """The ownerReference target for ``namespace``: the ConfigMap ``name`` there, or None if it does not exist."""
    try:
        found = to_dict(await asyncio.to_thread(core.read_namespaced_config_map, name, namespace))
    except Exception as err:
        if getattr(err, "status", None) == 404:
            return None
        raise api_error(err, f"read the owner ConfigMap {name}", namespace) from None
    meta = found.get("metadata") or {}
    return {"apiVersion": "v1", "kind": "ConfigMap", "name": name, "uid": str(meta.get("uid") or "")}


async def apply_secret(core: Any, secret: dict[str, Any]) -> None:
    """Create a kernel's credentials Secret, or replace it if a previous gateway left one with that name."""
    namespace, name = secret["metadata"]["namespace"], secret["metadata"]["name"]
    try:
        await asyncio.to_thread(core.create_namespaced_secret, namespace, secret)
        return
    except Exception as err:
        if getattr(err, "status", None) != 409:
            raise api_error(err, f"create Secret {name}", namespace) from None
    try:
        await asyncio.to_thread(core.replace_namespaced_secret, name, namespace, secret)
    except Exception as err:
        raise api_error(err, f"replace Secret {name}", namespace) from None


async def delete_secret(core: Any, name: str, namespace: str) -> None:
    """Delete a kernel's credentials Secret (gone already is fine)."""
    try:
        await asyncio.to_thread(core.delete_namespaced_secret, name, namespace)
    except Exception as err:
        if getattr(err, "status", None) != 404:
            raise api_error(err, f"delete the kernel's Secret {name}", namespace) from None


async def list_secrets(core: Any, namespace: str) -> list[dict[str, Any]]:
    """The kernels' credentials Secrets in ``namespace`` (metadata only is used)."""
    try:
        result = to_dict(
            await asyncio.to_thread(
                core.list_namespaced_secret, namespace, label_selector=objects.kernel_secret_selector()
            )
        )
    except Exception as err:
        raise api_error(err, "list kernels' Secrets", namespace) from None
    return [to_dict(item) for item in result.get("items") or []]


@dataclass(frozen=True)
class Orphan:
    """An object of a kernel this gateway does not run: ``kind`` is ``Pod`` or ``Secret``."""

    kind: str
    namespace: str
    name: str
    kernel_id: str

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name} (kernel {self.kernel_id})"


def _age(meta: Mapping[str, Any], now: datetime) -> float:
    created = meta.get("creationTimestamp")
    if isinstance(created, str):
        try:
            created = datetime.fromisoformat(created.replace("Z", "+00:00"))
        except ValueError:
            return 0.0
    if not isinstance(created, datetime):
        return 0.0  # unknown age: never old enough
    if created.tzinfo is None:
        created = created.replace(tzinfo=UTC)
    return (now - created).total_seconds()


def find_orphans(
    objects_: Iterable[tuple[str, Mapping[str, Any]]],
    known_kernels: set[str],
    *,
    now: datetime,
    grace: float,
) -> list[Orphan]:
    """The objects (``(kind, object)`` pairs) whose kernel is not one of ``known_kernels`` and that are older than
    ``grace`` seconds (a kernel being started right now is not known yet for a moment)."""
    found = []
    for kind, obj in objects_:
        meta = obj.get("metadata") or {}
        kernel_id = str((meta.get("labels") or {}).get(objects.KERNEL_ID_LABEL) or "")
        if not kernel_id or kernel_id in known_kernels or meta.get("deletionTimestamp"):
            continue
        if _age(meta, now) < grace:
            continue
        found.append(Orphan(kind, str(meta.get("namespace")), str(meta.get("name")), kernel_id))
    return sorted(found, key=lambda o: (o.kernel_id, o.kind, o.name))
