"""Temporal QC: a flicker score beside each output (pass, frame).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 14:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("outputs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("flicker", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("outputs", schema=None) as batch_op:
        batch_op.drop_column("flicker")
