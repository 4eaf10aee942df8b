"""Signals: the receiver side - wait_for, the gate, waking, consumption and the helpers
(docs/MANUAL.md, "Signals and webhooks", "Testing waiting steps")."""

from __future__ import annotations

from datetime import date, datetime, timedelta

import pytest
from sqlalchemy import select

from geneva_drive import (
    ExceptionPolicy,
    SignalMatcher,
    Workflow,
    db,
    removed_step,
    resumable_step,
    step,
)
from geneva_drive.errors import StepConfigurationError
from geneva_drive.models import Signal, StepExecution, utcnow
from geneva_drive.testing import (
    assert_signal_state,
    assert_waiting_for_signal,
    perform_next_step,
    perform_step_inline,
    run_iterations,
    speedrun_current_step,
    speedrun_workflow,
)
from geneva_drive.workflow import unregister
from tests.conftest import Order
from tests.engine.helpers import make_order


def executions(wf, name=None):
    return [e for e in wf.execution_history if name is None or e.step_name == name]


def reload(session, obj):
    session.commit()
    session.refresh(obj)
    return obj


# --- wait_for / wait validation (both ways) ------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [timedelta(days=2), 7200, 1.5, datetime(2026, 1, 1), date(2026, 1, 1)],
)
def test_wait_for_refuses_durations(value):
    with pytest.raises(StepConfigurationError) as raised:

        class DurationWaitForFlow(Workflow):
            @step(wait_for=value)
            def capture(self):
                pass

    message = str(raised.value)
    assert "Step 'capture'" in message
    assert f"wait_for={value!r}" in message
    assert "to delay the step, use wait=" in message


@pytest.mark.parametrize("value", [object(), ["go"], 0j])
def test_wait_for_refuses_other_objects(value):
    with pytest.raises(StepConfigurationError, match=r"invalid wait_for=.*matches\(signal\)"):

        class BadWaitForFlow(Workflow):
            @step(wait_for=value)
            def capture(self):
                pass


@pytest.mark.parametrize("value", ["payment_confirmed", "7200", SignalMatcher("x")])
def test_wait_refuses_signal_shaped_values(value):
    with pytest.raises(StepConfigurationError) as raised:

        class SignalWaitFlow(Workflow):
            @step(wait=value)
            def capture(self):
                pass

    assert "wait= takes a duration; to wait for a signal, use wait_for=" in str(raised.value)


def test_wait_must_be_non_negative_and_a_bad_wait_is_reported_before_a_bad_wait_for():
    with pytest.raises(StepConfigurationError, match="invalid wait value: must be non-negative"):

        class NegativeWaitFlow(Workflow):
            @step(wait=-5)
            def capture(self):
                pass

    with pytest.raises(StepConfigurationError, match="wait= takes a duration"):

        class BothBadFlow(Workflow):
            @step(wait="soon", wait_for=timedelta(days=1))
            def capture(self):
                pass


def test_wait_for_forms_are_normalized_or_kept():
    matcher = SignalMatcher("approved", where=lambda wf, p: True)

    class Custom:
        def matches(self, signal):
            return True

    custom = Custom()

    class FormsFlow(Workflow):
        @step(wait_for="go")
        def by_name(self):
            pass

        @step(wait_for=matcher)
        def by_matcher(self):
            pass

        @step(wait_for=custom, wait=timedelta(hours=1))
        def by_object(self):
            pass

        @resumable_step(wait_for="bulk")
        def resumable(self, it):
            pass

        @step
        def plain(self):
            pass

    steps = FormsFlow.steps
    assert isinstance(steps.named("by_name").signal_matcher, SignalMatcher)
    assert steps.named("by_name").signal_matcher.name == "go"
    assert steps.named("by_matcher").signal_matcher is matcher
    assert steps.named("by_object").signal_matcher is custom
    assert steps.named("by_object").wait == timedelta(hours=1)
    assert steps.named("resumable").resumable and steps.named("resumable").waits_for_signal
    assert not steps.named("plain").waits_for_signal
    assert steps.named("plain").signal_matcher is None


# --- parking and waking ---------------------------------------------------------------------


class ConfirmFlow(Workflow):
    @step
    def authorize(self):
        pass

    @step(wait_for="payment_confirmed")
    def capture(self):
        signal = self.received_signal
        self.hero.status = f"captured {signal.payload['amount_cents']} via #{signal.id}"

    @step
    def receipt(self):
        assert self.received_signal is None


