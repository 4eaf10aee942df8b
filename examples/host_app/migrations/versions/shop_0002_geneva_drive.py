"""GenevaDrive's tables, in the shop's own migration flow.

The engine's schema has its own Alembic history (and version table,
geneva_drive_alembic_version); this revision runs it, up to its newest revision, inside the
shop's `flask db upgrade`. A later GenevaDrive release with new engine migrations gets a new
shop revision that calls the same function again.

Revision ID: shop_0002
Revises: shop_0001
"""

from alembic import op

import geneva_drive.migrations

revision = "shop_0002"
down_revision = "shop_0001"
branch_labels = None
depends_on = None


def upgrade():
    geneva_drive.migrations.upgrade(op.get_bind())


def downgrade():
    raise NotImplementedError("GenevaDrive's tables are not dropped by the shop's history")
