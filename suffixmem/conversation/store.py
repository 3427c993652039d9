"""The conversation store: sessions, messages, segments and turn events in any SQL database.

Contract:
- ``Store(url)`` connects and upgrades the schema to the newest Alembic revision (programmatic:
  ``migrations/alembic.ini`` is found next to the ``migrations`` package, never via the working
  directory). An unreachable or unusable database raises ``StoreError`` naming the URL (password
  hidden).
- Every method is one transaction; nothing half-written is ever visible. ``commit_turn`` stores
  the user and assistant messages *and* the turn's statistics and session state together.
- Positions of a session's messages are 0, 1, 2, ... with no gaps; writers of the same session
  are serialised (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: a row lock on the session), so
  concurrent writers from several threads lose nothing.
- Returned values are small frozen dataclasses, never ORM rows.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, delete, event, func, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from suffixmem.conversation.schema import (
    MessageRow,
    SegmentEventRow,
    SegmentRow,
    SessionRow,
    TurnEventRow,
    utcnow,
)
from suffixmem.engine.protocol import ROLES, Message
from suffixmem.errors import InvalidRequestError, StoreError, UnknownSessionError

START_TEMPERATURE = 0.8
MAX_ID_LEN = 128
_RETRIES = 5


def _aware(t: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes; everything stored is UTC.
    if t is not None and t.tzinfo is None:
        return t.replace(tzinfo=UTC)
    return t


@dataclass(slots=True, frozen=True)
class SessionRecord:
    id: str
    title: str | None
    model: str | None
    system_prompt: str | None
    temperature: float
    state: str
    window_start: int
    created_at: datetime
    updated_at: datetime
    message_count: int
    forked_from: str | None = None


@dataclass(slots=True, frozen=True)
class StoredMessage:
    position: int
    role: str
    content: str
    token_ids: tuple[int, ...] | None
    token_count: int
    created_at: datetime

    def to_message(self) -> Message:
        return Message(self.role, self.content, self.token_ids)


@dataclass(slots=True, frozen=True)
class NewMessage:
    """A message to store: ``token_ids`` only for assistant turns (as generated)."""

    role: str
    content: str
    token_ids: tuple[int, ...] | None = None
    token_count: int = 0


@dataclass(slots=True, frozen=True)
class TurnEvent:
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    latency_s: float
    temperature: float
    output_tokens: int = 0
    topic_jump: bool = False
    similarity: float | None = None
    evicted_turns: int = 0
    finish_reason: str = "stop"
    request_id: str | None = None


@dataclass(slots=True, frozen=True)
class SegmentSighting:
    """One segment seen in a prompt (``scope``: a session id or ``"*"`` when shared)."""

    hash: str
    scope: str
    kind: str
    tokens: int
    features: dict[str, float]
    hit: bool = False


@dataclass(slots=True, frozen=True)
class SegmentRecord:
    hash: str
    scope: str
    kind: str
    tokens: int
    tier: str
    score: float | None
    expires_at: datetime | None
    hits: int
    tokens_saved: int
    sessions_seen: int
    created_at: datetime
    last_seen_at: datetime


@dataclass(slots=True, frozen=True)
class SegmentEvent:
    hash: str
    scope: str
    session_id: str | None
    kind: str
    tokens: int
    seen_at: datetime
    hit: bool
    features: dict[str, float]


def migrations_dir() -> Path:
    """The folder holding ``alembic.ini``, ``env.py`` and ``versions/``."""
    try:
        import migrations

        return Path(migrations.__file__).resolve().parent
    except ImportError:  # running from a source tree that is not installed
        return Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(connection: Any = None) -> Any:
    """An Alembic ``Config`` for our migrations, optionally bound to an open connection."""
    from alembic.config import Config

    here = migrations_dir()
    cfg = Config(str(here / "alembic.ini"))
    cfg.set_main_option("script_location", str(here))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def safe_url(url: str) -> str:
    """``url`` with its password hidden, for error messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable database URL>"


