"""Creating and finding workflows (docs/MANUAL.md, "Creating, finding and counting"):
polymorphic heroes, uniqueness, first-step scheduling, gravestone-only classes, query helpers,
and rows whose class no longer exists."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from sqlalchemy import select

from geneva_drive import Workflow, removed_step, step
from geneva_drive.errors import DuplicateWorkflowError, StepNotDefinedError
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.testing import perform_next_step, speedrun_workflow
from geneva_drive.workflow import unregister, workflow_class
from tests.conftest import Account, Order
from tests.engine.helpers import (
    assert_close,
    assert_recent,
    executions,
    make_account,
    make_order,
    other_session,
    summary,
)


class CreateOrderWorkflow(Workflow):
    @step
    def first(self):
        pass

    @step(wait=timedelta(hours=2))
    def second(self):
        pass


class CreateOtherWorkflow(Workflow):
    @step
    def first(self):
        pass


class CreateWaitFirstWorkflow(Workflow):
    @step(wait=timedelta(days=3))
    def later(self):
        pass


# --- heroes ----------------------------------------------------------------------------------


def test_integer_hero_is_stored_polymorphically_and_loads_back(geneva_session):
    order = make_order(geneva_session)
    wf = CreateOrderWorkflow.create(hero=order)
    geneva_session.commit()
    assert (wf.hero_type, wf.hero_id) == ("Order", str(order.id))
    with other_session() as session:
        loaded = session.get(Workflow, wf.id)
        assert type(loaded) is CreateOrderWorkflow
        assert isinstance(loaded.hero, Order) and loaded.hero.id == order.id


def test_uuid_hero_is_stored_polymorphically_and_loads_back(geneva_session):
    account = make_account(geneva_session)
    wf = CreateOrderWorkflow.create(hero=account)
    geneva_session.commit()
    assert (wf.hero_type, wf.hero_id) == ("Account", str(account.id))
    with other_session() as session:
        loaded = session.get(Workflow, wf.id)
        assert isinstance(loaded.hero, Account)
        assert loaded.hero.id == account.id and isinstance(loaded.hero.id, uuid.UUID)


def test_transient_hero_is_added_and_flushed(geneva_session):
    order = Order()
    wf = CreateOrderWorkflow.create(hero=order, session=geneva_session)
    assert order.id is not None
    assert wf.hero_id == str(order.id)


def test_deleted_hero_loads_as_none(geneva_session):
    order = make_order(geneva_session)
    wf = CreateOrderWorkflow.create(hero=order)
    geneva_session.commit()
    with other_session() as session:
        session.delete(session.get(Order, order.id))
        session.commit()
    with other_session() as session:
        assert session.get(Workflow, wf.id).hero is None


def test_hero_must_be_mapped_with_a_single_column_key(geneva_session):
    with pytest.raises(TypeError, match="SQLAlchemy-mapped"):
        CreateOrderWorkflow.create(hero="not a model", session=geneva_session)


def test_create_needs_a_registered_subclass(geneva_session):
    with pytest.raises(TypeError, match="registered Workflow subclass"):
        Workflow.create(hero=make_order(geneva_session))


# --- first-step scheduling --------------------------------------------------------------------


def test_create_schedules_the_first_step_now(geneva_session):
    wf = CreateOrderWorkflow.create(hero=make_order(geneva_session))
    assert wf.state == "ready" and wf.id is not None
    assert wf.next_step_name == "first" and wf.current_step_name is None
    assert wf.transitioned_at is None and wf.allow_multiple is False
    [execution] = executions(geneva_session, wf)
    assert (execution.step_name, execution.state, execution.outcome) == ("first", "scheduled", None)
    assert_recent(execution.scheduled_for)
    assert execution.started_at is None


def test_first_step_wait_delays_scheduled_for(geneva_session):
    wf = CreateWaitFirstWorkflow.create(hero=make_order(geneva_session))
    [execution] = executions(geneva_session, wf)
    assert_close(execution.scheduled_for, utcnow() + timedelta(days=3))
    assert execution.is_overdue is False


def test_step_wait_applies_when_the_step_is_scheduled(geneva_session):
    wf = CreateOrderWorkflow.create(hero=make_order(geneva_session))
    perform_next_step(wf)
    second = executions(geneva_session, wf)[-1]
    assert second.step_name == "second"
    assert_close(second.scheduled_for, utcnow() + timedelta(hours=2))


def test_create_is_flushed_not_committed(geneva_session):
    wf = CreateOrderWorkflow.create(hero=make_order(geneva_session))
    with other_session() as session:
        assert session.get(Workflow, wf.id) is None
    geneva_session.rollback()
    with other_session() as session:
        assert session.scalars(select(StepExecution)).all() == []


def test_leading_gravestones_are_skipped_at_create(geneva_session):
    class CreateLeadingGraveWorkflow(Workflow):
        gone = removed_step()

        @step
        def real(self):
            pass

    wf = CreateLeadingGraveWorkflow.create(hero=make_order(geneva_session))
    assert wf.next_step_name == "real"
    assert summary(geneva_session, wf) == [("real", "scheduled", None)]


def test_class_of_only_gravestones_finishes_on_create(geneva_session):
    class CreateOnlyGravesWorkflow(Workflow):
        a = removed_step()
        b = removed_step()

    wf = CreateOnlyGravesWorkflow.create(hero=make_order(geneva_session))
    assert wf.state == "finished"
    assert (wf.current_step_name, wf.next_step_name) == (None, None)
    assert_recent(wf.transitioned_at)
    assert executions(geneva_session, wf) == []


def test_class_without_steps_finishes_on_create(geneva_session):
    class CreateEmptyWorkflow(Workflow):
        pass

    wf = CreateEmptyWorkflow.create(hero=make_order(geneva_session))
    assert wf.state == "finished"
    assert executions(geneva_session, wf) == []


def test_create_stores_per_instance_step_job_options(geneva_session):
    wf = CreateOrderWorkflow.create(
        hero=make_order(geneva_session), step_job_options={"queue": "slow", "priority": 2}
    )
    geneva_session.commit()
    assert wf.metadata_ == {"step_job_options": {"queue": "slow", "priority": 2}}
    assert wf.step_job_options == {"queue": "slow", "priority": 2}


# --- uniqueness ------------------------------------------------------------------------------


def test_second_ongoing_workflow_for_the_same_hero_is_refused(geneva_session):
    order = make_order(geneva_session)
    first = CreateOrderWorkflow.create(hero=order)
    with pytest.raises(DuplicateWorkflowError) as info:
        CreateOrderWorkflow.create(hero=order)
    message = str(info.value)
    assert f"An ongoing CreateOrderWorkflow already exists for Order #{order.id}" in message
    assert f"(workflow #{first.id})" in message
    assert "allow_multiple=True" in message
    geneva_session.commit()
    assert len(CreateOrderWorkflow.for_hero(geneva_session, order)) == 1


def test_the_same_hero_with_an_equal_id_of_another_type_does_not_collide(geneva_session):
    order = make_order(geneva_session)
    CreateOrderWorkflow.create(hero=order)
    CreateOtherWorkflow.create(hero=order)  # another class: no collision
    account = make_account(geneva_session)
    CreateOrderWorkflow.create(hero=account)  # another hero type: no collision


def test_paused_workflow_keeps_its_uniqueness_slot(geneva_session):
    order = make_order(geneva_session)
    wf = CreateOrderWorkflow.create(hero=order)
    wf.pause()
    with pytest.raises(DuplicateWorkflowError):
        CreateOrderWorkflow.create(hero=order)


@pytest.mark.parametrize("end", ["finish", "cancel"])
def test_finished_or_canceled_workflow_frees_the_slot(geneva_session, end):
    order = make_order(geneva_session)
    wf = CreateOrderWorkflow.create(hero=order)
    if end == "finish":
        speedrun_workflow(wf)
        assert wf.state == "finished"
    else:
        wf.cancel()
    again = CreateOrderWorkflow.create(hero=order)
    geneva_session.commit()
    assert again.id != wf.id


def test_allow_multiple_permits_several_ongoing(geneva_session):
    order = make_order(geneva_session)
    a = CreateOrderWorkflow.create(hero=order, allow_multiple=True)
    b = CreateOrderWorkflow.create(hero=order, allow_multiple=True)
    # a regular one may still be created next to allow_multiple ones, but only one
    c = CreateOrderWorkflow.create(hero=order)
    with pytest.raises(DuplicateWorkflowError):
        CreateOrderWorkflow.create(hero=order)
    geneva_session.commit()
    assert {a.allow_multiple, b.allow_multiple, c.allow_multiple} == {True, False}
    assert len(CreateOrderWorkflow.for_hero(geneva_session, order)) == 3


def test_unique_index_is_the_final_arbiter(geneva_session):
    """Bypassing the validation (another process raced us) still hits the partial index."""
    order = make_order(geneva_session)
    CreateOrderWorkflow.create(hero=order)
    geneva_session.commit()
    from sqlalchemy.exc import IntegrityError

    with other_session() as session:
        session.add(
            CreateOrderWorkflow(
                state="paused", hero_type="Order", hero_id=str(order.id), allow_multiple=False
            )
        )
        with pytest.raises(IntegrityError):
            session.flush()


def test_duplicate_from_the_index_becomes_duplicate_workflow_error(geneva_session, monkeypatch):
    """When the validation query misses (a race), the index violation is translated."""
    order = make_order(geneva_session)
    CreateOrderWorkflow.create(hero=order)
    geneva_session.commit()

    from sqlalchemy.orm import Session

    real_scalars = Session.scalars

    def blind_scalars(self, statement, *args, **kwargs):
        result = real_scalars(self, statement, *args, **kwargs)
        if "geneva_drive_workflows.allow_multiple IS false" in str(statement) or (
            "allow_multiple IS 0" in str(statement)
        ):
            return real_scalars(self, select(Workflow.id).where(Workflow.id == -1))
        return result

    monkeypatch.setattr(Session, "scalars", blind_scalars)
    with pytest.raises(DuplicateWorkflowError, match="already exists for Order") as info:
        CreateOrderWorkflow.create(hero=order)
    monkeypatch.undo()
    # raised by the index (no existing id known), not by the validation query
    assert "(workflow #" not in str(info.value)
    assert info.value.__cause__ is not None
    # the outer transaction survives (only the savepoint rolled back)
    CreateOtherWorkflow.create(hero=order)
    geneva_session.commit()


def test_hero_less_workflows_are_unique_per_class(geneva_session):
    class CreateNoHeroWorkflow(Workflow):
        may_proceed_without_hero = True

        @step
        def only(self):
            pass

    CreateNoHeroWorkflow.create(session=geneva_session)
    # the model-level validation compares NULL = NULL (the gem's quirk), so a second one is refused
    with pytest.raises(DuplicateWorkflowError, match="for no hero"):
        CreateNoHeroWorkflow.create(session=geneva_session)
    CreateNoHeroWorkflow.create(session=geneva_session, allow_multiple=True)


def test_workflow_without_hero_is_canceled_at_its_first_step(geneva_session):
    calls = []

    class CreateHeroRequiredWorkflow(Workflow):
        @step
        def only(self):
            calls.append("ran")

    wf = CreateHeroRequiredWorkflow.create(session=geneva_session)
    assert wf.state == "ready"
    perform_next_step(wf)
    assert wf.state == "canceled"
    assert summary(geneva_session, wf) == [("only", "canceled", "canceled")]
    assert calls == []


# --- query helpers -----------------------------------------------------------------------------


def test_query_helpers(geneva_session):
    o1, o2, o3 = (make_order(geneva_session) for _ in range(3))
    a = CreateOrderWorkflow.create(hero=o1)
    b = CreateOrderWorkflow.create(hero=o2)
    c = CreateOrderWorkflow.create(hero=o3)
    other = CreateOtherWorkflow.create(hero=o1)
    b.pause()
    c.cancel()
    geneva_session.commit()

    assert {w.id for w in CreateOrderWorkflow.ongoing(geneva_session)} == {a.id, b.id}
    assert [w.id for w in CreateOrderWorkflow.paused(geneva_session)] == [b.id]
    assert [w.id for w in CreateOrderWorkflow.in_state(geneva_session, "canceled")] == [c.id]
    assert [w.id for w in CreateOrderWorkflow.for_hero(geneva_session, o1)] == [a.id]
    assert {w.id for w in Workflow.for_hero(geneva_session, o1)} == {a.id, other.id}
    assert {w.id for w in Workflow.ongoing(geneva_session)} == {a.id, b.id, other.id}
    assert {type(w) for w in Workflow.ongoing(geneva_session)} == {
        CreateOrderWorkflow,
        CreateOtherWorkflow,
    }
    assert geneva_session.scalars(CreateOtherWorkflow.query()).all() == [other]


# --- a stored type whose class is gone -------------------------------------------------------


def test_deleted_class_loads_as_plain_workflow(geneva_session):
    class CreateDoomedWorkflow(Workflow):
        @step
        def first(self):
            pass

    order = make_order(geneva_session)
    wf = CreateDoomedWorkflow.create(hero=order)
    doomed = CreateDoomedWorkflow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    unregister("CreateDoomedWorkflow")
    assert workflow_class("CreateDoomedWorkflow") is None
    try:
        with other_session() as session:
            loaded = session.get(Workflow, wf.id)
            assert type(loaded) is Workflow
            assert loaded.type == "CreateDoomedWorkflow"
            assert loaded.hero.id == order.id
            listed = session.scalars(select(Workflow).order_by(Workflow.id)).all()
            assert [type(w) for w in listed] == [Workflow, Workflow]

            # it can be paused and canceled by an operator
            loaded.pause()
            assert loaded.state == "paused"
            loaded.cancel()
            assert loaded.state == "canceled"
            session.commit()

        # executing its scheduled step pauses it with StepNotDefinedError (it has no steps)
        with other_session() as session:
            stranded = session.get(Workflow, doomed.id)
            with pytest.raises(
                StepNotDefinedError, match="Step 'first' is not defined in Workflow"
            ):
                perform_next_step(stranded)
            assert stranded.state == "paused"
            assert summary(session, stranded) == [("first", "failed", "failed")]
    finally:
        unregister("CreateDoomedWorkflow")


def test_create_without_any_session_explains(geneva_session):
    from geneva_drive import db

    db.set_current_session(None)
    try:
        with pytest.raises(RuntimeError, match=r"Workflow\.create\(\) needs a session"):
            CreateOrderWorkflow.create(hero=Order())
    finally:
        db.set_current_session(geneva_session)


def test_create_uses_the_heros_session(geneva_session):
    from geneva_drive import db

    order = make_order(geneva_session)
    db.set_current_session(None)
    try:
        wf = CreateOrderWorkflow.create(hero=order)
    finally:
        db.set_current_session(geneva_session)
    assert wf in geneva_session


def test_deleted_class_can_be_resumed_at_a_step_of_a_class_that_exists(geneva_session):
    """An orphaned workflow (its class is gone) is moved onto an existing class."""
    calls = []

    class CreateRenamedOld(Workflow):
        @step
        def first(self):
            raise RuntimeError("old code")

    class CreateRenamedNew(Workflow):
        @step
        def start(self):
            calls.append("start")

        @step
        def finish_up(self):
            calls.append("finish_up")

    order = make_order(geneva_session)
    wf = CreateRenamedOld.create(hero=order)
    with pytest.raises(RuntimeError):
        perform_next_step(wf)
    wf_id = wf.id
    unregister("CreateRenamedOld")
    try:
        with other_session() as session:
            orphan = session.get(Workflow, wf_id)
            assert type(orphan) is Workflow and orphan.state == "paused"
            with pytest.raises(StepNotDefinedError) as info:
                orphan.resume_at("finish_up")
            assert "The steps it can be resumed at are (none)" in str(info.value)
            assert "pass workflow_class=" in str(info.value)
            with pytest.raises(StepNotDefinedError, match="not defined in CreateRenamedNew"):
                orphan.resume_at("nope", workflow_class=CreateRenamedNew)
            with pytest.raises(ValueError, match="not a registered workflow class"):
                orphan.resume_at("finish_up", workflow_class="NoSuchWorkflow")
            ex = orphan.resume_at("finish_up", workflow_class="CreateRenamedNew")
            assert (ex.step_name, ex.state) == ("finish_up", "scheduled")
            assert orphan.type == "CreateRenamedNew" and orphan.state == "ready"
            session.commit()
        with other_session() as session:
            moved = session.get(Workflow, wf_id)
            assert type(moved) is CreateRenamedNew
            speedrun_workflow(moved)
            assert moved.state == "finished"
        assert calls == ["finish_up"]
    finally:
        unregister("CreateRenamedOld")


def test_moving_to_another_class_is_only_for_orphans_and_respects_uniqueness(geneva_session):
    from geneva_drive.errors import InvalidStateError

    class CreateMoveA(Workflow):
        @step
        def a(self):
            pass

    class CreateMoveB(Workflow):
        @step
        def b(self):
            pass

    class CreateMoveGone(Workflow):
        @step
        def g(self):
            pass

    order = make_order(geneva_session)
    live = CreateMoveA.create(hero=order)
    live.pause()
    with pytest.raises(InvalidStateError, match="only a workflow whose class no longer exists"):
        live.resume_at("b", workflow_class=CreateMoveB)
    CreateMoveB.create(hero=order)
    orphan = CreateMoveGone.create(hero=order)
    orphan.pause()
    geneva_session.commit()
    orphan_id = orphan.id
    unregister("CreateMoveGone")
    try:
        with other_session() as session:
            loaded = session.get(Workflow, orphan_id)
            with pytest.raises(DuplicateWorkflowError, match="an ongoing CreateMoveB"):
                loaded.resume_at("b", workflow_class=CreateMoveB)
            assert loaded.type == "CreateMoveGone"
    finally:
        unregister("CreateMoveGone")


def test_sqlite_never_reuses_the_id_of_a_deleted_workflow(geneva_session):
    """The audit log outlives workflows (no foreign key), so an id must never come back."""
    from sqlalchemy import delete

    from geneva_drive.workflow import Workflow as Base_

    if geneva_session.get_bind().dialect.name != "sqlite":
        pytest.skip("server databases never reuse ids (identities; InnoDB AUTO_INCREMENT persists)")

    class IdReuseFlow(Workflow):
        may_proceed_without_hero = True

        @step
        def only(self):
            pass

    first = IdReuseFlow.create(session=geneva_session)
    geneva_session.commit()
    first_id = first.id
    geneva_session.execute(delete(Base_).where(Base_.id == first_id))
    geneva_session.commit()
    second = IdReuseFlow.create(session=geneva_session)
    geneva_session.commit()
    assert second.id > first_id
