"""Housekeeping: batched cleanup of old terminal workflows, recovery of stuck executions
(reattempt or cancel; resumable ones continue from their cursor), a failing row never loops,
and the gem's gauges through the metrics facade (docs/MANUAL.md, "Housekeeping")."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import func, select

from geneva_drive import (
    Workflow,
    housekeeping,
    metrics_facade,
    recovery,
    resumable_step,
    settings,
    step,
)
from geneva_drive.housekeeping import HousekeepingReport
from geneva_drive.instrumentation import set_error_reporter
from geneva_drive.models import Signal, StepExecution, utcnow
from geneva_drive.testing import run_iterations, speedrun_workflow
from tests.engine.helpers import make_order


class HkTwoStepWorkflow(Workflow):
    @step
    def first(self):
        pass

    @step
    def second(self):
        pass


class HkSignalWorkflow(Workflow):
    @step(wait_for="go")
    def wait_here(self):
        pass


class HkResumableWorkflow(Workflow):
    @resumable_step(max_iterations=2)
    def walk(self, it):
        it.iterate_over(range(10), lambda item: None)


def _create(session, cls=HkTwoStepWorkflow):
    wf = cls.create(hero=make_order(session))
    session.commit()
    return wf


def _current(session, wf):
    session.expire_all()
    return session.scalars(
        select(StepExecution)
        .where(
            StepExecution.workflow_id == wf.id,
            StepExecution.state.in_(["scheduled", "in_progress", "waiting"]),
        )
        .order_by(StepExecution.id)
    ).first()


def _executions(session, wf):
    session.expire_all()
    return list(
        session.scalars(
            select(StepExecution)
            .where(StepExecution.workflow_id == wf.id)
            .order_by(StepExecution.id)
        )
    )


def _make_stuck_in_progress(session, wf, age=timedelta(hours=2)):
    """What a worker killed mid-step leaves behind: in_progress, workflow performing."""
    execution = _current(session, wf)
    execution.state = "in_progress"
    execution.started_at = utcnow() - age
    wf.state = "performing"
    wf.current_step_name = execution.step_name
    session.commit()
    return execution


def _backdate(session, wf, age):
    """Make the current scheduled execution overdue by ``age`` (its message was lost): due
    and, if it was sent, sent that long ago."""
    execution = _current(session, wf)
    execution.scheduled_for = utcnow() - age
    if execution.sent_at is not None:
        execution.sent_at = execution.scheduled_for
    session.commit()


def _count(session, model):
    return session.scalar(select(func.count()).select_from(model))


@pytest.fixture
def reported():
    errors = []
    set_error_reporter(lambda error, context: errors.append((error, context)))
    yield errors
    set_error_reporter(None)


@pytest.fixture
def gauges():
    seen = []

    def sink(name, value, tags):
        seen.append((name, value, dict(tags)))

    metrics_facade.add_sink(sink)
    yield seen
    metrics_facade.remove_sink(sink)


# --- cleanup ---------------------------------------------------------------------------------


def test_cleanup_deletes_old_terminal_workflows_in_batches_and_keeps_the_rest(geneva_session):
    settings.housekeeping_batch_size = 2
    old = []
    for _ in range(3):
        wf = _create(geneva_session)
        speedrun_workflow(wf)  # finished: two completed executions each
        old.append(wf)
    canceled = _create(geneva_session, HkSignalWorkflow)
    canceled.signal("go")
    geneva_session.commit()
    canceled.cancel()
    geneva_session.commit()
    old.append(canceled)
    recent = _create(geneva_session)
    speedrun_workflow(recent)
    ongoing = _create(geneva_session)  # ready, and "old" too: never deleted
    long_ago = utcnow() - timedelta(days=31)
    for wf in [*old, ongoing]:
        wf.transitioned_at = long_ago
        wf.created_at = long_ago
    geneva_session.commit()

    report = housekeeping.run()

    assert report.workflows_cleaned_up == 4
    assert report.step_executions_cleaned_up == 3 * 2 + 1
    assert report.signals_cleaned_up == 1
    remaining = set(geneva_session.scalars(select(Workflow.id)))
    assert remaining == {recent.id, ongoing.id}
    assert _count(geneva_session, Signal) == 0
    assert report["workflows_cleaned_up"] == 4


def test_cleanup_is_disabled_by_none(geneva_session):
    settings.delete_completed_workflows_after = None
    wf = _create(geneva_session)
    speedrun_workflow(wf)
    wf.transitioned_at = utcnow() - timedelta(days=365)
    geneva_session.commit()
    report = housekeeping.run()
    assert report.as_dict() == HousekeepingReport().as_dict()
    assert _count(geneva_session, Workflow) == 1


def _old_finished(session, count, cls=HkTwoStepWorkflow):
    """``count`` finished workflows moved back past the cleanup threshold."""
    made = []
    for _ in range(count):
        wf = _create(session, cls)
        speedrun_workflow(wf)
        made.append(wf)
    long_ago = utcnow() - timedelta(days=31)
    for wf in made:
        wf.transitioned_at = long_ago
    session.commit()
    return made


def _slices(monkeypatch):
    """Record what every committed-or-not cleanup slice deleted: (executions, signals, wfs)."""
    seen = []
    real = housekeeping._delete_workflows

    def recording(session, ids, postgres):
        counts = real(session, ids, postgres)
        seen.append(counts)
        return counts

    monkeypatch.setattr(housekeeping, "_delete_workflows", recording)
    return seen


def test_cleanup_over_many_slices_deletes_exact_counts_within_the_slice_caps(
    geneva_session, monkeypatch
):
    settings.housekeeping_batch_size = 2  # workflows per slice; at most 5 x 2 rows in all
    small = _old_finished(geneva_session, 9)  # 3 rows each: itself + 2 executions
    waited = []
    for _ in range(3):  # 3 rows each too: itself, 1 execution, 1 signal
        wf = _create(geneva_session, HkSignalWorkflow)
        wf.signal("go")
        geneva_session.commit()
        wf.cancel()
        geneva_session.commit()
        waited.append(wf)
    (big,) = _old_finished(geneva_session, 1, HkResumableWorkflow)  # several links
    huge = _create(geneva_session)
    speedrun_workflow(huge)
    for _ in range(10):  # 12 executions: more than a slice may hold, so a slice alone
        geneva_session.add(
            StepExecution(
                workflow_id=huge.id,
                step_name="first",
                state="completed",
                scheduled_for=utcnow(),
            )
        )
    recent = _old_finished(geneva_session, 1)[0]
    ongoing = _create(geneva_session)
    long_ago = utcnow() - timedelta(days=31)
    for wf in [*waited, huge, ongoing]:
        wf.transitioned_at = long_ago
    recent.transitioned_at = utcnow()
    geneva_session.commit()
    executions_before = {
        wf.id: len(_executions(geneva_session, wf)) for wf in [*small, *waited, big, huge]
    }
    slices = _slices(monkeypatch)

    report = housekeeping.run()

    assert report.workflows_cleaned_up == 9 + 3 + 1 + 1
    assert report.step_executions_cleaned_up == sum(executions_before.values())
    assert report.signals_cleaned_up == 3
    assert set(geneva_session.scalars(select(Workflow.id))) == {recent.id, ongoing.id}
    geneva_session.expire_all()
    assert _count(geneva_session, StepExecution) == 2 + 1
    assert _count(geneva_session, Signal) == 0
    assert len(slices) >= 14 // 2
    for executions, signals, workflows in slices:
        assert workflows <= 2
        # Within the row cap, unless one workflow alone is bigger than it.
        assert executions + signals + workflows <= 10 or workflows == 1
    assert (12, 0, 1) in slices


def test_cleanup_loop_ends_even_when_no_slice_deletes_anything(geneva_session, monkeypatch):
    settings.housekeeping_batch_size = 2
    made = _old_finished(geneva_session, 5)
    # Every slice comes back empty-handed (as if each chosen workflow had moved on under the
    # lock): the keyset must still move past it instead of reading the same rows forever.
    monkeypatch.setattr(housekeeping, "_delete_workflows", lambda session, ids, pg: (0, 0, 0))
    slices = []
    real_slice = housekeeping._cleanup_slice

    def guarded(*args):
        slices.append(args)
        assert len(slices) < 20, "the cleanup keyset stopped advancing"
        return real_slice(*args)

    monkeypatch.setattr(housekeeping, "_cleanup_slice", guarded)
    report = housekeeping.run()
    assert report.workflows_cleaned_up == report.step_executions_cleaned_up == 0
    assert len(slices) == 3 + 1  # two workflows per slice, then the read that finds none
    # The keyset is (transitioned_at, id); these share one transitioned_at, so id decides.
    long_ago = made[0].transitioned_at
    assert [after for _, after, _, _ in slices] == [
        None,
        (long_ago, made[1].id),
        (long_ago, made[3].id),
        (long_ago, made[4].id),
    ]
    assert _count(geneva_session, Workflow) == len(made)


def test_cleanup_deletes_oldest_first_by_transitioned_at_not_by_id(geneva_session, monkeypatch):
    settings.housekeeping_batch_size = 1
    made = _old_finished(geneva_session, 3)
    # The newest workflow finished longest ago: it goes first.
    made[2].transitioned_at = made[2].transitioned_at - timedelta(days=5)
    made[0].transitioned_at = made[0].transitioned_at - timedelta(days=1)
    geneva_session.commit()
    deleted = []
    real = housekeeping._delete_workflows

    def recording(session, ids, pg):
        deleted.append(list(ids))
        return real(session, ids, pg)

    monkeypatch.setattr(housekeeping, "_delete_workflows", recording)
    report = housekeeping.run()
    assert report.workflows_cleaned_up == 3
    assert deleted == [[made[2].id], [made[0].id], [made[1].id]]


def test_cleanup_with_nothing_to_delete_reads_an_index_range_not_the_table(geneva_session):
    """A pass with nothing old reads no whole table: the candidate query is a range of the
    partial (transitioned_at, id) index of finished/canceled workflows. SQLite names a walk of
    a whole table or index ``SCAN``; PostgreSQL (sequential scans off) shows ``Seq Scan`` where
    no index serves, and the index's name where one does."""
    from sqlalchemy import event

    dialect = geneva_session.get_bind().dialect.name
    if dialect in ("mysql", "mariadb"):
        pytest.skip("MariaDB's optimizer has no enable_seqscan; checked on SQLite and PostgreSQL")
    for _ in range(3):
        speedrun_workflow(_create(geneva_session))  # finished, but recent
    _create(geneva_session)  # ongoing
    engine = geneva_session.get_bind()
    statements = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("SELECT"):
            statements.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        report = HousekeepingReport()
        housekeeping.cleanup(utcnow(), report)
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    assert report.workflows_cleaned_up == 0
    ((statement, parameters),) = statements  # one read, finding nothing
    connection = geneva_session.connection()
    sqlite = dialect == "sqlite"
    if not sqlite:
        connection.exec_driver_sql("SET LOCAL enable_seqscan = off")
    explain = "EXPLAIN QUERY PLAN " if sqlite else "EXPLAIN "
    rows = connection.exec_driver_sql(explain + statement, parameters).fetchall()
    plan = "\n".join(str(row[-1]) if sqlite else str(row[0]) for row in rows)
    geneva_session.rollback()
    assert "index_geneva_drive_workflows_terminal_transitioned" in plan, plan
    assert "SCAN geneva_drive_workflows" not in plan, plan
    assert "Seq Scan on geneva_drive_workflows" not in plan, plan
    assert "TEMP B-TREE" not in plan and "Sort" not in plan, plan


