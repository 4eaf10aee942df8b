"""The shop's tables.

Revision ID: shop_0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "shop_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        "shop_users",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(80), nullable=False, unique=True),
        sa.Column("password_hash", sa.String(255), nullable=False),
        sa.Column("geneva_drive_role", sa.String(16), nullable=True),
    )
    op.create_table(
        "shop_orders",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("customer", sa.String(80), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("paid_cents", sa.Integer(), nullable=True),
    )
    op.create_table(
        "shop_order_lines",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("order_id", sa.Integer(), sa.ForeignKey("shop_orders.id"), nullable=False),
        sa.Column("sku", sa.String(40), nullable=False),
        sa.Column("reserved", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_shop_order_lines_order_id", "shop_order_lines", ["order_id"])


def downgrade():
    op.drop_table("shop_order_lines")
    op.drop_table("shop_orders")
    op.drop_table("shop_users")
