"""The conversation store: sessions, messages, segments and turn events in any SQL database.

Contract:
- ``Store(url)`` connects and upgrades the schema to the newest Alembic revision (see
  ``database``). An unreachable or unusable database raises ``StoreError`` naming the URL with
  its password masked.
- Every method is one transaction; nothing half-written is ever visible. ``turn_state`` reads a
  turn's session and history in one read-only transaction (only the messages it has not seen
  yet: ``history_cache``); ``commit_turn`` stores the turn's messages, statistics and session
  state in one (creating the session, or replacing its history, in the same transaction when
  asked). Read-only transactions never wait for writers (SQLite: deferred ``BEGIN`` under WAL,
  see ``database``). ``commit_later`` is ``commit_turn`` as a job for the background worker
  (``write_behind``): every method here first settles the pending commit of the session it
  touches (all of them for ``list_sessions``, ``turn_events()`` and ``close``), so callers of
  this store always see a turn once its call has returned.
- Positions of a session's messages are 0, 1, 2, ... with no gaps; writers of the same session
  are serialised (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: a row lock on the session), so
  concurrent writers from several threads lose nothing.
- Returned values are the frozen dataclasses of ``records``, never ORM rows.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from sqlalchemy import Connection, delete, func, select
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import QueuePool

from suffixmem.config import mask_url
from suffixmem.conversation.database import (
    StatementReader,
    dbapi_transaction,
    downgrade,
    make_engine,
    mask,
    read_engine,
    reason,
    upgrade,
    writer_lock,
)
from suffixmem.conversation.history_cache import CachedHistory, HistoryCache
from suffixmem.conversation.records import (
    NewMessage,
    NewSession,
    SegmentEvent,
    SegmentRecord,
    SegmentSighting,
    SessionRecord,
    StoredMessage,
    TurnEvent,
    aware,
)
from suffixmem.conversation.schema import MessageRow, SegmentRow, SessionRow, TurnEventRow, utcnow
from suffixmem.conversation.segment_store import SegmentQueries, SegmentSQL, delete_segment_log
from suffixmem.conversation.turn_store import TurnQueries, TurnSQL
from suffixmem.conversation.validation import check_session_id, check_text
from suffixmem.conversation.write_behind import PendingCommits
from suffixmem.engine.protocol import ROLES
from suffixmem.errors import InvalidRequestError, StoreError, UnknownSessionError

log = logging.getLogger(__name__)

__all__ = [
    "NewMessage", "NewSession", "SegmentEvent", "SegmentRecord", "SegmentSighting",
    "SessionRecord", "Store", "StoredMessage", "TurnEvent", "check_session_id", "downgrade",
    "upgrade",
]

START_TEMPERATURE = 0.8
WARM_CONNECTIONS = 4  # opened at start-up (``Store._warm_pool``)
_NO_WRITER = contextlib.nullcontext()  # read transactions take no writer lock
_RETRIES = 5


class Store(TurnQueries, SegmentQueries):
    """SQL persistence of conversations (see the module docstring for the contract)."""

    def __init__(self, url: str, *, migrate: bool = True) -> None:
        self.url = mask_url(url)  # shown in messages and logs: password masked
        self._raw_url = url
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._reads = sessionmaker(read_engine(self.engine), expire_on_commit=False)
        self.history_cache = HistoryCache()
        self.pending = PendingCommits()  # turns committed behind their callers (write_behind)
        self._writer = writer_lock(self.engine)  # this process's writers queue here (database)
        self.reader = StatementReader(self.engine)  # the per-turn session row (turn_state)
        try:
            with self.engine.connect():
                pass
        except SQLAlchemyError as e:
            self.engine.dispose()
            raise StoreError(
                f"cannot connect to database {mask_url(url)}: {mask(reason(e), self._raw_url)}"
            ) from e
        # compiled after the first connection: a dialect learns its server's version there
        self.turn_sql = TurnSQL(self.engine.dialect)
        self.segment_sql = SegmentSQL(self.engine.dialect)
        if migrate:
            try:
                upgrade(self.engine)
            except StoreError:
                self.engine.dispose()
                raise
        self._warm_pool()

    def _warm_pool(self) -> None:
        """Open ``WARM_CONNECTIONS`` pooled connections now, each with the turn's read prepared.
        The pool opens them on demand, so sessions turning at once would each open one inside
        their first turn, where it cost 1-6 ms with four sessions on two busy cores, and
        SQLite prepares a statement once per connection (0.1-0.2 ms; docs/profile.md, rounds
        7-8)."""
        pool = self.engine.pool
        size = pool.size() if isinstance(pool, QueuePool) else 0
        conns = [self.engine.raw_connection() for _ in range(min(WARM_CONNECTIONS, size))]
        for c in conns:
            try:  # a session that cannot exist: nothing is read, the statements are prepared
                self.turn_sql.session.rows(c, {"sid": ""})
                self.turn_sql.messages_from.rows(c, {"sid": "", "since": 0})
            finally:
                c.close()

    # -- plumbing -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """Database failures become ``StoreError`` (integrity errors pass: ``_retrying``)."""
        try:
            yield
        except IntegrityError:
            raise
        except DBAPIError as e:
            raise StoreError(f"database {self.url} failed: {mask(reason(e), self._raw_url)}") from e
        except SQLAlchemyError as e:
            raise StoreError(f"database {self.url} failed: {mask(str(e), self._raw_url)}") from e

    @contextlib.contextmanager
    def _tx(self, read: bool = False) -> Iterator[Session]:
        """One transaction; database failures become ``StoreError``. ``read``: it only reads
        (it then never waits for a writer; it must not write)."""
        maker, writer = (self._reads, _NO_WRITER) if read else (self._sessions, self._writer)
        with self._errors(), writer, maker.begin() as s:
            yield s

    @contextlib.contextmanager
    def _conn(self, read: bool = False) -> Iterator[Any]:
        """``_tx`` on a pooled DBAPI connection, for ``prepared`` statements: the per-turn
        read and commit (``turn_store``), where SQLAlchemy's session and connection layers
        cost more than the SQL itself."""
        with self._errors(), dbapi_transaction(self.engine, read, self._writer) as c:
            yield c

    def _retrying(self, fn: Any, core: bool = False) -> Any:
        """``fn(session)`` in a write transaction (``fn(connection)`` with ``core``)."""
        # PostgreSQL may still race two first writers of a brand-new row; retry those.
        for attempt in range(_RETRIES):
            try:
                with self._conn() if core else self._tx() as s:
                    return fn(s)
            except IntegrityError as e:
                if attempt == _RETRIES - 1:
                    raise StoreError(
                        f"database {self.url} conflict: {mask(str(e.orig), self._raw_url)}"
                    ) from e
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.pending.settle_all()
        for line in self.pending.failures():  # nobody read these sessions again: say so
            log.error("%s", line)
        self.reader.close()
        self.engine.dispose()

    # -- sessions -------------------------------------------------------------------------------
    def _record(self, s: Session | Connection, row: Any, count: int | None = None
                ) -> SessionRecord:
        if count is None:
            count = s.scalar(
                select(func.count()).select_from(MessageRow)
                .where(MessageRow.session_id == row.id))
        return SessionRecord(
            id=row.id, title=row.title, model=row.model, system_prompt=row.system_prompt,
            temperature=row.temperature, state=row.state, window_start=row.window_start,
            created_at=aware(row.created_at), updated_at=aware(row.updated_at),  # type: ignore[arg-type]
            message_count=int(count or 0), forked_from=row.forked_from,
            temperature_hot=row.temperature_hot, temperature_cold=row.temperature_cold,
        )

    def open_session(
        self, session_id: str | None = None, *, title: str | None = None,
        model: str | None = None, system_prompt: str | None = None,
        temperature: float = START_TEMPERATURE,
    ) -> tuple[SessionRecord, bool]:
        """Create the session unless it exists; returns ``(record, created)``. An existing
        session is returned unchanged (its title and system prompt are kept)."""
        sid = check_session_id(session_id) if session_id is not None else uuid.uuid4().hex
        self.pending.settle(sid)

        def run(s: Session) -> tuple[SessionRecord, bool]:
            row = s.get(SessionRow, sid)
            if row is not None:
                return self._record(s, row), False
            now = utcnow()
            row = SessionRow(
                id=sid, title=title, model=model, system_prompt=system_prompt,
                temperature=temperature, state="active", window_start=0,
                created_at=now, updated_at=now,
            )
            s.add(row)
            s.flush()
            return self._record(s, row), True

        record, created = self._retrying(run)
        if created:  # its first turn then reads the session row alone (history_cache)
            self.history_cache.put(sid, CachedHistory(record.updated_at, (), record))
        return record, created

    def get_session(self, session_id: str) -> SessionRecord | None:
        self.pending.settle(session_id)
        with self._tx(read=True) as s:
            row = s.get(SessionRow, check_session_id(session_id))
            return None if row is None else self._record(s, row)

    def require_session(self, session_id: str) -> SessionRecord:
        rec = self.get_session(session_id)
        if rec is None:
            raise UnknownSessionError(session_id)
        return rec

    def list_sessions(self) -> list[SessionRecord]:
        """All sessions, most recently updated first."""
        self.pending.settle_all()
        with self._tx(read=True) as s:
            counts = dict(
                s.execute(
                    select(MessageRow.session_id, func.count()).group_by(MessageRow.session_id)
                ).all()
            )
            rows = s.scalars(
                select(SessionRow).order_by(
                    SessionRow.updated_at.desc(), SessionRow.created_at.desc(),
                    SessionRow.id.desc(),
                )
            ).all()
            return [
                SessionRecord(
                    id=r.id, title=r.title, model=r.model, system_prompt=r.system_prompt,
                    temperature=r.temperature, state=r.state, window_start=r.window_start,
                    created_at=aware(r.created_at), updated_at=aware(r.updated_at),  # type: ignore[arg-type]
                    message_count=int(counts.get(r.id, 0)), forked_from=r.forked_from,
                    temperature_hot=r.temperature_hot, temperature_cold=r.temperature_cold,
                )
                for r in rows
            ]

    def fork_session(self, session_id: str, new_id: str | None = None) -> SessionRecord:
        """Copy a session (state, messages, window) under a new id."""
        src_id = check_session_id(session_id)
        nid = check_session_id(new_id) if new_id is not None else uuid.uuid4().hex
        self.pending.settle(src_id)
        self.pending.settle(nid)

        def run(s: Session) -> SessionRecord:
            src = s.get(SessionRow, src_id)
            if src is None:
                raise UnknownSessionError(src_id)
            if s.get(SessionRow, nid) is not None:
                raise InvalidRequestError(f"session {nid!r} already exists; pick another id")
            now = utcnow()
            row = SessionRow(
                id=nid, title=src.title, model=src.model, system_prompt=src.system_prompt,
                temperature=src.temperature, state=src.state, window_start=src.window_start,
                created_at=now, updated_at=now, forked_from=src_id,
                temperature_hot=src.temperature_hot, temperature_cold=src.temperature_cold,
            )
            s.add(row)
            s.flush()
            for m in s.scalars(
                select(MessageRow).where(MessageRow.session_id == src_id)
                .order_by(MessageRow.position)
            ):
                s.add(MessageRow(
                    session_id=nid, position=m.position, role=m.role, content=m.content,
                    token_ids=m.token_ids, token_count=m.token_count, status=m.status,
                    created_at=m.created_at,
                ))
            s.flush()
            return self._record(s, row)

        return self._retrying(run)  # type: ignore[no-any-return]

    def delete_session(self, session_id: str) -> None:
        sid = check_session_id(session_id)
        self.pending.settle(sid)
        self.history_cache.drop(sid)
        with self._tx() as s:
            if s.get(SessionRow, sid) is None:
                raise UnknownSessionError(sid)
            # explicit deletes: SQLite needs PRAGMA foreign_keys for CASCADE, be independent of it
            s.execute(delete(MessageRow).where(MessageRow.session_id == sid))
            s.execute(delete(TurnEventRow).where(TurnEventRow.session_id == sid))
            s.execute(delete(SegmentRow).where(SegmentRow.scope == sid))
            delete_segment_log(s, sid)
            s.execute(delete(SessionRow).where(SessionRow.id == sid))

    # -- messages -------------------------------------------------------------------------------
    def messages(self, session_id: str) -> list[StoredMessage]:
        """The session's committed messages in order (``UnknownSessionError`` if missing)."""
        sid = check_session_id(session_id)
        self.pending.settle(sid)
        with self._tx(read=True) as s:
            if s.get(SessionRow, sid) is None:
                raise UnknownSessionError(sid)
            return self._messages(s.connection(), sid)

    @staticmethod
    def _check(messages: Sequence[NewMessage]) -> None:
        for i, m in enumerate(messages):
            if not isinstance(m, NewMessage):
                raise InvalidRequestError(f"messages[{i}] is not a NewMessage")
            if m.role not in ROLES:
                raise InvalidRequestError(f"messages[{i}] has unknown role {m.role!r}")
            # what reaches SQL is storable text; an empty user/tool/system message would break
            # every later turn of the session
            check_text(f"messages[{i}].content", m.content, allow_empty=m.role == "assistant")
            if m.token_ids is not None and m.role != "assistant":
                raise InvalidRequestError("token_ids may only be stored for assistant messages")

    def append_messages(self, session_id: str, messages: Sequence[NewMessage], *,
                        replace_at: float | None = None) -> list[int]:
        """Append messages atomically; returns their positions. With ``replace_at`` (a
        temperature) the history is cleared first, as ``clear_history``, in the same
        transaction: no reader, in this process or another, sees it half replaced."""
        self._check(messages)
        sid = check_session_id(session_id)
        self.pending.settle(sid)

        def run(s: Session) -> list[int]:
            row = self._lock_session(s, sid)
            if replace_at is not None:
                s.execute(delete(MessageRow).where(MessageRow.session_id == sid))
                row.window_start = 0
                row.temperature = replace_at
            stored = self._append(s.connection(), sid, messages)
            row.updated_at = utcnow()
            return [m.position for m in stored]

        positions = self._retrying(run)
        self.history_cache.drop(sid)
        return positions  # type: ignore[no-any-return]

    def clear_history(self, session_id: str, temperature: float = START_TEMPERATURE) -> None:
        """Delete the session's messages and reset its window and ``temperature``."""
        self.append_messages(session_id, [], replace_at=temperature)

    def set_temperature_range(self, session_id: str, hot: float | None, cold: float | None,
                              clamp: Callable[[float], float]) -> SessionRecord:
        """Store the session's own semantic temperature range (None: the manager's) and move
        its current temperature with ``clamp`` (into the new range), in one transaction."""
        sid = check_session_id(session_id)
        self.pending.settle(sid)

        def run(s: Session) -> SessionRecord:
            row = self._lock_session(s, sid)
            row.temperature_hot, row.temperature_cold = hot, cold
            row.temperature = clamp(row.temperature)
            row.updated_at = utcnow()
            s.flush()
            return self._record(s, row)

        # the cached record (a pending commit's projection starts from it) is stale now
        self.history_cache.drop(sid)
        return self._retrying(run)  # type: ignore[no-any-return]

    # -- turn events ----------------------------------------------------------------------------
    def turn_events(self, session_id: str | None = None) -> list[TurnEvent]:
        if session_id is None:
            self.pending.settle_all()
        else:
            self.pending.settle(session_id)
        with self._tx(read=True) as s:
            q = select(TurnEventRow).order_by(TurnEventRow.id)
            if session_id is not None:
                q = q.where(TurnEventRow.session_id == check_session_id(session_id))
            return [
                TurnEvent(
                    prompt_tokens=r.prompt_tokens, cached_tokens=r.cached_tokens,
                    ttft_s=r.ttft_s, latency_s=r.latency_s, temperature=r.temperature,
                    output_tokens=r.output_tokens, topic_jump=r.topic_jump,
                    similarity=r.similarity, evicted_turns=r.evicted_turns,
                    finish_reason=r.finish_reason, request_id=r.request_id,
                    reply_position=r.reply_position,
                )
                for r in s.scalars(q)
            ]
