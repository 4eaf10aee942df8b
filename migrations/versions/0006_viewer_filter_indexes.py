"""indexes for the viewer-reachable filters

The third security review (issue 27) measured, at 1,000,000 rows, full scans behind filters any
viewer can repeat at will: ``/workflows?hero_id=`` alone (248 ms; the (hero_type, hero_id)
index needs the type), ``/audit?actor=`` (212 ms), ``/audit?action=`` (238 ms) and the bulk
preview with ``scope=all&hero_id=`` (319 ms). Each index ends with ``id``, the keyset order of
the pages, so a page is a range of one index.

Revision ID: 0006
Revises: 0005
"""
from alembic import op


# revision identifiers, used by Alembic.
revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('geneva_drive_workflows', schema=None) as batch_op:
        batch_op.create_index('index_geneva_drive_workflows_on_hero_id', ['hero_id', 'id'], unique=False)

    with op.batch_alter_table('geneva_drive_operator_actions', schema=None) as batch_op:
        batch_op.create_index('index_geneva_drive_operator_actions_on_actor', ['actor', 'id'], unique=False)
        batch_op.create_index('index_geneva_drive_operator_actions_on_action', ['action', 'id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('geneva_drive_operator_actions', schema=None) as batch_op:
        batch_op.drop_index('index_geneva_drive_operator_actions_on_action')
        batch_op.drop_index('index_geneva_drive_operator_actions_on_actor')

    with op.batch_alter_table('geneva_drive_workflows', schema=None) as batch_op:
        batch_op.drop_index('index_geneva_drive_workflows_on_hero_id')
