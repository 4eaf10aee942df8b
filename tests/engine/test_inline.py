"""Inline successors (engine/inline.py): a worker runs an immediately-due successor itself,
as its own execution row, within a budget; everything else is sent as before.

The worker is played by ``execute(id, budget=...)`` in its own session, as the Celery task and
the embedded worker call it; the recording transport shows what would have been sent.
"""

from __future__ import annotations

from datetime import timedelta
from itertools import pairwise

import pytest

from geneva_drive import (
    IterableStep,
    Workflow,
    current_worker,
    executor,
    inline,
    resumable_step,
    step,
)
from geneva_drive.config import Settings, settings
from geneva_drive.instrumentation import inline_successor, step_finalized, step_performed
from tests.engine.helpers import executions, make_order, summary

# The wall-time budget is not what these tests are about (tests/conftest.py says why).
pytestmark = pytest.mark.usefixtures("generous_inline_time_budget")


class Boom(Exception):
    pass


class InlineFiveWorkflow(Workflow):
    ran: list[str] = []

    @step
    def s1(self):
        InlineFiveWorkflow.ran.append("s1")

    @step
    def s2(self):
        InlineFiveWorkflow.ran.append("s2")

    @step
    def s3(self):
        InlineFiveWorkflow.ran.append("s3")

    @step
    def s4(self):
        InlineFiveWorkflow.ran.append("s4")

    @step
    def s5(self):
        InlineFiveWorkflow.ran.append("s5")


class InlineWaitWorkflow(Workflow):
    @step
    def first(self):
        pass

    @step(wait=timedelta(seconds=5))
    def later(self):
        pass


class InlineQueueWorkflow(Workflow):
    @step
    def first(self):
        pass

    @step(job_options={"queue": "elsewhere"})
    def second(self):
        pass


class InlineWalkWorkflow(Workflow):
    @resumable_step(max_iterations=2)
    def walk(self, it: IterableStep):
        it.iterate_over(range(5), lambda item: None)

    @step
    def done(self):
        pass


class InlineSkipRaisesWorkflow(Workflow):
    @step
    def first(self):
        pass

    @step(skip_if=lambda wf: wf.explode())
    def second(self):
        pass

    def explode(self) -> bool:
        raise Boom("skip_if failed")


class InlineBodyRaisesWorkflow(Workflow):
    @step
    def first(self):
        pass

    @step
    def second(self):
        raise Boom("body failed")

    @step
    def third(self):
        pass


@pytest.fixture(autouse=True)
def _reset():
    InlineFiveWorkflow.ran = []
    executor.clear_shutdown()
    yield
    executor.clear_shutdown()


def _start(session, cls):
    workflow = cls.create(hero=make_order(session))
    session.commit()
    return workflow, workflow.current_execution.id


def test_a_chain_runs_each_step_as_its_own_execution_with_its_own_events(
    geneva_session, geneva_transport
):
    workflow, first_id = _start(geneva_session, InlineFiveWorkflow)
    geneva_transport.clear()
    performed, finalized, hand_offs = [], [], []
    receivers = [
        (step_performed, lambda _s, **p: performed.append(p["execution_id"])),
        (step_finalized, lambda _s, **p: finalized.append(p["execution_id"])),
        (inline_successor, lambda _s, **p: hand_offs.append(p)),
    ]
    for signal, receiver in receivers:
        signal.connect(receiver)
    try:
        assert executor.execute(first_id, budget=inline.Budget())
    finally:
        for signal, receiver in receivers:
            signal.disconnect(receiver)
    assert InlineFiveWorkflow.ran == ["s1", "s2", "s3", "s4", "s5"]
    rows = executions(geneva_session, workflow)
    assert [(e.step_name, e.state, e.outcome) for e in rows] == [
        (f"s{n}", "completed", "success") for n in range(1, 6)
    ]
    ids = [e.id for e in rows]
    assert performed == ids and finalized == ids
    assert [(h["predecessor_id"], h["execution_id"]) for h in hand_offs] == list(pairwise(ids))
    for row in rows[1:]:
        # Claimed, never sent: no sent_at, but a job id like a published row;
        # started and finished like any step.
        assert row.sent_at is None and row.job_id is not None and len(row.job_id) == 32
        assert row.started_at is not None and row.finished_at is not None
    assert geneva_transport.messages == []  # nothing went through the broker
    geneva_session.expire_all()
    assert workflow.state == "finished"


