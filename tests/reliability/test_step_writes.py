"""A step's own writes commit exactly once, with its outcome (docs/MANUAL.md, "Transactions:
what a step's writes can rely on").

The rule: what a step body (and its hooks) writes through ``self.session`` commits if and only
if the attempt's outcome commits as success. Each test drives one fault or operator action
while the body is held (tests/reliability/harness.py, BodyGate) after it inserted its ledger
row, then checks the ledger of committed writes against the executions
(tests/reliability/invariants.py, check_writes): one row per successful execution, none for
any other. Runs on SQLite, PostgreSQL and MariaDB; the connection cut needs a server.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import MetaData, func, select, text

from geneva_drive import ExceptionPolicy, Workflow, housekeeping, step
from geneva_drive.config import settings
from geneva_drive.models import StepExecution
from geneva_drive.states import Outcome, StepState
from tests.backends import connection_id, on_server_database, terminate
from tests.reliability.harness import (
    WRITES,
    WRITES_METADATA,
    BodyGate,
    Ledger,
    act,
    committed_writes,
    drain,
    new_workflow,
    requires_server_database,
    session_scope,
    step_history,
    workflow_state,
    write_ledger_row,
)
from tests.reliability.invariants import assert_invariants, assert_writes

LEDGER = Ledger()
GATE = BodyGate()
#: The server connection id the held body's session is on (the test cuts it).
BODY_CONNECTION: list[int] = []
WRITING_STEPS = ("one", "two")


@pytest.fixture
def geneva_metadata() -> list[MetaData]:
    return [WRITES_METADATA]


@pytest.fixture(autouse=True)
def _reset():
    LEDGER.clear()
    GATE.reset()
    BODY_CONNECTION.clear()
    RUNNING.clear()
    yield
    GATE.released.set()


#: The execution each workflow runs now (set by the hook: ``current_execution`` is the
#: workflow's current one, another once an operator moved the workflow on).
RUNNING: dict[int, int] = {}


def _remember(workflow: Workflow, execution: StepExecution) -> None:
    RUNNING[workflow.id] = execution.id


def _write(workflow: Workflow, step_name: str) -> None:
    LEDGER.record(workflow.id, step_name)
    write_ledger_row(workflow, step_name, RUNNING[workflow.id])


def _note_connection(workflow: Workflow) -> None:
    if on_server_database() and not BODY_CONNECTION:
        BODY_CONNECTION.append(connection_id(workflow.session))


def _write_and_hold(workflow: Workflow, step_name: str) -> None:
    """Write the ledger row and hold. PostgreSQL and MariaDB: the row is on the server before
    the hold. SQLite: after it - a body's write takes SQLite's database write lock until the
    attempt ends, so an operator cannot act between the two there (they wait for the body)."""
    if on_server_database():
        _write(workflow, step_name)
        _note_connection(workflow)
        GATE.hold()
    else:
        GATE.hold()
        _write(workflow, step_name)


class WritingWorkflow(Workflow):
    """``one`` writes its ledger row, notes its connection, and holds; ``two`` writes."""

    before_step_execution = _remember

    @step
    def one(self) -> None:
        _write_and_hold(self, "one")

    @step
    def two(self) -> None:
        _write(self, "two")


class FlushingWorkflow(Workflow):
    """Like WritingWorkflow, but the write is an ORM change flushed before the hold."""

    before_step_execution = _remember

    @step
    def one(self) -> None:
        hero = self.hero
        hero.status = f"touched-{self.current_execution.id}"
        self.session.flush()
        _write(self, "one")
        _note_connection(self)
        GATE.hold()

    @step
    def two(self) -> None:
        _write(self, "two")


class ReadingWorkflow(Workflow):
    """``one`` only reads, then holds: a lost connection is no reason to fail it."""

    before_step_execution = _remember

    @step
    def one(self) -> None:
        LEDGER.record(self.id, "one")
        self.session.execute(text("SELECT 1"))
        _note_connection(self)
        GATE.hold()

    @step
    def two(self) -> None:
        _write(self, "two")


class FailingOnceWorkflow(Workflow):
    """``one`` writes, then raises the first time; the policy reattempts it."""

    exception_policies = (
        ExceptionPolicy("reattempt", matching=RuntimeError, wait=timedelta(0), report="never"),
    )

    before_step_execution = _remember

    @step
    def one(self) -> None:
        _write(self, "one")
        if LEDGER.count(self.id, "one") == 1:
            raise RuntimeError("the first attempt fails after its write")

    @step
    def two(self) -> None:
        _write(self, "two")


class HookWritingWorkflow(Workflow):
    """The hooks write too: their rows follow the body's outcome."""

    def before_step_execution(self, execution: StepExecution) -> None:
        _remember(self, execution)
        if on_server_database():  # SQLite: a write here would keep the operator waiting
            _write(self, f"before-{execution.step_name}")

    def after_step_execution(self, execution: StepExecution) -> None:
        _write(self, f"after-{execution.step_name}")

    @step
    def one(self) -> None:
        _write_and_hold(self, "one")

    @step
    def two(self) -> None:
        _write(self, "two")


