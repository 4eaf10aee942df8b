"""Resumable steps: cursor iteration with chained executions (docs/MANUAL.md, "Resumable steps")."""

from __future__ import annotations

import itertools
import threading
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace

import pytest
from sqlalchemy import select

import geneva_drive.executor
from geneva_drive import ExceptionPolicy, IterableStep, Workflow, db, resumable_step, settings, step
from geneva_drive.errors import CursorTooLargeError, InvalidStateError
from geneva_drive.executor import clear_shutdown, request_shutdown
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.testing import (
    assert_cursor,
    assert_step_has_successor,
    assert_workflow_state,
    perform_next_step,
    run_iterations,
    speedrun_current_step,
    speedrun_workflow,
)
from tests.conftest import Order
from tests.engine.helpers import make_order


def chain(wf, step_name):
    return [e for e in wf.execution_history if e.step_name == step_name]


def states(executions):
    return [(e.state, e.outcome) for e in executions]


def with_other_session(workflow_id, action):
    """Act on the workflow from another thread and connection, like an operator would.

    (Inside a step body, flow-control calls on the running workflow end the step; an operator
    acts from elsewhere.)
    """
    outcome = {}

    def run():
        other = db.SessionFactory()
        try:
            outcome["result"] = action(other.get(Workflow, workflow_id))
            other.commit()
        except BaseException as error:  # pragma: no cover - surfaced below
            outcome["error"] = error
        finally:
            other.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("result")


def committed(wf, transport):
    """Commit what the test set up (sending its messages), then forget recorded messages."""
    wf.session.commit()
    transport.clear()


# --- chains of executions -------------------------------------------------------------------


def test_ten_items_with_max_iterations_three_make_a_chain_of_four(order, geneva_transport):
    processed = []

    class TenItemsFlow(Workflow):
        @resumable_step(max_iterations=3)
        def walk(self, it):
            it.iterate_over(list(range(10)), processed.append)

        @step
        def done(self):
            processed.append("done")

    wf = TenItemsFlow.create(hero=order)
    executions = []
    for _ in range(4):
        executions.append(perform_next_step(wf))
    assert processed == list(range(10))
    links = chain(wf, "walk")
    assert len(links) == 4
    assert [e.id for e in links] == [e.id for e in executions]
    assert states(links) == [
        ("completed", "continued"),
        ("completed", "continued"),
        ("completed", "continued"),
        ("completed", "success"),
    ]
    assert [e.cursor_value for e in links] == [3, 6, 9, 10]
    assert links[0].continues_from_id is None
    for previous, successor in itertools.pairwise(links):
        assert successor.continues_from_id == previous.id
        assert previous.successor.id == successor.id
        assert successor.continues_from.id == previous.id
    # every successor was sent like any execution
    sent = geneva_transport.execution_ids
    for successor in links[1:]:
        assert successor.id in sent
    speedrun_workflow(wf)
    assert processed[-1] == "done"
    assert wf.state == "finished"


def test_iterations_and_resumed_flags(order):
    seen = []

    class FlagsFlow(Workflow):
        @resumable_step(max_iterations=2)
        def walk(self, it):
            seen.append(("start", it.resumed, it.iterations, it.cursor))
            for _ in range(3):
                it.advance()
                seen.append(("after", it.iterations, it.cursor))

    wf = FlagsFlow.create(hero=order)
    perform_next_step(wf)
    perform_next_step(wf)
    assert seen == [
        ("start", False, 0, None),
        ("after", 1, 1),
        # the second checkpoint interrupts inside advance()
        ("start", True, 0, 2),
        ("after", 1, 3),
    ]
    assert_cursor(wf, 4)


def test_description_and_advance_requires_an_integer(order):
    captured = {}

    class AdvanceFlow(Workflow):
        @resumable_step
        def walk(self, it):
            it.skip_to("token-1") if it.cursor is None else None
            captured["description"] = it.description
            captured["repr"] = repr(it)
            it.advance()

    wf = AdvanceFlow.create(hero=order)
    perform_next_step(wf)
    with pytest.raises(TypeError, match="advance\\(\\) requires an integer cursor, got 'token-1'"):
        perform_next_step(wf)
    assert captured["description"] == "at 'walk', cursor 'token-1'"
    assert "token-1" in captured["repr"]
    assert_workflow_state(wf, "paused")
    assert chain(wf, "walk")[-1].state == "failed"


def test_iterate_over_needs_an_iterable(order):
    class NotIterableFlow(Workflow):
        @resumable_step
        def walk(self, it):
            it.iterate_over(42, print)

    wf = NotIterableFlow.create(hero=order)
    with pytest.raises(TypeError, match="iterable"):
        perform_next_step(wf)


def test_run_iterations_assert_cursor_and_successor_then_speedrun(order):
    processed = []

    class CampaignFlow(Workflow):
        @step
        def prepare(self):
            processed.append("prepare")

        @resumable_step
        def send(self, it):
            it.iterate_over(["a", "b", "c", "d", "e"], processed.append)

        @step
        def finalize(self):
            processed.append("finalize")

    wf = CampaignFlow.create(hero=order)
    perform_next_step(wf)
    executed = run_iterations(wf, 3)
    assert executed.state == "completed"
    assert executed.outcome == "continued"
    assert_cursor(wf, 3)
    assert_step_has_successor(wf, "send")
    speedrun_workflow(wf)
    assert processed == ["prepare", "a", "b", "c", "d", "e", "finalize"]
    assert_workflow_state(wf, "finished")


