"""Shared fixtures: hero models mapped on the engine's Base, and the geneva_session fixture
(from the geneva_drive.testing pytest plugin, registered via the pytest11 entry point)."""

from __future__ import annotations

import uuid

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from geneva_drive.models import Base


class Order(Base):
    __tablename__ = "test_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str] = mapped_column(String(32), default="new")


class Account(Base):
    __tablename__ = "test_accounts"
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    email: Mapped[str] = mapped_column(String(255), default="a@example.com")
