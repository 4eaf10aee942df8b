"""child workflows: parent_id and the join counters on workflows

SPEC §6.3 (issue 31). ``parent_id`` names the workflow whose step started this one (ON DELETE
SET NULL: housekeeping may delete an old finished parent before its children), indexed with
``id`` for a parent's children in order (``wf.children``, ``/workflows?parent=``,
``cancel_children``). ``children_open`` and ``children_canceled`` are the parent's join
counters: each child's end changes them by one under the parent's row lock
(geneva_drive.children), so a join never rescans the children. Existing workflows have no
children: 0 and 0.

Revision ID: 0009
Revises: 0008
"""
from alembic import op
import sqlalchemy as sa

import geneva_drive.models


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

FK = 'fk_geneva_drive_workflows_parent_id_geneva_drive_workflows'
INDEX = 'index_geneva_drive_workflows_on_parent'


def _sqlite() -> bool:
    return op.get_bind().dialect.name == 'sqlite'


def upgrade() -> None:
    if _sqlite():
        # Not through a batch rebuild: SQLite adds a constraint only by copying the table, and
        # with the engine's PRAGMA foreign_keys=ON dropping the old copy deletes every execution
        # and signal through their ON DELETE CASCADE. ADD COLUMN may carry the reference itself.
        columns = {c['name'] for c in sa.inspect(op.get_bind()).get_columns('geneva_drive_workflows')}
        if 'parent_id' not in columns:  # a downgrade on SQLite keeps it (see downgrade)
            op.execute(
                f'ALTER TABLE geneva_drive_workflows ADD COLUMN parent_id INTEGER CONSTRAINT {FK} '
                'REFERENCES geneva_drive_workflows (id) ON DELETE SET NULL'
            )
        op.add_column('geneva_drive_workflows', sa.Column('children_open', sa.Integer(), server_default='0', nullable=False))
        op.add_column('geneva_drive_workflows', sa.Column('children_canceled', sa.Integer(), server_default='0', nullable=False))
        op.create_index(INDEX, 'geneva_drive_workflows', ['parent_id', 'id'], unique=False)
        return
    with op.batch_alter_table('geneva_drive_workflows', schema=None) as batch_op:
        batch_op.add_column(sa.Column('parent_id', geneva_drive.models.BigId, nullable=True))
        batch_op.add_column(sa.Column('children_open', sa.Integer(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('children_canceled', sa.Integer(), server_default='0', nullable=False))
        batch_op.create_index(INDEX, ['parent_id', 'id'], unique=False)
        batch_op.create_foreign_key(FK, 'geneva_drive_workflows', ['parent_id'], ['id'], ondelete='SET NULL')


def downgrade() -> None:
    if _sqlite():
        # SQLite drops a column that holds a foreign key only by copying the table, which
        # would delete every execution and signal (see upgrade): parent_id stays, unused and
        # nullable, and the upgrade takes it over again.
        op.drop_index(INDEX, table_name='geneva_drive_workflows')
        op.drop_column('geneva_drive_workflows', 'children_canceled')
        op.drop_column('geneva_drive_workflows', 'children_open')
        return
    with op.batch_alter_table('geneva_drive_workflows', schema=None) as batch_op:
        batch_op.drop_constraint(FK, type_='foreignkey')
        batch_op.drop_index(INDEX)
        batch_op.drop_column('children_canceled')
        batch_op.drop_column('children_open')
        batch_op.drop_column('parent_id')
