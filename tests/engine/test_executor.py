"""The executor (docs/MANUAL.md, "How a step runs"): prepare checks in their exact order, the body
and its hooks, finalize and its guards, and errors re-raised only after the commit."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update

from geneva_drive import ExceptionPolicy, Workflow, removed_step, step
from geneva_drive.errors import StepNotDefinedError
from geneva_drive.executor import execute
from geneva_drive.flow_control import FlowInterrupt
from geneva_drive.models import StepExecution
from geneva_drive.testing import perform_next_step, speedrun_workflow
from geneva_drive.workflow import Workflow as BaseWorkflow
from tests.engine.helpers import (
    assert_recent,
    executions,
    make_order,
    other_session,
    summary,
)


class Boom(Exception):
    pass


def _force(session, workflow, **values):
    """Force workflow columns (like the gem's transition_to!) and commit."""
    session.execute(update(BaseWorkflow).where(BaseWorkflow.id == workflow.id).values(**values))
    session.commit()
    session.expire_all()


def _run_current(session, workflow):
    """Execute the current execution by id, the way a worker would (own session)."""
    session.commit()
    ex = workflow.current_execution
    execute(ex.id)
    session.expire_all()
    return ex.id


class ExecTwoStepWorkflow(Workflow):
    calls: list = []

    @step
    def first(self):
        ExecTwoStepWorkflow.calls.append("first")

    @step
    def second(self):
        ExecTwoStepWorkflow.calls.append("second")


@pytest.fixture(autouse=True)
def _reset_calls():
    ExecTwoStepWorkflow.calls = []


# --- prepare -----------------------------------------------------------------------------------


def test_a_completed_execution_is_not_run_again(geneva_session):
    wf = ExecTwoStepWorkflow.create(hero=make_order(geneva_session))
    first_id = wf.current_execution.id
    perform_next_step(wf)
    before = summary(geneva_session, wf)
    execute(first_id)  # a duplicate job
    assert ExecTwoStepWorkflow.calls == ["first"]
    assert summary(geneva_session, wf) == before


def test_a_missing_execution_is_a_no_op(geneva_session):
    execute(987654)


def test_paused_workflow_cancels_its_due_execution_but_stays_paused(geneva_session):
    wf = ExecTwoStepWorkflow.create(hero=make_order(geneva_session))
    wf.pause()
    paused_at = wf.transitioned_at
    _run_current(geneva_session, wf)
    [ex] = executions(geneva_session, wf)
    assert (ex.state, ex.outcome) == ("canceled", "canceled")
    assert_recent(ex.canceled_at)
    assert_recent(ex.finished_at)
    geneva_session.refresh(wf)
    assert wf.state == "paused" and wf.transitioned_at == paused_at
    assert ExecTwoStepWorkflow.calls == []


@pytest.mark.parametrize("state", ["finished", "canceled"])
def test_terminal_workflow_cancels_a_leftover_execution(geneva_session, state):
    wf = ExecTwoStepWorkflow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    _force(geneva_session, wf, state=state)
    _run_current(geneva_session, wf)
    assert summary(geneva_session, wf) == [("first", "canceled", "canceled")]
    assert wf.state == state


def test_missing_hero_cancels_step_and_workflow(geneva_session):
    order = make_order(geneva_session)
    wf = ExecTwoStepWorkflow.create(hero=order)
    geneva_session.commit()
    geneva_session.delete(order)
    geneva_session.commit()
    perform_next_step(wf)
    [ex] = executions(geneva_session, wf)
    assert (ex.state, ex.outcome) == ("canceled", "canceled")
    assert_recent(ex.finished_at)
    assert wf.state == "canceled"
    assert_recent(wf.transitioned_at)
    assert ExecTwoStepWorkflow.calls == []


def test_workflow_state_check_comes_before_the_hero_check(geneva_session):
    order = make_order(geneva_session)
    wf = ExecTwoStepWorkflow.create(hero=order)
    wf.pause()
    geneva_session.delete(order)
    geneva_session.commit()
    _run_current(geneva_session, wf)
    assert summary(geneva_session, wf) == [("first", "canceled", "canceled")]
    assert wf.state == "paused"  # not canceled: b) fired before c)


def test_may_proceed_without_hero_runs_the_step(geneva_session):
    calls = []

    class ExecNoHeroWorkflow(Workflow):
        may_proceed_without_hero = True

        @step
        def only(self):
            calls.append(self.hero)

    wf = ExecNoHeroWorkflow.create(session=geneva_session)
    speedrun_workflow(wf)
    assert calls == [None]
    assert wf.state == "finished"


def test_undefined_step_fails_pauses_and_raises_after_commit(geneva_session):
    wf = ExecTwoStepWorkflow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    with other_session() as session:
        session.execute(
            update(StepExecution)
            .where(StepExecution.workflow_id == wf.id)
            .values(step_name="vanished")
        )
        session.commit()
    with pytest.raises(StepNotDefinedError) as info:
        perform_next_step(wf)
    assert str(info.value) == "Step 'vanished' is not defined in ExecTwoStepWorkflow"
    assert (info.value.workflow_id, info.value.workflow_class) == (wf.id, "ExecTwoStepWorkflow")
    assert info.value.step_name == "vanished" and info.value.step_execution_id is not None
    # the state was committed before the raise: a fresh connection sees it
    with other_session() as session:
        [ex] = session.query(StepExecution).filter_by(workflow_id=wf.id).all()
        assert (ex.state, ex.outcome) == ("failed", "failed")
        assert ex.error_message == "Step 'vanished' is not defined in ExecTwoStepWorkflow"
        assert ex.error_class_name == "geneva_drive.errors.StepNotDefinedError"
        assert_recent(ex.failed_at)
        assert session.get(BaseWorkflow, wf.id).state == "paused"


def test_hero_check_comes_before_the_step_definition_check(geneva_session):
    order = make_order(geneva_session)
    wf = ExecTwoStepWorkflow.create(hero=order)
    geneva_session.flush()
    geneva_session.execute(
        update(StepExecution).where(StepExecution.workflow_id == wf.id).values(step_name="vanished")
    )
    geneva_session.delete(order)
    geneva_session.commit()
    perform_next_step(wf)  # no StepNotDefinedError: c) canceled first
    assert wf.state == "canceled"
    assert summary(geneva_session, wf) == [("vanished", "canceled", "canceled")]


def test_execution_of_a_removed_step_is_skipped_and_the_next_scheduled(geneva_session):
    class ExecGraveV1(Workflow):
        workflow_name = "ExecGrave"

        @step
        def authorize(self):
            pass

        @step
        def capture(self):
            pass

        @step
        def receipt(self):
            pass

    wf = ExecGraveV1.create(hero=make_order(geneva_session))
    perform_next_step(wf)  # authorize done; capture scheduled by "old code"
    geneva_session.commit()
    calls = []

    class ExecGraveV2(Workflow):
        workflow_name = "ExecGrave"

        @step
        def authorize(self):
            pass

        capture = removed_step()

        @step
        def receipt(self):
            calls.append("receipt")

    geneva_session.expunge_all()
    wf = geneva_session.get(BaseWorkflow, wf.id)
    assert type(wf) is ExecGraveV2
    perform_next_step(wf)
    assert summary(geneva_session, wf) == [
        ("authorize", "completed", "success"),
        ("capture", "skipped", "skipped"),
        ("receipt", "scheduled", None),
    ]
    assert wf.state == "ready" and wf.next_step_name == "receipt"
    speedrun_workflow(wf)
    assert calls == ["receipt"] and wf.state == "finished"


def test_removed_last_step_in_flight_finishes_the_workflow(geneva_session):
    class ExecTailV1(Workflow):
        workflow_name = "ExecTail"

        @step
        def a(self):
            pass

        @step
        def b(self):
            pass

    wf = ExecTailV1.create(hero=make_order(geneva_session))
    perform_next_step(wf)
    geneva_session.commit()

    class ExecTailV2(Workflow):
        workflow_name = "ExecTail"

        @step
        def a(self):
            pass

        b = removed_step()

    geneva_session.expunge_all()
    wf = geneva_session.get(BaseWorkflow, wf.id)
    perform_next_step(wf)
    assert wf.state == "finished"
    assert summary(geneva_session, wf)[-1] == ("b", "skipped", "skipped")


# --- preconditions ------------------------------------------------------------------------------


@pytest.mark.parametrize("condition", ["is_voided", lambda wf: wf.hero.status == "voided", True])
def test_cancel_if_cancels_step_and_workflow(geneva_session, condition):
    class ExecCancelIfWorkflow(Workflow):
        cancel_if = (condition,)

        @step
        def only(self):
            raise AssertionError("must not run")

        def is_voided(self):
            return self.hero.status == "voided"

    wf = ExecCancelIfWorkflow.create(hero=make_order(geneva_session, status="voided"))
    perform_next_step(wf)
    assert summary(geneva_session, wf) == [("only", "canceled", "canceled")]
    assert wf.state == "canceled"
    assert_recent(wf.transitioned_at)


def test_false_cancel_if_lets_the_step_run(geneva_session):
    class ExecCancelIfFalse(Workflow):
        cancel_if = ("is_voided", False, lambda wf: None)

        @step
        def only(self):
            pass

        def is_voided(self):
            return False

    wf = ExecCancelIfFalse.create(hero=make_order(geneva_session))
    speedrun_workflow(wf)
    assert wf.state == "finished"


@pytest.mark.parametrize("condition", ["already_done", lambda wf: True, True])
def test_skip_if_skips_and_schedules_the_next_step(geneva_session, condition):
    calls = []

    class ExecSkipIfWorkflow(Workflow):
        @step(skip_if=condition)
        def maybe(self):
            calls.append("maybe")

        @step
        def after(self):
            calls.append("after")

        def already_done(self):
            return True

    wf = ExecSkipIfWorkflow.create(hero=make_order(geneva_session))
    perform_next_step(wf)
    assert summary(geneva_session, wf) == [
        ("maybe", "skipped", "skipped"),
        ("after", "scheduled", None),
    ]
    [skipped, _] = executions(geneva_session, wf)
    assert_recent(skipped.skipped_at)
    assert_recent(skipped.finished_at)
    assert skipped.started_at is None
    speedrun_workflow(wf)
    assert calls == ["after"]


def test_skip_if_on_the_last_step_finishes(geneva_session):
    class ExecSkipLast(Workflow):
        @step(skip_if=True)
        def only(self):
            pass

    wf = ExecSkipLast.create(hero=make_order(geneva_session))
    perform_next_step(wf)
    assert wf.state == "finished" and wf.next_step_name is None


def test_cancel_if_is_evaluated_before_skip_if(geneva_session):
    class ExecCancelBeatsSkip(Workflow):
        cancel_if = (True,)

        @step(skip_if=True)
        def only(self):
            pass

    wf = ExecCancelBeatsSkip.create(hero=make_order(geneva_session))
    perform_next_step(wf)
    assert wf.state == "canceled"
    assert summary(geneva_session, wf) == [("only", "canceled", "canceled")]


def test_precondition_exception_goes_through_the_policy_and_is_raised(geneva_session):
    class ExecBrokenCondition(Workflow):
        @step(skip_if="explode")
        def only(self):
            pass

        def explode(self):
            raise Boom("condition broke")

    wf = ExecBrokenCondition.create(hero=make_order(geneva_session))
    with pytest.raises(Boom, match="condition broke"):
        perform_next_step(wf)
    [ex] = executions(geneva_session, wf)
    assert (ex.state, ex.outcome) == ("failed", "failed")  # default policy: pause
    assert ex.error_class_name.endswith("Boom") and ex.error_message == "condition broke"
    assert ex.started_at is None
    assert wf.state == "paused"


def test_precondition_exception_with_reattempt_records_reason_precondition(geneva_session):
    class ExecConditionReattempt(Workflow):
        cancel_if = ("explode",)

        @step(on_exception="reattempt", max_reattempts=2)
        def only(self):
            pass

        def explode(self):
            raise Boom("flaky condition")

    wf = ExecConditionReattempt.create(hero=make_order(geneva_session))
    for _ in range(3):
        with pytest.raises(Boom):
            perform_next_step(wf)
    rows = executions(geneva_session, wf)
    assert [(e.state, e.outcome) for e in rows] == [
        ("completed", "reattempted"),
        ("completed", "reattempted"),
        ("failed", "failed"),
    ]
    assert rows[0].metadata_["reattempt_reason"] == "precondition"
    assert rows[0].metadata_["exception"]["message"] == "flaky condition"
    assert wf.state == "paused"  # the third failure hits max_reattempts=2


# --- other prepare exceptions (k) ----------------------------------------------------------------


def test_prepare_exception_fails_the_step_and_pauses(geneva_session):
    wf = ExecTwoStepWorkflow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    _force(geneva_session, wf, hero_type="NoSuchHeroModel")
    with pytest.raises(LookupError, match="NoSuchHeroModel"):
        perform_next_step(wf)
    [ex] = executions(geneva_session, wf)
    assert (ex.state, ex.outcome) == ("failed", "failed")
    assert ex.error_class_name == "LookupError"
    assert ex.metadata_["exception"]["class"] == "LookupError"
    assert wf.state == "paused"


def test_prepare_exception_reattempt_moves_only_the_workflow_and_is_not_counted(geneva_session):
    class ExecPrepareReattempt(Workflow):
        @step(on_exception="reattempt", max_reattempts=1)
        def only(self):
            pass

    wf = ExecPrepareReattempt.create(hero=make_order(geneva_session))
    geneva_session.commit()
    _force(geneva_session, wf, hero_type="NoSuchHeroModel")
    for _ in range(3):
        with pytest.raises(LookupError):
            perform_next_step(wf)
    # always failed/failed, never "reattempted", so max_reattempts=1 never trips
    assert summary(geneva_session, wf) == [
        ("only", "failed", "failed"),
        ("only", "failed", "failed"),
        ("only", "failed", "failed"),
        ("only", "scheduled", None),
    ]
    assert wf.state == "ready"


def test_prepare_exception_cancel_and_skip_policies(geneva_session):
    class ExecPrepareCancel(Workflow):
        @step(on_exception="cancel")
        def only(self):
            pass

    class ExecPrepareSkip(Workflow):
        @step(on_exception="skip")
        def first(self):
            pass

        @step
        def second(self):
            pass

    a = ExecPrepareCancel.create(hero=make_order(geneva_session))
    b = ExecPrepareSkip.create(hero=make_order(geneva_session))
    geneva_session.commit()
    _force(geneva_session, a, hero_type="NoSuchHeroModel")
    _force(geneva_session, b, hero_type="NoSuchHeroModel")
    with pytest.raises(LookupError):
        perform_next_step(a)
    with pytest.raises(LookupError):
        perform_next_step(b)
    assert a.state == "canceled"
    assert summary(geneva_session, a) == [("only", "failed", "failed")]
    assert b.state == "ready"
    assert summary(geneva_session, b) == [
        ("first", "failed", "failed"),
        ("second", "scheduled", None),
    ]


# --- start and body ------------------------------------------------------------------------------


def test_start_marks_in_progress_performing_and_current_step(geneva_session):
    seen = {}

    class ExecStartWorkflow(Workflow):
        @step
        def only(self):
            # prepare has committed: another connection sees the started state
            with other_session() as session:
                row = session.get(StepExecution, self.current_execution.id)
                seen["db"] = (row.state, row.started_at is not None)
                seen["wf_db"] = session.get(BaseWorkflow, self.id).state
            seen["self"] = (self.state, self.current_step_name, self.next_step_name)

    wf = ExecStartWorkflow.create(hero=make_order(geneva_session))
    perform_next_step(wf)
    assert seen == {
        "db": ("in_progress", True),
        "wf_db": "performing",
        "self": ("performing", "only", "only"),
    }
    [ex] = executions(geneva_session, wf)
    assert (ex.state, ex.outcome) == ("completed", "success")
    assert ex.started_at <= ex.completed_at and ex.finished_at == ex.completed_at
    assert wf.current_step_name is None


def test_hooks_run_in_order_around_the_body(geneva_session):
    calls = []

    class ExecHooksWorkflow(Workflow):
        def before_step_execution(self, execution):
            calls.append(("before", execution.step_name))

        def around_step_execution(self, execution, call):
            calls.append("around-in")
            result = call()
            calls.append("around-out")
            return result

        def after_step_execution(self, execution):
            calls.append(("after", execution.step_name))

        @step
        def ok(self):
            calls.append("body")

        @step
        def bad(self):
            calls.append("body-bad")
            raise Boom("x")

    wf = ExecHooksWorkflow.create(hero=make_order(geneva_session))
    perform_next_step(wf)
    with pytest.raises(Boom):
        perform_next_step(wf)
    assert calls == [
        ("before", "ok"),
        "around-in",
        "body",
        "around-out",
        ("after", "ok"),
        ("before", "bad"),
        "around-in",
        "body-bad",
        "around-out",
        ("after", "bad"),  # after_step_execution runs whatever the outcome
    ]


def test_body_exception_is_reraised_after_the_outcome_is_committed(geneva_session):
    class ExecRaiseWorkflow(Workflow):
        @step
        def only(self):
            raise Boom("kaput")

    wf = ExecRaiseWorkflow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    ex_id = wf.current_execution.id
    with pytest.raises(Boom, match="kaput"):
        execute(ex_id)
    with other_session() as session:
        ex = session.get(StepExecution, ex_id)
        assert (ex.state, ex.outcome) == ("failed", "failed")
        assert session.get(BaseWorkflow, wf.id).state == "paused"


@pytest.mark.parametrize("action", ["reattempt", "skip", "cancel"])
def test_exception_is_reraised_whatever_the_policy_did(geneva_session, action):
    class ExecPolicyRaise(Workflow):
        @step(on_exception=action)
        def only(self):
            raise Boom(action)

    wf = ExecPolicyRaise.create(hero=make_order(geneva_session))
    with pytest.raises(Boom):
        perform_next_step(wf)
    expected_state = {"reattempt": "ready", "skip": "finished", "cancel": "canceled"}[action]
    assert wf.state == expected_state


def test_flow_control_is_not_swallowed_by_except_exception(geneva_session):
    trace = []

    class ExecSwallowWorkflow(Workflow):
        @step
        def only(self):
            try:
                self.cancel()
            except Exception:  # user code that "handles everything"
                trace.append("swallowed")
            finally:
                trace.append("finally")
            trace.append("after")

        @step
        def never(self):
            trace.append("never")

    assert issubclass(FlowInterrupt, BaseException)
    assert not issubclass(FlowInterrupt, Exception)
    wf = ExecSwallowWorkflow.create(hero=make_order(geneva_session))
    speedrun_workflow(wf)
    assert trace == ["finally"]
    assert wf.state == "canceled"
    assert summary(geneva_session, wf) == [("only", "canceled", "canceled")]


def test_exception_in_before_hook_escapes_and_leaves_the_step_in_progress(geneva_session):
    class ExecBrokenHook(Workflow):
        def before_step_execution(self, execution):
            raise Boom("hook")

        @step
        def only(self):
            pass

    wf = ExecBrokenHook.create(hero=make_order(geneva_session))
    with pytest.raises(Boom, match="hook"):
        perform_next_step(wf)
    assert summary(geneva_session, wf) == [("only", "in_progress", None)]
    assert wf.state == "performing"  # housekeeping recovers it


# --- finalize guards -----------------------------------------------------------------------------


def test_finalize_leaves_an_execution_changed_meanwhile_alone(geneva_session):
    class ExecChangedExecution(Workflow):
        @step
        def only(self):
            with other_session() as session:
                session.execute(
                    update(StepExecution)
                    .where(StepExecution.workflow_id == self.id)
                    .values(state="canceled", outcome="canceled")
                )
                session.commit()
            raise Boom("swallowed by the guard")

    wf = ExecChangedExecution.create(hero=make_order(geneva_session))
    perform_next_step(wf)  # the captured exception is not re-raised
    assert summary(geneva_session, wf) == [("only", "canceled", "canceled")]
    assert wf.state == "performing"
    assert wf.current_step_name == "only"  # not cleared by a guard


def test_finalize_cancels_the_step_when_the_workflow_was_paused_meanwhile(geneva_session):
    """Our deliberate difference: an operator may pause a performing workflow. An ordinary
    step's result is discarded (canceled) and the step runs again on resume()."""
    runs = []

    class ExecPausedMeanwhile(Workflow):
        @step
        def only(self):
            runs.append(len(runs))
            if len(runs) == 1:
                with other_session() as session:
                    other = session.get(BaseWorkflow, self.id)
                    assert other.state == "performing"
                    session.execute(
                        update(BaseWorkflow)
                        .where(BaseWorkflow.id == self.id)
                        .values(state="paused")
                    )
                    session.commit()

    wf = ExecPausedMeanwhile.create(hero=make_order(geneva_session))
    perform_next_step(wf)
    assert wf.state == "paused"
    assert summary(geneva_session, wf) == [("only", "canceled", "canceled")]
    assert wf.next_step_name == "only"
    wf.resume()
    speedrun_workflow(wf)
    assert runs == [0, 1]
    assert wf.state == "finished"


def test_operator_pause_of_a_performing_workflow_is_allowed(geneva_session):
    from geneva_drive.states import can_pause

    assert can_pause("performing")
    wf = ExecTwoStepWorkflow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    _force(geneva_session, wf, state="performing")
    wf.pause()
    assert wf.state == "paused"


def test_finalize_events_and_wait_of_the_next_step(geneva_session):
    class ExecWaitNext(Workflow):
        @step
        def a(self):
            pass

        @step(wait=timedelta(minutes=30))
        def b(self):
            pass

    wf = ExecWaitNext.create(hero=make_order(geneva_session))
    perform_next_step(wf)
    b = executions(geneva_session, wf)[-1]
    assert b.step_name == "b" and b.state == "scheduled"
    assert (b.scheduled_for - executions(geneva_session, wf)[0].completed_at) >= timedelta(
        minutes=29
    )


def test_exception_policy_handler_gets_the_workflow_and_error(geneva_session):
    seen = []

    def handler(workflow, error):
        seen.append((type(workflow).__name__, str(error), workflow.state))

    class ExecHandlerWorkflow(Workflow):
        @step(on_exception=ExceptionPolicy(handler=handler))
        def only(self):
            raise Boom("handled")

    wf = ExecHandlerWorkflow.create(hero=make_order(geneva_session))
    with pytest.raises(Boom):
        perform_next_step(wf)
    assert seen == [("ExecHandlerWorkflow", "handled", "performing")]
    assert wf.state == "paused"  # a handler that returns normally pauses


# --- exactly once, and operators acting while a step runs ----------------------------------------


def test_concurrent_deliveries_of_one_execution_run_the_body_once(geneva_session):
    """Messages are at-least-once; the executor starts only a still-scheduled execution, under
    the workflow lock, so duplicates are no-ops."""
    import threading
    import time

    runs = []

    class ExecExactlyOnce(Workflow):
        @step
        def only(self):
            runs.append(1)
            time.sleep(0.2)

        @step
        def after(self):
            pass

    wf = ExecExactlyOnce.create(hero=make_order(geneva_session))
    geneva_session.commit()
    ex_id = wf.current_execution.id
    barrier = threading.Barrier(4)
    errors = []

    def deliver():
        try:
            barrier.wait(timeout=10)
            execute(ex_id)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=deliver) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert runs == [1]
    assert summary(geneva_session, wf) == [
        ("only", "completed", "success"),
        ("after", "scheduled", None),
    ]


