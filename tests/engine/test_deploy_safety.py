"""Renaming a step with workflows on it (``renamed_step``), and a waiting execution whose step
a deploy removed is stranded like a scheduled one (docs/MANUAL.md, "Removing steps, stranded
workflows and `resume_at`").

Each test "deploys" by defining the workflow class again under the same name, as a host's
new code would, with workflows already parked or scheduled under the old code.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import event, select

from geneva_drive import (
    Workflow,
    db,
    housekeeping,
    removed_step,
    renamed_step,
    resumable_step,
    settings,
    step,
)
from geneva_drive.errors import StepConfigurationError, StepNotDefinedError
from geneva_drive.explain import STEP_NOT_DEFINED
from geneva_drive.models import Signal, StepExecution
from geneva_drive.testing import perform_next_step
from tests.engine.helpers import make_order

RAN: list[str] = []


def _v1_parked(session, name):
    """Old code: the workflow parks on ``capture`` waiting for ``payment_confirmed``."""

    class V1(Workflow):
        workflow_name = name

        @step(wait_for="payment_confirmed")
        def capture(self):
            RAN.append("capture")

        @step
        def ship(self):
            RAN.append("ship")

    wf = V1.create(hero=make_order(session))
    perform_next_step(wf)
    session.commit()
    assert wf.current_execution.state == "waiting"
    return wf.id


def _reload(session, workflow_id):
    session.commit()
    session.expunge_all()
    return session.get(Workflow, workflow_id)


def _history(session, workflow_id):
    return [
        (e.step_name, e.state)
        for e in session.scalars(
            select(StepExecution)
            .where(StepExecution.workflow_id == workflow_id)
            .order_by(StepExecution.id)
        )
    ]


@pytest.fixture(autouse=True)
def _clear_ran():
    RAN.clear()


# --- the problem, reproduced: a rename without renamed_step ----------------------------------


def test_rename_of_a_parked_step_strands_it_visibly_and_resume_at_delivers_the_buffered_signal(
    geneva_session,
):
    workflow_id = _v1_parked(geneva_session, "RenameParkedFlow")

    class V2(Workflow):  # the deploy renamed the step and left no renamed_step line
        workflow_name = "RenameParkedFlow"

        @step(wait_for="payment_confirmed")
        def capture_payment(self):
            RAN.append("capture_payment")

        @step
        def ship(self):
            RAN.append("ship")

    wf = _reload(geneva_session, workflow_id)
    why = wf.why_waiting()
    assert "None" not in why
    assert why.startswith("stranded: parked on `capture`, which is no longer defined")

    # The webhook's signal arrives while nothing can take it: it is stored, not lost.
    wf.signal("payment_confirmed", payload={"amount": 12})
    wf = _reload(geneva_session, workflow_id)
    assert wf.current_execution.state == "waiting"

    assert housekeeping.run().stranded_waiting_released == 1
    wf = _reload(geneva_session, workflow_id)
    assert wf.state == "paused"
    last = _history(geneva_session, workflow_id)[-1]
    assert last == ("capture", "failed")
    failed = geneva_session.scalars(
        select(StepExecution).where(
            StepExecution.workflow_id == workflow_id, StepExecution.state == "failed"
        )
    ).one()
    assert failed.error_class_name == STEP_NOT_DEFINED
    assert "resume_at" in failed.error_message
    assert wf.why_waiting() == "stranded: step `capture` is no longer defined"
    # A second signal while stranded is buffered too.
    wf.signal("payment_confirmed", payload={"amount": 99}, idempotency_key="second")
    wf = _reload(geneva_session, workflow_id)
    pending = geneva_session.scalars(select(Signal).where(Signal.workflow_id == workflow_id)).all()
    assert [s.state for s in pending] == ["pending", "pending"]

    with pytest.raises(StepNotDefinedError, match="resume_at"):
        wf.resume()
    wf.resume_at("capture_payment")
    wf = _reload(geneva_session, workflow_id)
    perform_next_step(wf)  # the gate attaches the oldest buffered signal: no parking
    perform_next_step(wf)
    wf = _reload(geneva_session, workflow_id)
    assert RAN == ["capture_payment", "ship"]
    assert wf.state == "finished"
    first = geneva_session.scalars(
        select(Signal).where(Signal.workflow_id == workflow_id).order_by(Signal.id)
    ).first()
    assert first.state == "consumed" and first.payload == {"amount": 12}


def test_housekeeping_pauses_nothing_while_the_step_is_still_defined(geneva_session):
    workflow_id = _v1_parked(geneva_session, "StillDefinedFlow")
    assert housekeeping.run().stranded_waiting_released == 0
    wf = _reload(geneva_session, workflow_id)
    assert wf.state == "ready"
    assert wf.why_waiting().startswith("waiting for signal `payment_confirmed`")


def test_resume_of_a_paused_workflow_parked_on_a_deleted_step_is_refused_not_silent(
    geneva_session,
):
    workflow_id = _v1_parked(geneva_session, "PausedParkedFlow")
    wf = _reload(geneva_session, workflow_id)
    wf.pause()
    geneva_session.commit()

    class V2(Workflow):
        workflow_name = "PausedParkedFlow"

        @step(wait_for="payment_confirmed")
        def capture_payment(self):
            RAN.append("capture_payment")

    wf = _reload(geneva_session, workflow_id)
    with pytest.raises(StepNotDefinedError, match="step 'capture' is no longer defined"):
        wf.resume()
    geneva_session.rollback()
    wf = _reload(geneva_session, workflow_id)
    assert wf.state == "paused"
    assert wf.current_execution.state == "waiting"
    wf.signal("payment_confirmed")
    wf.resume_at("capture_payment")
    wf = _reload(geneva_session, workflow_id)
    perform_next_step(wf)
    assert RAN == ["capture_payment"]


def test_a_parked_execution_of_a_gravestone_is_skipped_by_housekeeping(geneva_session):
    workflow_id = _v1_parked(geneva_session, "GravestoneParkedFlow")

    class V2(Workflow):
        workflow_name = "GravestoneParkedFlow"
        capture = removed_step()

        @step
        def ship(self):
            RAN.append("ship")

    assert housekeeping.run().stranded_waiting_released == 1
    wf = _reload(geneva_session, workflow_id)
    assert wf.state == "ready"
    assert _history(geneva_session, workflow_id) == [("capture", "skipped"), ("ship", "scheduled")]


def test_stranded_waiting_pass_pages_by_id_not_by_a_growing_exclusion_list(
    geneva_session, monkeypatch
):
    """More stranded rows than one batch: every page starts after the last id seen (one bound
    parameter), where ``id NOT IN (every id so far)`` grew past the backends' parameter limit
    at ~32k rows and made the pass quadratic."""
    ids = [_v1_parked(geneva_session, "PagedStrandedFlow") for _ in range(5)]

    class V2(Workflow):
        workflow_name = "PagedStrandedFlow"
        capture = removed_step()

        @step
        def ship(self):
            RAN.append("ship")

    monkeypatch.setattr(settings, "housekeeping_batch_size", 2)
    statements: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        statements.append(statement)

    engine = db.get_engine()
    event.listen(engine, "before_cursor_execute", record)
    try:
        released = housekeeping.release_stranded_waiting()
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert released == 5
    for workflow_id in ids:
        assert _history(geneva_session, workflow_id) == [
            ("capture", "skipped"),
            ("ship", "scheduled"),
        ]
    assert not [s for s in statements if "NOT IN" in s.upper()]


def test_a_parked_execution_whose_wait_for_was_dropped_is_sent_to_run(geneva_session):
    workflow_id = _v1_parked(geneva_session, "DroppedWaitFlow")

    class V2(Workflow):
        workflow_name = "DroppedWaitFlow"

        @step
        def capture(self):
            RAN.append("capture (no wait)")

    assert housekeeping.run().stranded_waiting_released == 1
    wf = _reload(geneva_session, workflow_id)
    perform_next_step(wf)
    assert RAN == ["capture (no wait)"]


# --- renamed_step -------------------------------------------------------------------------


def test_renamed_step_runs_a_parked_execution_as_the_new_step(geneva_session):
    workflow_id = _v1_parked(geneva_session, "RenamedParkedFlow")

    class V2(Workflow):
        workflow_name = "RenamedParkedFlow"
        capture = renamed_step(to="capture_payment")

        @step(wait_for="payment_confirmed")
        def capture_payment(self):
            RAN.append("capture_payment")

        @step
        def ship(self):
            RAN.append("ship")

    assert V2.steps.names == ["capture_payment", "ship"]
    assert V2.renamed_steps_in_flight(geneva_session) == {"capture": 1}
    wf = _reload(geneva_session, workflow_id)
    assert wf.why_waiting().startswith("waiting for signal `payment_confirmed`")
    assert housekeeping.run().stranded_waiting_released == 0
    wf = _reload(geneva_session, workflow_id)
    wf.signal("payment_confirmed")
    wf = _reload(geneva_session, workflow_id)
    perform_next_step(wf)
    wf = _reload(geneva_session, workflow_id)
    assert RAN == ["capture_payment"]
    assert wf.next_step_name == "ship"
    perform_next_step(wf)
    wf = _reload(geneva_session, workflow_id)
    assert wf.state == "finished"
    # Scheduling never used the old name again: only the row from before the deploy has it.
    assert _history(geneva_session, workflow_id) == [
        ("capture", "completed"),
        ("ship", "completed"),
    ]
    assert V2.renamed_steps_in_flight(geneva_session) == {"capture": 0}


def test_renamed_step_runs_a_scheduled_execution_and_counts_from_the_new_position(
    geneva_session,
):
    class V1(Workflow):
        workflow_name = "RenamedScheduledFlow"

        @step(wait=timedelta(hours=1))
        def a(self):
            RAN.append("a")

        @step
        def b(self):
            RAN.append("b")

    wf = V1.create(hero=make_order(geneva_session))
    workflow_id = wf.id

    class V2(Workflow):
        workflow_name = "RenamedScheduledFlow"
        a = renamed_step(to="first")

        @step(wait=timedelta(hours=1))
        def first(self):
            RAN.append("first")

        @step
        def b(self):
            RAN.append("b")

    wf = _reload(geneva_session, workflow_id)
    assert wf.why_waiting().startswith("`a` scheduled in")
    perform_next_step(wf)
    perform_next_step(wf)
    assert RAN == ["first", "b"]
    assert _history(geneva_session, workflow_id) == [("a", "completed"), ("b", "completed")]
    # resume_at accepts the old name and schedules under the new one.
    assert V2.steps.named("a").name == "first"
    assert "a" in V2.steps and V2.steps.index("a") == 0


def test_a_resumable_chain_started_before_the_rename_continues_under_the_new_name(
    geneva_session,
):
    """Scheduling never uses the old name again, not even for the next link of a
    cursor chain whose first links ran under the old name."""

    class V1(Workflow):
        workflow_name = "RenamedChainFlow"

        @resumable_step(max_iterations=2)
        def walk(self, it):
            it.iterate_over(list(range(5)), RAN.append)

    wf = V1.create(hero=make_order(geneva_session))
    workflow_id = wf.id
    perform_next_step(wf)  # links 1 (walk, cursor 2) and its successor, scheduled as `walk`

    class V2(Workflow):
        workflow_name = "RenamedChainFlow"
        walk = renamed_step(to="walk_items")

        @resumable_step(max_iterations=2)
        def walk_items(self, it):
            it.iterate_over(list(range(5)), RAN.append)

    wf = _reload(geneva_session, workflow_id)
    perform_next_step(wf)
    wf = _reload(geneva_session, workflow_id)
    perform_next_step(wf)
    wf = _reload(geneva_session, workflow_id)
    assert RAN == [0, 1, 2, 3, 4]
    assert wf.state == "finished"
    # The link scheduled before the deploy keeps its name; every later link has the new one.
    assert _history(geneva_session, workflow_id) == [
        ("walk", "completed"),
        ("walk", "completed"),
        ("walk_items", "completed"),
    ]
    assert V2.renamed_steps_in_flight(geneva_session) == {"walk": 0}


def test_a_subclass_inherits_renames(geneva_session):
    class Base1(Workflow):
        workflow_name = "RenameBase"
        old = renamed_step(to="new")

        @step
        def new(self):
            pass

    class Child(Base1):
        workflow_name = "RenameChild"

    assert Child.steps.renamed == {"old": "new"}
    assert Child.steps.named("old").name == "new"


def _define(body):
    return type("BadRenameFlow", (Workflow,), {"workflow_name": "BadRenameFlow", **body})


def _body(**extra):
    return {"kept": step(lambda self: None), **extra}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            _body(old=renamed_step(to="missing")),
            "defines no step 'missing'. The steps it defines are kept",
        ),
        (_body(old=renamed_step(to="old")), "renames a step to itself"),
        (
            _body(kept2=renamed_step(to="kept"), **{"x": renamed_step(to="kept2")}),
            "itself the old name",
        ),
        (
            {
                "kept": step(lambda self: None),
                "gone": removed_step(),
                "old": renamed_step(to="gone"),
            },
            "'gone' is a removed_step",
        ),
        (
            {
                "kept": step(lambda self: None),
                "second": step(lambda self: None),
                "other": renamed_step(to="second", name="kept"),
            },
            "'kept' is also a step",
        ),
        (
            {
                "kept": step(lambda self: None),
                "gone": removed_step(),
                "g": renamed_step(to="kept", name="gone"),
            },
            "'gone' is also a removed_step",
        ),
    ],
)
def test_renamed_step_is_validated_when_the_class_is_defined(body, message):
    with pytest.raises(StepConfigurationError, match=message):
        _define(body)


@pytest.mark.parametrize("to", ["", "  ", None, 3])
def test_renamed_step_needs_the_new_name(to):
    with pytest.raises(StepConfigurationError, match="needs the new step's name"):
        renamed_step(to=to)


def test_a_step_added_later_may_not_take_an_old_name():
    class Renamed(Workflow):
        workflow_name = "RenameAddStep"
        old = renamed_step(to="new")

        @step
        def new(self):
            pass

    with pytest.raises(StepConfigurationError, match="old name of a renamed step"):
        Renamed.add_step("old", lambda self: None)
