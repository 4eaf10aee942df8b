"""The shop's own tables, on its own Flask-SQLAlchemy metadata."""

from __future__ import annotations

from flask_login import UserMixin
from sqlalchemy import ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column
from werkzeug.security import check_password_hash, generate_password_hash

from app import db, login_manager


class User(UserMixin, db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "shop_users"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(80), unique=True)
    password_hash: Mapped[str] = mapped_column(String(255))
    #: "operator", "viewer" or None (no dashboard access): GenevaDrive reads this attribute.
    geneva_drive_role: Mapped[str | None] = mapped_column(String(16), nullable=True)

    def set_password(self, password: str) -> None:
        self.password_hash = generate_password_hash(password)

    def check_password(self, password: str) -> bool:
        return check_password_hash(self.password_hash, password)


@login_manager.user_loader
def load_user(user_id: str) -> User | None:
    return db.session.get(User, int(user_id))


class Order(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "shop_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(80))
    status: Mapped[str] = mapped_column(String(32), default="new")
    paid_cents: Mapped[int | None] = mapped_column(Integer, nullable=True)


class OrderLine(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "shop_order_lines"
    id: Mapped[int] = mapped_column(primary_key=True)
    order_id: Mapped[int] = mapped_column(ForeignKey("shop_orders.id"), index=True)
    sku: Mapped[str] = mapped_column(String(40))
    reserved: Mapped[bool] = mapped_column(default=False)
