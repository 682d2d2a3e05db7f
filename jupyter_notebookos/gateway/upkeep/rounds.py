"""A gateway loop that runs one round every ``interval`` seconds and logs what the round did, as one line.

The GPU-ledger reconciler (:mod:`.reconcile`) and etcd's maintenance (:mod:`.defrag`) are such loops: each round
returns an outcome whose ``str`` is that line and whose ``acted`` says whether it changed anything (logged as a
warning then, at debug level otherwise). An etcd refusal or any other failure of one round is logged, and the next
round comes all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from jupyter_notebookos.coordination.errors import CoordinationError


class RoundOutcome(Protocol):
    """What one round did: ``acted`` when it changed something; ``str()`` says it in one line."""

    @property
    def acted(self) -> bool: ...


class PeriodicRounds:
    """Runs :meth:`run_round` every :attr:`interval` seconds (none when it is 0) between start() and stop()."""

    interval: float
    #: What the rounds do, for the log ("reconciling the GPU ledger").
    activity = "a periodic round"
    _task: asyncio.Task[None] | None = None

    async def run_round(self) -> RoundOutcome:
        raise NotImplementedError

    def start(self) -> None:
        """Start the rounds (nothing when ``interval`` is 0)."""
        if self._task is None and self.interval > 0:
            self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        log = logging.getLogger(type(self).__module__)
        while True:
            await asyncio.sleep(self.interval)
            try:
                outcome = await self.run_round()
            except CoordinationError as err:
                log.warning("%s: etcd refused (next round in %.0f s): %s", self.activity, self.interval, err)
                continue
            except Exception:  # the loop must outlive any one failure
                log.exception("%s failed", self.activity)
                continue
            (log.warning if self.worth_telling(outcome) else log.debug)("%s", outcome)

    def worth_telling(self, outcome: RoundOutcome) -> bool:
        """Whether a round's line goes out as a warning (it acted) rather than at debug level."""
        return outcome.acted