def test_a_step_parks_when_no_signal_is_there(order, geneva_session, geneva_transport):
    wf = ConfirmFlow.create(hero=order)
    perform_next_step(wf)  # authorize
    geneva_transport.clear()
    before = utcnow()
    execution = perform_next_step(wf)  # capture parks
    reload(geneva_session, execution)
    assert execution.state == "waiting"
    assert execution.waiting_since is not None and execution.waiting_since >= before
    assert execution.signal_id is None
    assert execution.started_at is None
    assert wf.state == "ready"
    assert wf.current_step_name is None
    assert geneva_transport.messages == []  # nothing is sent for a parked execution
    assert_waiting_for_signal(wf)
    assert_waiting_for_signal(wf, "payment_confirmed")
    with pytest.raises(
        AssertionError,
        match="Expected step 'capture' to be waiting for 'other', but it waits for "
        "payment_confirmed",
    ):
        assert_waiting_for_signal(wf, "other")


def test_delivery_wakes_the_parked_execution(order, geneva_session, geneva_transport):
    wf = ConfirmFlow.create(hero=order)
    perform_next_step(wf)
    execution = perform_next_step(wf)
    geneva_transport.clear()
    signal = wf.signal("payment_confirmed", payload={"amount_cents": 1250})
    assert geneva_transport.messages == []  # not before the commit
    geneva_session.commit()
    reload(geneva_session, execution)
    assert execution.state == "scheduled"
    assert execution.signal_id == signal.id
    assert execution.waiting_since is None
    assert abs((execution.scheduled_for - utcnow()).total_seconds()) < 30
    [message] = geneva_transport.messages
    assert message.execution_id == execution.id
    assert message.job_id == execution.job_id
    assert message.countdown is None
    reload(geneva_session, signal)
    assert signal.state == "claimed"
    assert (signal.claimed, signal.consumed) == (1, 0)
    claimed_at = signal.claimed_at
    assert claimed_at is not None

    speedrun_workflow(wf)
    assert wf.state == "finished"
    assert order.status == f"captured 1250 via #{signal.id}"
    reload(geneva_session, signal)
    assert signal.state == "consumed"
    assert (signal.claimed, signal.consumed) == (1, 1)
    assert signal.claimed_at == claimed_at
    assert signal.consumed_at is not None
    assert_signal_state(wf, "payment_confirmed", "consumed")


def test_a_signal_that_arrives_first_is_attached_at_the_gate_oldest_first(order, geneva_session):
    wf = ConfirmFlow.create(hero=order)
    older = wf.signal("payment_confirmed", payload={"amount_cents": 1})
    newer = wf.signal("payment_confirmed", payload={"amount_cents": 2})
    assert older.state == newer.state == "pending"
    speedrun_workflow(wf)
    assert order.status == f"captured 1 via #{older.id}"
    reload(geneva_session, older)
    reload(geneva_session, newer)
    assert older.state == "consumed"
    # the second matching signal is not consumed by the step
    assert newer.state == "pending"
    assert (newer.claimed, newer.consumed) == (0, 0)
    assert_signal_state(wf, "payment_confirmed", "pending")  # the latest one


def test_a_non_matching_signal_leaves_the_execution_parked(order, geneva_session):
    wf = ConfirmFlow.create(hero=order)
    perform_next_step(wf)
    execution = perform_next_step(wf)
    other = wf.signal("payment_failed")
    reload(geneva_session, execution)
    assert execution.state == "waiting"
    assert reload(geneva_session, other).state == "pending"


def test_a_job_for_a_parked_execution_is_a_no_op(order, geneva_session):
    from geneva_drive import executor

    wf = ConfirmFlow.create(hero=order)
    perform_next_step(wf)
    execution = perform_next_step(wf)
    geneva_session.commit()
    executor.execute(execution.id)  # a duplicate message, in its own session
    reload(geneva_session, execution)
    assert execution.state == "waiting"


def test_wait_and_wait_for_compose(order, geneva_session, geneva_transport):
    class DelayedConfirmFlow(Workflow):
        @step(wait=timedelta(hours=1), wait_for="go")
        def later(self):
            self.hero.status = "ran"

    wf = DelayedConfirmFlow.create(hero=order)
    execution = wf.current_execution
    assert execution.scheduled_for > utcnow() + timedelta(minutes=59)
    signal = wf.signal("go")
    geneva_session.commit()
    reload(geneva_session, execution)
    assert execution.state == "scheduled"
    assert execution.signal_id is None  # buffered: nothing is parked yet
    assert reload(geneva_session, signal).state == "pending"
    assert execution.scheduled_for > utcnow() + timedelta(minutes=59)
    speedrun_workflow(wf)
    assert order.status == "ran"
    assert reload(geneva_session, signal).state == "consumed"


