"""backfill finished_at of closed step executions

Before issue 17, an operator's skip() or cancel() and the bulk "stray" sweep closed executions
without finished_at, and the model and the dashboard fell back to completed_at, failed_at,
canceled_at or skipped_at. Every closing transition now writes finished_at
(geneva_drive.transitions) and the fallbacks are gone, so the old rows get it from the
timestamp of their state. Data only: no schema change; downgrade leaves the values.

Revision ID: 0004
Revises: 0003
"""
from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    executions = sa.table(
        'geneva_drive_step_executions',
        sa.column('state', sa.String),
        sa.column('finished_at', sa.DateTime),
        sa.column('completed_at', sa.DateTime),
        sa.column('failed_at', sa.DateTime),
        sa.column('skipped_at', sa.DateTime),
        sa.column('canceled_at', sa.DateTime),
        sa.column('updated_at', sa.DateTime),
    )
    c = executions.c
    op.execute(
        executions.update()
        .where(
            c.finished_at.is_(None),
            c.state.in_(['completed', 'failed', 'skipped', 'canceled']),
        )
        .values(
            finished_at=sa.func.coalesce(
                c.completed_at, c.failed_at, c.skipped_at, c.canceled_at, c.updated_at
            )
        )
    )


def downgrade() -> None:
    pass
