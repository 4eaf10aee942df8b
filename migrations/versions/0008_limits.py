"""concurrency and rate limits: limit slots on step executions, and the slot lock table

SPEC §6.2 (issue 30). Each step execution of a limited step records the ``name/key`` slots it
counts against, evaluated when it was created: ``limit_slot`` (the class's
``concurrency_limit``), ``step_limit_slot`` (the step's) and ``rate_slot`` (the step's
``rate_limit``); ``deferred_on`` names the slot a deferred execution waits for. Unlimited
executions leave all four NULL. ``geneva_drive_limits`` holds one row per slot, the row each
claim of the slot locks (geneva_drive.limits).

The four indexes are partial on PostgreSQL and SQLite (only limited rows), so executions
without limits cost them nothing; MariaDB and MySQL have no partial indexes and get composite
indexes led by the slot column (geneva_drive.models.MYSQL_FORMS), written out here so that this
revision does not change when the code does.

Revision ID: 0008
Revises: 0007
"""
from alembic import op
import sqlalchemy as sa


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

TABLE = 'geneva_drive_step_executions'
# (index name, PostgreSQL/SQLite columns, MariaDB/MySQL columns, partial condition)
INDEXES = [
    ('index_geneva_drive_step_executions_limit_slot', ['limit_slot', 'state'], ['limit_slot', 'state'], 'limit_slot IS NOT NULL'),
    ('index_geneva_drive_step_executions_step_limit_slot', ['step_limit_slot', 'state'], ['step_limit_slot', 'state'], 'step_limit_slot IS NOT NULL'),
    ('index_geneva_drive_step_executions_rate_slot', ['rate_slot', 'started_at'], ['rate_slot', 'started_at'], 'rate_slot IS NOT NULL'),
    ('index_geneva_drive_step_executions_deferred_on', ['deferred_on', 'state', 'id'], ['deferred_on', 'state'], 'deferred_on IS NOT NULL'),
]
COLUMNS = ['limit_slot', 'step_limit_slot', 'rate_slot', 'deferred_on']


def _mysql() -> bool:
    return op.get_bind().dialect.name in ('mysql', 'mariadb')


def upgrade() -> None:
    mysql = _mysql()
    # The engine's tables' charset and binary collation (as models.MYSQL_TABLE_OPTIONS): slot
    # keys are compared byte for byte, and any key text can be stored.
    options = {'mysql_charset': 'utf8mb4', 'mysql_collate': 'utf8mb4_nopad_bin'} if mysql else {}
    if mysql and not getattr(op.get_bind().dialect, 'is_mariadb', False):
        options['mysql_collate'] = 'utf8mb4_0900_bin'
    op.create_table('geneva_drive_limits',
    sa.Column('slot', sa.String(length=255), nullable=False),
    sa.PrimaryKeyConstraint('slot', name=op.f('pk_geneva_drive_limits')),
    **options,
    )
    with op.batch_alter_table(TABLE, schema=None) as batch_op:
        for column in COLUMNS:
            batch_op.add_column(sa.Column(column, sa.String(length=255), nullable=True))
        if not mysql:
            for name, columns, _mysql_columns, condition in INDEXES:
                batch_op.create_index(name, columns, unique=False, postgresql_where=sa.text(condition), sqlite_where=sa.text(condition))
    if mysql:
        for name, _columns, mysql_columns, _condition in INDEXES:
            listed = ', '.join(f'`{c}`' for c in mysql_columns)
            op.execute(f'CREATE INDEX `{name}` ON `{TABLE}` ({listed})')


def downgrade() -> None:
    mysql = _mysql()
    if mysql:
        for name, _columns, _mysql_columns, _condition in reversed(INDEXES):
            op.execute(f'DROP INDEX `{name}` ON `{TABLE}`')
    with op.batch_alter_table(TABLE, schema=None) as batch_op:
        if not mysql:
            for name, _columns, _mysql_columns, condition in reversed(INDEXES):
                batch_op.drop_index(name, postgresql_where=sa.text(condition), sqlite_where=sa.text(condition))
        for column in reversed(COLUMNS):
            batch_op.drop_column(column)
    op.drop_table('geneva_drive_limits')