# --- matchers at the gate and at dispatch --------------------------------------------------


def test_signal_matcher_where_sees_the_live_workflow_and_the_payload(order, geneva_session):
    seen = []
    bodies = []

    def big_enough(workflow, payload):
        seen.append((workflow, dict(payload)))
        return payload["amount"] >= 100

    class ThresholdFlow(Workflow):
        @step(wait_for=SignalMatcher("paid", where=big_enough))
        def ship(self):
            bodies.append(self)
            self.hero.status = f"shipped {self.received_signal.payload['amount']}"

    wf = ThresholdFlow.create(hero=order)
    small = wf.signal("paid", payload={"amount": 5})
    assert seen == []  # nothing parked: nothing to match at dispatch
    perform_next_step(wf)
    assert wf.current_execution.state == "waiting"  # the small payment does not match
    assert seen[-1][1] == {"amount": 5}
    big = wf.signal("paid", payload={"amount": 150})
    assert seen[-1] == (wf, {"amount": 150})
    assert seen[-1][0] is wf  # at dispatch: the very object signal() was called on
    speedrun_workflow(wf)
    assert order.status == "shipped 150"
    assert reload(geneva_session, small).state == "pending"
    assert reload(geneva_session, big).state == "consumed"

    # at the gate: the executor's live instance, the same object the step body runs on
    seen.clear()
    again = ThresholdFlow.create(hero=make_order(geneva_session))
    again.signal("paid", payload={"amount": 500})
    speedrun_workflow(again)
    assert len(bodies) == 2
    assert seen[-1][1] == {"amount": 500}
    assert seen[-1][0] is bodies[-1]


def test_a_custom_matcher_object_owns_the_whole_predicate(order, geneva_session):
    class EitherOf:
        """Accepts either of two names (no `name` attribute)."""

        def __init__(self, *names):
            self.names = names
            self.workflows = []

        def matches(self, signal):
            self.workflows.append(signal.workflow)
            return signal.name in self.names

        def __str__(self):
            return " or ".join(self.names)

    either = EitherOf("approved", "auto_approved")

    class EitherFlow(Workflow):
        @step(wait_for=either)
        def proceed(self):
            self.hero.status = self.received_signal.name

    wf = EitherFlow.create(hero=order)
    perform_next_step(wf)
    assert_waiting_for_signal(wf)
    with pytest.raises(AssertionError, match="waits for approved or auto_approved"):
        assert_waiting_for_signal(wf, "approved")
    wf.signal("rejected")
    assert wf.current_execution.state == "waiting"
    wf.signal("auto_approved")
    speedrun_workflow(wf)
    assert order.status == "auto_approved"
    assert all(w is wf for w in either.workflows)


def test_a_matcher_raising_at_the_gate_fails_the_step_and_pauses(order, geneva_session):
    class Broken:
        name = "go"

        def matches(self, signal):
            raise KeyError("matcher bug")

    class BrokenGateFlow(Workflow):
        @step(wait_for=Broken())
        def guarded(self):
            raise AssertionError("the body never runs")

    wf = BrokenGateFlow.create(hero=order)
    signal = wf.signal("go")
    with pytest.raises(KeyError, match="matcher bug"):
        perform_next_step(wf)
    [execution] = executions(wf)
    assert (execution.state, execution.outcome) == ("failed", "failed")
    assert execution.error_class_name == "KeyError"
    assert wf.state == "paused"
    assert reload(geneva_session, signal).state == "pending"


# --- preconditions on wake ------------------------------------------------------------------


def test_skip_if_is_reevaluated_on_wake_and_settles_the_signal(order, geneva_session):
    class SkipOnWakeFlow(Workflow):
        @step(wait_for="go", skip_if=lambda wf: wf.hero.status == "skip")
        def guarded(self):
            raise AssertionError("skipped, never runs")

        @step
        def after(self):
            pass

    wf = SkipOnWakeFlow.create(hero=order)
    perform_next_step(wf)
    order.status = "skip"
    signal = wf.signal("go")
    speedrun_workflow(wf)
    [guarded] = executions(wf, "guarded")[-1:]
    assert (guarded.state, guarded.outcome) == ("skipped", "skipped")
    reload(geneva_session, signal)
    assert signal.state == "consumed"
    assert (signal.claimed, signal.consumed) == (1, 1)
    assert wf.state == "finished"