def test_assert_helpers_fail_with_the_gems_messages(order):
    class HelperFailFlow(Workflow):
        @resumable_step
        def walk(self, it):
            it.iterate_over([1, 2], lambda _: None)

        @step
        def after(self):
            pass

    wf = HelperFailFlow.create(hero=order)
    with pytest.raises(AssertionError, match="Expected completed execution for step walk"):
        assert_step_has_successor(wf, "walk")
    with pytest.raises(AssertionError, match="Expected cursor 5, got None"):
        assert_cursor(wf, 5)
    perform_next_step(wf)  # completes without interruption: no successor
    with pytest.raises(AssertionError, match="Expected successor execution for step walk"):
        assert_step_has_successor(wf, "walk")
    # a successor that already ran is no longer scheduled
    run = HelperFailFlow.create(hero=make_order(wf.session))
    run_iterations(run, 1)
    assert_step_has_successor(run, "walk")
    speedrun_current_step(run)
    with pytest.raises(
        AssertionError, match="Expected successor to be scheduled, but was completed"
    ):
        assert_step_has_successor(run, "walk")


def Order_for_id(order):
    session = db.SessionFactory.object_session(order)
    other = Order()
    session.add(other)
    session.commit()
    return other.id


def test_run_iterations_without_current_execution(order):
    class NothingFlow(Workflow):
        @step
        def only(self):
            pass

    wf = NothingFlow.create(hero=order)
    speedrun_workflow(wf)
    with pytest.raises(RuntimeError, match="No current step execution to run"):
        run_iterations(wf, 1)


def test_speedrun_current_step_follows_the_chain_and_stops_at_the_step(order):
    processed = []

    class HopFlow(Workflow):
        @resumable_step(max_iterations=1)
        def hop(self, it):
            position = it.cursor or 0
            processed.append(position)
            if position < 4:
                it.skip_to(position + 1)

        @step
        def after(self):
            processed.append("after")

    wf = HopFlow.create(hero=order)
    final = speedrun_current_step(wf)
    assert processed == [0, 1, 2, 3, 4]
    links = chain(wf, "hop")
    assert len(links) == 5
    assert final.id == links[-1].id
    assert (final.state, final.outcome) == ("completed", "success")
    # it did not advance into the next step
    assert wf.next_step_name == "after"
    assert wf.current_execution.step_name == "after"
    assert wf.current_execution.state == "scheduled"


def test_speedrun_current_step_ignores_max_iterations_and_reports_loops(order):
    class LoopFlow(Workflow):
        @resumable_step(max_iterations=1)
        def spin(self, it):
            it.skip_to((it.cursor or 0) + 1)

    wf = LoopFlow.create(hero=order)
    with pytest.raises(RuntimeError, match="speedrun_current_step exceeded max_executions \\(5\\)"):
        speedrun_current_step(wf, max_executions=5)

    class LongFlow(Workflow):
        @resumable_step(max_iterations=1)
        def walk(self, it):
            it.iterate_over(range(7), lambda _: None)

    other = LongFlow.create(hero=make_order(wf.session))
    final = speedrun_current_step(other)
    assert final.cursor_value == 7
    assert len(chain(other, "walk")) == 1  # not interruptible: no chain at all


# --- interruption sources -------------------------------------------------------------------


def test_out_of_band_pause_at_item_two_then_resume_continues(order, geneva_transport):
    processed = []
    holder = {}

    class PausedMidwayFlow(Workflow):
        @resumable_step
        def walk(self, it):
            def work(item):
                processed.append(item)
                if item == 2:
                    with_other_session(holder["id"], lambda w: w.pause())

            it.iterate_over([1, 2, 3, 4, 5], work)

        @step
        def after(self):
            processed.append("after")

    wf = PausedMidwayFlow.create(hero=order)
    holder["id"] = wf.id
    first = perform_next_step(wf)
    assert processed == [1, 2]
    assert_workflow_state(wf, "paused")
    wf.session.refresh(first)
    assert (first.state, first.outcome) == ("completed", "workflow_paused")
    assert first.cursor_value == 2
    assert first.successor is None
    assert wf.current_execution is None

    geneva_transport.clear()
    successor = wf.resume()
    wf.session.commit()
    assert successor.continues_from_id == first.id
    assert successor.cursor_value == 2
    assert successor.state == "scheduled"
    assert geneva_transport.execution_ids == [successor.id]
    speedrun_workflow(wf)
    assert processed == [1, 2, 3, 4, 5, "after"]


def test_out_of_band_cancel_stops_at_the_next_checkpoint(order):
    processed = []
    holder = {}

    class CanceledMidwayFlow(Workflow):
        @resumable_step
        def walk(self, it):
            def work(item):
                processed.append(item)
                if item == 2:
                    with_other_session(holder["id"], lambda w: w.cancel())

            it.iterate_over([1, 2, 3, 4], work)

    wf = CanceledMidwayFlow.create(hero=order)
    holder["id"] = wf.id
    first = perform_next_step(wf)
    assert processed == [1, 2]
    assert_workflow_state(wf, "canceled")
    wf.session.refresh(first)
    assert (first.state, first.outcome) == ("canceled", "canceled")
    # The checkpoint after the cancel found the execution closed: a discarded attempt commits
    # nothing more, so the cursor is the last one committed before the cancel.
    assert first.cursor_value == 1
    assert len(chain(wf, "walk")) == 1


