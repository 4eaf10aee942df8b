"""step executions finished per minute, rolled up by housekeeping

Issue 26: the charts (24 h by hour, 1 h by minute) and the failures page (1 h, 24 h, 7 d)
grouped every execution of their window, joined to its workflow for the class: 543 ms for the
failures over 7 days at 1M workflows on PostgreSQL, growing with the throughput kept.
``geneva_drive_execution_minutes`` holds the same counts per minute and (class, step, kind,
error class), rolled up by housekeeping from settled minutes (``geneva_drive.rollups``);
``geneva_drive_rollup_marks`` says which minutes are rolled up. Minutes not rolled up yet
(all of them, until housekeeping first runs) are read from the executions as before, so the
upgrade fills nothing.

Revision ID: 0011
Revises: 0010
"""
from alembic import op
import sqlalchemy as sa

import geneva_drive.models


revision = '0011'
down_revision = '0010'
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
        'geneva_drive_execution_minutes',
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
        sa.PrimaryKeyConstraint('id', name=op.f('pk_geneva_drive_execution_minutes')),
        **_options(),
    )
    op.create_index(
        op.f('ix_geneva_drive_execution_minutes_minute'),
        'geneva_drive_execution_minutes',
        ['minute'],
    )
    op.create_table(
        'geneva_drive_rollup_marks',
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('from_minute', sa.BigInteger(), nullable=True),
        sa.Column('until_minute', sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint('name', name=op.f('pk_geneva_drive_rollup_marks')),
        **_options(),
    )


def downgrade() -> None:
    op.drop_table('geneva_drive_rollup_marks')
    op.drop_index(
        op.f('ix_geneva_drive_execution_minutes_minute'),
        table_name='geneva_drive_execution_minutes',
    )
    op.drop_table('geneva_drive_execution_minutes')
