"""OnboardingWorkflow: the waits, the ``skip_if`` on the nudge and the ``send_fax`` gravestone."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, update

from geneva_drive.examples.models import DemoCustomer
from geneva_drive.examples.onboarding import OnboardingWorkflow
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.testing import (
    assert_step_executed,
    assert_workflow_state,
    perform_next_step,
    speedrun_workflow,
)


def _start(session, profile_complete=False):
    customer = DemoCustomer(email="ada@example.com", profile_complete=profile_complete)
    session.add(customer)
    session.flush()
    return OnboardingWorkflow.create(hero=customer, session=session)


def _executions(session, workflow):
    return list(
        session.scalars(
            select(StepExecution)
            .where(StepExecution.workflow_id == workflow.id)
            .order_by(StepExecution.id)
        )
    )


def test_runs_every_step_and_waits_between_them(geneva_session):
    wf = _start(geneva_session)
    first = perform_next_step(wf)
    assert first.step_name == "send_welcome"
    nudge = wf.current_execution
    assert nudge.step_name == "nudge_profile"
    wait = nudge.scheduled_for - utcnow()
    assert timedelta(seconds=10) < wait <= timedelta(seconds=20)

    perform_next_step(wf)  # the nudge (the profile is not complete)
    tips = wf.current_execution
    assert tips.step_name == "send_tips"
    assert tips.scheduled_for - utcnow() > timedelta(days=1, hours=23)

    speedrun_workflow(wf)
    assert_workflow_state(wf, "finished")
    ran = [(e.step_name, e.state) for e in _executions(geneva_session, wf)]
    assert ran == [
        ("send_welcome", "completed"),
        ("nudge_profile", "completed"),
        ("send_tips", "completed"),
        ("ask_feedback", "completed"),
    ]


def test_nudge_is_skipped_when_the_profile_is_complete(geneva_session):
    wf = _start(geneva_session, profile_complete=True)
    speedrun_workflow(wf)
    assert_workflow_state(wf, "finished")
    assert_step_executed(wf, "nudge_profile", "skipped")
    assert_step_executed(wf, "send_tips")


def test_an_execution_scheduled_on_the_removed_send_fax_drains(geneva_session):
    wf = _start(geneva_session)
    perform_next_step(wf)  # send_welcome
    # An execution scheduled before send_fax was removed (as the seed leaves some).
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.id == wf.current_execution.id)
        .values(step_name="send_fax")
    )
    geneva_session.commit()
    assert OnboardingWorkflow.removed_steps_in_flight(geneva_session) == {"send_fax": 1}

    perform_next_step(wf)
    assert_step_executed(wf, "send_fax", "skipped")
    assert wf.state == "ready"  # carries on with the step after the gravestone
    assert wf.current_execution.step_name == "send_tips"
    speedrun_workflow(wf)
    assert_workflow_state(wf, "finished")
    # Drained: a finished workflow no longer counts against the gravestone.
    assert OnboardingWorkflow.removed_steps_in_flight(geneva_session) == {}