def test_max_runtime_interrupts_at_the_checkpoint(order, monkeypatch):
    clock = {"now": 1000.0}
    monkeypatch.setattr(
        geneva_drive.executor, "time", SimpleNamespace(monotonic=lambda: clock["now"])
    )
    processed = []

    class RuntimeFlow(Workflow):
        @resumable_step(max_runtime=timedelta(seconds=10))
        def walk(self, it):
            def work(item):
                processed.append(item)
                clock["now"] += 4

            it.iterate_over(list(range(8)), work)

    wf = RuntimeFlow.create(hero=order)
    perform_next_step(wf)
    # 4 s, 8 s, 12 s > 10 s: interrupted after the third item
    assert processed == [0, 1, 2]
    assert_cursor(wf, 3)
    assert_step_has_successor(wf, "walk")
    perform_next_step(wf)
    assert processed == [0, 1, 2, 3, 4, 5]
    perform_next_step(wf)
    assert processed == list(range(8))
    assert states(chain(wf, "walk"))[-1] == ("completed", "success")


def test_max_runtime_accepts_seconds_and_rejects_nonsense():
    class SecondsFlow(Workflow):
        @resumable_step(max_runtime=30)
        def walk(self, it):
            pass

    assert SecondsFlow.steps.named("walk").max_runtime == timedelta(seconds=30)
    from geneva_drive.errors import StepConfigurationError

    with pytest.raises(StepConfigurationError, match="max_runtime"):

        class BadRuntimeFlow(Workflow):
            @resumable_step(max_runtime=timedelta(0))
            def walk(self, it):
                pass

    with pytest.raises(StepConfigurationError, match="max_iterations"):

        class BadIterationsFlow(Workflow):
            @resumable_step(max_iterations=0)
            def walk(self, it):
                pass

    with pytest.raises(StepConfigurationError, match="resumable"):

        class NotResumableFlow(Workflow):
            @step(max_iterations=3)
            def walk(self):
                pass


def test_shutdown_request_interrupts_and_clear_lets_it_finish(order):
    processed = []

    class ShutdownFlow(Workflow):
        @resumable_step
        def walk(self, it):
            def work(item):
                processed.append(item)
                if item == 3:
                    request_shutdown()

            it.iterate_over([1, 2, 3, 4, 5], work)

    wf = ShutdownFlow.create(hero=order)
    try:
        perform_next_step(wf)
        assert geneva_drive.executor.shutdown_requested()
    finally:
        clear_shutdown()
    assert not geneva_drive.executor.shutdown_requested()
    assert processed == [1, 2, 3]
    assert_cursor(wf, 3)
    assert_step_has_successor(wf, "walk")
    perform_next_step(wf)
    assert processed == [1, 2, 3, 4, 5]
    assert_workflow_state(wf, "finished")


def test_helpers_that_are_not_interruptible_ignore_shutdown(order):
    processed = []

    class IgnoreShutdownFlow(Workflow):
        @resumable_step(max_iterations=1)
        def walk(self, it):
            it.iterate_over([1, 2, 3], processed.append)

    wf = IgnoreShutdownFlow.create(hero=order)
    request_shutdown()
    try:
        speedrun_workflow(wf)
    finally:
        clear_shutdown()
    assert processed == [1, 2, 3]
    assert len(chain(wf, "walk")) == 1


# --- flow control and policies inside resumable steps --------------------------------------


def test_failure_at_item_c_with_pause_policy_then_resume_yields_a_b_c_c_d(order):
    processed = []
    failures = {"c": 1}

    class FailAtCFlow(Workflow):
        @resumable_step
        def walk(self, it):
            def work(item):
                processed.append(item)
                if failures.get(item):
                    failures[item] -= 1
                    raise RuntimeError(f"boom at {item}")

            it.iterate_over(["a", "b", "c", "d"], work)

    wf = FailAtCFlow.create(hero=order)
    with pytest.raises(RuntimeError, match="boom at c"):
        perform_next_step(wf)
    assert_workflow_state(wf, "paused")
    failed = chain(wf, "walk")[0]
    assert (failed.state, failed.outcome) == ("failed", "failed")
    assert failed.cursor_value == 2
    assert failed.error_message == "boom at c"

    successor = wf.resume()
    assert successor.continues_from_id == failed.id
    assert successor.cursor_value == 2
    speedrun_workflow(wf)
    assert processed == ["a", "b", "c", "c", "d"]
    assert_workflow_state(wf, "finished")


def test_failure_before_the_first_checkpoint_resume_retries_from_scratch(order):
    processed = []
    failures = {"a": 1}

    class FailFirstFlow(Workflow):
        @resumable_step
        def walk(self, it):
            def work(item):
                processed.append((item, it.resumed))
                if failures.get(item):
                    failures[item] -= 1
                    raise RuntimeError("early")

            it.iterate_over(["a", "b"], work)

    wf = FailFirstFlow.create(hero=order)
    with pytest.raises(RuntimeError):
        perform_next_step(wf)
    retry = wf.resume()
    # no cursor to continue from: a fresh execution of the step
    assert retry.continues_from_id is None
    assert retry.cursor is None
    speedrun_workflow(wf)
    assert processed == [("a", False), ("a", False), ("b", False)]