def _postgres_only(session):
    """Row locks: PostgreSQL and MariaDB/MySQL."""
    if session.get_bind().dialect.name == "sqlite":
        pytest.skip("row locks are PostgreSQL's and MariaDB's; SQLite serializes writers")


def _cleanup_in_thread():
    report = HousekeepingReport()
    thread = threading.Thread(target=housekeeping.cleanup, args=(utcnow(), report))
    thread.start()
    return thread, report


def test_cleanup_waits_for_a_workflow_locked_elsewhere_then_deletes_it(geneva_session):
    _postgres_only(geneva_session)
    locked, _free = _old_finished(geneva_session, 2)
    # A signal delivery or an operator holds the workflow lock right now.
    geneva_session.scalars(select(Workflow).where(Workflow.id == locked.id).with_for_update()).one()
    thread, report = _cleanup_in_thread()
    thread.join(0.5)
    assert thread.is_alive(), "cleanup should wait for the lock, not skip the workflow"
    geneva_session.commit()
    thread.join(10)
    assert not thread.is_alive()
    assert report.workflows_cleaned_up == 2
    assert report.step_executions_cleaned_up == 4
    assert _count(geneva_session, Workflow) == 0


def test_cleanup_does_not_wait_for_a_locked_workflow_it_would_not_delete(geneva_session):
    """An executor holds an ongoing workflow's lock: cleanup must not queue behind it.

    PostgreSQL tests the WHERE clause before locking a row; InnoDB locks every row its scan
    reads, so on MariaDB a locking scan over all workflows waited for the running one (50 s,
    then a lock wait timeout and no cleanup at all).
    """
    _postgres_only(geneva_session)
    (old,) = _old_finished(geneva_session, 1)
    running = _create(geneva_session)
    geneva_session.scalars(
        select(Workflow).where(Workflow.id == running.id).with_for_update()
    ).one()
    thread, report = _cleanup_in_thread()
    thread.join(20)
    finished_meanwhile = not thread.is_alive()
    geneva_session.commit()
    thread.join(60)
    assert finished_meanwhile, "cleanup waited for the lock of a workflow it does not delete"
    assert report.workflows_cleaned_up == 1
    assert set(geneva_session.scalars(select(Workflow.id))) == {running.id}
    del old


