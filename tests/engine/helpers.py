"""Small helpers shared by the engine tests (heroes, fresh reads, time checks)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from geneva_drive import db
from geneva_drive.models import StepExecution, utcnow
from tests.conftest import Account, Order


def make_order(session: Session, status: str = "new") -> Order:
    order = Order(status=status)
    session.add(order)
    session.flush()
    return order


def create_workflow(session: Session, cls: Any, **current: Any) -> Any:
    """A ``cls`` workflow about a new order, committed (its after-commit hook has sent the
    first step's message to the test transport). ``current`` (column: value) is then written
    onto its current execution and committed: a test's way to age or mark it."""
    workflow = cls.create(hero=make_order(session))
    session.commit()
    if current:
        session.execute(
            update(StepExecution).where(StepExecution.workflow_id == workflow.id).values(**current)
        )
        session.commit()
    return workflow


def make_account(session: Session) -> Account:
    account = Account()
    session.add(account)
    session.flush()
    return account


def executions(session: Session, workflow: Any, step: str | None = None) -> list[StepExecution]:
    """Every execution of ``workflow`` (of ``step`` only, if given) in creation order, read
    fresh from the database."""
    session.expire_all()
    query = select(StepExecution).where(StepExecution.workflow_id == workflow.id)
    if step is not None:
        query = query.where(StepExecution.step_name == step)
    return list(session.scalars(query.order_by(StepExecution.id)))


def summary(session: Session, workflow: Any) -> list[tuple[str, str, str | None]]:
    return [(e.step_name, e.state, e.outcome) for e in executions(session, workflow)]


@contextmanager
def other_session() -> Iterator[Session]:
    """A second, independent session (another connection) on the test database."""
    session = db.new_session()
    try:
        yield session
    finally:
        session.rollback()
        session.close()


def assert_close(value: datetime | None, expected: datetime, tolerance: float = 15.0) -> None:
    assert value is not None, "expected a timestamp, got None"
    delta = abs((value - expected).total_seconds())
    assert delta <= tolerance, f"{value} is {delta:.1f}s away from {expected}"


def assert_recent(value: datetime | None, tolerance: float = 15.0) -> None:
    assert_close(value, utcnow(), tolerance)


def seconds(n: float) -> timedelta:
    return timedelta(seconds=n)
