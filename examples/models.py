"""Demo hero models, mapped on the engine's ``Base``.

They live in the demo's own tables (``demo_*``), which are not part of the engine's
migrations: ``geneva-drive up --demo`` creates exactly these tables with
``Base.metadata.create_all(tables=DEMO_TABLES)`` after migrating the engine's schema. A real
application maps its heroes on its own base and migrates them itself.
"""

from __future__ import annotations

from sqlalchemy import Boolean, ForeignKey, Integer, String, Table
from sqlalchemy.orm import Mapped, mapped_column

from geneva_drive.models import Base


class DemoCustomer(Base):
    __tablename__ = "demo_customers"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(255))
    profile_complete: Mapped[bool] = mapped_column(Boolean, default=False)


class DemoOrder(Base):
    __tablename__ = "demo_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    amount_cents: Mapped[int] = mapped_column(Integer)
    voided: Mapped[bool] = mapped_column(Boolean, default=False)
    captured_cents: Mapped[int | None] = mapped_column(Integer, nullable=True)


class DemoCampaign(Base):
    __tablename__ = "demo_campaigns"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    delivered: Mapped[int] = mapped_column(Integer, default=0)


class DemoSubscriber(Base):
    __tablename__ = "demo_subscribers"
    id: Mapped[int] = mapped_column(primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("demo_campaigns.id"), index=True)
    email: Mapped[str] = mapped_column(String(255))


class DemoFeed(Base):
    __tablename__ = "demo_feeds"
    id: Mapped[int] = mapped_column(primary_key=True)
    url: Mapped[str] = mapped_column(String(255))
    #: "healthy", "flaky" (the fetch times out a few times, then works) or "broken" (a
    #: malformed row: the parse fails and the workflow pauses for an operator).
    kind: Mapped[str] = mapped_column(String(16), default="healthy")
    fetch_attempts: Mapped[int] = mapped_column(Integer, default=0)


class DemoMember(Base):
    """A forum member who asked to be erased (the hero of ``UserErasureWorkflow``)."""

    __tablename__ = "demo_members"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(255))
    name: Mapped[str] = mapped_column(String(255))
    #: Set when the member's data export (and the 30-day notice) was sent.
    export_sent: Mapped[bool] = mapped_column(Boolean, default=False)
    #: Set when the member withdraws the erasure request during the grace period.
    erasure_withdrawn: Mapped[bool] = mapped_column(Boolean, default=False)


class DemoPost(Base):
    """A member's forum post; erasure keeps the thread readable but anonymizes the post."""

    __tablename__ = "demo_posts"
    id: Mapped[int] = mapped_column(primary_key=True)
    member_id: Mapped[int | None] = mapped_column(
        ForeignKey("demo_members.id"), index=True, nullable=True
    )
    author_name: Mapped[str] = mapped_column(String(255))
    body: Mapped[str] = mapped_column(String(2000))


DEMO_TABLES: list[Table] = [
    m.__table__  # type: ignore[misc]
    for m in (
        DemoCustomer,
        DemoOrder,
        DemoCampaign,
        DemoSubscriber,
        DemoFeed,
        DemoMember,
        DemoPost,
    )
]