def test_reattempt_policy_continues_from_the_last_checkpoint(order):
    processed = []
    failures = {"c": 1}

    class ReattemptFlow(Workflow):
        @resumable_step(on_exception="reattempt", max_reattempts=3)
        def walk(self, it):
            def work(item):
                processed.append(item)
                if failures.get(item):
                    failures[item] -= 1
                    raise TimeoutError(item)

            it.iterate_over(["a", "b", "c", "d"], work)

    wf = ReattemptFlow.create(hero=order)
    with pytest.raises(TimeoutError):
        perform_next_step(wf)
    assert_workflow_state(wf, "ready")
    first, successor = chain(wf, "walk")
    assert (first.state, first.outcome) == ("completed", "reattempted")
    assert first.metadata_["reattempt_reason"] == "exception_policy"
    assert successor.continues_from_id == first.id
    assert successor.cursor_value == 2
    assert successor.state == "scheduled"
    speedrun_workflow(wf)
    assert processed == ["a", "b", "c", "c", "d"]


def test_class_level_reattempt_policy_with_wait_creates_a_delayed_successor(
    order, geneva_transport
):
    failures = {"b": 1}

    class ClassPolicyFlow(Workflow):
        exception_policies = (ExceptionPolicy("reattempt", wait=timedelta(hours=2)),)

        @resumable_step
        def walk(self, it):
            def work(item):
                if failures.get(item):
                    failures[item] -= 1
                    raise ValueError(item)

            it.iterate_over(["a", "b", "c"], work)

    wf = ClassPolicyFlow.create(hero=order)
    committed(wf, geneva_transport)
    with pytest.raises(ValueError):
        perform_next_step(wf)
    successor = wf.current_execution
    assert successor.continues_from_id is not None
    assert successor.cursor_value == 1
    assert successor.scheduled_for > utcnow() + timedelta(minutes=110)
    # due later than the dispatch horizon: left for the dispatcher, not sent now
    assert successor.id not in geneva_transport.execution_ids
    assert successor.sent_at is None


def test_reattempt_continues_and_rewind_restarts(order):
    processed = []
    calls = {"n": 0}

    class RewindFlow(Workflow):
        @resumable_step
        def walk(self, it):
            calls["n"] += 1
            processed.append(("run", calls["n"], it.cursor, it.resumed))

            def work(item):
                processed.append(item)
                if item == "b" and calls["n"] == 1:
                    self.reattempt()
                if item == "c" and calls["n"] == 2:
                    self.reattempt(rewind=True)

            it.iterate_over(["a", "b", "c"], work)

    wf = RewindFlow.create(hero=order)
    perform_next_step(wf)
    first = chain(wf, "walk")[0]
    assert (first.state, first.outcome) == ("completed", "reattempted")
    assert first.metadata_["reattempt_reason"] == "flow_control"
    assert first.cursor_value == 1  # reattempt() inside work(b): b's checkpoint never happened
    perform_next_step(wf)
    second = chain(wf, "walk")[1]
    assert second.continues_from_id == first.id
    assert second.cursor is None  # rewind clears the cursor on the current row
    third = chain(wf, "walk")[2]
    assert third.continues_from_id == second.id
    assert third.cursor is None
    speedrun_workflow(wf)
    assert processed == [
        ("run", 1, None, False),
        "a",
        "b",
        ("run", 2, 1, True),
        "b",
        "c",
        ("run", 3, None, True),
        "a",
        "b",
        "c",
    ]


def test_pause_inside_keeps_the_cursor_and_resume_continues(order):
    processed = []
    paused = {"done": False}

    class SelfPauseFlow(Workflow):
        @resumable_step
        def walk(self, it):
            def work(item):
                if item == 3 and not paused["done"]:
                    paused["done"] = True
                    self.pause()
                processed.append(item)

            it.iterate_over([1, 2, 3, 4], work)

    wf = SelfPauseFlow.create(hero=order)
    perform_next_step(wf)
    assert_workflow_state(wf, "paused")
    marker = chain(wf, "walk")[0]
    assert (marker.state, marker.outcome) == ("completed", "workflow_paused")
    assert marker.cursor_value == 2
    successor = wf.resume()
    assert successor.continues_from_id == marker.id
    speedrun_workflow(wf)
    assert processed == [1, 2, 3, 4]


def test_cancel_skip_and_finish_behave_as_for_ordinary_steps(order):
    class CancelInsideFlow(Workflow):
        @resumable_step
        def walk(self, it):
            it.set(1)
            self.cancel()

    wf = CancelInsideFlow.create(hero=order)
    perform_next_step(wf)
    assert states(chain(wf, "walk")) == [("canceled", "canceled")]
    assert_workflow_state(wf, "canceled")

    class SkipInsideFlow(Workflow):
        @resumable_step
        def walk(self, it):
            it.set(1)
            self.skip()

        @step
        def after(self):
            pass

    wf = SkipInsideFlow.create(hero=make_order(wf.session))
    perform_next_step(wf)
    assert states(chain(wf, "walk")) == [("skipped", "skipped")]
    assert wf.next_step_name == "after"

    class FinishInsideFlow(Workflow):
        @resumable_step
        def walk(self, it):
            it.set(1)
            self.finish()

        @step
        def after(self):
            raise AssertionError("never runs")

    wf = FinishInsideFlow.create(hero=make_order(wf.session))
    perform_next_step(wf)
    assert states(chain(wf, "walk")) == [("completed", "success")]
    assert_workflow_state(wf, "finished")


