"""Per-session turn locks with owners (issue 18).

A lock is held only while a turn runs. The holder is recorded (thread and request) so a turn
that waits longer than the timeout fails with a ``SessionBusyError`` that says who holds it.
A turn holds its lock inside the ``stream_chat`` generator's ``with`` block, so a generator that
is abandoned without ``close()`` still releases it: CPython closes a generator when it is
collected, which runs the ``with`` exit. ``threading.Lock`` (not ``RLock``) because the
collection, or an async consumer's worker thread, may release it from another thread.

Entries of sessions nobody holds or waits for are dropped, so the table does not grow with the
number of sessions ever seen. Locks of different sessions never block each other.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from suffixmem.errors import SuffixmemError


class SessionBusyError(SuffixmemError, TimeoutError):
    """A turn waited longer than ``ManagerConfig.lock_timeout_s`` for its session's lock."""


@dataclass(slots=True)
class _Entry:
    lock: threading.Lock
    users: int = 0  # holders + waiters
    owner: str = ""
    since: float = 0.0


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
            if not entry.lock.acquire(timeout=self.timeout_s):
                held = time.monotonic() - entry.since
                raise SessionBusyError(
                    f"session {session_id!r} is busy: another turn ({entry.owner or 'unknown'})"
                    f" has held it for {held:.1f}s; gave up after {self.timeout_s:g}s")
        except BaseException:
            self._leave(session_id, entry)
            raise
        entry.owner = owner or f"thread {threading.current_thread().name}"
        entry.since = time.monotonic()
        try:
            yield
        finally:
            entry.owner = ""
            entry.lock.release()
            self._leave(session_id, entry)

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
