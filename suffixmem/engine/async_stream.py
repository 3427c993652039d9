"""Blocking event streams (an engine's ``stream``, a manager's turn) iterated from asyncio.

Contract: ``aiter_events(events)`` yields what ``events`` yields, each ``next`` in a worker
thread so the loop never blocks (``consumer()`` there names the awaiting asyncio task); a
consumer that stops early closes ``events`` (in a thread too, awaited), which for an engine
stream aborts the request and for a manager's turn frees the session's lock. A cancelled
consumer (``asyncio.wait_for`` timing out, a server whose client left) gets its
``CancelledError`` at once; ``events`` is closed in the background as soon as the ``next`` in
flight returns (one token, or the session lock it waits for). A ``next`` that waits on
something that may never answer (the remote engine's replica) polls ``abandoned()`` and gives
up once the consumer left, so the close (and the session's lock) need not wait for it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from typing import TypeVar

_T = TypeVar("_T")

log = logging.getLogger(__name__)

# the asyncio task on whose behalf a worker thread steps a stream (``aiter_events``)
_TASK: contextvars.ContextVar[int | None] = contextvars.ContextVar("suffixmem_consumer",
                                                                  default=None)


# set once the consumer of the stream a worker thread steps has left (``abandoned``)
_LEFT: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "suffixmem_consumer_left", default=None)


class ConsumerLeft(Exception):
    """Raised inside a ``next`` that gave up because its consumer left (``abandoned``); it
    reaches nobody but the stream's own cleanup, which stores nothing and frees the lock."""


def abandoned() -> bool:
    """Whether the asyncio consumer of the stream running here has left (cancelled, or stopped
    early): a blocking wait inside ``next`` should give up. False outside ``aiter_events``."""
    left = _LEFT.get()
    return left is not None and left.is_set()


def consumer() -> tuple[str, int]:
    """Who is stepping the stream running here: the asyncio task that awaits it (in
    ``aiter_events``' worker thread), else this thread. One consumer does one thing at a
    time, so a stream it left paused and then started another turn beside is abandoned."""
    task = _TASK.get()
    return ("task", task) if task is not None else ("thread", threading.get_ident())


async def aiter_events(events: Iterator[_T]) -> AsyncIterator[_T]:
    """Iterate a blocking event generator from asyncio without blocking the loop (module
    docstring)."""
    done = object()
    # next() and close() one at a time: a cancelled await leaves its worker thread inside
    # next(), and a generator closed meanwhile raised "generator already executing" (instead
    # of the cancellation) and was never closed, so a turn kept its session's lock for good
    guard = threading.Lock()

    def step() -> object:
        with guard:
            return next(events, done)

    def close() -> None:
        with guard:
            try:
                events.close()  # type: ignore[attr-defined]
            except Exception:
                log.warning("closing an abandoned event stream failed", exc_info=True)

    finished = cancelled = False
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    context.run(_TASK.set, id(asyncio.current_task()))
    left = threading.Event()
    context.run(_LEFT.set, left)
    try:
        while True:
            try:
                event = await loop.run_in_executor(None, context.run, step)
            except asyncio.CancelledError:
                cancelled = True
                raise
            if event is done:
                finished = True
                return
            yield event  # type: ignore[misc]
    finally:
        if not finished:
            left.set()  # a next() still in flight stops waiting (``abandoned``)
            closing = asyncio.get_running_loop().run_in_executor(None, close)
            if not cancelled:
                await closing
