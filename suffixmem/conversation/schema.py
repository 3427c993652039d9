"""SQLAlchemy 2.x table models of the conversation store.

The schema itself is owned by the Alembic migrations in ``suffixmem/migrations/versions``;
these models mirror it for queries (a test checks that the migrated database and these models
agree).

Times are timezone-aware UTC datetimes; token counts are model tokens; durations are seconds.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class SessionRow(Base):
    """One conversation. ``temperature`` is its semantic temperature; ``window_start`` the
    position of the first message still in the prompt (everything before was evicted)."""

    __tablename__ = "sessions"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, index=True
    )
    title: Mapped[str | None] = mapped_column(String(512))
    model: Mapped[str | None] = mapped_column(String(256))
    system_prompt: Mapped[str | None] = mapped_column(Text)
    temperature: Mapped[float] = mapped_column(Float, default=0.8)
    state: Mapped[str] = mapped_column(String(32), default="active")
    window_start: Mapped[int] = mapped_column(Integer, default=0)
    forked_from: Mapped[str | None] = mapped_column(String(128))
    # the replica that served its last turn (remote engine; migration 0002)
    replica: Mapped[str | None] = mapped_column(String(512))
    # the session's own semantic temperature range; NULL: the manager's (migration 0004)
    temperature_hot: Mapped[float | None] = mapped_column(Float)
    temperature_cold: Mapped[float | None] = mapped_column(Float)


class MessageRow(Base):
    """One committed message. ``token_ids`` (JSON list, assistant turns) are the ids exactly as
    generated; ``token_count`` is the content's token count."""

    __tablename__ = "messages"
    __table_args__ = (
        UniqueConstraint("session_id", "position", name="uq_messages_session_position"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("sessions.id", ondelete="CASCADE"), index=True
    )
    position: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text)
    token_ids: Mapped[str | None] = mapped_column(Text)
    token_count: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str] = mapped_column(String(16), default="committed")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class SegmentRow(Base):
    """A reusable prompt span. ``scope`` is a session id, or ``"*"`` for a shared segment."""

    __tablename__ = "segments"
    __table_args__ = (UniqueConstraint("hash", "scope", name="uq_segments_hash_scope"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    hash: Mapped[str] = mapped_column(String(64), index=True)
    scope: Mapped[str] = mapped_column(String(128), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    tokens: Mapped[int] = mapped_column(Integer)
    tier: Mapped[str] = mapped_column(String(16), default="none")
    score: Mapped[float | None] = mapped_column(Float)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    hits: Mapped[int] = mapped_column(Integer, default=0)
    tokens_saved: Mapped[int] = mapped_column(Integer, default=0)
    sessions_seen: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class SegmentEventRow(Base):
    """One sighting of a segment in a prompt, with its features at that moment (JSON). The value
    model's labels come from these: was the segment seen again within the horizon?"""

    __tablename__ = "segment_events"
    __table_args__ = (
        Index("ix_segment_events_hash_seen", "hash", "seen_at"),
        Index("ix_segment_events_hash_scope_session", "hash", "scope", "session_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    hash: Mapped[str] = mapped_column(String(64))
    scope: Mapped[str] = mapped_column(String(128))
    session_id: Mapped[str | None] = mapped_column(String(128), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    tokens: Mapped[int] = mapped_column(Integer)
    seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    hit: Mapped[bool] = mapped_column(Boolean, default=False)
    features: Mapped[str] = mapped_column(Text, default="{}")


class TurnEventRow(Base):
    """Statistics of one committed turn (failed turns leave no event)."""

    __tablename__ = "turn_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("sessions.id", ondelete="CASCADE"), index=True
    )
    request_id: Mapped[str | None] = mapped_column(String(64))
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    cached_tokens: Mapped[int] = mapped_column(Integer)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    ttft_s: Mapped[float] = mapped_column(Float)
    latency_s: Mapped[float] = mapped_column(Float)
    topic_jump: Mapped[bool] = mapped_column(Boolean, default=False)
    similarity: Mapped[float | None] = mapped_column(Float)
    temperature: Mapped[float] = mapped_column(Float)
    evicted_turns: Mapped[int] = mapped_column(Integer, default=0)
    finish_reason: Mapped[str] = mapped_column(String(16), default="stop")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # where the turn's reply was stored (migration 0005; NULL before it, or a turn that stored
    # no reply): a later edit rewrites positions, so the latest event at a position is the
    # reply's there now
    reply_position: Mapped[int | None] = mapped_column(Integer)


# -- LangGraph checkpoints (``checkpoints``; migration 0002) -----------------------------------
# A LangGraph thread is a suffixmem session: ``thread_id`` is a session id, but a thread may
# hold checkpoints before (or without) a session row, so there is no foreign key.


class CheckpointRow(Base):
    """One LangGraph checkpoint (serialised without its channel values, which live in
    ``checkpoint_blobs``); ``checkpoint_id`` sorts in creation order (uuid6)."""

    __tablename__ = "checkpoints"

    thread_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    checkpoint_ns: Mapped[str] = mapped_column(String(256), primary_key=True)
    checkpoint_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    parent_checkpoint_id: Mapped[str | None] = mapped_column(String(64))
    type: Mapped[str] = mapped_column(String(32))
    checkpoint: Mapped[bytes] = mapped_column(LargeBinary)
    meta_type: Mapped[str] = mapped_column(String(32))
    meta: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class CheckpointBlobRow(Base):
    """The value of one channel at one version (``type == "empty"``: the channel was cleared)."""

    __tablename__ = "checkpoint_blobs"

    thread_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    checkpoint_ns: Mapped[str] = mapped_column(String(256), primary_key=True)
    channel: Mapped[str] = mapped_column(String(256), primary_key=True)
    version: Mapped[str] = mapped_column(String(64), primary_key=True)
    type: Mapped[str] = mapped_column(String(32))
    blob: Mapped[bytes | None] = mapped_column(LargeBinary)


class CheckpointWriteRow(Base):
    """A pending write of one task against one checkpoint."""

    __tablename__ = "checkpoint_writes"

    thread_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    checkpoint_ns: Mapped[str] = mapped_column(String(256), primary_key=True)
    checkpoint_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    idx: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    channel: Mapped[str] = mapped_column(String(256))
    type: Mapped[str] = mapped_column(String(32))
    blob: Mapped[bytes] = mapped_column(LargeBinary)
    task_path: Mapped[str] = mapped_column(Text, default="")
