"""Blocking event streams (an engine's ``stream``, a manager's turn) iterated from asyncio.

Contract: ``aiter_events(events)`` yields what ``events`` yields, each ``next`` in a worker
thread so the loop never blocks; a consumer that stops early closes ``events`` (in a thread
too), which for an engine stream aborts the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import TypeVar

_T = TypeVar("_T")


async def aiter_events(events: Iterator[_T]) -> AsyncIterator[_T]:
    """Iterate a blocking event generator from asyncio without blocking the loop (module
    docstring)."""
    done = object()
    finished = False
    try:
        while True:
            event = await asyncio.to_thread(next, events, done)
            if event is done:
                finished = True
                return
            yield event  # type: ignore[misc]
    finally:
        if not finished:
            await asyncio.to_thread(events.close)  # type: ignore[attr-defined]