def test_skip_beats_wait(order, geneva_session):
    class SkipBeatsWaitFlow(Workflow):
        @step(wait_for="go", skip_if=True)
        def guarded(self):
            pass

        @step
        def after(self):
            pass

    wf = SkipBeatsWaitFlow.create(hero=order)
    buffered = wf.signal("go")
    perform_next_step(wf)
    [guarded] = executions(wf, "guarded")
    assert guarded.state == "skipped"
    assert guarded.signal_id is None  # never parked, never attached
    reload(geneva_session, buffered)
    assert buffered.state == "pending"
    assert (buffered.claimed, buffered.consumed) == (0, 0)


def test_cancel_if_is_reevaluated_on_wake_and_leaves_the_signal_claimed(order, geneva_session):
    class CancelOnWakeFlow(Workflow):
        cancel_if = "voided"

        @step(wait_for="go")
        def guarded(self):
            raise AssertionError("never runs")

        def voided(self):
            return self.hero.status == "void"

    wf = CancelOnWakeFlow.create(hero=order)
    perform_next_step(wf)
    order.status = "void"
    signal = wf.signal("go")
    perform_next_step(wf)
    assert wf.state == "canceled"
    assert executions(wf)[-1].state == "canceled"
    assert reload(geneva_session, signal).state == "claimed"


# --- received_signal -------------------------------------------------------------------------


def test_received_signal_is_scoped_to_the_step_body(order, geneva_session):
    seen = {}

    class ScopeFlow(Workflow):
        @step(wait_for="go")
        def waits(self):
            seen["waits"] = self.received_signal

        @step
        def plain(self):
            seen["plain"] = self.received_signal

        def after_step_execution(self, execution):
            seen.setdefault("hook", []).append(self.received_signal)

    wf = ScopeFlow.create(hero=order)
    signal = wf.signal("go", payload={"p": 1})
    speedrun_workflow(wf)
    assert seen["waits"].id == signal.id
    assert seen["waits"].payload == {"p": 1}
    assert seen["plain"] is None
    assert [s.id if s else None for s in seen["hook"]] == [signal.id, None]
    assert wf.received_signal is None


def test_received_signal_is_stable_across_reattempts(order, geneva_session):
    seen = []

    class ReattemptSignalFlow(Workflow):
        @step(wait_for="go", on_exception="reattempt", max_reattempts=3)
        def flaky(self):
            seen.append((self.received_signal.id, self.received_signal.payload["n"]))
            if len(seen) < 3:
                raise TimeoutError("flaky")

    wf = ReattemptSignalFlow.create(hero=order)
    signal = wf.signal("go", payload={"n": 7})
    wf.signal("go", payload={"n": 8})  # a newer one must not be picked by the retries
    for _ in range(2):
        with pytest.raises(TimeoutError):
            perform_next_step(wf)
        assert reload(geneva_session, signal).state == "claimed"
    perform_next_step(wf)
    assert seen == [(signal.id, 7)] * 3
    reload(geneva_session, signal)
    # three fresh executions re-attached the same claimed signal; one clean resolution
    assert (signal.claimed, signal.consumed) == (3, 1)
    assert signal.state == "consumed"


def test_failed_then_resumed_counts_two_claims_one_consumption(order, geneva_session):
    fail = {"n": 1}

    class FailOnceFlow(Workflow):
        @step(wait_for="go")
        def fragile(self):
            if fail["n"]:
                fail["n"] -= 1
                raise RuntimeError("fragile")

    wf = FailOnceFlow.create(hero=order)
    perform_next_step(wf)
    signal = wf.signal("go")
    with pytest.raises(RuntimeError):
        perform_next_step(wf)
    assert wf.state == "paused"
    reload(geneva_session, signal)
    assert signal.state == "claimed"  # a failure leaves it claimed
    claimed_at = signal.claimed_at
    wf.resume()
    speedrun_workflow(wf)
    reload(geneva_session, signal)
    assert (signal.claimed, signal.consumed) == (2, 1)
    assert signal.state == "consumed"
    assert signal.claimed_at == claimed_at


