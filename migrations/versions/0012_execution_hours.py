"""step executions finished per hour, summed from the rolled-up minutes

Issue 26: the failures page's 7 days read 10,080 minutes of ``geneva_drive_execution_minutes``
per group (30 ms at 1M workflows on MariaDB, seven times its 10k figure). Housekeeping now
sums each hour whose minutes are all rolled up into ``geneva_drive_execution_hours`` (the
same columns; ``minute`` is the hour's first), and the 7 days and the day chart read 168 and
24 rows per group. The ``execution_hours`` mark in ``geneva_drive_rollup_marks`` says which
hours are summed; until housekeeping first runs after the upgrade, none are, and the readers
use the minutes as before, so the upgrade fills nothing.

Revision ID: 0012
Revises: 0011
"""
from alembic import op
import sqlalchemy as sa

import geneva_drive.models


revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def _options() -> dict[str, str]:
    bind = op.get_bind()
    if bind.dialect.name not in ('mysql', 'mariadb'):
        return {}
    options = {'mysql_charset': 'utf8mb4', 'mysql_collate': 'utf8mb4_nopad_bin'}
    if not getattr(bind.dialect, 'is_mariadb', False):
        options['mysql_collate'] = 'utf8mb4_0900_bin'
    return options


def upgrade() -> None:
    op.create_table(
        'geneva_drive_execution_hours',
        sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
        sa.Column('minute', sa.BigInteger(), nullable=False),
        sa.Column('type', sa.String(length=255), nullable=False),
        sa.Column('step_name', sa.String(length=255), nullable=False),
        sa.Column('kind', sa.String(length=16), nullable=False),
        sa.Column('error_class_name', sa.String(length=255), nullable=False),
        sa.Column('count', sa.BigInteger(), nullable=False),
        sa.Column(
            'last_finished_at', geneva_drive.models.UTCDateTime(timezone=True), nullable=False
        ),
        sa.Column('last_execution_id', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_geneva_drive_execution_hours')),
        **_options(),
    )
    op.create_index(
        op.f('ix_geneva_drive_execution_hours_minute'),
        'geneva_drive_execution_hours',
        ['minute'],
    )


def downgrade() -> None:
    op.drop_index(
        op.f('ix_geneva_drive_execution_hours_minute'),
        table_name='geneva_drive_execution_hours',
    )
    op.drop_table('geneva_drive_execution_hours')
