"""LangGraph checkpoints: checkpoints, checkpoint blobs, checkpoint writes.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.String(256)


def upgrade() -> None:
    op.create_table(
        "checkpoints",
        sa.Column("thread_id", ID, primary_key=True),
        sa.Column("checkpoint_ns", ID, primary_key=True),
        sa.Column("checkpoint_id", sa.String(64), primary_key=True),
        sa.Column("parent_checkpoint_id", sa.String(64)),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("checkpoint", sa.LargeBinary(), nullable=False),
        sa.Column("meta_type", sa.String(32), nullable=False),
        sa.Column("meta", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "checkpoint_blobs",
        sa.Column("thread_id", ID, primary_key=True),
        sa.Column("checkpoint_ns", ID, primary_key=True),
        sa.Column("channel", ID, primary_key=True),
        sa.Column("version", sa.String(64), primary_key=True),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("blob", sa.LargeBinary()),
    )
    op.create_table(
        "checkpoint_writes",
        sa.Column("thread_id", ID, primary_key=True),
        sa.Column("checkpoint_ns", ID, primary_key=True),
        sa.Column("checkpoint_id", sa.String(64), primary_key=True),
        sa.Column("task_id", ID, primary_key=True),
        sa.Column("idx", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("channel", ID, nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.Column("task_path", sa.Text(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("checkpoint_writes")
    op.drop_table("checkpoint_blobs")
    op.drop_table("checkpoints")
