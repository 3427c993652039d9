"""Sessions may carry their own semantic temperature range (hot while a topic holds, cold on a
jump); NULL means the manager's range, relative to the model.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("temperature_hot", sa.Float))
        batch.add_column(sa.Column("temperature_cold", sa.Float))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("temperature_cold")
        batch.drop_column("temperature_hot")
