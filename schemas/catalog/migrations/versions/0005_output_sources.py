"""Stabilised versions: which outputs each output was made from.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26 12:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "output_sources",
        sa.Column(
            "output_id",
            sa.Integer(),
            sa.ForeignKey("outputs.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column(
            "source_output_id",
            sa.Integer(),
            sa.ForeignKey("outputs.id", ondelete="CASCADE"),
            primary_key=True,
        ),
    )
    op.create_index("ix_output_sources_source_output_id", "output_sources", ["source_output_id"])


def downgrade() -> None:
    op.drop_index("ix_output_sources_source_output_id", table_name="output_sources")
    op.drop_table("output_sources")
