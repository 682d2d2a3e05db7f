"""The loops the parts of a replica kernel run on, and how their threads share the GIL.

:class:`~jupyter_notebookos.kernel.replica.ReplicaKernel` (an ipykernel kernel) builds its parts (following the log,
publishing cells, checkpoints, idle verification) and hands each itself as a :class:`KernelLoop`: ipykernel's event
loop and its queue of dispatches, which run one at a time between shell requests, and the user's namespace. Their
etcd work runs on the :class:`CoordinationThread`'s loop instead, which a cell holding the kernel's loop never stops.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Protocol, TypeVar

_T = TypeVar("_T")


class KernelLoop(Protocol):
    """The kernel as its parts see it."""

    @property
    def io_loop(self) -> Any:
        """ipykernel's tornado IOLoop, on the main thread (set when the kernel starts)."""
        ...

    @property
    def namespace(self) -> dict[str, Any]:
        """The user's namespace."""
        ...

    def schedule_dispatch(self, dispatch: Callable[..., Any], *args: Any) -> None:
        """Queue ``dispatch(*args)`` to run on the loop between shell requests, in order with them."""
        ...

    def requests_waiting(self) -> bool:
        """Whether requests are queued for dispatch."""
        ...


class CoordinationThread:
    """A daemon thread running an asyncio loop for the etcd client."""

    def __init__(self, name: str = "notebookos-etcd") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self) -> None:
        """Start the thread (idempotent)."""
        if not self._thread.is_alive():
            self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        """Run ``coro`` on the loop; returns its future (safe from any thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, _T], timeout: float | None = None) -> _T:
        """Run ``coro`` on the loop and wait for its result (never call this from the loop itself)."""
        return self.submit(coro).result(timeout)


class QuickGilHandoff:
    """While a thread pickles the namespace for the kernel, a request that arrives gets the GIL within 0.5 ms,
    not Python's default 5 ms (the switch interval is the process's).

    Counted: a checkpoint (on the loop) and a verification (in a thread) can overlap and end in either order. Each
    saving and restoring the interval itself, the one that began second and ended last put back the 0.5 ms it had
    found, and the user's code ran with it from then on (more GIL switches with any thread of its own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._previous = 0.0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._users == 0:
                self._previous = sys.getswitchinterval()
                sys.setswitchinterval(min(self._previous, 0.0005))
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    sys.setswitchinterval(self._previous)


#: The process's one hand-off (the switch interval it changes is the process's).
quick_gil_handoff = QuickGilHandoff()