def test_cleanup_keeps_a_workflow_that_stopped_being_old_and_finished_under_it(geneva_session):
    _postgres_only(geneva_session)
    moved, revived, _deleted = _old_finished(geneva_session, 3)
    for wf in (moved, revived):
        geneva_session.scalars(select(Workflow).where(Workflow.id == wf.id).with_for_update()).one()
    thread, report = _cleanup_in_thread()
    thread.join(0.5)
    assert thread.is_alive()
    # While cleanup waits: one workflow is made ongoing again, one is touched recently.
    revived.state = "ready"
    moved.transitioned_at = utcnow()
    geneva_session.commit()
    thread.join(10)
    assert not thread.is_alive()
    assert report.workflows_cleaned_up == 1
    assert report.step_executions_cleaned_up == 2
    assert set(geneva_session.scalars(select(Workflow.id))) == {moved.id, revived.id}
    assert len(_executions(geneva_session, revived)) == 2
    assert len(_executions(geneva_session, moved)) == 2


# --- stuck in_progress -------------------------------------------------------------------------


def test_stuck_in_progress_is_reattempted_with_a_new_scheduled_execution(geneva_session):
    wf = _create(geneva_session)
    stuck = _make_stuck_in_progress(geneva_session, wf)
    report = housekeeping.run()
    assert report.stuck_in_progress_recovered == 1
    assert report.stuck_scheduled_recovered == 0
    first, second = _executions(geneva_session, wf)
    assert first.id == stuck.id
    assert (first.state, first.outcome) == ("completed", "recovered")
    assert first.completed_at is not None
    assert (second.step_name, second.state) == ("first", "scheduled")
    geneva_session.refresh(wf)
    assert wf.state == "ready"
    assert wf.current_step_name is None
    assert speedrun_workflow(wf).state == "finished"


