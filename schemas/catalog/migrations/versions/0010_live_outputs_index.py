"""The newest outputs on disk first: a partial index on outputs (created_at, id) where no
deletion removed them, for the outputs pages of a catalog of a million outputs.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28 16:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LIVE = sa.text("deletion_id IS NULL")


def upgrade() -> None:
    op.create_index(
        "ix_outputs_live_newest",
        "outputs",
        ["created_at", "id"],
        postgresql_where=LIVE,
        sqlite_where=LIVE,
    )


def downgrade() -> None:
    op.drop_index("ix_outputs_live_newest", table_name="outputs")
