"""What several suffixmem processes sharing one database need: a turn lock that holds across
processes, and the session's replica pin (``sessions.replica``, migration 0002).

Contract:
- ``SharedTurnLock(store).hold(session_id, timeout_s)``: on PostgreSQL a session-level advisory
  lock (``pg_try_advisory_lock``, key derived from the session id) taken on a connection of its
  own (outside the store's pool) and held for the ``with`` block, so two processes never run
  a turn of one session at once. If the process dies its connection closes and PostgreSQL
  releases the lock. Waiting longer than ``timeout_s`` raises ``SessionBusyError``. On a
  SQLite file with ``processes=True`` (the manager's ``durability="sync"``, which several
  processes on one file need) it is a POSIX byte-range lock (``fcntl.lockf``, one byte per
  session at an offset from the session id's hash) on ``<database>-turns.lock`` beside the
  file; the kernel drops it when the process dies. Otherwise on SQLite (one process, the
  default) it is a no-op: the in-process ``SessionLocks`` serialise turns, ``BEGIN
  IMMEDIATE`` the writes.
  ``shared`` says whether the lock is real, i.e. whether other processes may write the session.
- ``SqlPins(database_url)`` stores the replica in the session row; sessions without a row
  (stateless keys, a first turn not yet committed) are pinned in this process's memory.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, select, text, update
from sqlalchemy.pool import NullPool

from suffixmem.conversation.locks import SessionBusyError
from suffixmem.conversation.schema import SessionRow
from suffixmem.conversation.store import Store
from suffixmem.engine.routing import MemoryPins
from suffixmem.errors import StoreError

_POLL_S = 0.05


def advisory_key(session_id: str) -> int:
    """A signed 64-bit key for ``pg_advisory_lock`` (namespaced so other users of advisory
    locks on the same database do not collide with ours)."""
    digest = hashlib.sha256(f"suffixmem/session/{session_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class SharedTurnLock:
    """Cross-process per-session lock (see the module docstring)."""

    def __init__(self, store: Store, processes: bool = False) -> None:
        self.store = store
        url = store.engine.url
        self._file = (_lock_file(url.database) if processes and url.get_backend_name() ==
                      "sqlite" else None)
        self.shared = url.get_backend_name() == "postgresql" or self._file is not None
        # lock connections live outside the store's pool: a turn holds one for its whole
        # length, and many concurrent turns must not starve the store's own queries
        self._engine = (create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": 5})
                        if self.shared and self._file is None else None)

    @contextmanager
    def hold(self, session_id: str, timeout_s: float) -> Iterator[None]:
        if not self.shared:
            yield
            return
        if self._file is not None:
            with _file_lock(self._file, session_id, timeout_s):
                yield
            return
        key = advisory_key(session_id)
        deadline = time.monotonic() + timeout_s
        assert self._engine is not None
        with self._engine.connect() as conn:
            while not conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar():
                conn.rollback()  # no transaction left open while we wait
                if time.monotonic() > deadline:
                    raise SessionBusyError(
                        f"session {session_id!r} is busy in another suffixmem process; gave up "
                        f"after {timeout_s:g}s")
                time.sleep(_POLL_S)
            conn.commit()  # session-level lock: it outlives the transaction
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                conn.commit()


_FILES: dict[str, int] = {}  # lock file -> descriptor, kept open for the process's life
_FILES_GUARD = threading.Lock()


def _lock_file(database: str | None) -> str | None:
    """The turn-lock file of a SQLite database file (None: in memory, or no POSIX locks)."""
    if not database or database == ":memory:" or database.startswith("file::memory:"):
        return None
    try:
        import fcntl  # noqa: F401 - POSIX only
    except ImportError:  # pragma: no cover - Windows: one process per SQLite file
        return None
    return os.path.abspath(database) + "-turns.lock"


@contextmanager
def _file_lock(path: str, session_id: str, timeout_s: float) -> Iterator[None]:
    import fcntl

    with _FILES_GUARD:
        # one descriptor per file for the process: closing any descriptor of a file drops
        # every POSIX lock the process holds on it
        fd = _FILES.get(path)
        if fd is None:
            try:
                fd = _FILES[path] = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as e:  # a folder in its place, a read-only folder
                raise StoreError(f"cannot open the turn lock file {path}: {e.strerror} (it "
                                 "sits next to the database; remove what is in its way)"
                                 ) from None
    offset = advisory_key(session_id) & ((1 << 62) - 1)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset)
            break
        except OSError:  # held by another process (EAGAIN / EACCES)
            if time.monotonic() > deadline:
                raise SessionBusyError(
                    f"session {session_id!r} is busy in another suffixmem process; gave up "
                    f"after {timeout_s:g}s") from None
            time.sleep(_POLL_S)
    try:
        yield
    finally:
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, offset)


class SqlPins:
    """Replica pins in the session rows of a shared database (``routing.PinStore``)."""

    def __init__(self, database_url: str) -> None:
        self.store = Store(database_url)  # migrates: the replica column exists from here on
        self._memory = MemoryPins()

    def get(self, session_key: str) -> str | None:
        with self.store.engine.connect() as conn:
            found = conn.execute(
                select(SessionRow.replica).where(SessionRow.id == session_key)).first()
        if found is None:
            return self._memory.get(session_key)
        if found[0] is None:
            # a first turn is served before its commit creates the row: move its pin there now
            pin = self._memory.get(session_key)
            if pin is not None:
                self.set(session_key, pin)
            return pin
        return str(found[0])

    def set(self, session_key: str, url: str) -> None:
        with self.store.engine.begin() as conn:
            n = conn.execute(update(SessionRow).where(SessionRow.id == session_key)
                             .values(replica=url)).rowcount
        if not n:
            self._memory.set(session_key, url)

    def close(self) -> None:
        self.store.close()
