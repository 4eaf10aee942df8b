"""deferred_since: when a limit first held an execution back

An execution deferred by a concurrency or rate limit keeps its row and its place in line, but
its ``scheduled_for`` moves (to the backstop recheck, or to its token's time), so the start of
its wait was nowhere. ``deferred_since`` keeps it: the dashboard counts a wait longer than the
overdue grace as late and shows how long the oldest has waited (docs/MANUAL.md, "Concurrency
and rate limits"). Executions deferred before the upgrade have none and are judged from their
creation, so the upgrade fills nothing.

Revision ID: 0015
Revises: 0014
"""
from alembic import op
import sqlalchemy as sa

import geneva_drive.models


revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('geneva_drive_step_executions') as batch:
        batch.add_column(
            sa.Column(
                'deferred_since', geneva_drive.models.UTCDateTime(timezone=True), nullable=True
            )
        )


def downgrade() -> None:
    with op.batch_alter_table('geneva_drive_step_executions') as batch:
        batch.drop_column('deferred_since')
