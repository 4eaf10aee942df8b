"""geneva_drive.testing helpers (docs/MANUAL.md, "Testing"): what each
helper runs, what it returns, and the exact failure messages."""

from __future__ import annotations

from datetime import timedelta

import pytest

from geneva_drive import Workflow, resumable_step, step
from geneva_drive.testing import (
    assert_cursor,
    assert_signal_state,
    assert_step_executed,
    assert_step_has_successor,
    assert_waiting_for_signal,
    assert_workflow_state,
    perform_next_step,
    perform_step_inline,
    run_iterations,
    speedrun_current_step,
    speedrun_workflow,
)
from tests.engine.helpers import executions, make_order, summary


class HelperWorkflow(Workflow):
    calls: list = []

    @step
    def one(self):
        HelperWorkflow.calls.append("one")

    @step(wait=timedelta(days=30))
    def two(self):
        HelperWorkflow.calls.append("two")

    @step
    def three(self):
        HelperWorkflow.calls.append("three")


@pytest.fixture
def wf(geneva_session):
    HelperWorkflow.calls = []
    return HelperWorkflow.create(hero=make_order(geneva_session))


def test_speedrun_workflow_runs_every_step_ignoring_waits(geneva_session, wf):
    returned = speedrun_workflow(wf)
    assert returned is wf
    assert HelperWorkflow.calls == ["one", "two", "three"]
    assert wf.state == "finished"


def test_speedrun_workflow_stops_at_pause(geneva_session):
    class HelperPausing(Workflow):
        @step
        def a(self):
            self.pause()

        @step
        def b(self):
            raise AssertionError("not reached")

    wf = HelperPausing.create(hero=make_order(geneva_session))
    speedrun_workflow(wf)
    assert wf.state == "paused"


def test_speedrun_workflow_propagates_step_exceptions(geneva_session):
    class HelperRaising(Workflow):
        @step
        def a(self):
            raise ZeroDivisionError("x")

    wf = HelperRaising.create(hero=make_order(geneva_session))
    with pytest.raises(ZeroDivisionError):
        speedrun_workflow(wf)
    assert wf.state == "paused"


def test_speedrun_workflow_max_iterations(geneva_session):
    class HelperLooping(Workflow):
        @step
        def forever(self):
            self.reattempt()

    wf = HelperLooping.create(hero=make_order(geneva_session))
    with pytest.raises(RuntimeError) as info:
        speedrun_workflow(wf, max_iterations=5)
    assert str(info.value) == (
        "speedrun_workflow exceeded max_iterations (5). Workflow may be in an infinite loop."
    )
    assert len(executions(geneva_session, wf)) == 6


def test_perform_next_step_runs_one_and_returns_it(geneva_session, wf):
    first_id = wf.current_execution.id
    ex = perform_next_step(wf)
    assert ex.id == first_id
    assert HelperWorkflow.calls == ["one"]
    assert wf.next_step_name == "two"  # the workflow is reloaded
    perform_next_step(wf)  # runs the future-scheduled step now
    perform_next_step(wf)
    assert perform_next_step(wf) is None  # finished: nothing current
    assert HelperWorkflow.calls == ["one", "two", "three"]


def test_perform_step_inline_runs_a_named_step_and_cancels_the_scheduled_one(geneva_session, wf):
    ex = perform_step_inline(wf, "three")
    assert (ex.step_name, ex.state, ex.outcome) == ("three", "completed", "success")
    assert HelperWorkflow.calls == ["three"]
    rows = summary(geneva_session, wf)
    assert rows[0] == ("one", "canceled", "canceled")
    assert rows[1] == ("three", "completed", "success")
    # completing the last step finishes the workflow
    assert wf.state == "finished"


def test_perform_step_inline_defaults_to_the_next_step(geneva_session, wf):
    ex = perform_step_inline(wf)
    assert ex.step_name == "one"
    assert HelperWorkflow.calls == ["one"]


def test_perform_step_inline_unknown_step(geneva_session, wf):
    with pytest.raises(ValueError) as info:
        perform_step_inline(wf, "four")
    assert str(info.value) == (
        "Step 'four' is not defined in HelperWorkflow. Available steps: one, two, three"
    )


def test_speedrun_current_step_does_not_advance_into_the_next_step(geneva_session, wf):
    ex = speedrun_current_step(wf)
    assert (ex.step_name, ex.state) == ("one", "completed")
    assert HelperWorkflow.calls == ["one"]
    assert wf.current_execution.step_name == "two"