def test_a_resumable_chain_claims_once_and_consumes_once(order, geneva_session):
    seen = []

    class ResumableSignalFlow(Workflow):
        @resumable_step(wait_for="batch_ready", max_iterations=2)
        def process(self, it):
            seen.append(self.received_signal.id)
            it.iterate_over(self.received_signal.payload["items"], lambda _: None)

    wf = ResumableSignalFlow.create(hero=order)
    perform_next_step(wf)
    assert_waiting_for_signal(wf, "batch_ready")
    signal = wf.signal("batch_ready", payload={"items": [1, 2, 3, 4, 5]})
    for _ in range(3):
        perform_next_step(wf)
    chain = executions(wf, "process")
    # the parked execution itself was woken, then continued twice
    assert [(e.state, e.outcome) for e in chain] == [
        ("completed", "continued"),
        ("completed", "continued"),
        ("completed", "success"),
    ]
    assert all(e.signal_id == signal.id for e in chain)
    assert seen == [signal.id] * 3
    reload(geneva_session, signal)
    assert (signal.claimed, signal.consumed) == (1, 1)
    assert signal.state == "consumed"
    assert wf.state == "finished"


def test_two_steps_waiting_on_one_name_need_two_signals(order, geneva_session):
    class TwiceFlow(Workflow):
        @step(wait_for="tick")
        def one(self):
            pass

        @step(wait_for="tick")
        def two(self):
            pass

    wf = TwiceFlow.create(hero=order)
    first = wf.signal("tick")
    perform_next_step(wf)
    perform_next_step(wf)
    assert_waiting_for_signal(wf, "tick")
    assert executions(wf, "two")[0].state == "waiting"
    assert reload(geneva_session, first).state == "consumed"
    second = wf.signal("tick")
    speedrun_workflow(wf)
    assert wf.state == "finished"
    assert reload(geneva_session, second).state == "consumed"


# --- settling on every kind of skip; claims kept on failure, pause, cancel -------------------


def test_skip_inside_the_step_settles(order, geneva_session):
    class SkipInsideFlow(Workflow):
        @step(wait_for="go")
        def s(self):
            self.skip()

    wf = SkipInsideFlow.create(hero=order)
    signal = wf.signal("go")
    speedrun_workflow(wf)
    assert reload(geneva_session, signal).state == "consumed"


def test_finish_inside_the_step_settles(order, geneva_session):
    class FinishInsideFlow(Workflow):
        @step(wait_for="go")
        def s(self):
            self.finish()

        @step
        def never(self):
            raise AssertionError

    wf = FinishInsideFlow.create(hero=order)
    signal = wf.signal("go")
    speedrun_workflow(wf)
    assert wf.state == "finished"
    assert reload(geneva_session, signal).state == "consumed"


def test_a_skip_policy_settles(order, geneva_session):
    class SkipPolicyFlow(Workflow):
        @step(wait_for="go", on_exception="skip")
        def s(self):
            raise ValueError("skip me")

        @step
        def after(self):
            pass

    wf = SkipPolicyFlow.create(hero=order)
    signal = wf.signal("go")
    with pytest.raises(ValueError):
        perform_next_step(wf)
    assert executions(wf, "s")[0].state == "skipped"
    assert reload(geneva_session, signal).state == "consumed"


def test_a_finished_policy_settles(order, geneva_session):
    class FinishPolicyFlow(Workflow):
        exception_policies = (
            ExceptionPolicy(handler=lambda wf, error: wf.finish(), matching=ValueError),
        )

        @step(wait_for="go")
        def s(self):
            raise ValueError("done anyway")

    wf = FinishPolicyFlow.create(hero=order)
    signal = wf.signal("go")
    with pytest.raises(ValueError):
        perform_next_step(wf)
    assert wf.state == "finished"
    assert reload(geneva_session, signal).state == "consumed"


@pytest.mark.parametrize("action", ["pause", "cancel", "reattempt"])
def test_pause_cancel_and_reattempt_inside_leave_the_signal_claimed(order, geneva_session, action):
    class KeepClaimFlow(Workflow):
        @step(wait_for="go")
        def s(self):
            getattr(self, action)()

    wf = KeepClaimFlow.create(hero=order)
    signal = wf.signal("go")
    perform_next_step(wf)
    reload(geneva_session, signal)
    assert signal.state == "claimed"
    assert (signal.claimed, signal.consumed) == (1, 0)


def test_operator_skip_of_a_dispatched_execution_settles(order, geneva_session):
    class OperatorSkipFlow(Workflow):
        @step(wait_for="go")
        def s(self):
            raise AssertionError("skipped before it ran")

        @step
        def after(self):
            pass

    wf = OperatorSkipFlow.create(hero=order)
    perform_next_step(wf)
    signal = wf.signal("go")  # wakes: scheduled and pinned, not run yet
    geneva_session.commit()
    wf.skip()
    geneva_session.commit()
    [s] = executions(wf, "s")
    assert (s.state, s.outcome) == ("skipped", "skipped")
    assert reload(geneva_session, signal).state == "consumed"
    assert wf.next_step_name == "after"