def test_recent_in_progress_is_left_alone(geneva_session):
    wf = _create(geneva_session)
    _make_stuck_in_progress(geneva_session, wf, age=timedelta(minutes=5))
    assert housekeeping.run().stuck_in_progress_recovered == 0
    assert [e.state for e in _executions(geneva_session, wf)] == ["in_progress"]


def test_stuck_in_progress_with_cancel_action_cancels_the_workflow(geneva_session):
    settings.stuck_recovery_action = "cancel"
    wf = _create(geneva_session)
    _make_stuck_in_progress(geneva_session, wf)
    assert housekeeping.run().stuck_in_progress_recovered == 1
    (only,) = _executions(geneva_session, wf)
    assert (only.state, only.outcome) == ("canceled", "recovered")
    geneva_session.refresh(wf)
    assert wf.state == "canceled"
    assert wf.transitioned_at is not None


def test_stuck_resumable_step_continues_from_its_cursor(geneva_session):
    wf = _create(geneva_session, HkResumableWorkflow)
    run_iterations(wf, 2)  # first link: cursor 2, successor scheduled
    successor = _current(geneva_session, wf)
    assert successor.cursor_value == 2
    _make_stuck_in_progress(geneva_session, wf)
    assert housekeeping.run().stuck_in_progress_recovered == 1
    executions = _executions(geneva_session, wf)
    recovered, newest = executions[-2], executions[-1]
    assert recovered.id == successor.id
    assert recovered.outcome == "recovered"
    assert newest.state == "scheduled"
    assert newest.continues_from_id == recovered.id
    assert newest.cursor_value == 2