def test_skip_to_with_wait_creates_a_delayed_successor(order, geneva_transport):
    seen = []

    class SkipToFlow(Workflow):
        @resumable_step
        def walk(self, it):
            seen.append((it.cursor, it.iterations))
            if it.cursor is None:
                it.skip_to(100, wait=timedelta(hours=1))
            it.set(it.cursor + 1)

    wf = SkipToFlow.create(hero=order)
    committed(wf, geneva_transport)
    perform_next_step(wf)
    first, successor = chain(wf, "walk")
    assert (first.state, first.outcome) == ("completed", "continued")
    assert first.cursor_value == 100
    assert successor.cursor_value == 100
    assert successor.continues_from_id == first.id
    delay = successor.scheduled_for - utcnow()
    assert timedelta(minutes=59) < delay <= timedelta(hours=1)
    assert geneva_transport.execution_ids == []  # beyond the dispatch horizon
    # skip_to does not count an iteration
    assert seen == [(None, 0)]
    speedrun_workflow(wf)
    assert seen == [(None, 0), (100, 0)]
    assert chain(wf, "walk")[-1].cursor_value == 101


def test_skip_to_accepts_seconds_and_a_short_wait_is_sent_with_a_countdown(order, geneva_transport):
    class ShortSkipFlow(Workflow):
        @resumable_step
        def walk(self, it):
            if it.cursor is None:
                it.skip_to("page-2", wait=30)

    wf = ShortSkipFlow.create(hero=order)
    committed(wf, geneva_transport)
    perform_next_step(wf)
    successor = wf.current_execution
    assert successor.cursor_value == "page-2"
    [message] = geneva_transport.messages
    assert message.execution_id == successor.id
    assert 25 < message.countdown <= 30


def test_suspend_with_wait_continues_from_the_cursor(order, geneva_transport):
    seen = []

    class SuspendFlow(Workflow):
        @resumable_step
        def sync(self, it):
            page = it.cursor or 1
            seen.append(page)
            while page < 4:
                page += 1
                it.set(page)
                if page == 3 and len(seen) == 1:
                    self.suspend(wait=timedelta(minutes=10))

    wf = SuspendFlow.create(hero=order)
    perform_next_step(wf)
    first, successor = chain(wf, "sync")
    assert (first.state, first.outcome) == ("completed", "continued")
    assert successor.cursor_value == 3
    assert successor.scheduled_for > utcnow() + timedelta(minutes=9)
    speedrun_workflow(wf)
    assert seen == [1, 3]
    assert chain(wf, "sync")[-1].cursor_value == 4


def test_suspend_outside_a_resumable_step_is_refused(order):
    class NoSuspendFlow(Workflow):
        @step
        def plain(self):
            self.suspend()

    wf = NoSuspendFlow.create(hero=order)
    with pytest.raises(
        InvalidStateError, match="suspend\\(\\) can only be called from inside a resumable_step"
    ):
        wf.suspend()
    with pytest.raises(InvalidStateError, match="resumable_step"):
        perform_next_step(wf)
    assert_workflow_state(wf, "paused")


# --- preconditions on continuation ---------------------------------------------------------


def test_skip_if_is_reevaluated_on_every_continuation(order):
    processed = []

    class SkipContinuationFlow(Workflow):
        @resumable_step(max_iterations=2, skip_if=lambda wf: wf.hero.status == "skip")
        def walk(self, it):
            it.iterate_over([1, 2, 3, 4, 5], processed.append)

        @step
        def after(self):
            processed.append("after")

    wf = SkipContinuationFlow.create(hero=order)
    perform_next_step(wf)
    order.status = "skip"
    wf.session.commit()
    perform_next_step(wf)
    assert processed == [1, 2]
    links = chain(wf, "walk")
    assert states(links) == [("completed", "continued"), ("skipped", "skipped")]
    assert wf.next_step_name == "after"
    speedrun_workflow(wf)
    assert processed == [1, 2, "after"]


def test_cancel_if_is_reevaluated_on_every_continuation(order):
    processed = []

    class CancelContinuationFlow(Workflow):
        cancel_if = (lambda wf: wf.hero.status == "void",)

        @resumable_step(max_iterations=2)
        def walk(self, it):
            it.iterate_over([1, 2, 3, 4, 5], processed.append)

    wf = CancelContinuationFlow.create(hero=order)
    perform_next_step(wf)
    order.status = "void"
    wf.session.commit()
    perform_next_step(wf)
    assert processed == [1, 2]
    assert states(chain(wf, "walk")) == [("completed", "continued"), ("canceled", "canceled")]
    assert_workflow_state(wf, "canceled")


# --- successors ----------------------------------------------------------------------------