def test_operator_skip_on_a_paused_workflow_settles_the_failed_claim(order, geneva_session):
    class PausedSkipFlow(Workflow):
        @step(wait_for="go")
        def s(self):
            raise RuntimeError("broken")

        @step
        def after(self):
            pass

    wf = PausedSkipFlow.create(hero=order)
    signal = wf.signal("go")
    with pytest.raises(RuntimeError):
        perform_next_step(wf)
    assert wf.state == "paused"
    assert reload(geneva_session, signal).state == "claimed"
    wf.skip()
    geneva_session.commit()
    assert reload(geneva_session, signal).state == "consumed"
    assert wf.state == "ready"
    speedrun_workflow(wf)
    assert wf.state == "finished"


def test_operator_skip_frees_a_parked_workflow(order, geneva_session):
    wf = ConfirmFlow.create(hero=order)
    perform_next_step(wf)
    parked = perform_next_step(wf)
    wf.skip()
    geneva_session.commit()
    reload(geneva_session, parked)
    assert (parked.state, parked.outcome) == ("skipped", "skipped")
    assert wf.next_step_name == "receipt"
    speedrun_workflow(wf)
    assert wf.state == "finished"


def test_operator_cancel_frees_a_parked_workflow_and_keeps_a_claim(order, geneva_session):
    wf = ConfirmFlow.create(hero=order)
    perform_next_step(wf)
    parked = perform_next_step(wf)
    wf.cancel()
    geneva_session.commit()
    assert reload(geneva_session, parked).state == "canceled"
    assert wf.state == "canceled"

    other = ConfirmFlow.create(hero=make_order(geneva_session))
    perform_next_step(other)
    perform_next_step(other)
    signal = other.signal("payment_confirmed", payload={"amount_cents": 1})
    geneva_session.commit()
    other.cancel()
    geneva_session.commit()
    assert reload(geneva_session, signal).state == "claimed"


def test_pause_keeps_a_parked_execution_waiting(order, geneva_session, geneva_transport):
    wf = ConfirmFlow.create(hero=order)
    perform_next_step(wf)
    parked = perform_next_step(wf)
    wf.pause()
    geneva_session.commit()
    assert reload(geneva_session, parked).state == "waiting"


def test_paused_between_dispatch_and_run_then_resume_reattaches(order, geneva_session):
    wf = ConfirmFlow.create(hero=order)
    perform_next_step(wf)
    parked = perform_next_step(wf)
    signal = wf.signal("payment_confirmed", payload={"amount_cents": 3})
    geneva_session.commit()
    wf.pause()
    geneva_session.commit()
    from geneva_drive import executor

    executor.execute(parked.id)  # the woken job fires while paused
    reload(geneva_session, parked)
    assert (parked.state, parked.outcome) == ("canceled", "canceled")
    assert reload(geneva_session, signal).state == "claimed"
    fresh = wf.resume()
    geneva_session.commit()
    assert fresh.id != parked.id
    assert fresh.signal_id is None  # the gate re-attaches it
    speedrun_workflow(wf)
    reload(geneva_session, signal)
    assert (signal.claimed, signal.consumed) == (2, 1)
    assert signal.state == "consumed"
    assert order.status == f"captured 3 via #{signal.id}"


def test_rescheduling_past_a_parked_execution_sweeps_it(order, geneva_session):
    wf = ConfirmFlow.create(hero=order)
    perform_next_step(wf)
    parked = perform_next_step(wf)
    inline = perform_step_inline(wf, "receipt")
    assert inline.state == "completed"
    assert reload(geneva_session, parked).state == "canceled"


def test_a_woken_execution_of_a_removed_step_is_skipped_and_settles(order, geneva_session):
    class RemovedLaterFlow(Workflow):
        @step(wait_for="go")
        def gone(self):
            raise AssertionError("removed")

        @step
        def after(self):
            pass

    wf = RemovedLaterFlow.create(hero=order)
    perform_next_step(wf)
    signal = wf.signal("go")
    geneva_session.commit()
    workflow_id = wf.id

    class RemovedLaterFlow(Workflow):  # the next deploy removes the step
        gone = removed_step()

        @step
        def after(self):
            pass

    geneva_session.expunge_all()
    wf = geneva_session.get(Workflow, workflow_id)
    assert type(wf) is RemovedLaterFlow
    perform_next_step(wf)
    gone = executions(wf, "gone")[0]
    assert (gone.state, gone.outcome) == ("skipped", "skipped")
    assert reload(geneva_session, geneva_session.get(Signal, signal.id)).state == "consumed"
    assert wf.next_step_name == "after"