def test_stuck_in_progress_of_a_paused_workflow_is_closed_without_rescheduling(geneva_session):
    wf = _create(geneva_session)
    _make_stuck_in_progress(geneva_session, wf)
    wf.state = "paused"  # an operator paused it while its worker was dying
    geneva_session.commit()
    assert housekeeping.run().stuck_in_progress_recovered == 1
    (only,) = _executions(geneva_session, wf)
    assert (only.state, only.outcome) == ("completed", "recovered")
    geneva_session.refresh(wf)
    assert wf.state == "paused"
    wf.resume()
    geneva_session.commit()
    assert speedrun_workflow(wf).state == "finished"


# --- stuck scheduled ---------------------------------------------------------------------------


def test_stuck_scheduled_is_recovered_and_fresh_or_future_ones_are_not(geneva_session):
    stuck_wf = _create(geneva_session)
    fresh_wf = _create(geneva_session)
    _backdate(geneva_session, stuck_wf, timedelta(minutes=16))
    _backdate(geneva_session, fresh_wf, timedelta(minutes=14))
    report = housekeeping.run()
    assert report.stuck_scheduled_recovered == 1
    first, second = _executions(geneva_session, stuck_wf)
    assert (first.state, first.outcome) == ("completed", "recovered")
    assert second.state == "scheduled"
    assert [e.state for e in _executions(geneva_session, fresh_wf)] == ["scheduled"]


def test_waiting_and_paused_executions_are_never_recovered(geneva_session):
    waiting_wf = _create(geneva_session, HkSignalWorkflow)
    speedrun = _current(geneva_session, waiting_wf)
    from geneva_drive.testing import perform_next_step

    perform_next_step(waiting_wf)
    parked = _current(geneva_session, waiting_wf)
    assert parked.id == speedrun.id and parked.state == "waiting"
    parked.scheduled_for = utcnow() - timedelta(days=30)
    parked.waiting_since = utcnow() - timedelta(days=30)
    paused_wf = _create(geneva_session)
    paused_wf.pause()
    geneva_session.commit()
    held = _current(geneva_session, paused_wf)
    held.scheduled_for = utcnow() - timedelta(days=1)
    geneva_session.commit()
    report = housekeeping.run()
    assert report.stuck_scheduled_recovered == 0
    assert report.stuck_in_progress_recovered == 0
    assert [e.state for e in _executions(geneva_session, waiting_wf)] == ["waiting"]
    assert [e.state for e in _executions(geneva_session, paused_wf)] == ["scheduled"]


def test_recovery_loops_over_several_batches(geneva_session):
    settings.housekeeping_batch_size = 2
    workflows = [_create(geneva_session) for _ in range(5)]
    for wf in workflows:
        _backdate(geneva_session, wf, timedelta(hours=1))
    assert housekeeping.run().stuck_scheduled_recovered == 5


def test_a_failing_row_is_reported_and_does_not_stop_or_loop_the_sweep(
    geneva_session, reported, monkeypatch
):
    settings.housekeeping_batch_size = 1
    workflows = [_create(geneva_session) for _ in range(3)]
    for wf in workflows:
        _backdate(geneva_session, wf, timedelta(hours=1))
    poisoned = _current(geneva_session, workflows[1]).id
    real = recovery._recover

    def recover(session, workflow, execution):
        if execution.id == poisoned:
            raise RuntimeError("poisoned row")
        real(session, workflow, execution)

    monkeypatch.setattr(recovery, "_recover", recover)
    report = housekeeping.run()
    assert report.stuck_scheduled_recovered == 2
    assert [str(e) for e, _ in reported] == ["poisoned row"]
    assert reported[0][1]["step_execution_id"] == poisoned
    assert [e.state for e in _executions(geneva_session, workflows[1])] == ["scheduled"]


# --- gauges ------------------------------------------------------------------------------------


