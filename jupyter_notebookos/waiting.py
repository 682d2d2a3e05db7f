"""Waiting for an ``asyncio.Event`` with a deadline, in a way that a cancellation always ends."""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds passed; True when it is set.

    Not ``asyncio.wait_for(event.wait(), timeout)``: on Python 3.11 that swallows a cancellation which arrives
    as the event is set, and a caller waiting in a loop then waits on for as long as its deadline allows (a
    kernel start cut short by a sibling replica's failure stayed stuck for the full launch timeout).
    ``asyncio.timeout`` cancels the waiting task itself, so a cancellation from outside is never mistaken for
    the deadline, nor lost.
    """
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return event.is_set()
    return True
