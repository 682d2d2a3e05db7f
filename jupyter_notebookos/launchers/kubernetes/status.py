"""What a replica pod's state means for NotebookOS: pure functions over API-shaped pod and event dicts.

:func:`blocking_reason` says why a Pending pod will not start without someone changing something (no node
fits, the image cannot be pulled, the container config is broken), so a launch fails fast with that reason
instead of waiting out its timeout. :func:`replica_status` maps a pod (or its absence) to a
:class:`~jupyter_notebookos.launchers.base.ReplicaStatus`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jupyter_notebookos.launchers.base import ReplicaPhase, ReplicaStatus

# Waiting reasons of a container that will not fix themselves.
BLOCKING_WAIT_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
# Warning events that block a pod before its containers exist.
BLOCKING_EVENT_REASONS = frozenset({"FailedScheduling", "ErrImageNeverPull", "InspectFailed"})
# The cluster autoscaler is adding a node for this pod: unschedulable for now, not for good.
SCALE_UP_EVENT = "TriggeredScaleUp"


def _container_statuses(pod: dict[str, Any]) -> list[dict[str, Any]]:
    status = pod.get("status") or {}
    return list(status.get("initContainerStatuses") or []) + list(status.get("containerStatuses") or [])


def blocking_reason(pod: dict[str, Any], events: Iterable[dict[str, Any]] = ()) -> str:
    """Why this Pending pod cannot start (``"Reason: message"``), or ``""`` when it may still start."""
    status = pod.get("status") or {}
    if status.get("phase") not in (None, "Pending") or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return ""
    for container in _container_statuses(pod):
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in BLOCKING_WAIT_REASONS:
            return f"{waiting['reason']}: {waiting.get('message') or 'image ' + str(container.get('image'))}"
    scheduled = bool((pod.get("spec") or {}).get("nodeName"))
    event_list = list(events)
    if not scheduled and any(e.get("reason") == SCALE_UP_EVENT for e in event_list):
        return ""
    if not scheduled:
        for condition in status.get("conditions") or []:
            if (
                condition.get("type") == "PodScheduled"
                and condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"
            ):
                return f"Unschedulable: {condition.get('message') or 'no node fits the pod'}"
    for event in event_list:
        reason = event.get("reason")
        if event.get("type") != "Warning" or reason not in BLOCKING_EVENT_REASONS:
            continue
        if reason == "FailedScheduling" and scheduled:
            continue  # an earlier attempt; the pod has a node now
        return f"{reason}: {event.get('message') or ''}".rstrip(": ")
    for event in event_list:  # kubelet reports pull failures as reason Failed before the status shows them
        message = str(event.get("message") or "")
        if event.get("type") == "Warning" and event.get("reason") == "Failed" and "pull" in message.lower():
            return f"ErrImagePull: {message}"
    return ""


def termination_reason(pod: dict[str, Any]) -> str:
    """Why a pod stopped: its own reason (Evicted, NodeLost...) or its container's (OOMKilled, exit code)."""
    status = pod.get("status") or {}
    if status.get("reason"):
        return f"{status['reason']}: {status.get('message') or ''}".rstrip(": ")
    for container in _container_statuses(pod):
        terminated = (container.get("state") or {}).get("terminated") or {}
        if terminated:
            reason = terminated.get("reason") or "Error"
            detail = f" (exit code {terminated.get('exitCode')})" if terminated.get("exitCode") is not None else ""
            message = f": {terminated['message']}" if terminated.get("message") else ""
            return f"{reason}{detail}{message}"
    return str(status.get("phase") or "unknown")


def is_running(pod: dict[str, Any]) -> bool:
    """The pod is Running and not being deleted."""
    return (pod.get("status") or {}).get("phase") == "Running" and not (pod.get("metadata") or {}).get(
        "deletionTimestamp"
    )


def is_gone(pod: dict[str, Any]) -> bool:
    """The pod has finished or is being deleted: its replica is not coming back."""
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed") or bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def replica_status(
    pod: dict[str, Any] | None, events: Iterable[dict[str, Any]] = (), *, deleted: bool = False
) -> ReplicaStatus:
    """The launcher's view of a replica from its pod (``None``: not found; ``deleted``: seen deleted)."""
    if pod is None:
        return ReplicaStatus(ReplicaPhase.EXITED, "pod no longer exists")
    phase = (pod.get("status") or {}).get("phase")
    if phase == "Failed":
        return ReplicaStatus(ReplicaPhase.FAILED, termination_reason(pod))
    if phase == "Succeeded":
        return ReplicaStatus(ReplicaPhase.EXITED, termination_reason(pod))
    if deleted:
        return ReplicaStatus(ReplicaPhase.EXITED, "pod was deleted")
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return ReplicaStatus(ReplicaPhase.EXITED, "pod is being deleted")
    if phase == "Running":
        return ReplicaStatus(ReplicaPhase.RUNNING)
    if phase in (None, "Pending"):
        reason = blocking_reason(pod, events)
        return ReplicaStatus(ReplicaPhase.FAILED, reason) if reason else ReplicaStatus(ReplicaPhase.STARTING)
    return ReplicaStatus(ReplicaPhase.UNKNOWN, f"pod phase {phase}")