def test_resume_releases_a_parked_execution_of_a_removed_step(order, geneva_session):
    class ReleaseFlow(Workflow):
        @step(wait_for="go")
        def gone(self):
            pass

        @step
        def after(self):
            pass

    wf = ReleaseFlow.create(hero=order)
    perform_next_step(wf)
    wf.pause()
    geneva_session.commit()
    workflow_id = wf.id

    class ReleaseFlow(Workflow):  # the step was removed meanwhile
        gone = removed_step()

        @step
        def after(self):
            pass

    geneva_session.expunge_all()
    wf = geneva_session.get(Workflow, workflow_id)
    wf.resume()
    geneva_session.commit()
    gone = executions(wf, "gone")[0]
    assert (gone.state, gone.outcome) == ("skipped", "skipped")
    assert wf.next_step_name == "after"
    assert wf.current_execution.step_name == "after"


# --- the helpers refuse to spin on a parked execution ---------------------------------------


@pytest.mark.parametrize(
    "helper",
    [perform_next_step, speedrun_workflow, speedrun_current_step],
    ids=lambda h: h.__name__,
)
def test_step_driving_helpers_refuse_a_parked_execution(order, geneva_session, helper):
    wf = ConfirmFlow.create(hero=order)
    perform_next_step(wf)
    perform_next_step(wf)
    with pytest.raises(RuntimeError) as raised:
        helper(wf)
    message = str(raised.value)
    assert "parked" in message
    assert "payment_confirmed" in message
    assert message.startswith(f"{helper.__name__} cannot drive step 'capture'")
    assert "workflow.signal('payment_confirmed')" in message


def test_a_step_that_parks_during_perform_next_step_does_not_raise(order, geneva_session):
    wf = ConfirmFlow.create(hero=order)
    perform_next_step(wf)
    execution = perform_next_step(wf)
    assert execution.step_name == "capture"


def test_run_iterations_does_not_check_for_parking(order, geneva_session):
    wf = ConfirmFlow.create(hero=order)
    perform_next_step(wf)
    perform_next_step(wf)
    ran = run_iterations(wf, 1)
    assert ran.state == "waiting"


def test_assert_waiting_for_signal_and_assert_signal_state_messages(order, geneva_session):
    wf = ConfirmFlow.create(hero=order)
    with pytest.raises(
        AssertionError,
        match="Expected ConfirmFlow to be waiting for a signal, but no parked step execution "
        "was found \\(current execution: 'scheduled'\\)",
    ):
        assert_waiting_for_signal(wf)
    with pytest.raises(
        AssertionError, match="Expected a 'payment_confirmed' signal on ConfirmFlow, but none"
    ):
        assert_signal_state(wf, "payment_confirmed", "pending")
    wf.signal("payment_confirmed", payload={"amount_cents": 1})
    assert_signal_state(wf, "payment_confirmed", "pending")
    with pytest.raises(
        AssertionError, match="Expected signal 'payment_confirmed' to be consumed, but was pending"
    ):
        assert_signal_state(wf, "payment_confirmed", "consumed")
    speedrun_workflow(wf)
    with pytest.raises(AssertionError, match="current execution: nil"):
        assert_waiting_for_signal(wf)


def test_waiting_rows_are_what_the_dashboard_counts(order, geneva_session):
    wf = ConfirmFlow.create(hero=order)
    perform_next_step(wf)
    perform_next_step(wf)
    other = db.SessionFactory()
    try:
        waiting = other.scalars(select(StepExecution).where(StepExecution.state == "waiting")).all()
    finally:
        other.close()
    assert [(e.workflow_id, e.step_name) for e in waiting] == [(wf.id, "capture")]


def test_signals_of_an_unregistered_workflow_do_not_wake(order, geneva_session):
    class ForgottenFlow(Workflow):
        @step(wait_for="go")
        def s(self):
            pass

    wf = ForgottenFlow.create(hero=order)
    perform_next_step(wf)
    unregister("ForgottenFlow")
    geneva_session.expunge_all()
    plain = geneva_session.get(Workflow, wf.id)
    plain.signal("go")
    geneva_session.commit()
    assert geneva_session.scalars(select(StepExecution)).one().state == "waiting"


