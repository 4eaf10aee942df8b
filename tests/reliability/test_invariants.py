"""The invariant checker itself: it passes on healthy data and catches each kind of damage."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
from sqlalchemy import delete, insert, text

from geneva_drive import Workflow, step
from geneva_drive.models import utcnow
from geneva_drive.states import FINAL_STEP_STATES
from geneva_drive.testing import speedrun_workflow
from tests.engine.helpers import make_order
from tests.reliability.invariants import (
    assert_invariants,
    check_body_runs,
    check_invariants,
    check_writes,
    evaluate,
)
from tests.reliability.ledger import WRITES, WRITES_METADATA, write_ledger_row

NOW = utcnow()


_UNSET = object()


def wf(id, state="ready", current_step_name=_UNSET):
    if current_step_name is _UNSET:
        current_step_name = "a" if state == "performing" else None
    return SimpleNamespace(
        id=id, state=state, type="W", current_step_name=current_step_name, next_step_name="a"
    )


def ex(
    id,
    workflow_id,
    state="scheduled",
    outcome=None,
    signal_id=None,
    step_name="a",
    finished_at=_UNSET,
):
    if finished_at is _UNSET:
        finished_at = NOW if state in FINAL_STEP_STATES else None
    return SimpleNamespace(
        id=id,
        workflow_id=workflow_id,
        state=state,
        outcome=outcome,
        signal_id=signal_id,
        step_name=step_name,
        finished_at=finished_at,
    )


def sig(id, workflow_id, state="pending", claimed=0, consumed=0, claimed_at=None, consumed_at=None):
    return SimpleNamespace(
        id=id,
        workflow_id=workflow_id,
        name="s",
        state=state,
        claimed=claimed,
        consumed=consumed,
        claimed_at=claimed_at,
        consumed_at=consumed_at,
    )


CASES = {
    "current step while ready": ({1: wf(1, "ready", "a")}, [], {}, "current_step_name='a'"),
    "current step while paused": ({1: wf(1, "paused", "a")}, [], {}, "set exactly while"),
    "performing without current step": (
        {1: wf(1, "performing", None)},
        [ex(1, 1, "in_progress")],
        {},
        "set exactly while performing",
    ),
    "closed without finished_at": (
        {1: wf(1)},
        [ex(1, 1, "skipped", "skipped", finished_at=None), ex(2, 1)],
        {},
        "skipped without finished_at",
    ),
    "two active": ({1: wf(1)}, [ex(1, 1), ex(2, 1, "in_progress")], {}, "scheduled/in_progress"),
    "two current": ({1: wf(1)}, [ex(1, 1), ex(2, 1, "waiting")], {}, "current executions"),
    "illegal outcome": ({1: wf(1)}, [ex(1, 1, "completed", "failed")], {}, "illegal state/outcome"),
    "outcome on live": (
        {1: wf(1)},
        [ex(1, 1, "scheduled", "success")],
        {},
        "illegal state/outcome",
    ),
    "unknown step state": ({1: wf(1)}, [ex(1, 1, "zombie")], {}, "unknown state"),
    "unknown wf state": ({1: wf(1, "sleeping")}, [], {}, "unknown state"),
    "orphan execution": ({}, [ex(1, 99, "completed", "success")], {}, "orphaned"),
    "orphan signal": ({}, [], {1: sig(1, 5)}, "orphaned"),
    "finished with current": ({1: wf(1, "finished")}, [ex(1, 1)], {}, "finished but has current"),
    "canceled with waiting": ({1: wf(1, "canceled")}, [ex(1, 1, "waiting")], {}, "canceled but"),
    "consumed > claimed": ({1: wf(1)}, [], {1: sig(1, 1, "consumed", 1, 2, NOW, NOW)}, "counters"),
    "pending but claimed": ({1: wf(1)}, [], {1: sig(1, 1, "pending", 1, 0, NOW)}, "state pending"),
    "claimed with zero": ({1: wf(1)}, [], {1: sig(1, 1, "claimed", 0, 0)}, "state claimed"),
    "consumed with zero": (
        {1: wf(1)},
        [],
        {1: sig(1, 1, "consumed", 1, 0, NOW, NOW)},
        "consumed with consumed=0",
    ),
    "consumed_at missing": ({1: wf(1)}, [], {1: sig(1, 1, "consumed", 1, 1, NOW)}, "consumed_at"),
    "signal on two": (
        {1: wf(1), 2: wf(2)},
        [ex(1, 1, signal_id=1), ex(2, 2, signal_id=1)],
        {1: sig(1, 1, "claimed", 1, 0, NOW)},
        "attached to 2 current",
    ),
    "foreign signal": (
        {1: wf(1), 2: wf(2)},
        [ex(1, 1, signal_id=1)],
        {1: sig(1, 2, "claimed", 1, 0, NOW)},
        "belongs to workflow 2",
    ),
    "unclaimed attached": ({1: wf(1)}, [ex(1, 1, signal_id=1)], {1: sig(1, 1)}, "never claimed"),
    "waiting with signal": (
        {1: wf(1)},
        [ex(1, 1, "waiting", signal_id=1)],
        {1: sig(1, 1, "claimed", 1, 0, NOW)},
        "parked at the gate",
    ),
    "missing signal": ({1: wf(1)}, [ex(1, 1, signal_id=7)], {}, "does not exist"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_kind_of_damage_is_reported(name):
    workflows, executions, signals, needle = CASES[name]
    report = evaluate(workflows, executions, signals)
    assert not report.ok
    assert any(needle in v for v in report.violations), report.violations


def test_quiescent_rules():
    report = evaluate(
        {1: wf(1), 2: wf(2, "performing")}, [ex(1, 2, "in_progress")], {}, quiescent=True
    )
    text_ = "\n".join(report.violations)
    assert "ready with 0 current" in text_
    assert "still performing" in text_
    assert "still in_progress" in text_
    assert evaluate({1: wf(1)}, [ex(1, 1)], {}, quiescent=True).ok


def test_a_body_run_after_its_execution_closed_is_reported(geneva_session):
    class InvariantBodyProbe(Workflow):
        @step
        def one(self):
            pass

    order = make_order(geneva_session)
    workflow = InvariantBodyProbe.create(hero=order)
    speedrun_workflow(workflow)
    [execution] = workflow.step_executions
    assert execution.finished_at is not None
    before = execution.finished_at - timedelta(seconds=1)
    after = execution.finished_at + timedelta(seconds=1)
    assert check_body_runs(geneva_session, [(execution.id, before)]) == []
    [violation] = check_body_runs(geneva_session, [(execution.id, after)])
    assert f"execution {execution.id}: body ran at" in violation


def test_healthy_database_passes_and_damage_is_found(geneva_session):
    class InvariantProbeWorkflow(Workflow):
        @step
        def one(self):
            pass

        @step(wait=timedelta(hours=1))
        def two(self):
            pass

    for _ in range(3):
        order = make_order(geneva_session)
        speedrun_workflow(InvariantProbeWorkflow.create(hero=order))
    order = make_order(geneva_session)
    waiting = InvariantProbeWorkflow.create(hero=order)
    geneva_session.commit()
    report = assert_invariants(geneva_session.get_bind(), quiescent=True)
    assert report.workflows == 4 and report.executions == 7

    # Damage the data behind the engine's back: a finished workflow gets a live execution.
    geneva_session.execute(
        text(
            "UPDATE geneva_drive_step_executions SET state='scheduled', outcome=NULL "
            "WHERE id = (SELECT MIN(id) FROM geneva_drive_step_executions)"
        )
    )
    geneva_session.commit()
    report = check_invariants(geneva_session.get_bind())
    assert not report.ok
    assert any("finished but has current" in v for v in report.violations)
    assert waiting.id is not None


class InvariantWritesProbe(Workflow):
    """``one`` writes its ledger row through self.session; ``two`` fails after writing it."""

    def before_step_execution(self, execution):
        self._probe_execution_id = execution.id

    @step
    def one(self):
        write_ledger_row(self, "one", self._probe_execution_id)

    @step(on_exception="pause")
    def two(self):
        write_ledger_row(self, "two", self._probe_execution_id)
        raise RuntimeError("fails after its write")


@pytest.fixture
def geneva_metadata():
    return [WRITES_METADATA]


def test_the_ledger_rule_passes_on_healthy_writes_and_finds_each_kind_of_damage(geneva_session):
    order = make_order(geneva_session)
    workflow = InvariantWritesProbe.create(hero=order)
    with pytest.raises(RuntimeError, match="fails after its write"):
        speedrun_workflow(workflow)
    one, two = workflow.step_executions
    assert (one.state, two.state) == ("completed", "failed")
    assert check_writes(geneva_session, WRITES, ["one", "two"]) == []

    def add(execution_id: int) -> None:
        geneva_session.execute(
            insert(WRITES).values(workflow_id=workflow.id, step_name="x", execution_id=execution_id)
        )
        geneva_session.commit()

    add(one.id)  # doubled
    add(two.id)  # the writes of a failed attempt committed
    add(10**6)  # writes of an execution that does not exist
    violations = check_writes(geneva_session, WRITES, ["one", "two"])
    assert any(f"execution {one.id}" in v and "with 2 writes" in v for v in violations)
    assert any(f"execution {two.id}" in v and "1 of its writes committed" in v for v in violations)
    assert any("execution 1000000, which does not exist" in v for v in violations)
    geneva_session.execute(delete(WRITES))
    geneva_session.commit()
    [lost] = check_writes(geneva_session, WRITES, ["one", "two"])
    assert f"execution {one.id}" in lost and "writes were lost" in lost
