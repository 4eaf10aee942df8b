"""Flow control inside steps and operator actions outside them, the scheduling helpers and
removed_steps_in_flight (docs/MANUAL.md, "Flow control inside a step", "Operator actions
outside a step")."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update

from geneva_drive import Workflow, removed_step, step
from geneva_drive.errors import InvalidStateError, StepNotDefinedError
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.testing import perform_next_step, speedrun_workflow
from geneva_drive.workflow import Workflow as BaseWorkflow
from tests.engine.helpers import (
    assert_close,
    assert_recent,
    executions,
    make_order,
    summary,
)

# --- inside a step -------------------------------------------------------------------------


class FlowWorkflow(Workflow):
    """``action`` picks what the first step does; trace records what ran."""

    action: str = "none"
    trace: list = []

    @step
    def first(self):
        FlowWorkflow.trace.append("first")
        action = FlowWorkflow.action
        if action == "cancel":
            self.cancel()
        elif action == "pause":
            self.pause()
        elif action == "skip":
            self.skip()
        elif action == "finish":
            self.finish()
        elif action == "reattempt":
            if FlowWorkflow.trace.count("first") == 1:
                self.reattempt(wait=timedelta(minutes=10))
        elif action == "reattempt_now":
            if FlowWorkflow.trace.count("first") < 3:
                self.reattempt(rewind=True)
        FlowWorkflow.trace.append("after-flow-control")

    @step(wait=timedelta(hours=1))
    def second(self):
        FlowWorkflow.trace.append("second")

    @step
    def third(self):
        FlowWorkflow.trace.append("third")


@pytest.fixture
def flow(geneva_session):
    def make(action):
        FlowWorkflow.action = action
        FlowWorkflow.trace = []
        return FlowWorkflow.create(hero=make_order(geneva_session))

    return make


def test_cancel_in_step(geneva_session, flow):
    wf = flow("cancel")
    perform_next_step(wf)
    assert FlowWorkflow.trace == ["first"]  # code after the call never runs
    assert wf.state == "canceled"
    assert_recent(wf.transitioned_at)
    [ex] = executions(geneva_session, wf)
    assert (ex.state, ex.outcome) == ("canceled", "canceled")
    assert_recent(ex.canceled_at)
    assert_recent(ex.finished_at)


def test_pause_in_an_ordinary_step_cancels_the_execution_and_resume_reruns_it(geneva_session, flow):
    wf = flow("pause")
    perform_next_step(wf)
    assert wf.state == "paused" and wf.next_step_name == "first"
    assert_recent(wf.transitioned_at)
    assert summary(geneva_session, wf) == [("first", "canceled", "canceled")]
    FlowWorkflow.action = "none"
    wf.resume()
    assert wf.state == "ready" and wf.transitioned_at is None
    perform_next_step(wf)
    assert FlowWorkflow.trace == ["first", "first", "after-flow-control"]
    assert [e.step_name for e in executions(geneva_session, wf)] == ["first", "first", "second"]


def test_skip_in_step_schedules_the_next_step_with_its_wait(geneva_session, flow):
    wf = flow("skip")
    perform_next_step(wf)
    assert summary(geneva_session, wf) == [
        ("first", "skipped", "skipped"),
        ("second", "scheduled", None),
    ]
    skipped, nxt = executions(geneva_session, wf)
    assert_recent(skipped.skipped_at)
    assert_close(nxt.scheduled_for, utcnow() + timedelta(hours=1))
    assert wf.state == "ready"


def test_finish_in_step_ends_the_workflow_and_keeps_next_step_name(geneva_session, flow):
    wf = flow("finish")
    perform_next_step(wf)
    assert wf.state == "finished"
    assert_recent(wf.transitioned_at)
    assert summary(geneva_session, wf) == [("first", "completed", "success")]
    assert wf.next_step_name == "first"  # finished via finish() does not clear it
    assert wf.current_step_name is None


def test_reattempt_with_wait_reschedules_the_same_step(geneva_session, flow):
    wf = flow("reattempt")
    perform_next_step(wf)
    first, again = executions(geneva_session, wf)
    assert (first.state, first.outcome) == ("completed", "reattempted")
    assert first.metadata_ == {"reattempt_reason": "flow_control"}
    assert first.error_message is None
    assert (again.step_name, again.state) == ("first", "scheduled")
    assert_close(again.scheduled_for, utcnow() + timedelta(minutes=10))
    assert wf.state == "ready" and wf.next_step_name == "first"
    speedrun_workflow(wf)
    assert FlowWorkflow.trace == ["first", "first", "after-flow-control", "second", "third"]


def test_reattempt_without_wait_runs_now_and_rewind_is_ignored_for_ordinary_steps(
    geneva_session, flow
):
    wf = flow("reattempt_now")
    perform_next_step(wf)
    again = executions(geneva_session, wf)[-1]
    assert again.step_name == "first" and again.continues_from_id is None
    assert_recent(again.scheduled_for)
    speedrun_workflow(wf)
    assert wf.state == "finished"
    # two flow-control reattempts are never counted as policy reattempts
    assert [e.outcome for e in executions(geneva_session, wf)][:3] == [
        "reattempted",
        "reattempted",
        "success",
    ]


def test_reattempt_does_not_reapply_the_steps_own_wait(geneva_session):
    runs = []

    class FlowReattemptWait(Workflow):
        @step(wait=timedelta(days=1))
        def waited(self):
            runs.append(1)
            if len(runs) == 1:
                self.reattempt()

    wf = FlowReattemptWait.create(hero=make_order(geneva_session))
    perform_next_step(wf)
    again = executions(geneva_session, wf)[-1]
    assert_recent(again.scheduled_for)  # not now + 1 day


def test_reattempt_and_finish_outside_a_step(geneva_session, flow):
    wf = flow("none")
    with pytest.raises(InvalidStateError, match="finish\\(\\) ends a workflow from inside"):
        wf.finish()
    with pytest.raises(InvalidStateError, match="suspend\\(\\) can only be called from inside"):
        wf.suspend()


# --- operator pause ---------------------------------------------------------------------------


def test_operator_pause_keeps_the_scheduled_execution(geneva_session, flow):
    wf = flow("none")
    wf.pause()
    assert wf.state == "paused"
    assert_recent(wf.transitioned_at)
    assert summary(geneva_session, wf) == [("first", "scheduled", None)]


@pytest.mark.parametrize("state", ["paused", "finished", "canceled"])
def test_operator_pause_refuses_other_states(geneva_session, flow, state):
    wf = flow("none")
    geneva_session.commit()
    geneva_session.execute(update(BaseWorkflow).where(BaseWorkflow.id == wf.id).values(state=state))
    geneva_session.commit()
    geneva_session.refresh(wf)
    with pytest.raises(InvalidStateError) as info:
        wf.pause()
    assert str(info.value).startswith(f"Cannot pause a {state} workflow (FlowWorkflow #{wf.id})")


# --- operator cancel ----------------------------------------------------------------------------


@pytest.mark.parametrize("paused_first", [False, True])
def test_operator_cancel_cancels_the_current_execution(geneva_session, flow, paused_first):
    wf = flow("none")
    if paused_first:
        wf.pause()
    wf.cancel()
    assert wf.state == "canceled"
    assert_recent(wf.transitioned_at)
    [ex] = executions(geneva_session, wf)
    assert (ex.state, ex.outcome) == ("canceled", "canceled")
    assert_recent(ex.canceled_at)


@pytest.mark.parametrize("end", ["finished", "canceled"])
def test_operator_cancel_refuses_terminal_workflows(geneva_session, flow, end):
    wf = flow("none")
    if end == "finished":
        speedrun_workflow(wf)
    else:
        wf.cancel()
    with pytest.raises(InvalidStateError, match=f"Cannot cancel a {end} workflow"):
        wf.cancel()


# --- operator skip ------------------------------------------------------------------------------


def test_operator_skip_on_ready_marks_the_current_execution_skipped(geneva_session, flow):
    wf = flow("none")
    wf.skip()
    assert summary(geneva_session, wf) == [
        ("first", "skipped", "skipped"),
        ("second", "scheduled", None),
    ]
    assert_recent(executions(geneva_session, wf)[0].skipped_at)
    assert wf.next_step_name == "second"
    # repeated skips walk the steps one at a time, then finish
    wf.skip()
    assert wf.next_step_name == "third"
    wf.skip()
    assert wf.state == "finished"
    assert [e.state for e in executions(geneva_session, wf)] == ["skipped"] * 3
    assert FlowWorkflow.trace == []


def test_operator_skip_on_paused_resumes_at_the_following_step(geneva_session):
    class FlowFailing(Workflow):
        @step
        def broken(self):
            raise RuntimeError("nope")

        @step
        def fine(self):
            pass

    wf = FlowFailing.create(hero=make_order(geneva_session))
    with pytest.raises(RuntimeError):
        perform_next_step(wf)
    assert wf.state == "paused"
    wf.skip()
    assert wf.state == "ready" and wf.transitioned_at is None
    # the failed execution stays failed; the next step is scheduled
    assert summary(geneva_session, wf) == [
        ("broken", "failed", "failed"),
        ("fine", "scheduled", None),
    ]


def test_operator_skip_on_paused_with_a_preserved_execution(geneva_session, flow):
    wf = flow("none")
    wf.pause()
    wf.skip()
    # the preserved execution is swept (canceled) by the next create, not marked skipped
    assert summary(geneva_session, wf) == [
        ("first", "canceled", "canceled"),
        ("second", "scheduled", None),
    ]


@pytest.mark.parametrize("end", ["finished", "canceled"])
def test_operator_skip_refuses_terminal_workflows(geneva_session, flow, end):
    wf = flow("none")
    if end == "finished":
        speedrun_workflow(wf)
    else:
        wf.cancel()
    with pytest.raises(InvalidStateError, match=f"Cannot skip on a {end} workflow"):
        wf.skip()


def test_operator_skip_on_a_workflow_stranded_on_a_deleted_step_finishes_it(geneva_session):
    wf = _stranded(geneva_session)
    wf.skip()
    assert wf.state == "finished"


# --- resume ---------------------------------------------------------------------------------


def test_resume_re_sends_the_preserved_execution_without_a_new_row(
    geneva_session, geneva_transport, flow
):
    wf = flow("none")
    geneva_session.commit()
    [original] = executions(geneva_session, wf)
    wf.pause()
    geneva_session.commit()
    geneva_transport.clear()
    returned = wf.resume()
    geneva_session.commit()
    assert returned.id == original.id
    assert wf.state == "ready" and wf.transitioned_at is None
    assert [(e.id, e.state) for e in executions(geneva_session, wf)] == [(original.id, "scheduled")]
    assert geneva_transport.execution_ids == [original.id]


def test_resume_keeps_scheduled_for_so_overdue_is_visible(geneva_session, flow):
    wf = flow("none")
    geneva_session.commit()
    past = utcnow() - timedelta(hours=3)
    geneva_session.execute(
        update(StepExecution).where(StepExecution.workflow_id == wf.id).values(scheduled_for=past)
    )
    geneva_session.commit()
    wf.pause()
    wf.resume()
    [ex] = executions(geneva_session, wf)
    assert_close(ex.scheduled_for, past, 1)
    assert ex.is_overdue


def test_resume_after_a_failure_retries_the_failed_step(geneva_session):
    attempts = []

    class FlowRetryOnResume(Workflow):
        @step
        def flaky(self):
            attempts.append(1)
            if len(attempts) == 1:
                raise RuntimeError("first time")

    wf = FlowRetryOnResume.create(hero=make_order(geneva_session))
    with pytest.raises(RuntimeError):
        perform_next_step(wf)
    new = wf.resume()
    assert (new.step_name, new.state) == ("flaky", "scheduled")
    assert_recent(new.scheduled_for)
    speedrun_workflow(wf)
    assert wf.state == "finished" and len(attempts) == 2


@pytest.mark.parametrize("state", ["ready", "finished", "canceled"])
def test_resume_refuses_anything_but_paused(geneva_session, flow, state):
    wf = flow("none")
    if state == "finished":
        speedrun_workflow(wf)
    elif state == "canceled":
        wf.cancel()
    with pytest.raises(InvalidStateError, match=f"Cannot resume a {state} workflow"):
        wf.resume()


def _stranded(geneva_session):
    """A workflow paused by StepNotDefinedError: its step was deleted without a gravestone."""

    class FlowStrandedV1(Workflow):
        workflow_name = "FlowStranded"

        @step
        def a(self):
            pass

        @step
        def deleted(self):
            pass

        @step
        def c(self):
            pass

    wf = FlowStrandedV1.create(hero=make_order(geneva_session))
    perform_next_step(wf)
    geneva_session.commit()

    class FlowStrandedV2(Workflow):
        workflow_name = "FlowStranded"

        @step
        def a(self):
            pass

        @step
        def c(self):
            pass

    geneva_session.expunge_all()
    wf = geneva_session.get(BaseWorkflow, wf.id)
    with pytest.raises(StepNotDefinedError):
        perform_next_step(wf)
    assert wf.state == "paused" and wf.next_step_name == "deleted"
    return wf


def test_resume_of_a_stranded_workflow_explains_and_changes_nothing(geneva_session):
    wf = _stranded(geneva_session)
    with pytest.raises(StepNotDefinedError) as info:
        wf.resume()
    message = str(info.value)
    assert f"Cannot resume FlowStrandedV2 #{wf.id}: step 'deleted' is no longer defined" in message
    assert "resume_at(step_name)" in message
    assert "the steps still defined are a, c" in message
    assert "removed_step()" in message
    # deliberate difference: validated before changing anything, so resume_at stays possible
    geneva_session.refresh(wf)
    assert wf.state == "paused"
    ex = wf.resume_at("c")
    assert ex.step_name == "c"
    speedrun_workflow(wf)
    assert wf.state == "finished"


# --- resume_at ----------------------------------------------------------------------------------


def test_resume_at_schedules_the_target_now_and_sweeps_strays(geneva_session, flow):
    wf = flow("none")
    wf.pause()
    before = executions(geneva_session, wf)[0]
    ex = wf.resume_at("third")
    assert isinstance(ex, StepExecution)
    assert (ex.step_name, ex.state) == ("third", "scheduled")
    assert_recent(ex.scheduled_for)
    assert wf.state == "ready" and wf.transitioned_at is None
    assert wf.current_step_name is None and wf.next_step_name == "third"
    geneva_session.refresh(before)
    assert (before.state, before.outcome) == ("canceled", "canceled")
    speedrun_workflow(wf)
    assert FlowWorkflow.trace == ["third"]


def test_resume_at_does_not_apply_the_target_steps_wait(geneva_session, flow):
    wf = flow("none")
    wf.pause()
    ex = wf.resume_at("second")  # second has wait=1h
    assert_recent(ex.scheduled_for)


def test_resume_at_refuses_unknown_and_removed_steps(geneva_session):
    class FlowResumeAtGrave(Workflow):
        @step
        def a(self):
            pass

        gone = removed_step()

        @step
        def b(self):
            pass

    wf = FlowResumeAtGrave.create(hero=make_order(geneva_session))
    wf.pause()
    with pytest.raises(StepNotDefinedError) as info:
        wf.resume_at("nope")
    assert str(info.value) == (
        f"Cannot resume FlowResumeAtGrave #{wf.id} at 'nope': that step is not defined in "
        "FlowResumeAtGrave. The steps it can be resumed at are a, b."
    )
    with pytest.raises(
        StepNotDefinedError, match="that step is a removed_step in FlowResumeAtGrave"
    ):
        wf.resume_at("gone")
    assert wf.state == "paused"


@pytest.mark.parametrize("state", ["ready", "finished", "canceled"])
def test_resume_at_refuses_anything_but_paused(geneva_session, flow, state):
    wf = flow("none")
    if state == "finished":
        speedrun_workflow(wf)
    elif state == "canceled":
        wf.cancel()
    with pytest.raises(InvalidStateError, match=f"Cannot resume_at a {state} workflow"):
        wf.resume_at("first")


# --- operator reattempt -----------------------------------------------------------------------


def test_operator_reattempt_on_ready_runs_the_current_step_again_now(geneva_session, flow):
    wf = flow("none")
    perform_next_step(wf)  # second is scheduled an hour out
    wf.reattempt()
    ex = executions(geneva_session, wf)[-1]
    assert (ex.step_name, ex.state) == ("second", "scheduled")
    assert_recent(ex.scheduled_for)
    assert [e.state for e in executions(geneva_session, wf)] == [
        "completed",
        "canceled",
        "scheduled",
    ]


def test_operator_reattempt_on_paused_resumes(geneva_session, flow):
    wf = flow("none")
    wf.pause()
    wf.reattempt()
    assert wf.state == "ready"


def _stranded_on_an_execution(geneva_session):
    """Paused by StepNotDefinedError on ``send_sms``, an execution's step the class never
    defined, while the workflow's own pointer still names its first step (the demo's
    ``/workflows/107``): resume() would run ``a``, not the step it is stranded on."""

    class FlowStrandedExec(Workflow):
        @step
        def a(self):
            pass

        @step
        def c(self):
            pass

    wf = FlowStrandedExec.create(hero=make_order(geneva_session))
    geneva_session.execute(
        update(StepExecution).where(StepExecution.workflow_id == wf.id).values(step_name="send_sms")
    )
    geneva_session.commit()
    geneva_session.expire_all()
    with pytest.raises(StepNotDefinedError):
        perform_next_step(wf)
    assert wf.state == "paused" and wf.next_step_name == "a"
    return wf


def test_operator_reattempt_of_a_stranded_workflow_is_refused_with_the_way_out(geneva_session):
    wf = _stranded_on_an_execution(geneva_session)
    before = summary(geneva_session, wf)
    with pytest.raises(StepNotDefinedError) as info:
        wf.reattempt()
    message = str(info.value)
    assert message.startswith(
        f"Cannot reattempt FlowStrandedExec #{wf.id}: step 'send_sms' is no longer defined"
    )
    assert "resume_at(step_name)" in message and "the steps still defined are a, c" in message
    geneva_session.rollback()
    geneva_session.refresh(wf)
    assert wf.state == "paused" and summary(geneva_session, wf) == before
    # resume() of the same workflow would run `a`, which is not the step it stopped on.
    with pytest.raises(StepNotDefinedError, match=r"Cannot resume FlowStrandedExec #.*'send_sms'"):
        wf.resume()
    geneva_session.rollback()
    assert wf.resume_at("c").step_name == "c"


def test_operator_reattempt_of_a_workflow_stranded_on_its_next_step_says_reattempt(
    geneva_session,
):
    wf = _stranded(geneva_session)
    with pytest.raises(StepNotDefinedError) as info:
        wf.reattempt()
    assert str(info.value).startswith(
        f"Cannot reattempt FlowStrandedV2 #{wf.id}: step 'deleted' is no longer defined"
    )
    assert "resume_at(step_name)" in str(info.value)


# --- removed_steps_in_flight -------------------------------------------------------------------


def test_removed_steps_in_flight(geneva_session):
    class FlowDrainV1(Workflow):
        workflow_name = "FlowDrain"

        @step
        def a(self):
            pass

        @step
        def legacy(self):
            pass

        @step
        def b(self):
            pass

    class FlowDrainOther(Workflow):
        @step
        def a(self):
            pass

        @step
        def legacy(self):
            pass

    no_graves = FlowDrainOther
    ongoing = [FlowDrainV1.create(hero=make_order(geneva_session)) for _ in range(3)]
    done = FlowDrainV1.create(hero=make_order(geneva_session))
    other = FlowDrainOther.create(hero=make_order(geneva_session))
    for wf in [*ongoing, done, other]:
        perform_next_step(wf)  # everyone now has a 'legacy' execution scheduled
    speedrun_workflow(done)
    perform_next_step(ongoing[0])  # its 'legacy' row is completed history now
    geneva_session.commit()
    ongoing_ids = [w.id for w in ongoing]

    class FlowDrainV2(Workflow):
        workflow_name = "FlowDrain"

        @step
        def a(self):
            pass

        legacy = removed_step()

        @step
        def b(self):
            pass

    geneva_session.expunge_all()
    # any state counts (completed history too); finished workflows and other classes do not
    assert FlowDrainV2.removed_steps_in_flight(geneva_session) == {"legacy": 3}
    assert no_graves.removed_steps_in_flight(geneva_session) == {}

    for wf_id in ongoing_ids[1:]:
        perform_next_step(geneva_session.get(BaseWorkflow, wf_id))  # skipped gravestone rows
    assert FlowDrainV2.removed_steps_in_flight(geneva_session) == {"legacy": 3}
    for wf_id in ongoing_ids:
        speedrun_workflow(geneva_session.get(BaseWorkflow, wf_id))
    assert FlowDrainV2.removed_steps_in_flight(geneva_session) == {}


def test_resume_at_clears_a_stale_current_step_name(geneva_session, flow):
    wf = flow("none")
    geneva_session.commit()
    # finalize guards leave current_step_name set; force that shape
    geneva_session.execute(
        update(BaseWorkflow)
        .where(BaseWorkflow.id == wf.id)
        .values(state="paused", current_step_name="first")
    )
    geneva_session.commit()
    geneva_session.refresh(wf)
    assert wf.previous_step_name is None  # reference step is current_step_name "first"
    wf.resume_at("third")
    assert wf.current_step_name is None and wf.next_step_name == "third"
    assert wf.previous_step_name == "second"
