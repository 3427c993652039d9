"""Initial schema: sessions, messages, segments, segment events, turn events.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("updated_at", TZ, nullable=False),
        sa.Column("title", sa.String(512)),
        sa.Column("model", sa.String(256)),
        sa.Column("system_prompt", sa.Text()),
        sa.Column("temperature", sa.Float(), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("window_start", sa.Integer(), nullable=False),
        sa.Column("forked_from", sa.String(128)),
    )
    op.create_index("ix_sessions_updated_at", "sessions", ["updated_at"])

    op.create_table(
        "messages",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "session_id", sa.String(128),
            sa.ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False,
        ),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("token_ids", sa.Text()),
        sa.Column("token_count", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.UniqueConstraint("session_id", "position", name="uq_messages_session_position"),
    )
    op.create_index("ix_messages_session_id", "messages", ["session_id"])

    op.create_table(
        "segments",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("scope", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("tier", sa.String(16), nullable=False),
        sa.Column("score", sa.Float()),
        sa.Column("expires_at", TZ),
        sa.Column("hits", sa.Integer(), nullable=False),
        sa.Column("tokens_saved", sa.Integer(), nullable=False),
        sa.Column("sessions_seen", sa.Integer(), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("last_seen_at", TZ, nullable=False),
        sa.UniqueConstraint("hash", "scope", name="uq_segments_hash_scope"),
    )
    op.create_index("ix_segments_hash", "segments", ["hash"])
    op.create_index("ix_segments_scope", "segments", ["scope"])

    op.create_table(
        "segment_events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("scope", sa.String(128), nullable=False),
        sa.Column("session_id", sa.String(128)),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("seen_at", TZ, nullable=False),
        sa.Column("hit", sa.Boolean(), nullable=False),
        sa.Column("features", sa.Text(), nullable=False),
    )
    op.create_index("ix_segment_events_hash_seen", "segment_events", ["hash", "seen_at"])
    op.create_index(
        "ix_segment_events_hash_scope_session", "segment_events", ["hash", "scope", "session_id"]
    )
    op.create_index("ix_segment_events_session_id", "segment_events", ["session_id"])

    op.create_table(
        "turn_events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "session_id", sa.String(128),
            sa.ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False,
        ),
        sa.Column("request_id", sa.String(64)),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("ttft_s", sa.Float(), nullable=False),
        sa.Column("latency_s", sa.Float(), nullable=False),
        sa.Column("topic_jump", sa.Boolean(), nullable=False),
        sa.Column("similarity", sa.Float()),
        sa.Column("temperature", sa.Float(), nullable=False),
        sa.Column("evicted_turns", sa.Integer(), nullable=False),
        sa.Column("finish_reason", sa.String(16), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
    )
    op.create_index("ix_turn_events_session_id", "turn_events", ["session_id"])


def downgrade() -> None:
    op.drop_index("ix_turn_events_session_id", table_name="turn_events")
    op.drop_table("turn_events")
    op.drop_index("ix_segment_events_session_id", table_name="segment_events")
    op.drop_index("ix_segment_events_hash_scope_session", table_name="segment_events")
    op.drop_index("ix_segment_events_hash_seen", table_name="segment_events")
    op.drop_table("segment_events")
    op.drop_index("ix_segments_scope", table_name="segments")
    op.drop_index("ix_segments_hash", table_name="segments")
    op.drop_table("segments")
    op.drop_index("ix_messages_session_id", table_name="messages")
    op.drop_table("messages")
    op.drop_index("ix_sessions_updated_at", table_name="sessions")
    op.drop_table("sessions")
