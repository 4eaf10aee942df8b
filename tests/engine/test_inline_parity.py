"""Inline successors are indistinguishable from published ones.

Each test runs the same workflow with inline successors on (a worker's budget) and off (no
budget: every successor is published, as with ``GENEVA_INLINE_SUCCESSORS=false``) and compares
what each difference once found between the two looks like: the successor's own ``priority`` job
option, its row's ``job_id``, who its exception is attributed to, and a dispatcher sweep in the
gap between the predecessor's commit and the successor's claim.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from geneva_drive import Workflow, dispatch, executor, inline, step
from geneva_drive.config import settings
from geneva_drive.instrumentation import inline_successor
from geneva_drive.models import utcnow
from tests.engine.helpers import executions, make_order, summary


class Boom(Exception):
    pass


class PriorityWorkflow(Workflow):
    @step
    def first(self) -> None:
        pass

    @step(job_options={"priority": 7})
    def second(self) -> None:
        pass


class ChainWorkflow(Workflow):
    @step
    def first(self) -> None:
        pass

    @step
    def second(self) -> None:
        pass


class SuccessorRaisesWorkflow(Workflow):
    @step
    def first(self) -> None:
        pass

    @step
    def second(self) -> None:
        raise Boom("the successor's own failure")


def _budget() -> inline.Budget:
    # Generous wall time: a loaded machine must not end the chain (and change the path).
    return inline.Budget(max_seconds=60.0)


def _run_first(session: Any, cls: type[Workflow], inline_on: bool) -> tuple[Workflow, Any]:
    """Create a workflow, run its first execution as a worker would (inline on or off)."""
    workflow = cls.create(hero=make_order(session))
    session.commit()
    (first,) = executions(session, workflow)
    executor.execute(first.id, budget=_budget() if inline_on else None)
    session.expire_all()
    return workflow, first


@pytest.mark.parametrize("inline_on", [True, False], ids=["inline", "published"])
def test_a_successors_own_priority_is_honoured(geneva_session, geneva_transport, inline_on):
    workflow, _first = _run_first(geneva_session, PriorityWorkflow, inline_on)
    # Either way: published with its priority, not run at once ahead of the queue.
    _first_row, second = executions(geneva_session, workflow)
    assert (second.step_name, second.state) == ("second", "scheduled")
    message = geneva_transport.messages[-1]
    assert (message.execution_id, message.priority) == (second.id, 7)
    assert second.job_id == message.job_id and second.sent_at is not None


@pytest.mark.parametrize("inline_on", [True, False], ids=["inline", "published"])
def test_every_successor_row_gets_a_job_id(geneva_session, geneva_transport, inline_on):
    workflow, _first = _run_first(geneva_session, ChainWorkflow, inline_on)
    if not inline_on:
        executor.execute(geneva_transport.messages[-1].execution_id)
    geneva_session.expire_all()
    rows = executions(geneva_session, workflow)
    assert [(e.step_name, e.state) for e in rows] == [
        ("first", "completed"),
        ("second", "completed"),
    ]
    assert all(e.job_id is not None and len(e.job_id) == 32 for e in rows), rows
    assert len({e.job_id for e in rows}) == 2


@pytest.mark.parametrize("inline_on", [True, False], ids=["inline", "published"])
def test_a_successors_exception_is_attributed_to_the_successor(
    geneva_session, geneva_transport, inline_on
):
    # The task that delivered ``first`` succeeds either way: first succeeded.
    workflow, _first = _run_first(geneva_session, SuccessorRaisesWorkflow, inline_on)
    if not inline_on:
        # Published: the successor's own task raises its error.
        with pytest.raises(Boom):
            executor.execute(geneva_transport.messages[-1].execution_id)
    geneva_session.expire_all()
    assert summary(geneva_session, workflow) == [
        ("first", "completed", "success"),
        ("second", "failed", "failed"),
    ]
    second = executions(geneva_session, workflow)[1]
    assert second.error_class_name.endswith("Boom")
    assert second.job_id is not None


@pytest.mark.parametrize("inline_on", [True, False], ids=["inline", "published"])
def test_a_dispatcher_sweep_in_the_gap_sends_no_duplicate(
    geneva_session, geneva_transport, inline_on
):
    """Between first's commit and second's claim a sweep sends nothing: inline, the row is
    held for the worker that runs it next; published, it is marked sent with its message."""
    workflow = ChainWorkflow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    (first,) = executions(geneva_session, workflow)
    geneva_transport.clear()
    swept: list[int] = []

    def sweep_in_the_gap(_sender: Any, **_payload: Any) -> None:
        swept.append(dispatch.dispatch_due())

    if inline_on:
        inline_successor.connect(sweep_in_the_gap)
        try:
            executor.execute(first.id, budget=_budget())
        finally:
            inline_successor.disconnect(sweep_in_the_gap)
        assert geneva_transport.messages == []  # no duplicate message on the broker
    else:
        executor.execute(first.id)
        # The gap of the published path: the message is on the broker, no worker took it.
        sweep_in_the_gap(None)
        assert len(geneva_transport.messages) == 1  # its own message, no duplicate
        executor.execute(geneva_transport.messages[0].execution_id)
    assert swept == [0]
    geneva_session.expire_all()
    assert [(e.step_name, e.state) for e in executions(geneva_session, workflow)] == [
        ("first", "completed"),
        ("second", "completed"),
    ]


@pytest.mark.parametrize("cls", [ChainWorkflow, SuccessorRaisesWorkflow], ids=["ok", "raises"])
def test_step_events_and_counts_are_the_same_inline_and_published(
    geneva_session, geneva_transport, cls
):
    """What metrics and error reporting see — one step event per execution with its
    outcome, on the step's own execution — does not depend on the path."""
    from geneva_drive.instrumentation import step_performed

    seen: dict[bool, list[tuple[str, str, bool]]] = {}
    for inline_on in (True, False):
        events: list[tuple[str, str, bool]] = []

        def record(_sender: Any, events: list[tuple[str, str, bool]] = events, **payload: Any):  # type: ignore[no-untyped-def]
            events.append(
                (
                    str(payload.get("step_name")),
                    str(payload.get("outcome")),
                    payload.get("execution_id") is not None,
                )
            )

        step_performed.connect(record)
        try:
            geneva_transport.clear()
            _run_first(geneva_session, cls, inline_on)
            if not inline_on:
                try:
                    executor.execute(geneva_transport.messages[-1].execution_id)
                except Boom:
                    pass  # the published successor's own task raises (attributed above)
        finally:
            step_performed.disconnect(record)
        seen[inline_on] = events
    assert seen[True] == seen[False], seen
    second = "exception" if cls is SuccessorRaisesWorkflow else "completed"
    assert [(name, outcome) for name, outcome, _ in seen[True]] == [
        ("first", "completed"),
        ("second", second),
    ]
    assert all(has_id for _, _, has_id in seen[True])


def test_a_held_row_whose_worker_died_is_sent_after_one_dispatch_interval(
    geneva_session, geneva_transport
):
    """The worker died in the gap: the row stays held for one dispatch_interval, then the
    dispatcher sends it (once)."""
    workflow = ChainWorkflow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    (first,) = executions(geneva_session, workflow)

    class Died(BaseException):
        pass

    def die(_sender: Any, **_payload: Any) -> None:
        raise Died

    inline_successor.connect(die)
    try:
        with pytest.raises(Died):
            executor.execute(first.id, budget=_budget())
    finally:
        inline_successor.disconnect(die)
    geneva_transport.clear()
    geneva_session.expire_all()
    second = executions(geneva_session, workflow)[1]
    assert (second.state, second.sent_at) == ("scheduled", None) and second.job_id is not None
    assert dispatch.dispatch_due() == 0  # its worker may still claim it
    later = utcnow() + settings.dispatch_interval + timedelta(seconds=1)
    assert dispatch.dispatch_due(now=later) == 1
    assert geneva_transport.execution_ids == [second.id]
    assert dispatch.dispatch_due(now=later) == 0
