"""The dispatcher sends due, unsent executions of ready workflows, once per resend interval,
after its own commit; executions due later than the horizon wait for it (docs/MANUAL.md,
"The row is the schedule; Celery is only the transport")."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from geneva_drive import Workflow, settings, step
from geneva_drive.dialects import dialect_for
from geneva_drive.dispatch import dispatch_due, run_dispatcher
from geneva_drive.models import StepExecution, utcnow
from tests.engine.helpers import assert_close, create_workflow, executions, make_order


class DispatchLaterWorkflow(Workflow):
    """First step two days out: beyond any horizon, so nothing is sent at commit."""

    @step(wait=timedelta(days=2))
    def remind(self):
        pass


class DispatchNowWorkflow(Workflow):
    @step
    def greet(self):
        pass


def _execution(session, wf):
    session.expire_all()
    return session.scalars(select(StepExecution).where(StepExecution.workflow_id == wf.id)).one()


def test_execution_beyond_horizon_is_not_sent_at_commit_nor_before_due(
    geneva_session, geneva_transport
):
    wf = create_workflow(geneva_session, DispatchLaterWorkflow)
    assert geneva_transport.execution_ids == []
    assert dispatch_due() == 0
    assert dispatch_due(utcnow() + timedelta(days=2) - timedelta(minutes=1)) == 0
    assert geneva_transport.execution_ids == []
    assert _execution(geneva_session, wf).sent_at is None


def test_due_execution_is_sent_marked_and_given_a_job_id(geneva_session, geneva_transport):
    wf = create_workflow(geneva_session, DispatchLaterWorkflow)
    execution = _execution(geneva_session, wf)
    execution.scheduled_for = utcnow() - timedelta(seconds=1)  # the two days have passed
    geneva_session.commit()
    now = utcnow()
    assert dispatch_due(now) == 1
    execution = _execution(geneva_session, wf)
    assert geneva_transport.execution_ids == [execution.id]
    assert execution.sent_at == now
    assert execution.job_id == geneva_transport.messages[0].job_id
    # Due work goes out at once: no countdown, no ETA held by a worker.
    assert geneva_transport.messages[0].countdown is None
    assert geneva_transport.messages[0].eta is None


def test_sent_execution_is_resent_only_after_resend_interval(geneva_session, geneva_transport):
    settings.dispatch_resend_after = timedelta(minutes=2)
    create_workflow(geneva_session, DispatchLaterWorkflow)
    due = utcnow() + timedelta(days=2, seconds=1)
    assert dispatch_due(due) == 1
    assert dispatch_due(due + timedelta(minutes=1)) == 0
    assert dispatch_due(due + timedelta(minutes=2, seconds=1)) == 1
    assert len(geneva_transport.messages) == 2
    first, second = geneva_transport.messages
    assert first.execution_id == second.execution_id
    assert first.job_id != second.job_id


def test_execution_sent_at_commit_is_not_sent_again_by_the_next_sweep(
    geneva_session, geneva_transport
):
    create_workflow(geneva_session, DispatchNowWorkflow)
    assert len(geneva_transport.messages) == 1
    assert dispatch_due() == 0
    assert len(geneva_transport.messages) == 1


def test_lost_message_is_resent_as_a_backstop(geneva_session, geneva_transport):
    wf = create_workflow(geneva_session, DispatchNowWorkflow)
    geneva_transport.clear()  # the broker lost it
    assert dispatch_due(utcnow() + settings.dispatch_resend_after + timedelta(seconds=1)) == 1
    assert geneva_transport.execution_ids == [_execution(geneva_session, wf).id]


def test_paused_workflow_is_not_dispatched(geneva_session, geneva_transport):
    wf = create_workflow(geneva_session, DispatchLaterWorkflow)
    wf.pause()
    geneva_session.commit()
    assert dispatch_due(utcnow() + timedelta(days=3)) == 0
    assert geneva_transport.execution_ids == []


def test_sweep_covers_more_rows_than_one_batch(geneva_session, geneva_transport):
    workflows = [create_workflow(geneva_session, DispatchLaterWorkflow) for _ in range(7)]
    assert dispatch_due(utcnow() + timedelta(days=3), batch_size=3) == 7
    expected = {_execution(geneva_session, wf).id for wf in workflows}
    assert set(geneva_transport.execution_ids) == expected
    assert len(geneva_transport.execution_ids) == 7


def test_oldest_due_execution_is_sent_first(geneva_session, geneva_transport):
    first = create_workflow(geneva_session, DispatchLaterWorkflow)
    second = create_workflow(geneva_session, DispatchLaterWorkflow)
    ex_second = _execution(geneva_session, second)
    ex_second.scheduled_for = ex_second.scheduled_for - timedelta(hours=1)
    geneva_session.commit()
    assert dispatch_due(utcnow() + timedelta(days=3), batch_size=1) == 2
    assert geneva_transport.execution_ids == [ex_second.id, _execution(geneva_session, first).id]


def test_nothing_is_sent_when_the_sweep_rolls_back(geneva_session, geneva_transport, monkeypatch):
    create_workflow(geneva_session, DispatchLaterWorkflow)
    from sqlalchemy.orm import Session

    def broken_commit(self):
        raise RuntimeError("database went away")

    monkeypatch.setattr(Session, "commit", broken_commit)
    try:
        dispatch_due(utcnow() + timedelta(days=3))
    except RuntimeError:
        pass
    else:
        raise AssertionError("the sweep should have raised")
    monkeypatch.undo()
    assert geneva_transport.execution_ids == []


def test_run_dispatcher_sweeps_until_stopped(geneva_session, geneva_transport):
    wf = create_workflow(geneva_session, DispatchNowWorkflow)
    geneva_transport.clear()
    execution = _execution(geneva_session, wf)
    execution.sent_at = None  # as if the send had failed before it was recorded
    geneva_session.commit()
    stop = threading.Event()
    thread = threading.Thread(
        target=run_dispatcher, args=(stop,), kwargs={"interval": 0.01, "housekeeping": False}
    )
    thread.start()
    try:
        for _ in range(500):
            if geneva_transport.execution_ids:
                break
            threading.Event().wait(0.01)
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()
    assert geneva_transport.execution_ids == [execution.id]


def test_rows_locked_by_another_dispatcher_are_skipped_on_a_server_database(
    geneva_session, geneva_transport
):
    if not dialect_for(geneva_session).row_locks:
        pytest.skip(
            "SKIP LOCKED is PostgreSQL's and MariaDB's; SQLite serializes dispatchers with its "
            "write lock"
        )
    wf = create_workflow(geneva_session, DispatchLaterWorkflow)
    later = utcnow() + timedelta(days=3)
    # Another dispatcher's open claim: the row is locked FOR UPDATE in this transaction.
    geneva_session.scalars(
        select(StepExecution).where(StepExecution.workflow_id == wf.id).with_for_update()
    ).one()
    assert dispatch_due(later) == 0  # skipped at once, not waited for
    geneva_session.commit()
    assert dispatch_due(later) == 1


class DispatchRoutedWorkflow(Workflow):
    step_job_options = {"queue": "payments", "priority": 5}

    @step(wait=timedelta(days=2), job_options={"priority": 9})
    def settle(self):
        pass


def test_dispatched_message_carries_the_merged_job_options(geneva_session, geneva_transport):
    wf = create_workflow(geneva_session, DispatchRoutedWorkflow)
    execution = _execution(geneva_session, wf)
    execution.scheduled_for = utcnow() - timedelta(seconds=1)
    geneva_session.commit()
    assert dispatch_due() == 1
    (message,) = geneva_transport.messages
    assert (message.queue, message.priority) == ("payments", 9)


# --- a wait_until job option beyond the horizon ----------------------------------------------


class DispatchWaitUntilWorkflow(Workflow):
    @step
    def held(self):
        pass


def _held_workflow(session, ahead: timedelta):
    workflow = DispatchWaitUntilWorkflow.create(
        hero=make_order(session), step_job_options={"wait_until": utcnow() + ahead}
    )
    session.commit()
    return workflow


def test_a_wait_until_beyond_the_horizon_is_held_like_scheduled_for(
    geneva_session, geneva_transport
):
    workflow = _held_workflow(geneva_session, timedelta(days=7))
    [execution] = executions(geneva_session, workflow)
    # No message at commit: the row itself carries the time, as for a far scheduled_for.
    assert geneva_transport.messages == []
    assert execution.sent_at is None
    assert_close(execution.scheduled_for, utcnow() + timedelta(days=7))
    assert dispatch_due() == 0
    assert dispatch_due(utcnow() + timedelta(days=6)) == 0
    assert geneva_transport.messages == []


def test_the_dispatcher_never_sends_a_long_countdown_for_a_wait_until_ahead(
    geneva_session, geneva_transport
):
    """A row that is due by its scheduled_for while its wait_until job option still lies days
    ahead (an option set after the row was made, or rows written by an older version): the
    dispatcher used to send it with a days-long countdown, which the worker holds in memory
    and Redis redelivers past its visibility timeout. It is held to the horizon instead."""
    workflow = _held_workflow(geneva_session, timedelta(days=7))
    [execution] = executions(geneva_session, workflow)
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.id == execution.id)
        .values(scheduled_for=utcnow() - timedelta(minutes=1))
    )
    geneva_session.commit()
    assert dispatch_due() == 1  # looked at once...
    assert geneva_transport.messages == []  # ...and nothing sent
    [execution] = executions(geneva_session, workflow)
    assert execution.sent_at is None
    assert_close(execution.scheduled_for, utcnow() + timedelta(days=7))
    assert dispatch_due() == 0  # not due again until then


def test_a_wait_until_that_comes_within_the_horizon_is_sent_with_a_short_countdown(
    geneva_session, geneva_transport
):
    workflow = _held_workflow(geneva_session, timedelta(seconds=90))
    assert geneva_transport.messages == []
    # Time passes (the option and the row travel together, as in B6's time travel).
    soon = utcnow() + timedelta(seconds=20)
    workflow.step_job_options = {"wait_until": soon}
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == workflow.id)
        .values(scheduled_for=soon - timedelta(seconds=40))
    )
    geneva_session.commit()
    assert dispatch_due() == 1
    [message] = geneva_transport.messages
    assert 15 <= message.countdown <= 20


# --- a burst due at one instant ----------------------------------------------------------------


def _burst(geneva_session, count: int):
    """``count`` workflows whose first executions are all due at one and the same instant."""
    workflows = [create_workflow(geneva_session, DispatchLaterWorkflow) for _ in range(count)]
    instant = utcnow() + timedelta(days=2, hours=1)
    geneva_session.execute(update(StepExecution).values(scheduled_for=instant))
    geneva_session.commit()
    return workflows, instant


def test_a_burst_at_one_instant_is_sent_exactly_once_in_batches_in_id_order(
    geneva_session, geneva_transport
):
    workflows, instant = _burst(geneva_session, 23)
    # A paused workflow first in the order: passed over once, not read again by every batch.
    workflows[0].pause()
    geneva_session.commit()
    batches = []
    import geneva_drive.dispatch as dispatch_module

    original = dispatch_module._dispatch_batch

    def counting(now, batch_size, after):
        sent, following = original(now, batch_size, after)
        batches.append(sent)
        return sent, following

    dispatch_module._dispatch_batch = counting
    try:
        assert dispatch_due(instant + timedelta(seconds=1), batch_size=5) == 22
    finally:
        dispatch_module._dispatch_batch = original
    assert batches == [5, 5, 5, 5, 2]
    expected = [_execution(geneva_session, wf).id for wf in workflows[1:]]
    assert geneva_transport.execution_ids == sorted(expected)  # each once, oldest id first
    # The next sweep finds nothing left to send (the resend interval has not passed).
    assert dispatch_due(instant + timedelta(seconds=2), batch_size=5) == 0


def test_the_claim_reads_due_work_off_the_index_in_order_without_a_sort(
    geneva_session, geneva_transport
):
    """The claim after the first batch (keyset on (scheduled_for, id)) is an index range in
    the order it sends, with no sort step: the cost of a batch does not grow with a burst at
    one instant. SQLite's plan names a sort ``USE TEMP B-TREE``; PostgreSQL's a ``Sort`` node
    (sequential scans and sorts discouraged, so the plan shows whether the index can serve)."""
    from sqlalchemy import event

    from geneva_drive.dispatch import _due_query

    dialect = geneva_session.get_bind().dialect.name
    if dialect in ("mysql", "mariadb"):
        pytest.skip("InnoDB's (state, scheduled_for) index carries the primary key: no new index")
    _workflows, instant = _burst(geneva_session, 3)
    query = _due_query(instant, 2, geneva_session, after=(instant, 1))
    engine = geneva_session.get_bind()
    captured = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        captured.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        geneva_session.execute(query).all()
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    ((statement, parameters),) = captured
    connection = geneva_session.connection()
    sqlite = dialect == "sqlite"
    if not sqlite:
        connection.exec_driver_sql("SET LOCAL enable_seqscan = off")
        connection.exec_driver_sql("SET LOCAL enable_sort = off")
    explain = "EXPLAIN QUERY PLAN " if sqlite else "EXPLAIN "
    rows = connection.exec_driver_sql(explain + statement, parameters).fetchall()
    plan = "\n".join(str(row[-1]) if sqlite else str(row[0]) for row in rows)
    geneva_session.rollback()
    assert "TEMP B-TREE" not in plan and "Sort" not in plan, plan
    if sqlite:
        # SQLite's (state, scheduled_for) index carries the rowid: that order already.
        assert "USING INDEX index_geneva_drive_step_executions_scheduled" in plan, plan
    else:
        assert "index_geneva_drive_step_executions_due" in plan, plan
        # Both keyset columns are index conditions, not a filter over rows already passed.
        conditions = [line for line in plan.splitlines() if "Index Cond:" in line]
        assert any("ROW(scheduled_for, id) > ROW(" in line for line in conditions), plan