def make_engine(url: str) -> Engine:
    """A SQLAlchemy engine for ``url`` with the settings the store relies on.

    SQLite: foreign keys on, WAL journal, a 30 s busy timeout, and ``BEGIN IMMEDIATE`` for every
    transaction so that concurrent writers queue up instead of failing on lock upgrades.
    """
    try:
        parsed = make_url(url)
    except Exception as e:
        raise StoreError(f"invalid database URL {url!r}: {e}") from e
    backend = parsed.get_backend_name()
    kwargs: dict[str, Any] = {}
    if backend == "sqlite":
        memory = parsed.database in (None, "", ":memory:")
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        if memory:
            kwargs["poolclass"] = StaticPool  # one shared connection, or each gets an empty DB
    elif backend == "postgresql":
        kwargs["connect_args"] = {"connect_timeout": 5}
        kwargs["pool_pre_ping"] = True
    try:
        engine = create_engine(url, **kwargs)
    except Exception as e:  # missing driver, bad options
        raise StoreError(f"cannot use database {safe_url(url)}: {e}") from e
    if backend == "sqlite":

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (see below)
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            if parsed.database not in (None, "", ":memory:"):
                cur.execute("PRAGMA journal_mode=WAL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def upgrade(url_or_engine: str | Engine, revision: str = "head") -> None:
    """Upgrade the database to ``revision`` (default: the newest)."""
    _migrate(url_or_engine, "upgrade", revision)


def downgrade(url_or_engine: str | Engine, revision: str = "base") -> None:
    """Downgrade the database to ``revision`` (default: empty)."""
    _migrate(url_or_engine, "downgrade", revision)


def current_revision(url_or_engine: str | Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    engine = make_engine(url_or_engine) if isinstance(url_or_engine, str) else url_or_engine
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    except SQLAlchemyError as e:
        raise StoreError(f"cannot read schema revision: {e}") from e
    finally:
        if isinstance(url_or_engine, str):
            engine.dispose()


def _migrate(url_or_engine: str | Engine, direction: str, revision: str) -> None:
    from alembic import command

    engine = make_engine(url_or_engine) if isinstance(url_or_engine, str) else url_or_engine
    try:
        with engine.begin() as conn:
            getattr(command, direction)(alembic_config(conn), revision)
    except SQLAlchemyError as e:
        raise StoreError(
            f"cannot {direction} database {safe_url(str(engine.url))} to {revision!r}: {e}"
        ) from e
    finally:
        if isinstance(url_or_engine, str):
            engine.dispose()


def check_session_id(session_id: object) -> str:
    if not isinstance(session_id, str) or not session_id.strip():
        raise InvalidRequestError(f"session id must be a non-empty string, got {session_id!r}")
    if len(session_id) > MAX_ID_LEN:
        raise InvalidRequestError(f"session id longer than {MAX_ID_LEN} characters")
    return session_id


class Store:
    """SQL persistence of conversations (see the module docstring for the contract)."""

    def __init__(self, url: str, *, migrate: bool = True) -> None:
        self.url = url
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        try:
            with self.engine.connect():
                pass
        except SQLAlchemyError as e:
            self.engine.dispose()
            raise StoreError(
                f"cannot connect to database {safe_url(url)}: {_reason(e)}"
            ) from e
        if migrate:
            try:
                upgrade(self.engine)
            except StoreError:
                self.engine.dispose()
                raise

    # -- plumbing -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _tx(self) -> Iterator[Session]:
        """One transaction; database failures become ``StoreError``."""
        try:
            with self._sessions.begin() as s:
                yield s
        except IntegrityError:
            raise
        except DBAPIError as e:
            raise StoreError(f"database {safe_url(self.url)} failed: {_reason(e)}") from e
        except SQLAlchemyError as e:
            raise StoreError(f"database {safe_url(self.url)} failed: {e}") from e

    def _retrying(self, fn: Any) -> Any:
        # PostgreSQL may still race two first writers of a brand-new row; retry those.
        for attempt in range(_RETRIES):
            try:
                with self._tx() as s:
                    return fn(s)
            except IntegrityError as e:
                if attempt == _RETRIES - 1:
                    raise StoreError(f"database {safe_url(self.url)} conflict: {e.orig}") from e
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.engine.dispose()

    # -- sessions -------------------------------------------------------------------------------
    def _record(self, s: Session, row: SessionRow) -> SessionRecord:
        count = s.scalar(
            select(func.count()).select_from(MessageRow).where(MessageRow.session_id == row.id)
        )
        return SessionRecord(
            id=row.id, title=row.title, model=row.model, system_prompt=row.system_prompt,
            temperature=row.temperature, state=row.state, window_start=row.window_start,
            created_at=_aware(row.created_at), updated_at=_aware(row.updated_at),  # type: ignore[arg-type]
            message_count=int(count or 0), forked_from=row.forked_from,
        )

    def open_session(
        self, session_id: str | None = None, *, title: str | None = None,
        model: str | None = None, system_prompt: str | None = None,
        temperature: float = START_TEMPERATURE,
    ) -> tuple[SessionRecord, bool]:
        """Create the session unless it exists; returns ``(record, created)``. An existing
        session is returned unchanged (its title and system prompt are kept)."""
        sid = check_session_id(session_id) if session_id is not None else uuid.uuid4().hex

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

        return self._retrying(run)  # type: ignore[no-any-return]

    def get_session(self, session_id: str) -> SessionRecord | None:
        with self._tx() as s:
            row = s.get(SessionRow, check_session_id(session_id))
            return None if row is None else self._record(s, row)

    def require_session(self, session_id: str) -> SessionRecord:
        rec = self.get_session(session_id)
        if rec is None:
            raise UnknownSessionError(session_id)
        return rec

    def list_sessions(self) -> list[SessionRecord]:
        """All sessions, most recently updated first."""
        with self._tx() as s:
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
                    created_at=_aware(r.created_at), updated_at=_aware(r.updated_at),  # type: ignore[arg-type]
                    message_count=int(counts.get(r.id, 0)), forked_from=r.forked_from,
                )
                for r in rows
            ]

    def fork_session(self, session_id: str, new_id: str | None = None) -> SessionRecord:
        """Copy a session (state, messages, window) under a new id."""
        src_id = check_session_id(session_id)
        nid = check_session_id(new_id) if new_id is not None else uuid.uuid4().hex

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
        with self._tx() as s:
            if s.get(SessionRow, sid) is None:
                raise UnknownSessionError(sid)
            # explicit deletes: SQLite needs PRAGMA foreign_keys for CASCADE, be independent of it
            s.execute(delete(MessageRow).where(MessageRow.session_id == sid))
            s.execute(delete(TurnEventRow).where(TurnEventRow.session_id == sid))
            s.execute(delete(SegmentRow).where(SegmentRow.scope == sid))
            s.execute(delete(SessionRow).where(SessionRow.id == sid))

    def update_session(self, session_id: str, **values: Any) -> None:
        """Set ``title``, ``state``, ``temperature``, ``system_prompt`` or ``model``."""
        allowed = {"title", "state", "temperature", "system_prompt", "model"}
        bad = set(values) - allowed
        if bad:
            raise InvalidRequestError(f"cannot update session fields {sorted(bad)}")
        sid = check_session_id(session_id)
        with self._tx() as s:
            n = s.execute(
                update(SessionRow).where(SessionRow.id == sid).values(
                    **values, updated_at=utcnow())
            ).rowcount
            if not n:
                raise UnknownSessionError(sid)

    # -- messages -------------------------------------------------------------------------------
    def messages(self, session_id: str) -> list[StoredMessage]:
        """The session's committed messages in order (``UnknownSessionError`` if missing)."""
        sid = check_session_id(session_id)
        with self._tx() as s:
            if s.get(SessionRow, sid) is None:
                raise UnknownSessionError(sid)
            rows = s.scalars(
                select(MessageRow).where(MessageRow.session_id == sid)
                .order_by(MessageRow.position)
            ).all()
            return [
                StoredMessage(
                    position=r.position, role=r.role, content=r.content,
                    token_ids=tuple(json.loads(r.token_ids)) if r.token_ids else None,
                    token_count=r.token_count, created_at=_aware(r.created_at),  # type: ignore[arg-type]
                )
                for r in rows
            ]

    def _lock_session(self, s: Session, sid: str) -> SessionRow:
        row = s.execute(
            select(SessionRow).where(SessionRow.id == sid).with_for_update()
        ).scalar_one_or_none()
        if row is None:
            raise UnknownSessionError(sid)
        return row

    def _append(self, s: Session, sid: str, messages: Sequence[NewMessage]) -> list[int]:
        last = s.scalar(
            select(func.max(MessageRow.position)).where(MessageRow.session_id == sid)
        )
        pos = -1 if last is None else int(last)
        now = utcnow()
        out = []
        for m in messages:
            pos += 1
            s.add(MessageRow(
                session_id=sid, position=pos, role=m.role, content=m.content,
                token_ids=json.dumps(list(m.token_ids)) if m.token_ids is not None else None,
                token_count=m.token_count, status="committed", created_at=now,
            ))
            out.append(pos)
        s.flush()
        return out

    @staticmethod
    def _check(messages: Sequence[NewMessage]) -> None:
        for i, m in enumerate(messages):
            if not isinstance(m, NewMessage):
                raise InvalidRequestError(f"messages[{i}] is not a NewMessage")
            if m.role not in ROLES:
                raise InvalidRequestError(f"messages[{i}] has unknown role {m.role!r}")
            if m.token_ids is not None and m.role != "assistant":
                raise InvalidRequestError("token_ids may only be stored for assistant messages")

    def append_messages(self, session_id: str, messages: Sequence[NewMessage]) -> list[int]:
        """Append messages atomically; returns their positions."""
        self._check(messages)
        sid = check_session_id(session_id)

        def run(s: Session) -> list[int]:
            row = self._lock_session(s, sid)
            positions = self._append(s, sid, messages)
            row.updated_at = utcnow()
            return positions

        return self._retrying(run)  # type: ignore[no-any-return]

    def commit_turn(
        self, session_id: str, messages: Sequence[NewMessage], turn: TurnEvent, *,
        temperature: float, window_start: int,
    ) -> list[int]:
        """Store a finished turn in one transaction: its messages, its statistics and the
        session's new temperature and window start. Returns the messages' positions."""
        self._check(messages)
        sid = check_session_id(session_id)

        def run(s: Session) -> list[int]:
            row = self._lock_session(s, sid)
            positions = self._append(s, sid, messages)
            row.temperature = temperature
            row.window_start = window_start
            row.updated_at = utcnow()
            s.add(TurnEventRow(
                session_id=sid, request_id=turn.request_id, prompt_tokens=turn.prompt_tokens,
                cached_tokens=turn.cached_tokens, output_tokens=turn.output_tokens,
                ttft_s=turn.ttft_s, latency_s=turn.latency_s, topic_jump=turn.topic_jump,
                similarity=turn.similarity, temperature=turn.temperature,
                evicted_turns=turn.evicted_turns, finish_reason=turn.finish_reason,
                created_at=utcnow(),
            ))
            return positions

        return self._retrying(run)  # type: ignore[no-any-return]

    def clear_history(self, session_id: str) -> None:
        """Delete the session's messages and reset its window and temperature."""
        sid = check_session_id(session_id)
        with self._tx() as s:
            row = self._lock_session(s, sid)
            s.execute(delete(MessageRow).where(MessageRow.session_id == sid))
            row.window_start = 0
            row.temperature = START_TEMPERATURE
            row.updated_at = utcnow()

    # -- turn events ----------------------------------------------------------------------------
    def turn_events(self, session_id: str | None = None) -> list[TurnEvent]:
        with self._tx() as s:
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
                )
                for r in s.scalars(q)
            ]

    # -- segments -------------------------------------------------------------------------------
    def record_segments(
        self, session_id: str | None, sightings: Sequence[SegmentSighting],
        seen_at: datetime | None = None,
    ) -> None:
        """Log sightings (the value model's training data) and update the segments' counters:
        a sighting with ``hit`` adds one hit and its tokens to ``tokens_saved``."""
        when = seen_at or utcnow()

        def run(s: Session) -> None:
            for g in sightings:
                first_here = session_id is not None and g.scope == "*" and s.scalar(
                    select(SegmentEventRow.id).where(
                        SegmentEventRow.hash == g.hash, SegmentEventRow.scope == "*",
                        SegmentEventRow.session_id == session_id,
                    ).limit(1)
                ) is None
                s.add(SegmentEventRow(
                    hash=g.hash, scope=g.scope, session_id=session_id, kind=g.kind,
                    tokens=g.tokens, seen_at=when, hit=g.hit,
                    features=json.dumps(g.features, sort_keys=True),
                ))
                row = s.execute(
                    select(SegmentRow).where(SegmentRow.hash == g.hash,
                                             SegmentRow.scope == g.scope)
                ).scalar_one_or_none()
                if row is None:
                    s.add(SegmentRow(
                        hash=g.hash, scope=g.scope, kind=g.kind, tokens=g.tokens, tier="none",
                        hits=int(g.hit), tokens_saved=g.tokens if g.hit else 0,
                        sessions_seen=1, created_at=when, last_seen_at=when,
                    ))
                    s.flush()
                    continue
                if first_here:
                    row.sessions_seen += 1
                if g.hit:
                    row.hits += 1
                    row.tokens_saved += g.tokens
                row.last_seen_at = when
                s.flush()

        self._retrying(run)

    def set_segment_tier(
        self, hash_: str, scope: str, tier: str, score: float | None,
        expires_at: datetime | None,
    ) -> None:
        with self._tx() as s:
            s.execute(
                update(SegmentRow).where(SegmentRow.hash == hash_, SegmentRow.scope == scope)
                .values(tier=tier, score=score, expires_at=expires_at)
            )

    def release_segments(self, scope: str) -> int:
        """Mark every segment of ``scope`` as no longer cached; returns how many."""
        with self._tx() as s:
            return int(s.execute(
                update(SegmentRow).where(SegmentRow.scope == scope)
                .values(tier="none", expires_at=utcnow())
            ).rowcount or 0)

    def segment(self, hash_: str, scope: str) -> SegmentRecord | None:
        with self._tx() as s:
            r = s.execute(
                select(SegmentRow).where(SegmentRow.hash == hash_, SegmentRow.scope == scope)
            ).scalar_one_or_none()
            if r is None:
                return None
            return SegmentRecord(
                hash=r.hash, scope=r.scope, kind=r.kind, tokens=r.tokens, tier=r.tier,
                score=r.score, expires_at=_aware(r.expires_at), hits=r.hits,
                tokens_saved=r.tokens_saved, sessions_seen=r.sessions_seen,
                created_at=_aware(r.created_at),  # type: ignore[arg-type]
                last_seen_at=_aware(r.last_seen_at),  # type: ignore[arg-type]
            )

    def sightings(self, hash_: str, scope: str) -> int:
        """How many times the segment was logged as seen."""
        with self._tx() as s:
            return int(s.scalar(
                select(func.count()).select_from(SegmentEventRow).where(
                    SegmentEventRow.hash == hash_, SegmentEventRow.scope == scope)
            ) or 0)

    def segment_events(self, limit: int | None = None) -> list[SegmentEvent]:
        """Logged sightings, oldest first."""
        with self._tx() as s:
            q = select(SegmentEventRow).order_by(SegmentEventRow.seen_at, SegmentEventRow.id)
            if limit is not None:
                q = q.limit(limit)
            return [
                SegmentEvent(
                    hash=r.hash, scope=r.scope, session_id=r.session_id, kind=r.kind,
                    tokens=r.tokens, seen_at=_aware(r.seen_at), hit=r.hit,  # type: ignore[arg-type]
                    features=json.loads(r.features),
                )
                for r in s.scalars(q)
            ]


def _reason(e: SQLAlchemyError) -> str:
    orig = getattr(e, "orig", None)
    return str(orig if orig is not None else e).strip().splitlines()[0]
