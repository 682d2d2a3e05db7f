"""wait_event: a deadline on an Event, and a cancellation that always ends the wait."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import pytest

from jupyter_notebookos.waiting import wait_event


async def _wait_for(event: asyncio.Event, timeout: float) -> bool:
    """What the platform's waiting loops did before: asyncio.wait_for on the Event."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)
    return event.is_set()


async def _cancel_as_the_event_is_set(wait: Callable[[asyncio.Event, float], Awaitable[bool]]) -> bool:
    """A loop waiting for a wake-up until a 30 s deadline (as a replica's launch does), cancelled in the same
    turn of the event loop as a wake-up arrives; True if the cancellation ended it."""
    event = asyncio.Event()
    woken = 0

    async def waiting() -> None:
        nonlocal woken
        for _ in range(3):
            event.clear()
            await wait(event, 30)
            woken += 1

    task = asyncio.ensure_future(waiting())
    await asyncio.sleep(0.01)
    event.set()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=0.5)
    if not done:
        task.cancel()  # the swallowed cancellation: end it for the next test
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return False
    return task.cancelled() and woken == 0


@pytest.mark.asyncio
async def test_a_cancellation_that_arrives_with_the_wake_up_ends_the_wait() -> None:
    assert await _cancel_as_the_event_is_set(wait_event)


@pytest.mark.asyncio
async def test_asyncio_wait_for_loses_that_cancellation_on_this_python() -> None:
    """Why wait_event exists (Python 3.11's wait_for; 3.12 rewrote it on asyncio.timeout)."""
    assert not await _cancel_as_the_event_is_set(_wait_for)


@pytest.mark.asyncio
async def test_the_deadline_and_the_event() -> None:
    event = asyncio.Event()
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert not await wait_event(event, 0.05)
    assert 0.04 < loop.time() - began < 1
    loop.call_later(0.01, event.set)
    assert await wait_event(event, 5)
    assert await wait_event(event, 0)  # set already: no wait
