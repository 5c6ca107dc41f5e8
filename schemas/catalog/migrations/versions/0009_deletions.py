"""Deleted versions: a ``deletions`` row per version folder removed from disk, and each output
of it pointing there (NULL: its file is on disk).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28 15:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "deletions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("shot_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(length=16), nullable=False),
        sa.Column("output_root", sa.String(length=2048), nullable=False),
        sa.Column("requested_by", sa.String(length=256), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("outputs", sa.Integer(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["shot_id"], ["shots.id"], name=op.f("fk_deletions_shot_id_shots"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deletions")),
    )
    op.create_index(op.f("ix_deletions_shot_id"), "deletions", ["shot_id"])
    op.create_index(op.f("ix_deletions_output_root"), "deletions", ["output_root"])
    with op.batch_alter_table("outputs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("deletion_id", sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f("ix_outputs_deletion_id"), ["deletion_id"])
        batch_op.create_foreign_key(
            batch_op.f("fk_outputs_deletion_id_deletions"), "deletions", ["deletion_id"], ["id"]
        )


def downgrade() -> None:
    with op.batch_alter_table("outputs", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_outputs_deletion_id_deletions"), type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_outputs_deletion_id"))
        batch_op.drop_column("deletion_id")
    op.drop_index(op.f("ix_deletions_output_root"), table_name="deletions")
    op.drop_index(op.f("ix_deletions_shot_id"), table_name="deletions")
    op.drop_table("deletions")
