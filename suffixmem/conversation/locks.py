"""Per-session turn locks with owners (issue 18).

A lock is held only while a turn runs. The holder is recorded (thread and request) so a turn
that waits longer than the timeout fails with a ``SessionBusyError`` that says who holds it.
A turn holds its lock inside the ``stream_chat`` generator's ``with`` block, so a generator that
is abandoned without ``close()`` still releases it: CPython closes a generator when it is
collected, which runs the ``with`` exit. ``threading.Lock`` (not ``RLock``) because the
collection, or an async consumer's worker thread, may release it from another thread.

A stream paused between two events ``park``s its turn, naming its consumer (``consumer()``:
the thread, or the asyncio task, that steps it). If that same consumer starts another turn of
the session, the paused one was abandoned, since one consumer does one thing at a time (a
``break`` out of a stream still referenced, LlamaIndex's ``gen = llm.stream_chat(...)``): the
new turn closes it (its engine request is aborted, nothing is stored) instead of waiting for
the garbage collector, or ``lock_timeout_s`` and a ``SessionBusyError``. A thread waits
``THREAD_GRACE_S`` first, and leaves a stream that is stepped meanwhile alone: a thread pool may
step one live stream from several threads. Turns of other consumers (other threads, other
server requests) wait as before.

Entries of sessions nobody holds or waits for are dropped, so the table does not grow with the
number of sessions ever seen. Locks of different sessions never block each other.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from suffixmem.engine.async_stream import consumer
from suffixmem.errors import SuffixmemError

log = logging.getLogger(__name__)

# how long a stream left paused by a thread must stay untouched before that thread's next turn
# of its session closes it (an asyncio task is told apart exactly, and closes it at once)
THREAD_GRACE_S = 1.0


class SessionBusyError(SuffixmemError, TimeoutError):
    """A turn waited longer than ``ManagerConfig.lock_timeout_s`` for its session's lock."""


@dataclass(slots=True)
class _Entry:
    lock: threading.Lock
    users: int = 0  # holders + waiters
    owner: str = ""
    since: float = 0.0
    # the holder paused between two events: its consumer, and how to close it
    parked: tuple[tuple[str, int], Callable[[], None]] | None = None


class SessionLocks:
    """One lock per session id, created on demand."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._guard = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    @contextmanager
    def hold(self, session_id: str, owner: str = "") -> Iterator[None]:
        """Hold the session's lock for the ``with`` block; ``SessionBusyError`` after
        ``timeout_s`` of waiting."""
        with self._guard:
            entry = self._entries.get(session_id)
            if entry is None:
                entry = self._entries[session_id] = _Entry(threading.Lock())
            entry.users += 1
        try:
            if not entry.lock.acquire(blocking=False):
                self._take_over(entry)
                if not entry.lock.acquire(timeout=self.timeout_s):
                    held = time.monotonic() - entry.since
                    raise SessionBusyError(
                        f"session {session_id!r} is busy: another turn "
                        f"({entry.owner or 'unknown'}) has held it for {held:.1f}s; gave up "
                        f"after {self.timeout_s:g}s")
        except BaseException:
            self._leave(session_id, entry)
            raise
        entry.owner = owner or f"thread {threading.current_thread().name}"
        entry.since = time.monotonic()
        try:
            yield
        finally:
            entry.owner, entry.parked = "", None
            entry.lock.release()
            self._leave(session_id, entry)

    def park(self, session_id: str, close: Callable[[], None]) -> None:
        """The holder of ``session_id``'s lock pauses between two events (until ``unpark``);
        ``close`` ends it (module docstring)."""
        entry = self._entries.get(session_id)
        if entry is not None:
            entry.parked = (consumer(), close)

    def unpark(self, session_id: str) -> None:
        entry = self._entries.get(session_id)
        if entry is not None:
            entry.parked = None

    @staticmethod
    def _take_over(entry: _Entry) -> None:
        """Close the holder if it is a stream this consumer left paused (module docstring)."""
        parked = entry.parked
        if parked is None or parked[0] != consumer():
            return
        if parked[0][0] == "thread":
            # a thread pool (Starlette's ``iterate_in_threadpool``) steps one live stream from
            # several threads: only a stream nobody steps for a while is taken as abandoned
            deadline = time.monotonic() + THREAD_GRACE_S
            while time.monotonic() < deadline:
                if entry.parked is not parked:
                    return  # stepped meanwhile (or finished): alive
                time.sleep(0.01)
        try:
            parked[1]()
        except Exception:  # e.g. resumed meanwhile ("generator already executing"): wait
            log.debug("closing an abandoned turn failed", exc_info=True)

    def held(self, session_id: str) -> bool:
        with self._guard:
            entry = self._entries.get(session_id)
            return entry is not None and entry.lock.locked()

    def __len__(self) -> int:
        with self._guard:
            return len(self._entries)

    def _leave(self, session_id: str, entry: _Entry) -> None:
        with self._guard:
            entry.users -= 1
            if entry.users == 0 and self._entries.get(session_id) is entry:
                del self._entries[session_id]