def test_the_step_budget_sends_the_successor_once_spent(geneva_session, geneva_transport):
    workflow, first_id = _start(geneva_session, InlineFiveWorkflow)
    geneva_transport.clear()
    executor.execute(first_id, budget=inline.Budget(max_steps=3))
    assert InlineFiveWorkflow.ran == ["s1", "s2", "s3"]
    rows = executions(geneva_session, workflow)
    fourth = rows[3]
    assert (fourth.step_name, fourth.state) == ("s4", "scheduled")
    assert geneva_transport.execution_ids == [fourth.id]
    assert fourth.sent_at is not None and fourth.job_id == geneva_transport.messages[0].job_id


def test_the_time_budget_sends_the_successor_once_spent(geneva_session, geneva_transport):
    workflow, first_id = _start(geneva_session, InlineFiveWorkflow)
    geneva_transport.clear()
    executor.execute(first_id, budget=inline.Budget(max_seconds=0.0))
    assert InlineFiveWorkflow.ran == ["s1"]
    second = executions(geneva_session, workflow)[1]
    assert geneva_transport.execution_ids == [second.id]


def test_a_requested_shutdown_ends_the_chain_at_a_step_boundary(geneva_session, geneva_transport):
    workflow, first_id = _start(geneva_session, InlineFiveWorkflow)
    geneva_transport.clear()

    def shut_down_after_s2(_sender, **payload):
        if payload["step_name"] == "s2":
            executor.request_shutdown()

    step_performed.connect(shut_down_after_s2)
    try:
        executor.execute(first_id, budget=inline.Budget())
    finally:
        step_performed.disconnect(shut_down_after_s2)
    assert InlineFiveWorkflow.ran == ["s1", "s2"]
    third = executions(geneva_session, workflow)[2]
    assert (third.step_name, third.state) == ("s3", "scheduled")
    assert geneva_transport.execution_ids == [third.id]  # handed to the broker


def test_a_successor_with_a_wait_is_sent(geneva_session, geneva_transport):
    workflow, first_id = _start(geneva_session, InlineWaitWorkflow)
    geneva_transport.clear()
    executor.execute(first_id, budget=inline.Budget())
    later = executions(geneva_session, workflow)[1]
    assert later.state == "scheduled"
    assert [m.execution_id for m in geneva_transport.messages] == [later.id]
    assert geneva_transport.messages[0].countdown is not None


def test_a_wait_until_job_option_ahead_is_sent(geneva_session, geneva_transport):
    from geneva_drive.models import utcnow

    workflow, first_id = _start(geneva_session, InlineFiveWorkflow)
    workflow.step_job_options = {"wait_until": utcnow() + timedelta(seconds=10)}
    geneva_session.commit()
    geneva_transport.clear()
    executor.execute(first_id, budget=inline.Budget())
    assert InlineFiveWorkflow.ran == ["s1"]
    assert len(geneva_transport.messages) == 1


def test_a_successor_on_a_queue_this_worker_does_not_consume_is_sent(
    geneva_session, geneva_transport
):
    workflow, first_id = _start(geneva_session, InlineQueueWorkflow)
    geneva_transport.clear()
    executor.execute(first_id, budget=inline.Budget(accepts_queue=lambda queue: queue is None))
    second = executions(geneva_session, workflow)[1]
    assert second.state == "scheduled"
    assert [(m.execution_id, m.queue) for m in geneva_transport.messages] == [
        (second.id, "elsewhere")
    ]