def _successes(workflow_id: int, step_name: str) -> int:
    return sum(
        1
        for name, state, outcome in step_history(workflow_id)
        if name == step_name and state == StepState.COMPLETED and outcome == Outcome.SUCCESS
    )


def _assert_ledger(
    rdb: Any, workflow_id: int, steps: tuple[str, ...] = WRITING_STEPS, *, checker: bool = True
) -> None:
    """The ledger rule, on this workflow's rows (per label: a step, or a hook around one) and
    in the invariant checker."""
    with session_scope() as session:
        per_step = dict(
            session.execute(
                select(WRITES.c.step_name, func.count())
                .where(WRITES.c.workflow_id == workflow_id)
                .group_by(WRITES.c.step_name)
            ).all()
        )
    for name in steps:
        step_name = name.split("-")[-1]
        assert per_step.get(name, 0) == _successes(workflow_id, step_name), (
            name,
            per_step,
            step_history(workflow_id),
        )
    if checker:
        assert_writes(rdb, WRITES, steps)


# --- a lost connection after the body wrote (PostgreSQL, MariaDB) --------------------------------


def _cut_the_body_connection() -> None:
    assert BODY_CONNECTION, "the body did not note its connection"
    with session_scope() as session:
        terminate(session, BODY_CONNECTION[0])


@requires_server_database
@pytest.mark.parametrize("flow", [WritingWorkflow, FlushingWorkflow])
def test_connection_cut_after_the_body_wrote_fails_the_attempt(rdb, flow):
    workflow_id = new_workflow(flow)
    errors: list[BaseException] = []
    GATE.run_held(workflow_id, while_held=_cut_the_body_connection, worker_errors=errors)
    # Never success without the writes: the attempt failed through its policy (pause), with
    # an error that names the lost connection.
    assert workflow_state(workflow_id) == "paused"
    assert committed_writes(workflow_id) == 0
    assert _successes(workflow_id, "one") == 0
    assert len(errors) == 1 and "connection" in str(errors[0]).lower(), errors
    with session_scope() as session:
        messages = [
            message
            for state, message in session.execute(
                select(StepExecution.state, StepExecution.error_message).where(
                    StepExecution.workflow_id == workflow_id
                )
            )
            if state == StepState.FAILED and message
        ]
    assert any("database connection" in m for m in messages), messages
    _assert_ledger(rdb, workflow_id)
    act(workflow_id, "resume")
    drain()
    assert workflow_state(workflow_id) == "finished"
    assert LEDGER.count(workflow_id, "one") == 2
    _assert_ledger(rdb, workflow_id)
    assert_invariants(rdb, quiescent=True)


@requires_server_database
def test_connection_cut_after_the_body_only_read_reconnects_and_succeeds(rdb):
    workflow_id = new_workflow(ReadingWorkflow)
    GATE.run_held(workflow_id, while_held=_cut_the_body_connection)
    assert _successes(workflow_id, "one") == 1
    drain()
    assert workflow_state(workflow_id) == "finished"
    assert LEDGER.count(workflow_id, "one") == 1
    _assert_ledger(rdb, workflow_id, ("two",))
    assert_invariants(rdb, quiescent=True)


# --- operator actions discard the attempt: its writes roll back ---------------------------------


