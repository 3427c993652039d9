"""The per-turn half of the conversation store: the one read and the one commit of a turn.
A mixin of ``Store`` (its ``_conn``, ``_retrying``, ``_record``, ``_check``, ``history_cache``
and ``turn_sql``); kept apart because it is the hot path, where SQLAlchemy's own bookkeeping
was most of a turn's overhead: plain connections (no ORM session), statements compiled once
for the dialect and run on the DBAPI cursor (``prepared``), executemany, and only the messages
not read before (``history_cache``; a commit leaves the row's new ``updated_at`` there, so the
next turn's read confirms it with the session row alone).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, delete, func, insert, select, update
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session

from suffixmem.conversation.background import Job
from suffixmem.conversation.database import StatementReader
from suffixmem.conversation.history_cache import CachedHistory, HistoryCache
from suffixmem.conversation.prepared import Prepared
from suffixmem.conversation.records import (
    NewMessage,
    NewSession,
    SessionRecord,
    StoredMessage,
    TurnEvent,
    aware,
)
from suffixmem.conversation.schema import MessageRow, SessionRow, TurnEventRow, utcnow
from suffixmem.conversation.validation import check_session_id
from suffixmem.conversation.write_behind import PendingCommits
from suffixmem.errors import UnknownSessionError

SESSIONS = SessionRow.__table__
MESSAGES = MessageRow.__table__
EVENTS = TurnEventRow.__table__

# the per-turn statements, built once (bound parameters in ``:name`` style)
_SESSION = select(SESSIONS).where(SESSIONS.c.id == bindparam("sid"))
_SESSION_EXISTS = select(SESSIONS.c.id).where(SESSIONS.c.id == bindparam("sid"))
_MESSAGES_FROM = (
    select(MESSAGES.c.position, MESSAGES.c.role, MESSAGES.c.content, MESSAGES.c.token_ids,
           MESSAGES.c.token_count, MESSAGES.c.created_at)
    .where(MESSAGES.c.session_id == bindparam("sid"), MESSAGES.c.position >= bindparam("since"))
    .order_by(MESSAGES.c.position)
)
_LAST_POSITION = select(func.max(MESSAGES.c.position)).where(
    MESSAGES.c.session_id == bindparam("sid"))
# the session's new state; on PostgreSQL the UPDATE also takes the row lock that serialises
# the session's writers (SQLite's BEGIN IMMEDIATE already did)
_TOUCH = update(SESSIONS).where(SESSIONS.c.id == bindparam("sid")).values(
    temperature=bindparam("new_temperature"), window_start=bindparam("new_window_start"),
    updated_at=bindparam("now"))
_MESSAGE_KEYS = ("session_id", "position", "role", "content", "token_ids", "token_count",
                 "status", "created_at")
_SESSION_KEYS = ("id", "title", "model", "system_prompt", "temperature", "state",
                 "window_start", "created_at", "updated_at", "replica")
_EVENT_KEYS = ("session_id", "request_id", "prompt_tokens", "cached_tokens", "output_tokens",
               "ttft_s", "latency_s", "topic_jump", "similarity", "temperature",
               "evicted_turns", "finish_reason", "created_at", "reply_position")


class TurnSQL:
    """The per-turn statements prepared for one dialect (``Store.turn_sql``)."""

    def __init__(self, dialect: Dialect) -> None:
        self.session = Prepared(_SESSION, dialect)
        self.session_exists = Prepared(_SESSION_EXISTS, dialect)
        self.messages_from = Prepared(_MESSAGES_FROM, dialect)
        self.last_position = Prepared(_LAST_POSITION, dialect)
        self.touch = Prepared(_TOUCH, dialect)
        self.insert_messages = Prepared(insert(MESSAGES), dialect, _MESSAGE_KEYS)
        self.insert_event = Prepared(insert(EVENTS), dialect, _EVENT_KEYS)
        # a new session created by its first turn; a history replaced with a system prompt
        self.insert_session = Prepared(insert(SESSIONS), dialect, _SESSION_KEYS)
        self.touch_system = Prepared(
            _TOUCH.values(system_prompt=bindparam("new_system_prompt")), dialect)
        self.delete_messages = Prepared(
            delete(MESSAGES).where(MESSAGES.c.session_id == bindparam("sid")), dialect)


class TurnQueries:
    """``turn_state`` and ``commit_turn`` over ``Store``'s transactions."""

    history_cache: HistoryCache
    turn_sql: TurnSQL
    pending: PendingCommits
    reader: StatementReader

    def _conn(self, read: bool = False) -> contextlib.AbstractContextManager[Any]:
        raise NotImplementedError  # provided by Store

    def _retrying(self, fn: Any, core: bool = False) -> Any:
        raise NotImplementedError  # provided by Store

    def _record(self, s: Session | Connection, row: Any, count: int | None = None
                ) -> SessionRecord:
        raise NotImplementedError  # provided by Store

    @staticmethod
    def _check(messages: Sequence[NewMessage]) -> None:
        raise NotImplementedError  # provided by Store

    def _messages(self, conn: Any, sid: str, since: int = 0) -> list[StoredMessage]:
        # plain rows, not ORM entities: this runs on every turn
        rows = self.turn_sql.messages_from.rows(conn, {"sid": sid, "since": since})
        return [
            StoredMessage(
                position=r[0], role=r[1], content=r[2],
                token_ids=tuple(json.loads(r[3])) if r[3] else None,
                token_count=r[4], created_at=aware(r[5]),  # type: ignore[arg-type]
            )
            for r in rows
        ]

    def turn_state(self, session_id: str) -> tuple[SessionRecord, list[StoredMessage]] | None:
        """The session and its history read in one read-only transaction (None: no such
        session). Only messages not seen by an earlier call are read (``history_cache``); when
        the session row's ``updated_at`` confirms the cached history, that row is the only
        read (one statement, on ``reader`` where it can serve)."""
        sid = check_session_id(session_id)
        cache = self.history_cache
        projected = self.pending.projection(sid)
        if projected is not None:
            # the session's last turn is still queued behind its caller: plan from what that
            # commit will store (``commit_later``'s projection) rather than wait for it
            return projected.record, list(projected.messages)
        self.pending.settle(sid)
        entry = cache.get(sid)
        if entry is not None and entry.stamp is not None:
            # the usual turn: the cached history is confirmed by the session row alone, one
            # statement that needs no transaction of its own (``StatementReader``)
            found = self.reader.rows(self.turn_sql.session, {"sid": sid})
            if found and aware(found[0].updated_at) == entry.stamp:
                cache.hits += 1
                record = self._record(None, found[0], len(entry.messages))  # type: ignore[arg-type]
                cache.put(sid, CachedHistory(entry.stamp, entry.messages, record))
                return record, list(entry.messages)
        with self._conn(read=True) as s:
            # a plain row with every column: ``_record`` reads it like an ORM row
            found = self.turn_sql.session.rows(s, {"sid": sid})
            row = found[0] if found else None
            if row is None:
                cache.drop(sid)
                return None
            stamp = aware(row.updated_at)
            entry = cache.get(sid)
            msgs: tuple[StoredMessage, ...] | None = None
            if entry is not None and entry.stamp is not None and entry.stamp == stamp:
                msgs = entry.messages
                cache.hits += 1
            elif entry is not None and entry.messages:
                last = entry.messages[-1]
                tail = self._messages(s, sid, since=last.position)
                if tail and tail[0] == last:
                    msgs = entry.messages + tuple(tail[1:])
                    cache.partial += 1
            if msgs is None:
                msgs = tuple(self._messages(s, sid))
                cache.full += 1
            record = self._record(s, row, len(msgs))
            cache.put(sid, CachedHistory(stamp, msgs, record))
            return record, list(msgs)

    def _lock_session(self, s: Session, sid: str) -> SessionRow:
        row = s.execute(
            select(SessionRow).where(SessionRow.id == sid).with_for_update()
        ).scalar_one_or_none()
        if row is None:
            raise UnknownSessionError(sid)
        return row

    def _append(self, conn: Any, sid: str, messages: Sequence[NewMessage],
                now: datetime | None = None) -> tuple[StoredMessage, ...]:
        """Insert ``messages`` after the session's last one; returns them as stored."""
        last = self.turn_sql.last_position.scalar(conn, {"sid": sid})
        first = 0 if last is None else int(last) + 1
        now = now or utcnow()
        stored = _as_stored(messages, first, now)
        if stored:
            # one executemany, no ORM unit of work: this is on every turn's commit
            self.turn_sql.insert_messages.run_many(conn, [
                {"session_id": sid, "position": m.position, "role": m.role,
                 "content": m.content,
                 "token_ids": json.dumps(list(m.token_ids)) if m.token_ids is not None else None,
                 "token_count": m.token_count, "status": "committed", "created_at": now}
                for m in stored
            ])
        return stored

    def commit_turn(
        self, session_id: str, messages: Sequence[NewMessage], turn: TurnEvent, *,
        temperature: float, window_start: int, create: NewSession | None = None,
        replace_history: bool = False,
    ) -> list[int]:
        """Store a finished turn in one transaction: its messages, its statistics and the
        session's new temperature and window start. With ``create`` the session is created
        first when missing; with ``replace_history`` the stored messages are replaced by
        ``messages`` (and the system prompt set from ``create``). Returns the positions."""
        self._check(messages)
        sid = check_session_id(session_id)
        self.pending.settle(sid)  # an earlier turn of the session queued behind its caller
        return self._commit(sid, messages, turn, temperature=temperature,
                            window_start=window_start, create=create,
                            replace_history=replace_history)

    def _commit(
        self, sid: str, messages: Sequence[NewMessage], turn: TurnEvent, *,
        temperature: float, window_start: int, create: NewSession | None,
        replace_history: bool, at: datetime | None = None,
    ) -> list[int]:

        def run(conn: Any) -> tuple[tuple[StoredMessage, ...], datetime]:
            now = at or utcnow()
            sql = self.turn_sql
            if create is not None and not sql.session_exists.rows(conn, {"sid": sid}):
                sql.insert_session.run(conn, {
                    "id": sid, "title": create.title, "model": create.model,
                    "system_prompt": create.system_prompt, "temperature": temperature,
                    "state": "active", "window_start": 0, "created_at": now, "updated_at": now,
                    "replica": create.replica})
            state = {"sid": sid, "new_temperature": temperature,
                     "new_window_start": window_start, "now": now}
            if replace_history and create is not None:
                state["new_system_prompt"] = create.system_prompt
                touched = sql.touch_system.run(conn, state).rowcount
            else:
                touched = sql.touch.run(conn, state).rowcount
            if touched == 0:
                raise UnknownSessionError(sid)
            if replace_history:
                sql.delete_messages.run(conn, {"sid": sid})
            stored = self._append(conn, sid, messages, now)
            sql.insert_event.run(conn, {
                "session_id": sid, "request_id": turn.request_id,
                "prompt_tokens": turn.prompt_tokens, "cached_tokens": turn.cached_tokens,
                "output_tokens": turn.output_tokens, "ttft_s": turn.ttft_s,
                "latency_s": turn.latency_s, "topic_jump": turn.topic_jump,
                "similarity": turn.similarity, "temperature": turn.temperature,
                "evicted_turns": turn.evicted_turns, "finish_reason": turn.finish_reason,
                "created_at": now,
                "reply_position": stored[-1].position if stored and stored[-1].role == "assistant"
                else None,
            })
            return stored, now

        stored, stamp = self._retrying(run, core=True)
        if replace_history:
            # the new history is exactly what was stored (positions from 0, this stamp): the
            # next turn, a RAG engine's usual rewrite, then reads only the session row
            self.history_cache.put(sid, CachedHistory(stamp, stored))
        elif stored:
            self.history_cache.extend(sid, stored[0].position, stored, stamp)
        return [m.position for m in stored]

    def commit_later(self, session_id: str, messages: Sequence[NewMessage], turn: TurnEvent,
                     **state: Any) -> Job:
        """``commit_turn`` (same arguments) as a ``Job`` for the caller to queue, registered
        as the session's pending commit (``write_behind``). The messages are checked now, so
        bad input still fails the call itself."""
        self._check(messages)
        sid = check_session_id(session_id)
        at = utcnow()
        # _commit, not commit_turn: settling from inside the pending job would wait for itself
        return self.pending.add(
            sid, lambda: self._commit(sid, messages, turn, at=at, **state), "turn commit",
            projection=self._project(sid, messages, at, state))

    def _project(self, sid: str, messages: Sequence[NewMessage], at: datetime,
                 state: dict[str, Any]) -> CachedHistory | None:
        """What the queued commit will store, so the session's next turn plans from it
        (``turn_state``); also left in the history cache, which the commit then confirms. Only
        a plain append of a session this process read is projected; anything else drops the
        entry and returns None (the next read waits for the commit instead)."""
        cache = self.history_cache
        # on top of an earlier turn's commit still queued, else of what this process read
        entry = self.pending.projection(sid) or cache.get(sid)
        if (entry is None or entry.record is None or state.get("create") is not None
                or state.get("replace_history")):
            cache.drop(sid)
            return None
        first = entry.messages[-1].position + 1 if entry.messages else 0
        history = entry.messages + _as_stored(messages, first, at)
        record = dataclasses.replace(
            entry.record, temperature=state["temperature"], window_start=state["window_start"],
            updated_at=at, message_count=len(history))
        projection = CachedHistory(at, history, record)
        cache.put(sid, projection)
        return projection


def _as_stored(messages: Sequence[NewMessage], first: int, at: datetime
               ) -> tuple[StoredMessage, ...]:
    """``messages`` as stored from position ``first`` at time ``at``: one builder for the
    commit's rows and its projection, which must compare equal (``history_cache``)."""
    return tuple(
        StoredMessage(first + i, m.role, m.content,
                      tuple(m.token_ids) if m.token_ids is not None else None,
                      m.token_count, at)
        for i, m in enumerate(messages))
