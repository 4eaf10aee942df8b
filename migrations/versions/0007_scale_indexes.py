"""indexes that keep dispatch, housekeeping and the dashboard proportional to the live set

Issue 26 measured each at 1M to 5M workflows: every one grew with total history.

- ``index_geneva_drive_step_executions_due``: the dispatcher's claim in ``(scheduled_for,
  id)`` order for scheduled rows, so a burst due at one instant is not re-sorted per batch
  (100,000 at one instant took 83.5 s). PostgreSQL only (partial): SQLite's and InnoDB's
  ``(state, scheduled_for)`` index carries the rowid / primary key and gives that order.
- ``index_geneva_drive_step_executions_failed_at``: the failures page reads recent failures
  only (failures-1h went from 794 ms to 0.2 ms on a copy at 5M).
- ``index_geneva_drive_signals_pending``: the signal inbox reads pending signals only.
- ``index_geneva_drive_workflows_terminal_transitioned``: housekeeping's cleanup finds old
  finished/canceled workflows in time order; a pass with nothing to delete reads an empty range.

The last three are partial on PostgreSQL; on SQLite the inbox's is partial and the other two
are full indexes (only failed rows have failed_at; old ongoing workflows are few), as SQLite's
planner, without statistics, picks a state index over a partial one and sorts; on MariaDB/MySQL each is a composite
index led by the state column under the same name (geneva_drive.models.MYSQL_FORMS), written
out here so that this revision does not change when the code does.

Revision ID: 0007
Revises: 0006
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

SCHEDULED = "state = 'scheduled'"
FAILED = "state = 'failed'"
PENDING = "state = 'pending'"
TERMINAL = "state IN ('finished', 'canceled')"
MYSQL_UPGRADE = [
    "CREATE INDEX `index_geneva_drive_step_executions_failed_at` ON "
    "`geneva_drive_step_executions` (`state`, `failed_at`)",
    "CREATE INDEX `index_geneva_drive_signals_pending` ON `geneva_drive_signals` "
    "(`state`, `created_at`)",
    "CREATE INDEX `index_geneva_drive_workflows_terminal_transitioned` ON "
    "`geneva_drive_workflows` (`state`, `transitioned_at`)",
]
MYSQL_DOWNGRADE = [
    "DROP INDEX `index_geneva_drive_workflows_terminal_transitioned` ON `geneva_drive_workflows`",
    "DROP INDEX `index_geneva_drive_signals_pending` ON `geneva_drive_signals`",
    "DROP INDEX `index_geneva_drive_step_executions_failed_at` ON "
    "`geneva_drive_step_executions`",
]


def _backend() -> str:
    return op.get_bind().dialect.name


def upgrade() -> None:
    backend = _backend()
    postgres = backend == 'postgresql'
    if backend in ('mysql', 'mariadb'):
        for statement in MYSQL_UPGRADE:
            op.execute(statement)
        return
    with op.batch_alter_table('geneva_drive_step_executions', schema=None) as batch_op:
        if postgres:
            batch_op.create_index('index_geneva_drive_step_executions_due', ['scheduled_for', 'id'], unique=False, postgresql_where=sa.text(SCHEDULED))
        batch_op.create_index('index_geneva_drive_step_executions_failed_at', ['failed_at'], unique=False, postgresql_where=sa.text(FAILED))
    with op.batch_alter_table('geneva_drive_signals', schema=None) as batch_op:
        batch_op.create_index('index_geneva_drive_signals_pending', ['created_at', 'id'], unique=False, postgresql_where=sa.text(PENDING), sqlite_where=sa.text(PENDING))
    with op.batch_alter_table('geneva_drive_workflows', schema=None) as batch_op:
        batch_op.create_index('index_geneva_drive_workflows_terminal_transitioned', ['transitioned_at', 'id'], unique=False, postgresql_where=sa.text(TERMINAL))


def downgrade() -> None:
    backend = _backend()
    postgres = backend == 'postgresql'
    if backend in ('mysql', 'mariadb'):
        for statement in MYSQL_DOWNGRADE:
            op.execute(statement)
        return
    with op.batch_alter_table('geneva_drive_workflows', schema=None) as batch_op:
        batch_op.drop_index('index_geneva_drive_workflows_terminal_transitioned', postgresql_where=sa.text(TERMINAL))
    with op.batch_alter_table('geneva_drive_signals', schema=None) as batch_op:
        batch_op.drop_index('index_geneva_drive_signals_pending', postgresql_where=sa.text(PENDING), sqlite_where=sa.text(PENDING))
    with op.batch_alter_table('geneva_drive_step_executions', schema=None) as batch_op:
        batch_op.drop_index('index_geneva_drive_step_executions_failed_at', postgresql_where=sa.text(FAILED))
        if postgres:
            batch_op.drop_index('index_geneva_drive_step_executions_due', postgresql_where=sa.text(SCHEDULED))