def test_a_resumable_continuation_always_goes_through_the_broker(geneva_session, geneva_transport):
    workflow, first_id = _start(geneva_session, InlineWalkWorkflow)
    geneva_transport.clear()
    executor.execute(first_id, budget=inline.Budget())
    first, successor = executions(geneva_session, workflow)
    assert (first.state, first.outcome) == ("completed", "continued")
    assert successor.continues_from_id == first.id and successor.state == "scheduled"
    assert geneva_transport.execution_ids == [successor.id]


def test_a_raising_prepare_of_the_successor_cannot_take_the_outcome_down(
    geneva_session, geneva_transport
):
    workflow, first_id = _start(geneva_session, InlineSkipRaisesWorkflow)
    # The successor's error is its own: the delivered task does not raise it.
    executor.execute(first_id, budget=inline.Budget())
    # first's outcome was committed before second was claimed; second's own failure is
    # recorded by the policy (pause), as when its message is delivered.
    assert summary(geneva_session, workflow) == [
        ("first", "completed", "success"),
        ("second", "failed", "failed"),
    ]
    geneva_session.expire_all()
    assert workflow.state == "paused"


def test_a_raising_body_ends_the_chain_and_its_successor_is_sent(geneva_session, geneva_transport):
    workflow, first_id = _start(geneva_session, InlineBodyRaisesWorkflow)
    geneva_transport.clear()
    # The successor's error is its own: the delivered task does not raise it.
    executor.execute(first_id, budget=inline.Budget())
    rows = summary(geneva_session, workflow)
    assert rows[:2] == [("first", "completed", "success"), ("second", "failed", "failed")]
    assert geneva_transport.messages == []  # paused by the default policy: nothing to run


def test_the_setting_turns_it_off(geneva_session):
    settings.inline_successors = False
    assert inline.budget() is None
    settings.inline_successors = True
    assert inline.budget() is not None


def test_the_settings_read_their_environment_variables():
    fresh = Settings()
    fresh.load_env(
        {
            "GENEVA_INLINE_SUCCESSORS": "false",
            "GENEVA_INLINE_SUCCESSOR_MAX_STEPS": "7",
            "GENEVA_INLINE_SUCCESSOR_MAX_TIME": "0.5",
            "GENEVA_INLINE_SUCCESSOR_YIELD_AFTER": "4",
        }
    )
    assert fresh.inline_successor_yield_after == 4
    assert Settings().inline_successor_yield_after == 3
    assert fresh.inline_successors is False
    assert fresh.inline_successor_max_steps == 7
    assert fresh.inline_successor_max_time == timedelta(seconds=0.5)
    assert Settings().inline_successor_max_steps == 50
    assert Settings().inline_successor_max_time == timedelta(milliseconds=200)
    with pytest.raises(ValueError, match="GENEVA_INLINE_SUCCESSOR_MAX_STEPS"):
        fresh.load_env({"GENEVA_INLINE_SUCCESSOR_MAX_STEPS": "0"})


def test_past_yield_after_the_chain_hands_over_when_other_work_waits(
    geneva_session, geneva_transport
):
    workflow, first_id = _start(geneva_session, InlineFiveWorkflow)
    geneva_transport.clear()
    asked: list[int] = []
    budget = inline.Budget(yield_after=2)
    budget.others_waiting = lambda: asked.append(budget.steps) or True
    executor.execute(first_id, budget=budget)
    assert InlineFiveWorkflow.ran == ["s1", "s2"]
    assert asked == [2]  # asked once the shared steps were used up
    third = executions(geneva_session, workflow)[2]
    assert geneva_transport.execution_ids == [third.id]  # to the back of its queue


