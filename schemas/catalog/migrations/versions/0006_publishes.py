"""Publishes: what a job's outputs became in a production tracker (Kitsu, ShotGrid), or why
the publish is pending.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26 12:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "publishes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("shot_id", sa.Integer(), nullable=False),
        sa.Column("tracker", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("code", sa.String(length=256), nullable=False),
        sa.Column(
            "entity_ids",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_publishes_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["shot_id"], ["shots.id"], name=op.f("fk_publishes_shot_id_shots"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_publishes")),
        sa.UniqueConstraint("job_id", "tracker", name=op.f("uq_publishes_job_id_tracker")),
    )
    with op.batch_alter_table("publishes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_publishes_shot_id"), ["shot_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_publishes_status"), ["status"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("publishes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_publishes_status"))
        batch_op.drop_index(batch_op.f("ix_publishes_shot_id"))
    op.drop_table("publishes")