def test_successor_carries_cursor_and_pin_but_not_metadata_or_the_steps_wait(order):
    class SuccessorFlow(Workflow):
        @resumable_step(wait=timedelta(hours=3), max_iterations=1)
        def walk(self, it):
            self.current_execution.merge_metadata(note="first")
            it.iterate_over([1, 2], lambda _: None)

    wf = SuccessorFlow.create(hero=order)
    first = wf.current_execution
    assert first.scheduled_for > utcnow() + timedelta(hours=2)  # the step's own wait
    first.scheduled_for = utcnow()
    wf.session.commit()
    perform_next_step(wf)
    first, successor = chain(wf, "walk")
    assert successor.step_name == "walk"
    assert successor.state == "scheduled"
    assert successor.cursor == first.cursor
    assert successor.signal_id == first.signal_id
    assert not (successor.metadata_ or {}).get("note")
    # the step's own wait is not applied to successors
    assert successor.scheduled_for <= utcnow()
    assert wf.next_step_name == "walk"


def test_create_successor_execution_sweeps_strays_and_copies_the_pin(order, geneva_transport):
    from geneva_drive import scheduling
    from geneva_drive.models import Signal

    class DirectSuccessorFlow(Workflow):
        @resumable_step
        def walk(self, it):
            pass

        @step
        def other(self):
            pass

    wf = DirectSuccessorFlow.create(hero=order)
    session = wf.session
    session.commit()
    predecessor = wf.current_execution
    signal = Signal(workflow_id=wf.id, name="go", state="claimed", claimed=1, consumed=0)
    session.add(signal)
    session.flush()
    predecessor.state = "completed"
    predecessor.outcome = "continued"
    predecessor.signal_id = signal.id
    predecessor.cursor_value = {"page": 7, "when": date(2026, 1, 2)}
    stray = scheduling.create_step_execution(
        session, wf, DirectSuccessorFlow.steps.named("other"), None
    )
    committed(wf, geneva_transport)
    scheduling.lock_workflow(session, wf)
    successor = scheduling.create_successor_execution(
        session, wf, predecessor, timedelta(seconds=5)
    )
    session.commit()
    session.refresh(stray)
    assert stray.state == "canceled"
    assert successor.continues_from_id == predecessor.id
    assert successor.cursor_value == {"page": 7, "when": date(2026, 1, 2)}
    assert successor.signal_id == signal.id
    assert wf.next_step_name == "walk"
    assert geneva_transport.execution_ids == [successor.id]
    assert 0 < geneva_transport.messages[0].countdown <= 5
    session.refresh(signal)
    assert signal.claimed == 1  # the pin is carried, no new claim


# --- cursors: serialization and the size limit ---------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        date(2026, 3, 1),
        datetime(2026, 3, 1, 12, 30, 15, 123456, tzinfo=UTC),
        uuid.UUID("12345678-1234-5678-1234-567812345678"),
        Decimal("12.3400"),
        ["2026-03-01", 5],
        {"after": datetime(2026, 3, 1, tzinfo=UTC), "id": uuid.UUID(int=7), "n": Decimal("1.5")},
        [date(2026, 1, 1), [Decimal("0.1"), None, True, 2.5, "x"]],
        "ünïcode ✓",
    ],
)
def test_cursors_round_trip_typed_values(order, value):
    seen = []

    class CursorTypesFlow(Workflow):
        @resumable_step
        def walk(self, it):
            if it.cursor is None:
                it.skip_to(value)
            seen.append(it.cursor)

    wf = CursorTypesFlow.create(hero=order)
    perform_next_step(wf)
    assert_cursor(wf, value)
    speedrun_workflow(wf)
    assert seen == [value]
    assert type(seen[0]) is type(value)
    if isinstance(value, dict):
        assert {k: type(v) for k, v in seen[0].items()} == {k: type(v) for k, v in value.items()}


def test_tuple_cursor_comes_back_as_a_list(order):
    seen = []

    class TupleCursorFlow(Workflow):
        @resumable_step
        def walk(self, it):
            if it.cursor is None:
                it.skip_to((datetime(2026, 1, 1, tzinfo=UTC), 42))
            seen.append(it.cursor)

    wf = TupleCursorFlow.create(hero=order)
    speedrun_workflow(wf)
    assert seen == [[datetime(2026, 1, 1, tzinfo=UTC), 42]]


def test_unserializable_cursor_fails_the_step_with_a_clear_message(order):
    class BadCursorFlow(Workflow):
        @resumable_step
        def walk(self, it):
            it.set(object())

    wf = BadCursorFlow.create(hero=order)
    with pytest.raises(TypeError, match="cannot be stored as JSON"):
        perform_next_step(wf)
    assert_workflow_state(wf, "paused")


def test_cursor_over_max_cursor_size_raises_with_the_gems_guidance(order):
    settings.max_cursor_size = 64
    ok = "x" * 62  # '"' + 62 + '"' = 64 bytes: equal to the limit is allowed

    class BigCursorFlow(Workflow):
        @resumable_step
        def walk(self, it):
            it.set(ok)
            it.set(ok + "y")

    wf = BigCursorFlow.create(hero=order)
    with pytest.raises(CursorTooLargeError) as raised:
        perform_next_step(wf)
    message = str(raised.value)
    assert "Serialized cursor is 65 bytes, exceeding settings.max_cursor_size (64 bytes)" in message
    assert "position marker" in message
    assert "not a place to store the data being processed" in message
    assert "max_cursor_size to None" in message
    assert_workflow_state(wf, "paused")
    failed = chain(wf, "walk")[0]
    assert failed.state == "failed"
    assert failed.error_class_name == "geneva_drive.errors.CursorTooLargeError"
    assert failed.cursor_value == ok  # the last good checkpoint is kept