# --- worker crash after the attach: housekeeping recovery -----------------------------------


def _crash_mid_step(session, execution, wf):
    """What a worker that died inside the body leaves behind."""
    execution.state = "in_progress"
    execution.started_at = utcnow() - timedelta(hours=3)
    wf.state = "performing"
    wf.current_step_name = execution.step_name
    session.commit()


def test_recovery_after_a_crash_reattaches_the_claimed_signal(order, geneva_session):
    from geneva_drive import housekeeping

    wf = ConfirmFlow.create(hero=order)
    perform_next_step(wf)
    parked_execution = perform_next_step(wf)
    signal = wf.signal("payment_confirmed", payload={"amount_cents": 9})
    geneva_session.commit()
    reload(geneva_session, parked_execution)
    _crash_mid_step(geneva_session, parked_execution, wf)
    assert housekeeping.recover_execution(parked_execution.id) is True
    reload(geneva_session, parked_execution)
    assert (parked_execution.state, parked_execution.outcome) == ("completed", "recovered")
    assert reload(geneva_session, signal).state == "claimed"
    fresh = wf.current_execution
    assert fresh.step_name == "capture"
    assert fresh.signal_id is None  # a fresh execution: the gate re-attaches
    speedrun_workflow(wf)
    reload(geneva_session, signal)
    assert (signal.claimed, signal.consumed) == (2, 1)
    assert signal.state == "consumed"
    assert order.status == f"captured 9 via #{signal.id}"


def test_recovery_of_a_resumable_signal_step_carries_the_pin(order, geneva_session):
    from geneva_drive import housekeeping

    class ResumableRecoverFlow(Workflow):
        @resumable_step(wait_for="go")
        def walk(self, it):
            it.iterate_over(self.received_signal.payload["items"], lambda _: None)

    wf = ResumableRecoverFlow.create(hero=order)
    signal = wf.signal("go", payload={"items": [1, 2, 3]})
    run_iterations(wf, 1)  # attaches, checkpoints once, continues in a successor
    successor = wf.current_execution
    assert successor.signal_id == signal.id
    _crash_mid_step(geneva_session, successor, wf)
    assert housekeeping.recover_execution(successor.id) is True
    recovered_from = wf.current_execution
    assert recovered_from.continues_from_id == successor.id
    assert recovered_from.signal_id == signal.id
    assert recovered_from.cursor_value == 1
    speedrun_workflow(wf)
    reload(geneva_session, signal)
    assert (signal.claimed, signal.consumed) == (1, 1)
    assert signal.state == "consumed"


def test_resume_sends_a_parked_execution_whose_step_no_longer_waits(
    order, geneva_session, geneva_transport
):
    class DroppedWaitFlow(Workflow):
        @step(wait_for="go")
        def gate(self):
            pass

    wf = DroppedWaitFlow.create(hero=order)
    order_id = order.id
    parked_id = perform_next_step(wf).id
    wf.pause()
    geneva_session.commit()
    workflow_id = wf.id

    class DroppedWaitFlow(Workflow):  # the next deploy drops wait_for=
        @step
        def gate(self):
            self.hero.status = "ran without a signal"

    geneva_session.expunge_all()
    wf = geneva_session.get(Workflow, workflow_id)
    geneva_transport.clear()
    woken = wf.resume()
    geneva_session.commit()
    assert woken.id == parked_id
    assert woken.state == "scheduled"
    assert woken.waiting_since is None
    assert geneva_transport.execution_ids == [woken.id]
    speedrun_workflow(wf)
    assert wf.state == "finished"
    assert geneva_session.get(Order, order_id).status == "ran without a signal"


def test_a_released_removed_step_execution_gets_its_timestamps(order, geneva_session):
    class StampedReleaseFlow(Workflow):
        @step(wait_for="go")
        def gone(self):
            pass

        @step
        def after(self):
            pass

    wf = StampedReleaseFlow.create(hero=order)
    perform_next_step(wf)
    wf.pause()
    geneva_session.commit()
    workflow_id = wf.id

    class StampedReleaseFlow(Workflow):  # the step was removed meanwhile
        gone = removed_step()

        @step
        def after(self):
            pass

    geneva_session.expunge_all()
    wf = geneva_session.get(Workflow, workflow_id)
    wf.resume()
    geneva_session.commit()
    gone = executions(wf, "gone")[0]
    assert gone.skipped_at is not None
    assert gone.finished_at is not None
