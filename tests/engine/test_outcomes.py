"""Every outcome of a step run, as the rows and events it leaves, and the rule that finalize moves
the workflow through exactly one state.

Each case runs one step of a two-step workflow - the first or the last - and pins what the
executor wrote: the execution's state, outcome and error columns, the workflow's state and
step pointers, the execution scheduled after it (if any), the ``step`` and ``finalize``
events, and the workflow states finalize assigned on the way (read from the ORM attribute
event on ``Workflow.state``, so every assignment counts, even one a later one overwrites
before the row is written).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event

from geneva_drive import ExceptionPolicy, Workflow, resumable_step, step
from geneva_drive.instrumentation import step_finalized, step_performed
from geneva_drive.testing import perform_next_step
from geneva_drive.workflow import Workflow as BaseWorkflow
from tests.engine.helpers import assert_close, assert_recent, executions, make_order


class Boom(Exception):
    pass


@dataclass
class Recorder:
    """What one step run did, beyond its rows: events, and the workflow states assigned
    between the end of the body and the end of finalize."""

    log: list[tuple[str, Any]] = field(default_factory=list)

    def step_outcomes(self) -> list[Any]:
        return [value["outcome"] for name, value in self.log if name == "step"]

    def finalized(self) -> list[tuple[Any, Any]]:
        return [
            (value.get("workflow_state"), value.get("step_state"))
            for name, value in self.log
            if name == "finalize"
        ]

    def finalize_transitions(self) -> list[tuple[Any, Any]]:
        """The (old, new) workflow states assigned after the body, before finalize ended."""
        out: list[tuple[Any, Any]] = []
        in_finalize = False
        for name, value in self.log:
            if name == "step":
                in_finalize = True
            elif name == "finalize":
                in_finalize = False
            elif name == "state" and in_finalize:
                out.append(value)
        return out


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    rec = Recorder()

    def on_step(_sender: Any, **payload: Any) -> None:
        rec.log.append(("step", payload))

    def on_finalize(_sender: Any, **payload: Any) -> None:
        rec.log.append(("finalize", payload))

    def on_state(_target: Any, value: Any, old: Any, _initiator: Any) -> None:
        rec.log.append(("state", (old, value)))

    step_performed.connect(on_step)
    step_finalized.connect(on_finalize)
    event.listen(BaseWorkflow.state, "set", on_state, propagate=True)
    try:
        yield rec
    finally:
        event.remove(BaseWorkflow.state, "set", on_state)
        step_finalized.disconnect(on_finalize)
        step_performed.disconnect(on_step)


def _act(workflow: Workflow, action: str) -> None:
    if action == "return":
        return
    if action == "raise":
        raise Boom("the step failed")
    if action == "reattempt":
        workflow.reattempt(wait=timedelta(minutes=10))
    else:
        getattr(workflow, action)()


def two_steps(action: str, at: str, policy: Any = None) -> type[Workflow]:
    """A two-step workflow whose step ``at`` does ``action`` (the other returns)."""

    class OutcomeFlow(Workflow):
        @step(on_exception=policy)
        def first(self) -> None:
            if at == "first":
                _act(self, action)

        @step(on_exception=policy)
        def last(self) -> None:
            if at == "last":
                _act(self, action)

    return OutcomeFlow


def run_step(session: Any, cls: type[Workflow], at: str) -> Any:
    """Create the workflow, run the steps before ``at``, then ``at`` itself (recorded)."""
    workflow = cls.create(hero=make_order(session))
    session.commit()
    if at == "last":
        perform_next_step(workflow)
    return workflow


@dataclass(frozen=True)
class Case:
    action: str
    at: str
    policy: Any
    execution: tuple[str, str]
    workflow: str
    next_step_name: str | None
    #: The execution created by the run: (step, state), or None.
    created: tuple[str, str] | None
    step_event: str
    transitions: list[tuple[str, str]]
    error: bool = False
    reattempt_reason: str | None = None


CASES = [
    # The body returned: the next step, or (last step) finished - from performing directly.
    Case("return", "first", None, ("completed", "success"), "ready", "last",
         ("last", "scheduled"), "completed", [("performing", "ready")]),
    Case("return", "last", None, ("completed", "success"), "finished", None,
         None, "completed", [("performing", "finished")]),
    # Flow control inside the step.
    Case("skip", "first", None, ("skipped", "skipped"), "ready", "last",
         ("last", "scheduled"), "skip", [("performing", "ready")]),
    Case("skip", "last", None, ("skipped", "skipped"), "finished", None,
         None, "skip", [("performing", "finished")]),
    Case("cancel", "first", None, ("canceled", "canceled"), "canceled", "first",
         None, "cancel", [("performing", "canceled")]),
    Case("pause", "first", None, ("canceled", "canceled"), "paused", "first",
         None, "pause", [("performing", "paused")]),
    Case("finish", "first", None, ("completed", "success"), "finished", "first",
         None, "finished", [("performing", "finished")]),
    Case("reattempt", "first", None, ("completed", "reattempted"), "ready", "first",
         ("first", "scheduled"), "reattempt", [("performing", "ready")],
         reattempt_reason="flow_control"),
    Case("reattempt", "last", None, ("completed", "reattempted"), "ready", "last",
         ("last", "scheduled"), "reattempt", [("performing", "ready")],
         reattempt_reason="flow_control"),
    # An exception, by the policy's action.
    Case("raise", "first", None, ("failed", "failed"), "paused", "first",
         None, "exception", [("performing", "paused")], error=True),
    Case("raise", "first", "pause", ("failed", "failed"), "paused", "first",
         None, "exception", [("performing", "paused")], error=True),
    Case("raise", "first", "cancel", ("failed", "canceled"), "canceled", "first",
         None, "exception", [("performing", "canceled")], error=True),
    Case("raise", "first", "skip", ("skipped", "skipped"), "ready", "last",
         ("last", "scheduled"), "exception", [("performing", "ready")]),
    Case("raise", "last", "skip", ("skipped", "skipped"), "finished", None,
         None, "exception", [("performing", "finished")]),
    Case("raise", "first", "reattempt", ("completed", "reattempted"), "ready", "first",
         ("first", "scheduled"), "exception", [("performing", "ready")],
         reattempt_reason="exception_policy"),
    Case("raise", "first", ExceptionPolicy(handler=lambda wf, _e: wf.finish()),
         ("completed", "success"), "finished", "first",
         None, "exception", [("performing", "finished")]),
    Case("raise", "last", ExceptionPolicy(handler=lambda wf, _e: wf.skip()),
         ("skipped", "skipped"), "finished", None,
         None, "exception", [("performing", "finished")]),
]  # fmt: skip


def _case_id(case: Case) -> str:
    policy = case.policy if isinstance(case.policy, str | None) else "handler"
    return f"{case.action}-{case.at}" + (f"-{policy}" if policy else "")


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_outcome_rows_and_events(geneva_session, recorder, case):
    cls = two_steps(case.action, case.at, case.policy)
    workflow = run_step(geneva_session, cls, case.at)
    before = {e.id for e in executions(geneva_session, workflow)}
    recorder.log.clear()
    if case.action == "raise":
        with pytest.raises(Boom):
            perform_next_step(workflow)
    else:
        perform_next_step(workflow)

    rows = executions(geneva_session, workflow)
    [ran] = [e for e in rows if e.step_name == case.at and e.id in before]
    assert (ran.state, ran.outcome) == case.execution
    assert_recent(ran.finished_at)
    assert (ran.error_class_name is not None) == case.error
    if case.error:
        assert ran.error_class_name.endswith("Boom")
        assert ran.error_message == "the step failed"
    assert (ran.metadata_ or {}).get("reattempt_reason") == case.reattempt_reason

    geneva_session.refresh(workflow)
    assert workflow.state == case.workflow
    assert workflow.current_step_name is None
    assert workflow.next_step_name == case.next_step_name
    if case.workflow in ("finished", "canceled", "paused"):
        assert_recent(workflow.transitioned_at)
    else:
        assert workflow.transitioned_at is None

    created = [(e.step_name, e.state) for e in rows if e.id not in before]
    assert created == ([case.created] if case.created else [])
    if case.action == "reattempt":
        [new] = [e for e in rows if e.id not in before]
        assert_close(new.scheduled_for, ran.finished_at + timedelta(minutes=10))

    assert recorder.step_outcomes() == [case.step_event]
    # The finalize event names the states only when the step raised nothing.
    expected = (None, None) if case.action == "raise" else (case.workflow, case.execution[0])
    assert recorder.finalized() == [expected]
    # One workflow transition per finalize: on the last step, finished straight from
    # performing (it used to go through ready first).
    assert recorder.finalize_transitions() == case.transitions


# --- resumable chains ----------------------------------------------------------------------


def resumable_flow(action: str | None) -> type[Workflow]:
    class ChainFlow(Workflow):
        @step
        def first(self) -> None:
            pass

        @resumable_step(max_iterations=2)
        def walk(self, it: Any) -> None:
            if action == "pause" and it.cursor is not None:
                self.pause()
            if action == "suspend" and it.cursor is not None:
                self.suspend(wait=timedelta(minutes=5))
            it.iterate_over([1, 2, 3], lambda _item: None)

    return ChainFlow


def test_resumable_chain_rows_and_events(geneva_session, recorder):
    workflow = resumable_flow(None).create(hero=make_order(geneva_session))
    geneva_session.commit()
    perform_next_step(workflow)
    recorder.log.clear()
    perform_next_step(workflow)  # items 1, 2: interrupted, a successor follows
    first_link = [e for e in executions(geneva_session, workflow, "walk")]
    assert [(e.state, e.outcome) for e in first_link] == [
        ("completed", "continued"),
        ("scheduled", None),
    ]
    assert first_link[1].continues_from_id == first_link[0].id
    assert first_link[1].cursor_value == 2
    assert recorder.step_outcomes() == ["interrupted"]
    assert recorder.finalize_transitions() == [("performing", "ready")]

    recorder.log.clear()
    perform_next_step(workflow)  # item 3, the last step's last link: finished
    links = executions(geneva_session, workflow, "walk")
    assert [(e.state, e.outcome) for e in links] == [
        ("completed", "continued"),
        ("completed", "success"),
    ]
    geneva_session.refresh(workflow)
    assert (workflow.state, workflow.next_step_name) == ("finished", None)
    assert recorder.step_outcomes() == ["completed"]
    assert recorder.finalize_transitions() == [("performing", "finished")]


@pytest.mark.parametrize(
    ("action", "link", "workflow_state", "created", "event"),
    [
        ("pause", ("completed", "workflow_paused"), "paused", 0, "pause"),
        ("suspend", ("completed", "continued"), "ready", 1, "suspend"),
    ],
)
def test_resumable_flow_control_rows_and_events(
    geneva_session, recorder, action, link, workflow_state, created, event
):
    workflow = resumable_flow(action).create(hero=make_order(geneva_session))
    geneva_session.commit()
    perform_next_step(workflow)
    perform_next_step(workflow)  # the first link: 1, 2, interrupted
    recorder.log.clear()
    perform_next_step(workflow)  # the second link calls pause() / suspend()
    links = executions(geneva_session, workflow, "walk")
    assert (links[1].state, links[1].outcome) == link
    assert links[1].cursor_value == 2  # kept for resume() / the successor
    assert len(links) == 2 + created
    if created:
        assert links[2].state == "scheduled" and links[2].continues_from_id == links[1].id
        assert_close(links[2].scheduled_for, links[1].finished_at + timedelta(minutes=5))
    geneva_session.refresh(workflow)
    assert workflow.state == workflow_state
    assert recorder.step_outcomes() == [event]
    assert recorder.finalize_transitions() == [("performing", workflow_state)]


# --- signals --------------------------------------------------------------------------------


class GateFlow(Workflow):
    @step(wait_for="go")
    def gated(self) -> None:
        pass


def test_parked_step_then_signal_rows_and_events(geneva_session, recorder):
    workflow = GateFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    perform_next_step(workflow)  # no signal yet: parked at the gate, no body, no finalize
    [parked] = executions(geneva_session, workflow)
    assert (parked.state, parked.outcome) == ("waiting", None)
    geneva_session.refresh(workflow)
    assert workflow.state == "ready"
    assert recorder.step_outcomes() == [] and recorder.finalized() == []

    signal = workflow.signal("go")
    geneva_session.commit()
    recorder.log.clear()
    perform_next_step(workflow)
    [ran] = executions(geneva_session, workflow)
    assert (ran.state, ran.outcome, ran.signal_id) == ("completed", "success", signal.id)
    geneva_session.refresh(signal)
    assert signal.state == "consumed"  # the clean finish resolved the attached signal
    geneva_session.refresh(workflow)
    assert (workflow.state, workflow.next_step_name) == ("finished", None)
    assert recorder.finalize_transitions() == [("performing", "finished")]
