"""``settings.inline_successor_start_with_outcome`` (docs/MANUAL.md, "How a step runs"): an
inline successor whose start
needs no check of its own is started in the commit of its predecessor's outcome, so a chain
costs one transaction per step instead of two; every other successor keeps its own start.

The worker is played by ``execute(id, budget=...)`` in its own session, as the Celery task and
the embedded worker call it; commits are counted on the engine.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event

from geneva_drive import Workflow, db, executor, housekeeping, inline, step
from geneva_drive.config import Settings, settings
from geneva_drive.dialects import dialect_for
from geneva_drive.instrumentation import (
    inline_successor,
    precondition_evaluated,
    step_performed,
)
from tests.engine.helpers import executions, make_order, summary

pytestmark = pytest.mark.usefixtures("generous_inline_time_budget")


class HeroChain(Workflow):
    """Three plain steps about an order: each start checks the hero (prepare's check). ``two``
    writes to the order and records what it found there, so a run whose write was lost or
    doubled shows in ``ran`` and in the order's status."""

    ran: list[str] = []

    @step
    def one(self):
        HeroChain.ran.append("one")

    @step
    def two(self):
        HeroChain.ran.append(f"two:{self.hero.status}")
        self.hero.status = f"{self.hero.status}+two"

    @step
    def three(self):
        HeroChain.ran.append("three")


class HerolessChain(Workflow):
    may_proceed_without_hero = True

    @step
    def one(self):
        pass

    @step
    def two(self):
        pass

    @step
    def three(self):
        pass


class DeletesItsHero(Workflow):
    @step
    def one(self):
        self.session.delete(self.hero)

    @step
    def two(self):
        raise AssertionError("a workflow whose hero is gone must not run its next step")


class SkipsTwo(Workflow):
    @step
    def one(self):
        pass

    @step(skip_if=lambda workflow: True)
    def two(self):
        raise AssertionError("skipped")

    @step
    def three(self):
        pass


class CancelsBeforeTwo(Workflow):
    may_proceed_without_hero = True
    cancel_now = False
    cancel_if = (lambda workflow: CancelsBeforeTwo.cancel_now,)

    @step
    def one(self):
        CancelsBeforeTwo.cancel_now = True

    @step
    def two(self):
        raise AssertionError("canceled before it ran")


@pytest.fixture(autouse=True)
def _start_with_outcome(geneva_session) -> Iterator[None]:
    HeroChain.ran = []
    CancelsBeforeTwo.cancel_now = False
    settings.inline_successor_start_with_outcome = True
    yield


@pytest.fixture
def commits() -> Iterator[list[int]]:
    """One entry per transaction the engine commits."""
    seen: list[int] = []

    def counted(_connection: Any) -> None:
        seen.append(1)

    engine = db.get_engine()
    event.listen(engine, "commit", counted)
    yield seen
    event.remove(engine, "commit", counted)


def _run(session, cls, **kw: Any):
    workflow = cls.create(hero=make_order(session), **kw)
    session.commit()
    first = workflow.current_execution.id
    return workflow, first


def test_a_chain_of_plain_steps_commits_once_per_step(geneva_session, geneva_transport, commits):
    workflow, first = _run(geneva_session, HeroChain)
    geneva_transport.clear()
    commits.clear()
    assert executor.execute(first, budget=inline.Budget())
    # The first step's start, then one commit per step: its outcome with the next one's start.
    assert len(commits) == 1 + 3
    assert summary(geneva_session, workflow) == [
        ("one", "completed", "success"),
        ("two", "completed", "success"),
        ("three", "completed", "success"),
    ]
    assert HeroChain.ran == ["one", "two:new", "three"]
    geneva_session.expire_all()
    assert workflow.hero.status == "new+two"  # two's write, committed with its outcome
    one, two, three = executions(geneva_session, workflow)
    for successor, predecessor in ((two, one), (three, two)):
        # Started in the commit of its predecessor's outcome: never sent, a job id of its own.
        assert successor.sent_at is None and successor.job_id is not None
        assert successor.started_at is not None and successor.finished_at is not None
        assert successor.started_at >= predecessor.finished_at
    assert geneva_transport.messages == []
    geneva_session.expire_all()
    assert workflow.state == "finished"


@pytest.fixture
def inserted() -> Iterator[list[tuple[str, Any]]]:
    """(statement kind, the successor row's state) of each execution INSERT the engine sends;
    and every statement other than BEGIN/COMMIT, as ("statement", None)."""
    seen: list[tuple[str, Any]] = []

    def record(_c: Any, _cursor: Any, statement: str, params: Any, _ctx: Any, _many: Any) -> None:
        seen.append(("statement", None))
        if "INSERT INTO geneva_drive_step_executions" in statement:
            if isinstance(params, dict):
                state = params.get("i_v_state", params.get("v_state"))
            else:  # positional (qmark): the state is among the values
                state = next((p for p in params if p in ("scheduled", "in_progress")), None)
            seen.append(("insert", state))

    engine = db.get_engine()
    event.listen(engine, "before_cursor_execute", record)
    yield seen
    event.remove(engine, "before_cursor_execute", record)


def test_postgresql_inserts_a_successor_started_with_its_predecessor_s_outcome(
    geneva_session, geneva_transport, inserted
):
    """PostgreSQL: the lock read draws the successor's id, and one statement writes the
    outcome and inserts the successor already in progress; no UPDATE starts it afterwards.
    Elsewhere the row is inserted scheduled and started by an UPDATE in the same commit."""
    workflow, first = _run(geneva_session, HerolessChain)
    inserted.clear()
    assert executor.execute(first, budget=inline.Budget())
    states = [state for kind, state in inserted if kind == "insert"]
    statements = sum(1 for kind, _state in inserted if kind == "statement")
    if dialect_for(geneva_session).combined_insert:
        assert states == ["in_progress", "in_progress"]
        # one's start: a lock read and an UPDATE; then per step a lock read (drawing the next
        # id) and one write; three's commit also adds the finished workflow to its count.
        assert statements == 2 + 2 + 2 + 2 + 1, inserted
    else:
        assert states == ["scheduled", "scheduled"]
    one, two, three = executions(geneva_session, workflow)
    assert (two.state, three.state) == ("completed", "completed")
    assert two.id > one.id and three.id > two.id
    assert two.sent_at is None and two.started_at is not None


def test_off_by_default_and_read_from_its_environment_variable():
    assert Settings().inline_successor_start_with_outcome is False
    fresh = Settings()
    fresh.load_env({"GENEVA_INLINE_SUCCESSOR_START_WITH_OUTCOME": "true"})
    assert fresh.inline_successor_start_with_outcome is True
    with pytest.raises(ValueError, match="GENEVA_INLINE_SUCCESSOR_START_WITH_OUTCOME"):
        fresh.load_env({"GENEVA_INLINE_SUCCESSOR_START_WITH_OUTCOME": "sometimes"})


def test_off_each_step_starts_in_a_transaction_of_its_own(
    geneva_session, geneva_transport, commits
):
    settings.inline_successor_start_with_outcome = False
    _workflow, first = _run(geneva_session, HeroChain)
    commits.clear()
    assert executor.execute(first, budget=inline.Budget())
    assert len(commits) == 2 * 3
    assert HeroChain.ran == ["one", "two:new", "three"]


@pytest.mark.parametrize("cls", [HeroChain, HerolessChain])
def test_the_events_are_those_of_a_step_started_on_its_own(geneva_session, geneva_transport, cls):
    """Metrics and error reporting see the same precondition and step events either way."""
    seen: dict[bool, list[tuple[str, str]]] = {}
    for merged in (True, False):
        settings.inline_successor_start_with_outcome = merged
        events: list[tuple[str, str]] = []

        def precondition(_s: Any, events: list[tuple[str, str]] = events, **p: Any) -> None:
            events.append(("precondition", str(p.get("outcome"))))

        def performed(_s: Any, events: list[tuple[str, str]] = events, **p: Any) -> None:
            events.append((str(p.get("step_name")), str(p.get("outcome"))))

        precondition_evaluated.connect(precondition)
        step_performed.connect(performed)
        try:
            _workflow, first = _run(geneva_session, cls)
            executor.execute(first, budget=inline.Budget())
        finally:
            precondition_evaluated.disconnect(precondition)
            step_performed.disconnect(performed)
        seen[merged] = events
    assert seen[True] == seen[False]
    assert seen[True].count(("precondition", "passed")) == 3


def test_a_hero_deleted_by_the_step_before_cancels_the_workflow_as_before(
    geneva_session, geneva_transport
):
    """The start re-reads the hero in the commit's transaction; gone, the successor is left to
    its own prepare, which cancels the workflow."""
    workflow, first = _run(geneva_session, DeletesItsHero)
    assert executor.execute(first, budget=inline.Budget())
    assert summary(geneva_session, workflow) == [
        ("one", "completed", "success"),
        ("two", "canceled", "canceled"),
    ]
    geneva_session.expire_all()
    assert workflow.state == "canceled"


def test_a_successor_with_a_skip_condition_starts_in_its_own_transaction(
    geneva_session, geneva_transport, commits
):
    workflow, first = _run(geneva_session, SkipsTwo)
    commits.clear()
    assert executor.execute(first, budget=inline.Budget())
    assert summary(geneva_session, workflow) == [
        ("one", "completed", "success"),
        ("two", "skipped", "skipped"),
        ("three", "completed", "success"),
    ]
    # one: start + outcome; two: its own prepare (the skip, with three scheduled); three: its
    # own start (the skip's commit could not start it: it runs only after the chain's check)
    # and outcome.
    assert len(commits) == 2 + 1 + 2


def test_a_class_with_a_cancel_condition_starts_each_step_on_its_own(
    geneva_session, geneva_transport
):
    workflow, first = _run(geneva_session, CancelsBeforeTwo)
    assert executor.execute(first, budget=inline.Budget())
    assert summary(geneva_session, workflow) == [
        ("one", "completed", "success"),
        ("two", "canceled", "canceled"),
    ]
    geneva_session.expire_all()
    assert workflow.state == "canceled"


def test_a_caller_s_own_session_is_never_taken_over(geneva_session, geneva_transport, commits):
    """``execute(session=...)`` (test helpers): the successor must not take the caller's
    session over (its objects would be let go), so it starts on its own."""
    workflow, first = _run(geneva_session, HeroChain)
    commits.clear()
    assert executor.execute(first, session=geneva_session, budget=inline.Budget())
    assert len(commits) == 2 * 3
    assert summary(geneva_session, workflow)[-1] == ("three", "completed", "success")


class _Died(BaseException):
    pass


def test_a_worker_that_dies_after_the_commit_leaves_the_successor_to_stuck_recovery(
    geneva_session, geneva_transport
):
    """The price of the setting (docs/MANUAL.md): the successor is already in progress when its
    worker dies, so it is not the dispatcher's to send; housekeeping's stuck recovery runs it
    again once ``stuck_in_progress_threshold`` has passed."""
    workflow, first = _run(geneva_session, HeroChain)

    def die(_sender: Any, **_payload: Any) -> None:
        raise _Died

    inline_successor.connect(die)
    try:
        with pytest.raises(_Died):
            executor.execute(first, budget=inline.Budget())
    finally:
        inline_successor.disconnect(die)
    geneva_transport.clear()
    one, two = executions(geneva_session, workflow)
    assert (one.state, one.outcome) == ("completed", "success")
    assert (two.state, two.sent_at) == ("in_progress", None) and two.started_at is not None
    geneva_session.expire_all()
    assert workflow.state == "performing"
    assert HeroChain.ran == ["one"]

    settings.stuck_in_progress_threshold = timedelta(milliseconds=1)
    time.sleep(0.01)
    assert housekeeping.run().stuck_in_progress_recovered == 1
    retry = executions(geneva_session, workflow)[-1]
    assert (retry.step_name, retry.state) == ("two", "scheduled")
    (message,) = geneva_transport.messages
    assert message.execution_id == retry.id
    assert executor.execute(retry.id, budget=inline.Budget())
    assert HeroChain.ran == ["one", "two:new", "three"]
    assert summary(geneva_session, workflow) == [
        ("one", "completed", "success"),
        ("two", "completed", "recovered"),
        ("two", "completed", "success"),
        ("three", "completed", "success"),
    ]
    geneva_session.expire_all()
    assert workflow.hero.status == "new+two"  # the recovered run wrote once


def test_a_pause_right_after_the_commit_finds_the_successor_running(
    geneva_session, geneva_transport
):
    """The other price: the operator's pause lands while the successor already counts as
    running, so it is handled as a pause during a body (the attempt is discarded, and
    ``resume()`` runs the step again), not as a pause before the step starts."""
    workflow, first = _run(geneva_session, HeroChain)

    def pause(_sender: Any, **payload: Any) -> None:
        with db.transaction() as session:
            found = session.get(Workflow, payload["workflow_id"])
            assert found is not None
            found.pause()

    inline_successor.connect(pause)
    try:
        assert executor.execute(first, budget=inline.Budget())
    finally:
        inline_successor.disconnect(pause)
    assert HeroChain.ran == ["one", "two:new"]  # two's body ran ...
    assert summary(geneva_session, workflow) == [
        ("one", "completed", "success"),
        ("two", "canceled", "canceled"),  # ... and its attempt was discarded
    ]
    geneva_session.expire_all()
    assert workflow.state == "paused"

    geneva_transport.clear()
    workflow.resume()
    geneva_session.commit()
    (message,) = geneva_transport.messages
    assert executor.execute(message.execution_id, budget=inline.Budget())
    # The discarded attempt's write rolled back: the rerun found the order as it was, and the
    # order carries the step's write once.
    assert HeroChain.ran == ["one", "two:new", "two:new", "three"]
    geneva_session.expire_all()
    assert workflow.state == "finished"
    assert workflow.hero.status == "new+two"