def test_cursor_size_counts_utf8_bytes_and_none_disables_the_check(order):
    settings.max_cursor_size = 10

    class Utf8CursorFlow(Workflow):
        @resumable_step
        def walk(self, it):
            it.set("éééé")  # 2 quotes + 8 bytes = 10: allowed
            it.set("ééééé")  # 12 bytes

    wf = Utf8CursorFlow.create(hero=order)
    with pytest.raises(CursorTooLargeError, match="is 12 bytes"):
        perform_next_step(wf)

    settings.max_cursor_size = None

    class HugeCursorFlow(Workflow):
        @resumable_step
        def walk(self, it):
            it.set("z" * 300_000)

    other = HugeCursorFlow.create(hero=make_order(wf.session))
    perform_next_step(other)
    assert_workflow_state(other, "finished")
    assert len(chain(other, "walk")[0].cursor_value) == 300_000


def test_default_cursor_limit_is_128_kib_and_cursor_value_setter_enforces_it(order):
    assert settings.max_cursor_size == 128 * 1024
    execution = StepExecution(step_name="x", state="scheduled", scheduled_for=utcnow())
    execution.cursor_value = "a" * (128 * 1024 - 2)
    with pytest.raises(CursorTooLargeError):
        execution.cursor_value = "a" * (128 * 1024 - 1)
    execution.cursor_value = None
    assert execution.cursor is None


def test_oversized_cursor_with_a_skip_policy_skips_the_step(order):
    settings.max_cursor_size = 16

    class SkipBigCursorFlow(Workflow):
        @resumable_step(on_exception="skip")
        def walk(self, it):
            it.set("q" * 100)

        @step
        def after(self):
            pass

    wf = SkipBigCursorFlow.create(hero=order)
    with pytest.raises(CursorTooLargeError):
        perform_next_step(wf)
    assert states(chain(wf, "walk")) == [("skipped", "skipped")]
    assert wf.next_step_name == "after"


def test_checkpoints_commit_the_steps_work_with_the_cursor(order):
    holder = {}

    class CommitFlow(Workflow):
        @resumable_step
        def walk(self, it):
            def work(item):
                if item == 3:
                    # what another connection sees mid-step: item 2's write, with cursor 2
                    holder["seen"] = with_other_session(
                        holder["wf"],
                        lambda w: (w.hero.status, w.current_execution.cursor_value),
                    )
                self.hero.status = f"item-{item}"
                if item == 3:
                    raise RuntimeError("crash")

            it.iterate_over([1, 2, 3], work)

    wf = CommitFlow.create(hero=order)
    holder["id"] = order.id
    holder["wf"] = wf.id
    with pytest.raises(RuntimeError):
        perform_next_step(wf)
    other = db.SessionFactory()
    try:
        stored = other.get(Order, holder["id"])
        cursor = other.scalar(
            select(StepExecution.cursor).where(StepExecution.workflow_id == wf.id)
        )
    finally:
        other.close()
    assert holder["seen"] == ("item-2", 2)
    assert cursor == 2
    # the failing item's own write rolls back with the failed attempt, as for any step body
    # (writes commit with a success or a checkpoint); item 2's checkpoint stays
    assert stored.status == "item-2"


def test_iterable_step_is_exported():
    import geneva_drive

    assert geneva_drive.IterableStep is IterableStep


def test_a_stale_pause_marker_of_a_skipped_step_does_not_hijack_a_later_resume(order):
    """Deliberate deviation from a quirk of the gem's resume: the marker search is
    limited to the step the workflow is on, so a skipped step is not continued later."""
    processed = []
    fail_after = {"n": 1}
    paused = {"done": False}

    class StaleMarkerFlow(Workflow):
        @resumable_step
        def walk(self, it):
            def work(item):
                if item == 2 and not paused["done"]:
                    paused["done"] = True
                    self.pause()
                processed.append(item)

            it.iterate_over([1, 2, 3], work)

        @step
        def after(self):
            processed.append("after")
            if fail_after["n"]:
                fail_after["n"] -= 1
                raise RuntimeError("after failed")

    wf = StaleMarkerFlow.create(hero=order)
    perform_next_step(wf)
    assert_workflow_state(wf, "paused")
    assert processed == [1]
    assert chain(wf, "walk")[0].outcome == "workflow_paused"
    wf.skip()  # operator: skip the paused resumable step altogether
    wf.session.commit()
    assert wf.next_step_name == "after"
    with pytest.raises(RuntimeError, match="after failed"):
        perform_next_step(wf)
    assert_workflow_state(wf, "paused")
    retry = wf.resume()
    assert retry.step_name == "after"
    assert retry.continues_from_id is None
    speedrun_workflow(wf)
    assert processed == [1, "after", "after"]
    assert_workflow_state(wf, "finished")


