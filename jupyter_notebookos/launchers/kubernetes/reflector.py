"""One shared list-then-watch per kind of object with a local cache (the habit of KubeSpawner's reflector).

A :class:`Reflector` runs the blocking kubernetes-client watch in a daemon thread, keeps the objects it sees
(as API-shaped dicts, like the manifests in :mod:`.objects`) and calls ``on_change(kind, obj)`` for every
change, where kind is ``ADDED``, ``MODIFIED`` or ``DELETED``. After the watch expires or the resource version
is too old (410 Gone) it lists again and reports the objects that vanished meanwhile as ``DELETED``, so
listeners never miss a removal.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s_client
from kubernetes import watch as k8s_watch
from kubernetes.client.rest import ApiException

ChangeCallback = Callable[[str, dict[str, Any]], None]


@functools.cache
def _serializer() -> k8s_client.ApiClient:
    return k8s_client.ApiClient()  # no network: only its model-to-dict conversion is used


def to_dict(obj: Any) -> dict[str, Any]:
    """An API object (kubernetes-client model or dict) as the API's JSON-shaped dict."""
    if isinstance(obj, dict):
        return obj
    data: dict[str, Any] = _serializer().sanitize_for_serialization(obj)
    return data


def object_key(obj: dict[str, Any]) -> str:
    """``namespace/name`` (or ``name`` for cluster-scoped objects)."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


class Reflector:
    """Lists and watches one kind of object with a selector, and keeps them in ``objects`` by key."""

    def __init__(
        self,
        list_func: Callable[..., Any],
        *,
        name: str,
        on_change: ChangeCallback | None = None,
        watch_factory: Callable[[], Any] = k8s_watch.Watch,
        watch_timeout: int = 300,
        retry_delay: float = 2.0,
        log: logging.Logger | None = None,
        **list_kwargs: Any,
    ) -> None:
        self.list_func = list_func
        self.list_kwargs = list_kwargs
        self.name = name
        self.on_change = on_change
        self.watch_factory = watch_factory
        self.watch_timeout = watch_timeout
        self.retry_delay = retry_delay
        self.log = log or logging.getLogger(__name__)
        self.objects: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.synced = threading.Event()
        self.error: Exception | None = None
        self._stopping = threading.Event()
        self._watch: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start listing and watching in a daemon thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"reflector-{self.name}", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the watch and wait briefly for the thread to end."""
        self._stopping.set()
        if self._watch is not None:
            self._watch.stop()
        if self._thread is not None:
            self._thread.join(timeout)

    def snapshot(self) -> list[dict[str, Any]]:
        """The cached objects, as a list (safe to iterate while the watch runs)."""
        with self.lock:
            return list(self.objects.values())

    def get(self, key: str) -> dict[str, Any] | None:
        """One cached object by ``namespace/name`` key."""
        with self.lock:
            return self.objects.get(key)

    def _emit(self, kind: str, obj: dict[str, Any]) -> None:
        if self.on_change is not None:
            try:
                self.on_change(kind, obj)
            except Exception:  # a listener's bug must not stop the watch
                self.log.exception("%s reflector listener failed on %s %s", self.name, kind, object_key(obj))

    def _relist(self) -> str:
        result = to_dict(self.list_func(**self.list_kwargs))
        fresh = {object_key(item): item for item in (to_dict(i) for i in result.get("items") or [])}
        with self.lock:
            old = self.objects
            self.objects = fresh
        for key, item in old.items():
            if key not in fresh:
                self._emit("DELETED", item)
        for key, item in fresh.items():
            before = old.get(key)
            if before is None:
                self._emit("ADDED", item)
            elif before != item:
                self._emit("MODIFIED", item)
        self.synced.set()
        return str((result.get("metadata") or {}).get("resourceVersion") or "")

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                version = self._relist()
                self.error = None
                self._watch = self.watch_factory()
                for event in self._watch.stream(
                    self.list_func,
                    resource_version=version,
                    timeout_seconds=self.watch_timeout,
                    **self.list_kwargs,
                ):
                    if self._stopping.is_set():
                        break
                    kind = event.get("type")
                    raw = event.get("raw_object") or to_dict(event.get("object"))
                    if kind == "ERROR":  # e.g. 410 Gone: relist
                        self.log.debug("%s watch error %s; listing again", self.name, raw)
                        break
                    if kind not in ("ADDED", "MODIFIED", "DELETED") or not isinstance(raw, dict):
                        continue
                    key = object_key(raw)
                    with self.lock:
                        if kind == "DELETED":
                            self.objects.pop(key, None)
                        else:
                            self.objects[key] = raw
                    self._emit(kind, raw)
            except ApiException as err:
                self.error = err
                self.log.warning("%s watch failed (%s %s); retrying", self.name, err.status, err.reason)
                self._stopping.wait(self.retry_delay)
            except Exception as err:  # network errors: keep the cache, retry
                self.error = err
                self.log.warning("%s watch failed (%s); retrying", self.name, err)
                self._stopping.wait(self.retry_delay)
