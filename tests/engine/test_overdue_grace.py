"""Overdue means late beyond a grace (``settings.overdue_after`` = dispatch interval +
``overdue_grace``), never "due now": the why line, ``StepExecution.is_overdue`` and the
metrics snapshot agree on both sides of the line, and GENEVA_OVERDUE_GRACE sets it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update

from geneva_drive import Workflow, metrics, step
from geneva_drive.config import Settings, settings
from geneva_drive.explain import why_waiting
from geneva_drive.models import StepExecution, utcnow
from tests.engine.helpers import make_order


class GraceFlow(Workflow):
    @step
    def fetch(self) -> None:
        pass


def _late_by(session, late: timedelta) -> GraceFlow:  # type: ignore[no-untyped-def]
    order = make_order(session)
    workflow = GraceFlow.create(hero=order, session=session)
    session.flush()
    session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == workflow.id)
        .values(scheduled_for=utcnow() - late)
    )
    session.commit()
    session.expire_all()
    return workflow


def _execution(session, workflow: Workflow) -> StepExecution:  # type: ignore[no-untyped-def]
    return session.query(StepExecution).filter_by(workflow_id=workflow.id).one()


def test_within_the_grace_it_is_due_now_beyond_it_overdue_and_by_how_much(geneva_session):
    settings.dispatch_interval = 5
    settings.overdue_grace = 30
    assert settings.overdue_after == timedelta(seconds=35)
    fresh = _late_by(geneva_session, timedelta(seconds=20))
    late = _late_by(geneva_session, timedelta(minutes=3))

    assert why_waiting(fresh) == "`fetch` due now"
    assert not _execution(geneva_session, fresh).is_overdue
    assert why_waiting(late) == "`fetch` overdue by 3 min"
    assert _execution(geneva_session, late).is_overdue

    snapshot = metrics.collect(geneva_session)
    assert snapshot.overdue == 1
    assert snapshot.oldest_overdue_seconds == pytest.approx(180, abs=5)

    # A larger grace takes the late one out of every count at once.
    settings.overdue_grace = 600
    assert why_waiting(late) == "`fetch` due now"
    assert not _execution(geneva_session, late).is_overdue
    assert metrics.collect(geneva_session).overdue == 0


def test_geneva_overdue_grace_is_read_and_checked():
    configured = Settings()
    configured.load_env({"GENEVA_OVERDUE_GRACE": "90"})
    assert configured.overdue_grace == timedelta(seconds=90)
    with pytest.raises(ValueError, match="GENEVA_OVERDUE_GRACE='soon' is not valid"):
        configured.load_env({"GENEVA_OVERDUE_GRACE": "soon"})
    with pytest.raises(ValueError, match="must not be negative"):
        configured.overdue_grace = -1