def test_operator_cancel_while_the_step_runs(geneva_session):
    """Deliberate difference: an operator may cancel a performing workflow. The running
    execution is marked canceled at once; finalize then leaves it alone."""
    import threading

    class ExecCancelWhileRunning(Workflow):
        @step
        def only(self):
            def operator():
                with other_session() as session:
                    session.get(BaseWorkflow, self.id).cancel()
                    session.commit()

            t = threading.Thread(target=operator)  # another process, in effect
            t.start()
            t.join(timeout=30)

        @step
        def never(self):
            raise AssertionError("not reached")

    wf = ExecCancelWhileRunning.create(hero=make_order(geneva_session))
    perform_next_step(wf)
    assert wf.state == "canceled"
    assert summary(geneva_session, wf) == [("only", "canceled", "canceled")]


@pytest.mark.parametrize(
    ("verb", "message"),
    [
        ("skip", "Cannot skip on a performing workflow"),
        ("resume", "Cannot resume a performing workflow"),
        ("resume_at", "Cannot resume_at a performing workflow"),
    ],
)
def test_operator_verbs_refused_while_performing(geneva_session, verb, message):
    from geneva_drive.errors import InvalidStateError

    wf = ExecTwoStepWorkflow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    _force(geneva_session, wf, state="performing")
    with pytest.raises(InvalidStateError, match=message):
        if verb == "resume_at":
            wf.resume_at("first")
        else:
            getattr(wf, verb)()
