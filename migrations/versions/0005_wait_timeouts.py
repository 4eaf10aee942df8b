"""time-bounded waits: timeout_at and timed_out_at on step executions

SPEC §6.1 (issue 29). ``timeout_at`` is the deadline of a parked execution whose step has
``timeout=``; ``timed_out_at`` records that the time-out fired. Two indexes: the dispatcher's
sweep finds parked executions by deadline, and the dashboard's ``timed_out`` filter finds the
workflows with an execution that timed out. On PostgreSQL and SQLite both are partial (only
parked rows, only timed-out rows), so steps without a time-out cost them nothing; MariaDB and
MySQL have no partial indexes and get the composite forms of geneva_drive.models.MYSQL_FORMS,
written out here so that this revision does not change when the code does.

Executions already parked when this runs keep ``timeout_at`` NULL: their steps had no time-out.
A deploy that adds ``timeout=`` to such a step starts their clock at the first sweep of the new
code (geneva_drive.timeouts.adopt_parked; docs/MANUAL.md, "Time-bounded waits").

Revision ID: 0005
Revises: 0004
"""
from alembic import op
import sqlalchemy as sa

import geneva_drive.models


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

MYSQL_UPGRADE = [
    "CREATE INDEX `index_geneva_drive_step_executions_waiting_timeout` ON "
    "`geneva_drive_step_executions` (`state`, `timeout_at`)",
    "CREATE INDEX `index_geneva_drive_step_executions_timed_out` ON "
    "`geneva_drive_step_executions` (`timed_out_at`, `workflow_id`)",
]


def _mysql() -> bool:
    return op.get_bind().dialect.name in ('mysql', 'mariadb')


def upgrade() -> None:
    mysql = _mysql()
    with op.batch_alter_table('geneva_drive_step_executions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('timeout_at', geneva_drive.models.UTCDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('timed_out_at', geneva_drive.models.UTCDateTime(timezone=True), nullable=True))
        if not mysql:
            batch_op.create_index('index_geneva_drive_step_executions_waiting_timeout', ['timeout_at'], unique=False, postgresql_where=sa.text("state = 'waiting'"), sqlite_where=sa.text("state = 'waiting'"))
            batch_op.create_index('index_geneva_drive_step_executions_timed_out', ['timed_out_at', 'workflow_id'], unique=False, postgresql_where=sa.text("timed_out_at IS NOT NULL"), sqlite_where=sa.text("timed_out_at IS NOT NULL"))
    if mysql:
        for statement in MYSQL_UPGRADE:
            op.execute(statement)


def downgrade() -> None:
    mysql = _mysql()
    if mysql:
        op.execute("DROP INDEX `index_geneva_drive_step_executions_timed_out` ON `geneva_drive_step_executions`")
        op.execute("DROP INDEX `index_geneva_drive_step_executions_waiting_timeout` ON `geneva_drive_step_executions`")
    with op.batch_alter_table('geneva_drive_step_executions', schema=None) as batch_op:
        if not mysql:
            batch_op.drop_index('index_geneva_drive_step_executions_timed_out', postgresql_where=sa.text("timed_out_at IS NOT NULL"), sqlite_where=sa.text("timed_out_at IS NOT NULL"))
            batch_op.drop_index('index_geneva_drive_step_executions_waiting_timeout', postgresql_where=sa.text("state = 'waiting'"), sqlite_where=sa.text("state = 'waiting'"))
        batch_op.drop_column('timed_out_at')
        batch_op.drop_column('timeout_at')
