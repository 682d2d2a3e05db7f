"""The background tasks of one kernel's router: started by its parts, cancelled together when it closes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable

log = logging.getLogger("jupyter_notebookos.gateway.router")


class RouterTasks:
    """Tasks the parts of one router start (socket loops, watches, sends, closing lost records).

    A task that fails is logged with the kernel's id: nothing awaits most of them, and a failure must not pass
    unseen. :meth:`cancel_all` ends them when the router closes."""

    def __init__(self, kernel_id: str) -> None:
        self.kernel_id = kernel_id
        self._tasks: list[asyncio.Task[None]] = []

    def spawn(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        """Run ``coro`` in the background until it ends or the router closes."""
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.append(task)
        task.add_done_callback(self._done)
        return task

    def cancel_all(self) -> None:
        """Cancel every task still running (the router is closing)."""
        for task in self._tasks:
            task.cancel()

    def _done(self, task: asyncio.Task[None]) -> None:
        with contextlib.suppress(ValueError):
            self._tasks.remove(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("kernel %s: router task failed: %r", self.kernel_id, task.exception())