def test_speedrun_current_step_follows_a_resumable_chain(geneva_session):
    seen = []

    class HelperChain(Workflow):
        @resumable_step(max_iterations=2)
        def walk(self, it):
            it.iterate_over(range(5), seen.append)

        @step
        def after(self):
            seen.append("after")

    wf = HelperChain.create(hero=make_order(geneva_session))
    run_iterations(wf, 2)
    assert seen == [0, 1]
    assert_step_has_successor(wf, "walk")
    assert_cursor(wf, 2)
    last = speedrun_current_step(wf)
    assert last.step_name == "walk" and last.state == "completed" and last.outcome == "success"
    assert seen == [0, 1, 2, 3, 4]
    assert wf.current_execution.step_name == "after"


def test_speedrun_current_step_with_nothing_current(geneva_session, wf):
    speedrun_workflow(wf)
    assert speedrun_current_step(wf) is None


def test_run_iterations_without_a_current_execution(geneva_session, wf):
    speedrun_workflow(wf)
    with pytest.raises(RuntimeError, match=r"^No current step execution to run$"):
        run_iterations(wf, 3)


def test_assert_step_executed(geneva_session, wf):
    perform_next_step(wf)
    assert_step_executed(wf, "one")
    assert_step_executed(wf, "two", state="scheduled")
    with pytest.raises(AssertionError) as info:
        assert_step_executed(wf, "two")
    assert str(info.value) == "Expected step 'two' to be completed, but it was not found"
    with pytest.raises(
        AssertionError, match="Expected step 'one' to be failed, but it was not found"
    ):
        assert_step_executed(wf, "one", state="failed")


def test_assert_workflow_state(geneva_session, wf):
    assert_workflow_state(wf, "ready")
    with pytest.raises(AssertionError) as info:
        assert_workflow_state(wf, "finished")
    assert str(info.value) == "Expected workflow to be finished, but was ready"


def test_assert_cursor_without_an_execution(geneva_session, wf):
    assert_cursor(wf, None)
    speedrun_workflow(wf)
    assert_cursor(wf, None)
    with pytest.raises(AssertionError, match=r"^Expected cursor 3, got None$"):
        assert_cursor(wf, 3)


def test_assert_step_has_successor_messages(geneva_session, wf):
    with pytest.raises(AssertionError, match=r"^Expected completed execution for step one$"):
        assert_step_has_successor(wf, "one")
    perform_next_step(wf)
    with pytest.raises(
        AssertionError, match=r"^Expected successor execution for step one, but none found$"
    ):
        assert_step_has_successor(wf, "one")


class HelperSignalWorkflow(Workflow):
    @step(wait_for="payment_confirmed")
    def capture(self):
        pass


def test_parked_executions_cannot_be_driven(geneva_session):
    wf = HelperSignalWorkflow.create(hero=make_order(geneva_session))
    perform_next_step(wf)  # parks during this call: no error
    assert_waiting_for_signal(wf)
    assert_waiting_for_signal(wf, "payment_confirmed")
    for helper in (perform_next_step, speedrun_workflow, speedrun_current_step):
        with pytest.raises(RuntimeError) as info:
            helper(wf)
        message = str(info.value)
        assert "parked" in message and "payment_confirmed" in message
        assert message.startswith(f"{helper.__name__} cannot drive step 'capture'")
    with pytest.raises(AssertionError) as info:
        assert_waiting_for_signal(wf, "other")
    assert str(info.value) == (
        "Expected step 'capture' to be waiting for 'other', but it waits for payment_confirmed"
    )


def test_assert_waiting_for_signal_when_nothing_is_parked(geneva_session):
    wf = HelperSignalWorkflow.create(hero=make_order(geneva_session))
    with pytest.raises(AssertionError) as info:
        assert_waiting_for_signal(wf)
    assert str(info.value) == (
        "Expected HelperSignalWorkflow to be waiting for a signal, but no parked step execution "
        "was found (current execution: 'scheduled')"
    )


def test_assert_signal_state(geneva_session):
    wf = HelperSignalWorkflow.create(hero=make_order(geneva_session))
    with pytest.raises(AssertionError) as info:
        assert_signal_state(wf, "payment_confirmed", "pending")
    assert str(info.value) == (
        "Expected a 'payment_confirmed' signal on HelperSignalWorkflow, but none was found"
    )
    perform_next_step(wf)
    wf.signal("payment_confirmed", {"amount_cents": 100})
    assert_signal_state(wf, "payment_confirmed", "claimed")
    speedrun_workflow(wf)
    assert_signal_state(wf, "payment_confirmed", "consumed")
    with pytest.raises(AssertionError) as info:
        assert_signal_state(wf, "payment_confirmed", "pending")
    assert str(info.value) == "Expected signal 'payment_confirmed' to be pending, but was consumed"
