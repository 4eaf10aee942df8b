"""Unit tests of the dashboard's presenters (app/presenters.py): what a page is given to show.

The vocabulary comes from the engine: the buttons from states.allowed_operator_actions, the
bulk bar from states.BULK_OPERATIONS, overdue/stuck/waiting too long from engine/lateness.py.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from geneva_drive import Workflow, step
from geneva_drive.dashboard import presenters
from geneva_drive.dashboard.auth import DashboardUser
from geneva_drive.models import utcnow
from geneva_drive.states import BULK_OPERATIONS, Operation
from geneva_drive.testing import speedrun_workflow
from tests.engine.helpers import create_workflow

OPERATOR = DashboardUser("olga", "operator")
VIEWER = DashboardUser("vic", "viewer")


class PresentFlow(Workflow):
    @step
    def first(self) -> None:
        pass

    @step(wait_for="go")
    def second(self) -> None:
        pass


def test_state_badges_spell_the_state_and_carry_a_tone():
    assert presenters.state_badge("in_progress") == presenters.Badge("in progress", "active")
    assert presenters.state_badge("failed").tone == "bad"
    assert presenters.state_badge("something new") == presenters.Badge("something new", "muted")


@pytest.mark.parametrize(
    ("state", "names"),
    [
        ("ready", ["pause", "skip", "cancel", "signal"]),
        ("performing", ["pause", "cancel", "signal"]),
        ("paused", ["resume", "skip", "cancel", "reattempt", "resume_at", "signal"]),
        ("finished", []),
        ("canceled", []),
    ],
)
def test_action_controls_follow_the_engine_and_confirm_what_throws_work_away(state, names):
    controls = presenters.action_controls(state, OPERATOR, 7)
    assert [c.name for c in controls] == names
    for control in controls:
        assert control.label == presenters.ACTION_LABELS[control.name]
        if control.name in (Operation.SKIP, Operation.CANCEL, Operation.RESUME_AT):
            assert control.confirm is not None and "#7" in control.confirm
    assert presenters.action_controls(state, VIEWER, 7) == []
    assert presenters.action_controls(state, None, 7) == []


def test_bulk_actions_are_the_engines_bulk_operations_in_order():
    assert list(presenters.BULK_ACTIONS) == list(BULK_OPERATIONS)
    assert set(presenters.BULK_ACTIONS) >= presenters.DANGEROUS_BULK_ACTIONS
    label, verb = presenters.BULK_ACTIONS[Operation.CANCEL]
    assert (label, verb) == ("Cancel selected", "canceled")


def _badges(session, workflow):  # type: ignore[no-untyped-def]
    """The badges after the state's own (which comes first)."""
    [row] = presenters.workflow_rows(session, [workflow])
    assert row.badges[0] == presenters.state_badge(row.state)
    return [b.label for b in row.badges[1:]]


def _park(workflow):  # type: ignore[no-untyped-def]
    """Run ``first``; ``second`` then parks at its signal gate."""
    with pytest.raises(RuntimeError, match="parked waiting for go"):
        speedrun_workflow(workflow)


def test_row_badges_say_overdue_stuck_and_waiting_too_long(geneva_session, monkeypatch):
    on_time = create_workflow(
        geneva_session, PresentFlow, scheduled_for=utcnow() + timedelta(minutes=5)
    )
    assert _badges(geneva_session, on_time) == []
    just_due = create_workflow(
        geneva_session, PresentFlow, scheduled_for=utcnow() - timedelta(seconds=10)
    )
    assert _badges(geneva_session, just_due) == []  # within the dispatcher's grace: due now
    late = create_workflow(
        geneva_session, PresentFlow, scheduled_for=utcnow() - timedelta(minutes=5)
    )
    assert _badges(geneva_session, late) == ["overdue, late by 5 min"]
    stuck = create_workflow(
        geneva_session, PresentFlow, state="in_progress", started_at=utcnow() - timedelta(hours=2)
    )
    assert _badges(geneva_session, stuck) == ["stuck"]
    running = create_workflow(geneva_session, PresentFlow, state="in_progress", started_at=utcnow())
    assert _badges(geneva_session, running) == []

    parked = create_workflow(geneva_session, PresentFlow)
    _park(parked)
    assert _badges(geneva_session, parked) == ["waiting"]
    from geneva_drive.config import settings

    monkeypatch.setattr(settings, "waiting_visibility_threshold", timedelta(seconds=0))
    assert _badges(geneva_session, parked) == ["waiting", "waiting too long"]


def test_a_paused_workflows_preserved_execution_is_not_called_overdue(geneva_session):
    paused = create_workflow(
        geneva_session, PresentFlow, scheduled_for=utcnow() - timedelta(minutes=5)
    )
    paused.pause()
    geneva_session.commit()
    assert "overdue" not in _badges(geneva_session, paused)


def test_execution_view_ends_at_finished_at(geneva_session):
    workflow = create_workflow(geneva_session, PresentFlow)
    _park(workflow)
    workflow.skip()  # an operator skips the parked step: closed with finished_at
    geneva_session.commit()
    first, second = sorted(workflow.step_executions, key=lambda e: e.id)
    now = utcnow()
    done = presenters.execution_view(first, 1, now)
    assert done.ended_at == first.finished_at and done.duration is not None
    assert not done.overdue
    skipped = presenters.execution_view(second, 1, now)
    assert second.state == "skipped" and skipped.ended_at == second.finished_at is not None


def test_the_inbox_lists_overdue_waiters_first():
    from datetime import UTC, datetime

    from geneva_drive.dashboard.presenters import Waiter, waiter_order

    def waiter(workflow_id: int, overdue: bool, hour: int) -> Waiter:
        since = datetime(2026, 1, 1, hour, tzinfo=UTC)
        return Waiter(workflow_id, workflow_id, "C", None, None, "s", since, overdue)

    waiters = [waiter(1, False, 1), waiter(2, True, 5), waiter(3, True, 2), waiter(4, False, 0)]
    assert [w.workflow_id for w in sorted(waiters, key=waiter_order)] == [3, 2, 4, 1]