def test_with_nothing_waiting_the_chain_goes_on_asking_every_yield_after_steps(
    geneva_session, geneva_transport
):
    _start(geneva_session, InlineFiveWorkflow)
    asked: list[int] = []
    budget = inline.Budget(yield_after=2)
    budget.others_waiting = lambda: asked.append(budget.steps) or False
    first_id = geneva_transport.messages[-1].execution_id
    executor.execute(first_id, budget=budget)
    assert InlineFiveWorkflow.ran == ["s1", "s2", "s3", "s4", "s5"]
    assert asked == [2, 4]


def test_a_failing_broker_question_counts_as_others_waiting(geneva_session, geneva_transport):
    _start(geneva_session, InlineFiveWorkflow)
    first_id = geneva_transport.messages[-1].execution_id

    def broken() -> bool:
        raise ConnectionError("broker down")

    executor.execute(first_id, budget=inline.Budget(yield_after=1, others_waiting=broken))
    assert InlineFiveWorkflow.ran == ["s1"]


def test_a_remembered_answer_is_asked_again_only_once_its_time_is_up():
    now = [10.0]
    answers = iter([False, True, True])
    asked: list[float] = []

    def ask() -> bool:
        asked.append(now[0])
        return next(answers)

    recent = inline.remembered(ask, 1.0, clock=lambda: now[0])
    assert recent() is False
    now[0] = 10.75
    assert recent() is False  # kept: the broker was not asked again
    now[0] = 11.0
    assert recent() is True  # a second after the first question: asked again
    assert asked == [10.0, 11.0]


def test_a_failed_question_is_not_remembered():
    calls: list[int] = []

    def flaky() -> bool:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("broker down")
        return False

    recent = inline.remembered(flaky, 60.0, clock=lambda: 0.0)
    with pytest.raises(ConnectionError):
        recent()
    assert recent() is False  # asked again at once, not the failure kept
    assert len(calls) == 2


def test_a_celery_worker_process_asks_the_broker_at_most_every_50_ms(monkeypatch):
    from geneva_drive import celery as geneva_celery

    asked: list[int] = []
    monkeypatch.setattr(geneva_celery, "_ask_broker", lambda: asked.append(1) or True)
    now = [0.0]
    recent = geneva_celery._remembered_broker_answer(clock=lambda: now[0])
    assert recent() and recent()
    now[0] = 0.049
    assert recent()
    assert asked == [1]
    now[0] = 0.05
    assert recent()
    assert asked == [1, 1]


def test_a_slow_answer_is_kept_from_when_it_arrived():
    now = [0.0]
    asked: list[float] = []

    def slow() -> bool:
        asked.append(now[0])
        now[0] += 2.0  # the broker took longer than the window
        return True

    recent = inline.remembered(slow, 1.0, clock=lambda: now[0])
    assert recent()
    now[0] += 0.5
    assert recent()  # half a second after the answer came: kept
    assert asked == [0.0]


def test_the_celery_task_shares_through_the_process_s_remembered_answer(monkeypatch):
    from geneva_drive import celery as geneva_celery

    asks: list[int] = []
    monkeypatch.setattr(geneva_celery, "_ask_broker", lambda: asks.append(1) or False)
    for _ in range(100):  # far less than 50 ms; even a preempted loop asks a few times at most
        geneva_celery._messages_waiting()
    assert 1 <= len(asks) <= 5  # asking every time: 100
    budgets: list[inline.Budget | None] = []
    monkeypatch.setattr(geneva_celery, "_consumed_queues", frozenset({"default"}))
    # A registered worker process (the step itself is stubbed; no database is needed).
    current_worker.set_process(4242, "celery@test/4242")
    monkeypatch.setattr(
        geneva_celery.executor, "execute", lambda _id, **kw: budgets.append(kw["budget"]) or True
    )
    geneva_celery.perform_step(1)
    [budget] = budgets
    assert budget is not None
    assert budget.others_waiting is geneva_celery._messages_waiting
