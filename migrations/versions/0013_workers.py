"""worker liveness: the workers' rows, the execution's worker, the housekeeping lease

A worker process (a Celery pool process, an embedded worker) registers a row in
``geneva_drive_workers`` and renews its heartbeat from a thread of its own; the statement that
starts an execution records ``worker_id``. An execution whose worker's lease expired is
recovered at the next dispatcher sweep, instead of after ``stuck_in_progress_threshold``
(docs/MANUAL.md, "When a worker dies"). ``geneva_drive_leases`` keeps two housekeeping runs
from overlapping. Executions started before the upgrade have no worker and are judged by age,
as before, so the upgrade fills nothing.

Revision ID: 0013
Revises: 0012
"""
from alembic import op
import sqlalchemy as sa

import geneva_drive.models


revision = '0013'
down_revision = '0012'
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
        'geneva_drive_workers',
        sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
        sa.Column('name', sa.String(length=255), nullable=False),
        sa.Column('hostname', sa.String(length=255), nullable=False),
        sa.Column('pid', sa.Integer(), nullable=False),
        sa.Column('kind', sa.String(length=16), nullable=False),
        sa.Column('queues', sa.String(length=1024), server_default='', nullable=False),
        sa.Column('code_version', sa.String(length=64), nullable=False),
        sa.Column('started_at', geneva_drive.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column('heartbeat_at', geneva_drive.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column('stopped_at', geneva_drive.models.UTCDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_geneva_drive_workers')),
        **_options(),
    )
    op.create_index(
        op.f('ix_geneva_drive_workers_heartbeat_at'), 'geneva_drive_workers', ['heartbeat_at']
    )
    op.create_table(
        'geneva_drive_leases',
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('holder', sa.String(length=255), nullable=False),
        sa.Column('expires_at', geneva_drive.models.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('name', name=op.f('pk_geneva_drive_leases')),
        **_options(),
    )
    with op.batch_alter_table('geneva_drive_step_executions') as batch:
        batch.add_column(
            sa.Column(
                'worker_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True
            )
        )


def downgrade() -> None:
    with op.batch_alter_table('geneva_drive_step_executions') as batch:
        batch.drop_column('worker_id')
    op.drop_table('geneva_drive_leases')
    op.drop_index(op.f('ix_geneva_drive_workers_heartbeat_at'), table_name='geneva_drive_workers')
    op.drop_table('geneva_drive_workers')
