"""Executor instrumentation events (docs/MANUAL.md, "Instrumentation and error reporting"):
precondition -> step -> finalize, with payloads and durations; aborted prepares emit less."""

from __future__ import annotations

import time
from contextlib import ExitStack

import pytest

from geneva_drive import Workflow, step
from geneva_drive.instrumentation import precondition_evaluated, step_finalized, step_performed
from geneva_drive.testing import perform_next_step
from tests.engine.helpers import executions, make_order


@pytest.fixture
def events():
    recorded: list[tuple[str, dict]] = []
    receivers = {}
    with ExitStack() as stack:
        for name, signal in (
            ("precondition", precondition_evaluated),
            ("step", step_performed),
            ("finalize", step_finalized),
        ):

            def receiver(sender, _name=name, **payload):
                recorded.append((_name, payload))

            receivers[name] = receiver
            stack.enter_context(signal.connected_to(receiver))
        yield recorded


class InstrWorkflow(Workflow):
    mode = "ok"

    @step(skip_if="should_skip")
    def first(self):
        mode = InstrWorkflow.mode
        time.sleep(0.01)
        if mode == "raise":
            raise KeyError("missing")
        if mode == "skip":
            self.skip()
        if mode == "cancel":
            self.cancel()

    @step
    def second(self):
        pass

    def should_skip(self):
        if InstrWorkflow.mode == "precondition_raise":
            raise ValueError("broken condition")
        return InstrWorkflow.mode == "skip_if"


@pytest.fixture
def workflow(geneva_session):
    def make(mode):
        InstrWorkflow.mode = mode
        return InstrWorkflow.create(hero=make_order(geneva_session))

    return make


def _common(wf, ex):
    return {
        "execution_id": ex.id,
        "workflow_id": wf.id,
        "workflow_class": "InstrWorkflow",
        "step_name": "first",
    }


def test_normal_run_emits_precondition_step_finalize_with_durations(
    geneva_session, events, workflow
):
    wf = workflow("ok")
    perform_next_step(wf)
    ex = executions(geneva_session, wf)[0]
    assert [name for name, _ in events] == ["precondition", "step", "finalize"]
    pre, body, fin = (payload for _, payload in events)
    common = _common(wf, ex)
    assert {k: pre[k] for k in common} == common
    assert pre["outcome"] == "passed" and "exception" not in pre
    assert {k: body[k] for k in common} == common
    assert body["outcome"] == "completed"
    assert body["duration"] >= 0.01  # the body sleeps 10 ms
    assert {k: fin[k] for k in common} == common
    assert (fin["workflow_state"], fin["step_state"]) == ("ready", "completed")
    for payload in (pre, body, fin):
        assert isinstance(payload["duration"], float) and payload["duration"] >= 0
        assert "resumable" not in payload


def test_body_exception_event_carries_the_exception_and_finalize_omits_states(
    geneva_session, events, workflow
):
    wf = workflow("raise")
    with pytest.raises(KeyError):
        perform_next_step(wf)
    names = [name for name, _ in events]
    assert names == ["precondition", "step", "finalize"]
    body = events[1][1]
    assert body["outcome"] == "exception"
    assert isinstance(body["exception"], KeyError)
    fin = events[2][1]
    assert "workflow_state" not in fin and "step_state" not in fin


@pytest.mark.parametrize("mode", ["skip", "cancel"])
def test_flow_control_outcome_is_the_action(geneva_session, events, workflow, mode):
    wf = workflow(mode)
    perform_next_step(wf)
    body = events[1][1]
    assert body["outcome"] == mode
    fin = events[2][1]
    expected = {"skip": ("ready", "skipped"), "cancel": ("canceled", "canceled")}[mode]
    assert (fin["workflow_state"], fin["step_state"]) == expected


def test_skip_if_emits_only_the_precondition_event(geneva_session, events, workflow):
    wf = workflow("skip_if")
    perform_next_step(wf)
    assert [(name, payload["outcome"]) for name, payload in events] == [("precondition", "skipped")]


def test_cancel_if_emits_only_the_precondition_event(geneva_session, events):
    class InstrCancelIf(Workflow):
        cancel_if = (True,)

        @step
        def only(self):
            pass

    wf = InstrCancelIf.create(hero=make_order(geneva_session))
    perform_next_step(wf)
    assert [(name, payload["outcome"]) for name, payload in events] == [
        ("precondition", "canceled")
    ]


def test_precondition_exception_event(geneva_session, events, workflow):
    wf = workflow("precondition_raise")
    with pytest.raises(ValueError):
        perform_next_step(wf)
    [(name, payload)] = events
    assert name == "precondition" and payload["outcome"] == "exception"
    assert isinstance(payload["exception"], ValueError)


def test_prepare_that_aborts_before_preconditions_emits_nothing(geneva_session, events, workflow):
    wf = workflow("ok")
    wf.pause()
    geneva_session.commit()
    from geneva_drive.executor import execute

    execute(wf.current_execution.id)  # paused: canceled in prepare, before the preconditions
    assert events == []
    perform_next_step(wf)  # nothing current any more: a no-op
    assert events == []


def test_resumable_steps_are_flagged(geneva_session, events):
    from geneva_drive import resumable_step

    class InstrResumable(Workflow):
        @resumable_step
        def walk(self, it):
            it.iterate_over([1, 2], lambda item: None)

    wf = InstrResumable.create(hero=make_order(geneva_session))
    perform_next_step(wf)
    assert [name for name, _ in events] == ["precondition", "step", "finalize"]
    assert all(payload.get("resumable") is True for _, payload in events)


def test_no_receivers_no_cost(geneva_session, workflow):
    # with nobody connected the executor still runs normally
    wf = workflow("ok")
    perform_next_step(wf)
    assert wf.next_step_name == "second"
