"""Temporal QC: how each flicker score was made, so scores of two methods are never read as one
scale (NULL: recorded before methods were, compared where the pixels are).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27 00:40:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("outputs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("flicker_method", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("outputs", schema=None) as batch_op:
        batch_op.drop_column("flicker_method")