def test_pause_mid_body_then_resume_writes_once(rdb):
    workflow_id = new_workflow(WritingWorkflow)
    GATE.run_held(workflow_id, ("pause",))
    assert workflow_state(workflow_id) == "paused"
    assert committed_writes(workflow_id) == 0  # the discarded attempt's row rolled back
    _assert_ledger(rdb, workflow_id)
    act(workflow_id, "resume")
    drain()
    assert workflow_state(workflow_id) == "finished"
    assert LEDGER.count(workflow_id, "one") == 2  # the paused step ran again
    assert committed_writes(workflow_id) == 2  # one, then two: once each
    _assert_ledger(rdb, workflow_id)
    assert_invariants(rdb, quiescent=True)


def test_pause_and_resume_mid_body_keeps_the_writes_with_the_success(rdb):
    workflow_id = new_workflow(WritingWorkflow)
    GATE.run_held(workflow_id, ("pause",), ("resume",))
    drain()
    assert workflow_state(workflow_id) == "finished"
    assert LEDGER.count(workflow_id, "one") == 1
    _assert_ledger(rdb, workflow_id)
    assert_invariants(rdb, quiescent=True)


def test_cancel_mid_body_commits_no_writes(rdb):
    workflow_id = new_workflow(WritingWorkflow)
    GATE.run_held(workflow_id, ("cancel",))
    assert workflow_state(workflow_id) == "canceled"
    assert committed_writes(workflow_id) == 0
    _assert_ledger(rdb, workflow_id)
    assert_invariants(rdb, quiescent=True)


def test_skip_mid_body_commits_no_writes(rdb):
    workflow_id = new_workflow(WritingWorkflow)
    GATE.run_held(workflow_id, ("pause",), ("skip",))
    if workflow_state(workflow_id) == "paused":
        act(workflow_id, "resume")
    drain()
    assert workflow_state(workflow_id) == "finished"
    assert _successes(workflow_id, "one") == 0
    _assert_ledger(rdb, workflow_id)
    assert_invariants(rdb, quiescent=True)


@pytest.mark.parametrize("target", ["one", "two"])
def test_resume_at_mid_body_commits_only_the_successful_attempts(rdb, target):
    workflow_id = new_workflow(WritingWorkflow)
    GATE.run_held(workflow_id, ("pause",), ("resume_at", target))
    drain()
    assert workflow_state(workflow_id) == "finished"
    _assert_ledger(rdb, workflow_id)
    assert_invariants(rdb, quiescent=True)


def test_stale_execution_recovered_mid_body_commits_no_writes(rdb):
    """Housekeeping recovers the execution as stuck while its body still runs (a slow body, a
    worker thought dead): the late finalize finds it closed and its writes roll back."""
    workflow_id = new_workflow(WritingWorkflow)

    def recover() -> None:
        settings.stuck_in_progress_threshold = 0
        housekeeping.run()

    GATE.run_held(workflow_id, while_held=recover)
    drain()
    assert workflow_state(workflow_id) == "finished"
    assert LEDGER.count(workflow_id, "one") == 2
    _assert_ledger(rdb, workflow_id)
    assert_invariants(rdb, quiescent=True)


def test_a_failed_attempt_commits_no_writes(rdb):
    workflow_id = new_workflow(FailingOnceWorkflow)
    drain()
    assert workflow_state(workflow_id) == "finished"
    assert LEDGER.count(workflow_id, "one") == 2
    _assert_ledger(rdb, workflow_id)
    assert_invariants(rdb, quiescent=True)


def test_hook_writes_follow_the_outcome(rdb):
    workflow_id = new_workflow(HookWritingWorkflow)
    GATE.run_held(workflow_id, ("pause",))
    assert committed_writes(workflow_id) == 0  # body and both hooks: discarded together
    act(workflow_id, "resume")
    drain()
    assert workflow_state(workflow_id) == "finished"
    labels = ("one", "two", "after-one", "after-two")
    if on_server_database():
        labels += ("before-one", "before-two")
    _assert_ledger(rdb, workflow_id, labels, checker=False)
    assert committed_writes(workflow_id) == len(labels)
    assert_invariants(rdb, quiescent=True)