def test_out_of_band_pause_after_the_last_checkpoint_does_not_restart_the_iteration(order):
    """The operator pauses while the step finishes its last item: the gem cannot get here
    (it pauses only ready workflows); we keep the cursor so resume does not redo the work."""
    processed = []
    holder = {}

    class PausedAtTheEndFlow(Workflow):
        @resumable_step
        def walk(self, it):
            it.iterate_over([1, 2, 3], processed.append)
            if not holder.get("paused"):
                holder["paused"] = True
                with_other_session(holder["id"], lambda w: w.pause())

        @step
        def after(self):
            processed.append("after")

    wf = PausedAtTheEndFlow.create(hero=order)
    holder["id"] = wf.id
    first = perform_next_step(wf)
    assert_workflow_state(wf, "paused")
    wf.session.refresh(first)
    assert (first.state, first.outcome) == ("completed", "workflow_paused")
    assert first.cursor_value == 3
    successor = wf.resume()
    assert successor.continues_from_id == first.id
    speedrun_workflow(wf)
    assert processed == [1, 2, 3, "after"]
    assert_workflow_state(wf, "finished")


def test_a_stuck_resumable_step_recovered_while_paused_resumes_from_its_cursor(order):
    from geneva_drive import housekeeping

    processed = []

    class CrashWhilePausedFlow(Workflow):
        @resumable_step
        def walk(self, it):
            it.iterate_over(["a", "b", "c", "d"], processed.append)

    wf = CrashWhilePausedFlow.create(hero=order)
    run_iterations(wf, 2)  # a, b; cursor 2 in the successor
    assert processed == ["a", "b"]
    successor = wf.current_execution
    # the worker running the successor died after one more checkpoint; then an operator paused
    session = wf.session
    successor.state = "in_progress"
    successor.started_at = utcnow() - timedelta(hours=3)
    successor.cursor_value = 3
    processed.append("c")
    wf.state = "paused"
    session.commit()
    assert housekeeping.recover_execution(successor.id) is True
    session.refresh(successor)
    assert (successor.state, successor.outcome) == ("completed", "recovered")
    assert_workflow_state(wf, "paused")
    continued = wf.resume()
    assert continued.continues_from_id == successor.id
    assert continued.cursor_value == 3
    speedrun_workflow(wf)
    assert processed == ["a", "b", "c", "d"]


def test_a_checkpoint_whose_commit_fails_is_handled_by_the_policy(order):
    """The checkpoint commits the step's own writes with the cursor; when that commit fails
    (here a duplicate primary key), the step fails like any exception instead of leaving the
    execution stuck in_progress."""
    from sqlalchemy.exc import IntegrityError

    taken = Order_for_id(order)

    class BadWriteFlow(Workflow):
        @resumable_step
        def walk(self, it):
            def work(item):
                if item == 2:
                    self.session.add(Order(id=taken))  # a primary key that is already used

            it.iterate_over([1, 2, 3], work)

    wf = BadWriteFlow.create(hero=order)
    with pytest.raises(IntegrityError):
        perform_next_step(wf)
    [execution] = chain(wf, "walk")
    assert (execution.state, execution.outcome) == ("failed", "failed")
    assert execution.cursor_value == 1  # the last checkpoint that committed
    assert_workflow_state(wf, "paused")


def test_reattempt_policy_cap_then_pause_keeps_the_cursor(order):
    processed = []
    broken = {"on": True}

    class CappedFlow(Workflow):
        @resumable_step(on_exception="reattempt", max_reattempts=2)
        def walk(self, it):
            def work(item):
                processed.append(item)
                if item == "c" and broken["on"]:
                    raise TimeoutError("still down")

            it.iterate_over(["a", "b", "c", "d"], work)

    wf = CappedFlow.create(hero=order)
    for _ in range(3):
        with pytest.raises(TimeoutError):
            perform_next_step(wf)
    links = chain(wf, "walk")
    assert [(e.state, e.outcome) for e in links] == [
        ("completed", "reattempted"),
        ("completed", "reattempted"),
        ("failed", "failed"),
    ]
    assert [e.cursor_value for e in links] == [2, 2, 2]
    assert_workflow_state(wf, "paused")
    broken["on"] = False
    wf.resume()
    speedrun_workflow(wf)
    assert processed == ["a", "b", "c", "c", "c", "c", "d"]
    assert_workflow_state(wf, "finished")


def test_a_resumable_step_failing_after_an_operator_pause_keeps_error_and_cursor(order):
    processed = []
    holder = {"fail": True}

    class FailAfterPauseFlow(Workflow):
        @resumable_step
        def walk(self, it):
            def work(item):
                processed.append(item)
                if item == "c" and holder["fail"]:
                    holder["fail"] = False
                    with_other_session(holder["id"], lambda w: w.pause())
                    raise RuntimeError("broke right after the pause")

            it.iterate_over(["a", "b", "c", "d"], work)

    wf = FailAfterPauseFlow.create(hero=order)
    holder["id"] = wf.id
    first = perform_next_step(wf)
    assert_workflow_state(wf, "paused")
    wf.session.refresh(first)
    assert (first.state, first.outcome) == ("failed", "failed")
    assert first.error_message == "broke right after the pause"
    assert first.cursor_value == 2
    successor = wf.resume()
    assert successor.continues_from_id == first.id
    speedrun_workflow(wf)
    assert processed == ["a", "b", "c", "c", "d"]
