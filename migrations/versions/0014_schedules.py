"""schedules: recurring workflows, one row each

A schedule defined in code (a ``Schedule`` on a workflow class) or at run time
(``Schedule.create``) is a row of ``geneva_drive_schedules``; the dispatcher's sweep fires each
tick under the row's lock, exactly once (docs/MANUAL.md, "Recurring work"). Code schedules are
written from the registered classes when a dispatcher starts, so the upgrade fills nothing.

Revision ID: 0014
Revises: 0013
"""
from alembic import op
import sqlalchemy as sa

import geneva_drive.models


revision = '0014'
down_revision = '0013'
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


def _time(name: str, nullable: bool = True) -> sa.Column:
    return sa.Column(name, geneva_drive.models.UTCDateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        'geneva_drive_schedules',
        sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
        sa.Column('name', sa.String(length=255), nullable=False),
        sa.Column('workflow_type', sa.String(length=255), nullable=False),
        sa.Column('hero_type', sa.String(length=255), nullable=True),
        sa.Column('hero_id', sa.String(length=64), nullable=True),
        sa.Column('cron', sa.String(length=255), nullable=True),
        sa.Column('every_seconds', sa.Double(), nullable=True),
        sa.Column('timezone', sa.String(length=64), nullable=False),
        sa.Column('catch_up', sa.String(length=16), nullable=False),
        sa.Column('catch_up_window_seconds', sa.Double(), nullable=False),
        sa.Column('overlap', sa.String(length=16), nullable=False),
        sa.Column('paused', sa.Boolean(), nullable=False),
        sa.Column('source', sa.String(length=16), nullable=False),
        _time('next_fire_at', nullable=False),
        _time('anchor_at'),
        _time('last_tick_at'),
        _time('last_fired_at'),
        sa.Column(
            'last_workflow_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True
        ),
        sa.Column('ticks_created', sa.BigInteger(), nullable=False),
        sa.Column('ticks_skipped', sa.BigInteger(), nullable=False),
        sa.Column('ticks_missed', sa.BigInteger(), nullable=False),
        _time('last_skipped_at'),
        sa.Column('last_skip_reason', sa.String(length=255), nullable=True),
        _time('last_missed_at'),
        _time('disabled_at'),
        _time('created_at', nullable=False),
        _time('updated_at', nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_geneva_drive_schedules')),
        sa.UniqueConstraint('name', name=op.f('uq_geneva_drive_schedules_name')),
        **_options(),
    )
    op.create_index(
        op.f('ix_geneva_drive_schedules_next_fire_at'), 'geneva_drive_schedules', ['next_fire_at']
    )


def downgrade() -> None:
    op.drop_index(
        op.f('ix_geneva_drive_schedules_next_fire_at'), table_name='geneva_drive_schedules'
    )
    op.drop_table('geneva_drive_schedules')
