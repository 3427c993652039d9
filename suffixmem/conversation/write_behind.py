"""Turns stored just after their caller has the reply (``ManagerConfig.durability="async"``).

A turn's commit is one transaction (about 0.5 ms on SQLite: ``BEGIN IMMEDIATE``, five
statements, the WAL append and the Python around them, docs/profile.md round 5), and it was
the largest piece of the time the manager adds to a call after the last token. With
``durability="async"`` the manager hands the commit to the background worker instead of
running it before returning (the worker runs it while the next turn's engine works, or within
``Background.delay_s`` on an idle server), as LangGraph's ``durability="async"`` persists a
step's checkpoint while the next step runs.

What this process sees never changes: the store settles a session's pending commit at the top
of every method that reads or writes that session (``settle``: the commit runs inline if the
worker has not started it, else the caller waits for it), and every pending commit before
listing sessions or closing. So its history, a fork or a delete all see the turn. The
session's next turn does not wait: it plans from the commit's projection (the rows the commit
will write, kept in ``history_cache``) and its own commit queues behind the pending one; with
four sessions turning at once, settling inline was most of the time before the engine
(docs/profile.md, round 7). What changes: another *process* may read the session up to
``delay_s`` before the turn is there, and a process killed in that window loses the turn (its
caller already had the reply); a commit refused in the background is reported by the
session's next read that settles (its history, or the turn after a turn that had to wait).
Hence ``durability="sync"`` (commit before returning), which the manager also uses whenever
other processes may write the session (``SharedTurnLock.shared``: the turn's cross-process
lock must cover its commit).

Contract:
- ``add(session_id, fn, name)`` registers ``fn`` as the session's pending commit and returns it
  as a ``Job`` for the caller to queue; an earlier commit of the session still pending runs
  first (order is kept even if a caller settles only the newest).
- ``settle(session_id)``: when it returns the session's commits have run. A commit that failed
  raises here, once, as ``StoreError`` naming the session, how many turns were lost and the
  cause (the worker has also logged it); later calls proceed.
- A commit queued behind one that fails is not run: its turn was planned from the failed
  commit's projection (its prompt read that turn), so stored on top of what is really there it
  would answer a turn the history does not have. It is lost with it, and counted.
- ``add(..., projection=)`` keeps what the commit will leave (the store's ``CachedHistory``);
  ``projection(session_id)`` returns it while that commit is queued and has not finished, and
  the store serves the session's next turn from it. It is kept with the job rather than read
  from the history cache, which a concurrent read of the same session may overwrite.
- ``settle_all()``: every pending commit has run; failures are kept for their session's next
  ``settle``. At interpreter exit every store's pending commits are settled (``atexit``), so a
  script that never calls ``close()`` loses no turn either.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

from suffixmem.conversation.background import Job
from suffixmem.errors import StoreError

log = logging.getLogger(__name__)


class PendingCommits:
    """Per-session commits not yet known to have run (module docstring)."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        # session -> what its newest pending commit will leave (``add(projection=)``)
        self._projections: dict[str, Any] = {}
        self._failed: dict[str, _Lost] = {}  # reported by the session's next settle
        self._lock = threading.Lock()  # guards the dicts only, never held while a job runs
        _LIVE.add(self)

    def add(self, session_id: str, fn: Callable[[], Any], name: str = "turn commit",
            projection: Any = None) -> Job:
        with self._lock:
            # still registered: pending, or failed and not reported yet (a commit that ran is
            # forgotten), so a turn planned on a failed commit's projection is lost with it
            earlier = self._jobs.get(session_id)

            def commit() -> Any:
                if earlier is not None:
                    try:
                        earlier.run()
                    except Exception as e:
                        # planned on top of the lost turn: lost with it (module docstring)
                        with self._lock:
                            self._failed.setdefault(session_id, _Lost(e)).behind += 1
                        raise StoreError(f"session {session_id!r}: a turn was not stored "
                                         f"because the turn before it was not ({e})") from e
                try:
                    value = fn()
                except Exception as e:  # kept for settle(): the next plan reads the store
                    with self._lock:
                        self._failed.setdefault(session_id, _Lost(e))
                    raise
                self._forget(session_id, job)  # nothing left to settle (a failure is kept)
                return value

            job = Job(commit, name)
            self._jobs[session_id] = job
            self._projections[session_id] = projection
            return job

    def __len__(self) -> int:
        with self._lock:
            return sum(not job.done for job in self._jobs.values())

    def _forget(self, session_id: str, job: Job) -> None:
        with self._lock:
            if self._jobs.get(session_id) is job:
                del self._jobs[session_id]
                self._projections.pop(session_id, None)

    def _finish(self, session_id: str, job: Job) -> None:
        """Run ``job`` (or wait for it) and drop it; a failure is already in ``_failed`` (the
        commit ``add`` wrapped records its own)."""
        with contextlib.suppress(Exception):
            job.run()
        self._forget(session_id, job)

    def projection(self, session_id: str) -> Any:
        """What the session's newest commit will leave, while it is queued and has not finished
        (nor failed unreported); else None."""
        with self._lock:
            job = self._jobs.get(session_id)
            if job is None or job.done or session_id in self._failed:
                return None
            return self._projections.get(session_id)

    def settle(self, session_id: str) -> None:
        job = self._jobs.get(session_id)
        if job is not None:
            self._finish(session_id, job)
        if self._failed:
            with self._lock:
                lost = self._failed.pop(session_id, None)
            if lost is not None:
                raise StoreError(lost.message(session_id)) from lost.error

    def failures(self) -> list[str]:
        """Lost turns not reported yet, one line per session, forgotten once read."""
        with self._lock:
            lost, self._failed = self._failed, {}
        return [f.message(sid) for sid, f in lost.items()]

    def settle_all(self) -> None:
        with self._lock:
            pending = list(self._jobs.items())
        for session_id, job in pending:
            self._finish(session_id, job)


class _Lost:
    """A session's turns lost in the background: the first commit's error and how many turns
    (that one and those queued behind it)."""

    def __init__(self, error: BaseException) -> None:
        self.error, self.behind = error, 0  # behind: turns queued after the one that failed

    def message(self, session_id: str) -> str:
        n = self.behind + 1
        which = "its last turn was" if n == 1 else f"its last {n} turns were"
        return f"session {session_id!r}: {which} not stored ({self.error})"


_LIVE: weakref.WeakSet[PendingCommits] = weakref.WeakSet()


@atexit.register
def _settle_at_exit() -> None:
    """A program that exits without ``close()`` still stores its last turns: the background
    worker is a daemon thread, which the interpreter would stop with its queue unrun (atexit
    handlers run before that, while the database is still usable)."""
    for pending in list(_LIVE):
        try:
            pending.settle_all()
        except Exception:  # never fail an exit; the worker has logged the commit's error
            log.warning("storing pending turns at exit failed", exc_info=True)
