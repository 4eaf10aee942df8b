"""workflow counts per (class, state), kept by every write of a workflow row

Issue 26: the overview and /metrics counted every workflow row for the per-(class, state)
numbers (2.2 s at 1M workflows on PostgreSQL, 5.3 s at 5M). ``geneva_drive_workflow_counts``
holds the same numbers in a few rows per (class, state): each transaction adds its net changes
to one of a few shards (``geneva_drive.counts``), the readers sum the shards.

The upgrade fills the table from the workflows kept (one grouped scan, shard 0). Run it with
the engine's workers stopped, or call ``geneva_drive.counts.rebuild(session)`` (and commit)
once the new code runs everywhere: a workflow that code without the counts writes meanwhile
is not counted.

Revision ID: 0010
Revises: 0009
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    mysql = op.get_bind().dialect.name in ('mysql', 'mariadb')
    options = {'mysql_charset': 'utf8mb4', 'mysql_collate': 'utf8mb4_nopad_bin'} if mysql else {}
    if mysql and not getattr(op.get_bind().dialect, 'is_mariadb', False):
        options['mysql_collate'] = 'utf8mb4_0900_bin'
    op.create_table(
        'geneva_drive_workflow_counts',
        sa.Column('type', sa.String(length=255), nullable=False),
        sa.Column('state', sa.String(length=32), nullable=False),
        sa.Column('shard', sa.Integer(), autoincrement=False, nullable=False),
        sa.Column('count', sa.BigInteger(), server_default='0', nullable=False),
        sa.PrimaryKeyConstraint('type', 'state', 'shard', name=op.f('pk_geneva_drive_workflow_counts')),
        **options,
    )
    op.execute(
        "INSERT INTO geneva_drive_workflow_counts (type, state, shard, count) "
        # ready and performing share one row, "ongoing" (geneva_drive.counts.bucket).
        "SELECT type, CASE WHEN state IN ('ready', 'performing') THEN 'ongoing' ELSE state END, "
        "0, COUNT(*) FROM geneva_drive_workflows "
        "GROUP BY type, CASE WHEN state IN ('ready', 'performing') THEN 'ongoing' ELSE state END"
    )


def downgrade() -> None:
    op.drop_table('geneva_drive_workflow_counts')
