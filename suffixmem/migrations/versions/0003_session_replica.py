"""Sessions remember the replica that served them (remote engine's session affinity).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("replica", sa.String(512)))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("replica")
