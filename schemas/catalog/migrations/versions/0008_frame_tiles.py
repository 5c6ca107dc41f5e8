"""The person gate: how many tiles each frame's tiled passes ran and skipped (NULL: recorded
before the gate, or a frame that ran no model).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27 23:40:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job_frames", schema=None) as batch_op:
        batch_op.add_column(sa.Column("tiles_run", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("tiles_skipped", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_frames", schema=None) as batch_op:
        batch_op.drop_column("tiles_skipped")
        batch_op.drop_column("tiles_run")