def test_gauges_report_states_paused_ratio_and_waiting(geneva_session, gauges):
    settings.waiting_visibility_threshold = timedelta(days=7)
    paused = _create(geneva_session)
    paused.pause()
    _create(geneva_session)
    waiting = _create(geneva_session, HkSignalWorkflow)
    from geneva_drive.testing import perform_next_step

    perform_next_step(waiting)
    parked = _current(geneva_session, waiting)
    parked.waiting_since = utcnow() - timedelta(days=8)
    geneva_session.commit()

    housekeeping.run()

    got = {(name, tuple(sorted(tags.items()))): value for name, value, tags in gauges}
    wf_tag = (("workflow", "HkTwoStepWorkflow"),)
    sig_tag = (("workflow", "HkSignalWorkflow"),)
    assert got[("geneva_drive.ready", ())] == 2
    assert got[("geneva_drive.paused", ())] == 1
    assert got[("geneva_drive.paused", wf_tag)] == 1
    assert got[("geneva_drive.ready", wf_tag)] == 1
    assert got[("geneva_drive.paused_ratio", wf_tag)] == pytest.approx(0.5)
    assert got[("geneva_drive.paused_ratio", sig_tag)] == 0.0
    assert got[("geneva_drive.waiting_step_executions", ())] == 1
    assert got[("geneva_drive.waiting_step_executions", sig_tag)] == 1
    assert got[("geneva_drive.waiting_overdue", ())] == 1
    assert got[("geneva_drive.waiting_overdue", sig_tag)] == 1
    assert ("geneva_drive.waiting_overdue", wf_tag) not in got


def test_no_overdue_gauge_when_threshold_is_none(geneva_session, gauges):
    settings.waiting_visibility_threshold = None
    _create(geneva_session)
    housekeeping.run()
    assert not [g for g in gauges if g[0] == "geneva_drive.waiting_overdue"]
    assert ("geneva_drive.waiting_step_executions", 0, {}) in gauges


def test_a_broken_sink_does_not_break_housekeeping(geneva_session, gauges):
    def broken(name, value, tags):
        raise RuntimeError("statsd is down")

    metrics_facade.add_sink(broken)
    try:
        _create(geneva_session)
        housekeeping.run()
    finally:
        metrics_facade.remove_sink(broken)
    assert any(name == "geneva_drive.ready" for name, _, _ in gauges)


def test_workflow_locked_elsewhere_is_skipped_this_run_on_a_server_database(geneva_session):
    if geneva_session.get_bind().dialect.name == "sqlite":
        pytest.skip("SKIP LOCKED is PostgreSQL's and MariaDB's; SQLite serializes housekeepers")
    wf = _create(geneva_session)
    _make_stuck_in_progress(geneva_session, wf)
    # An executor's finalize (or an operator) holds the workflow lock right now.
    geneva_session.scalars(select(Workflow).where(Workflow.id == wf.id).with_for_update()).one()
    assert housekeeping.run().stuck_in_progress_recovered == 0
    geneva_session.commit()
    assert housekeeping.run().stuck_in_progress_recovered == 1


def test_a_run_with_a_future_clock_does_not_recover_its_own_retries(geneva_session):
    wf = _create(geneva_session)
    # Far in the future every new retry would look stuck too; the run must still end.
    report = housekeeping.run(now=utcnow() + timedelta(days=1))
    assert report.stuck_scheduled_recovered == 1
    assert [e.state for e in _executions(geneva_session, wf)] == ["completed", "scheduled"]


def test_row_started_by_a_worker_after_the_sweep_read_it_is_left_running(
    geneva_session, monkeypatch
):
    wf = _create(geneva_session)
    _backdate(geneva_session, wf, timedelta(hours=1))  # an overdue row of a backlog
    real = housekeeping._stuck_ids

    def read_then_worker_starts_it(state, now, excluded, newest):
        ids = real(state, now, excluded, newest)
        if state == "scheduled" and ids:
            # A worker picks the row up between the sweep's read and its lock.
            running = _current(geneva_session, wf)
            running.state = "in_progress"
            running.started_at = utcnow()
            geneva_session.commit()
        return ids

    monkeypatch.setattr(housekeeping, "_stuck_ids", read_then_worker_starts_it)
    report = housekeeping.run()
    assert report.stuck_scheduled_recovered == 0
    assert report.stuck_in_progress_recovered == 0
    assert [e.state for e in _executions(geneva_session, wf)] == ["in_progress"]
