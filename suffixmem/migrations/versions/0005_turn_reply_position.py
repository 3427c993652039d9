"""A turn's statistics say where its reply was stored, so a reader pairs them with the reply
after an edit rewrote the history (pairing by order showed an abandoned turn's figures); NULL
for turns stored before.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("turn_events") as batch:
        batch.add_column(sa.Column("reply_position", sa.Integer))


def downgrade() -> None:
    with op.batch_alter_table("turn_events") as batch:
        batch.drop_column("reply_position")
