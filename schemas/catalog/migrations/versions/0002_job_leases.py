"""Job leases: who runs a job, its last heartbeat and the output folder it writes, so a job
whose process died is closed by the next one and two live jobs never share an output folder.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 10:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("owner", sa.String(length=256), nullable=True))
        batch_op.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("output_root", sa.String(length=2048), nullable=True))
        batch_op.create_index(batch_op.f("ix_jobs_output_root"), ["output_root"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_output_root"))
        batch_op.drop_column("output_root")
        batch_op.drop_column("heartbeat_at")
        batch_op.drop_column("owner")
