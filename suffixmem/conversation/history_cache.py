"""Committed histories kept in memory, so a turn reads from SQL only what changed.

A turn needs its session's whole history, but between two turns of a session only the last
turn's messages are new. ``Store.turn_state`` therefore keeps each session's history here and,
within its one read transaction, reads the session row and then:

- nothing more when the row's ``updated_at`` is the one the entry was read or committed at
  (every write of a session's messages sets ``updated_at``; ``Store`` is their only writer);
- otherwise the messages from the entry's last position on: if the first of them is that last
  message unchanged (same position, role, content, ids and ``created_at``), the rest is
  appended; any other outcome (a cleared or rewritten history, another process's edit) reads
  the whole history again.

So the cache is never trusted over the database, only used to skip rows the database confirms.
While a turn's commit is still queued behind its caller (``write_behind``), the session's
next turn plans from that commit's *projection* (the record and history as the commit will
leave them, built by ``Store.commit_later`` and kept with the pending commit); the projection
is also put here, and since the commit stores exactly the projected rows (same positions and
timestamps), once it lands the entry is confirmed as any other.
Entries are immutable tuples of frozen ``StoredMessage``s; the table holds at most
``max_sessions`` sessions (oldest written first out). Plain dict operations only: no lock,
so sessions never wait for each other here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from suffixmem.conversation.records import SessionRecord, StoredMessage


@dataclass(slots=True, frozen=True)
class CachedHistory:
    """A session's history as read or committed (``stamp``: the row's ``updated_at`` then;
    None when unknown: the next read confirms the entry row by row). ``record``: the session
    row as of ``stamp`` when known (a pending commit's projection needs it)."""

    stamp: datetime | None
    messages: tuple[StoredMessage, ...]
    record: SessionRecord | None = None


class HistoryCache:
    """Per-session histories (module docstring). ``full`` / ``partial`` / ``hits`` count the
    reads that loaded everything, only the new tail, or nothing (for tests and profiles)."""

    def __init__(self, max_sessions: int = 256) -> None:
        self.max_sessions = max_sessions
        self._entries: dict[str, CachedHistory] = {}
        self.full = self.partial = self.hits = 0

    def get(self, session_id: str) -> CachedHistory | None:
        return self._entries.get(session_id)

    def put(self, session_id: str, entry: CachedHistory) -> None:
        if self.max_sessions <= 0:
            return
        self._entries.pop(session_id, None)  # re-insert: the dict's order is write order
        self._entries[session_id] = entry
        while len(self._entries) > self.max_sessions:
            try:
                del self._entries[next(iter(self._entries))]
            except (KeyError, StopIteration, RuntimeError):  # another thread got there first
                break

    def extend(self, session_id: str, first_position: int,
               messages: tuple[StoredMessage, ...], stamp: datetime | None = None) -> None:
        """A commit appended ``messages`` at ``first_position`` and set the row's ``updated_at``
        to ``stamp``: extend the entry when it ends right before them (or already ends with
        them: the commit's projection), else drop it. The next read trusts the entry only
        while the row still carries ``stamp`` (no write since)."""
        entry = self._entries.get(session_id)
        if entry is None:
            return
        if messages and entry.messages[-len(messages):] == messages:
            if entry.stamp != stamp:  # a projection built with another stamp: not this commit's
                self.drop(session_id)
            return
        end = entry.messages[-1].position + 1 if entry.messages else 0
        if end != first_position:
            self.drop(session_id)
            return
        self.put(session_id, CachedHistory(stamp, entry.messages + messages))

    def drop(self, session_id: str) -> None:
        self._entries.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._entries)
