"""the dashboard's session generations (logout ends every session of the user)

Revision ID: 0003
Revises: 0002
"""
from alembic import op
import sqlalchemy as sa

import geneva_drive.models


# revision identifiers, used by Alembic.
revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('geneva_drive_dashboard_sessions',
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('generation', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('updated_at', geneva_drive.models.UTCDateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_geneva_drive_dashboard_sessions'))
    )


def downgrade() -> None:
    op.drop_table('geneva_drive_dashboard_sessions')
