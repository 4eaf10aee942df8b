"""Housekeeping: batched cleanup of old terminal workflows, recovery of stuck executions
(reattempt or cancel; resumable ones continue from their cursor), a failing row never loops,
and the gem's gauges through the metrics facade (reference signals-policies-housekeeping §4)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select

from engine import Workflow, housekeeping, metrics_facade, resumable_step, settings, step
from engine.housekeeping import HousekeepingReport
from engine.instrumentation import set_error_reporter
from engine.models import Signal, StepExecution, utcnow
from engine.testing import run_iterations, speedrun_workflow
from tests.conftest import Order


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


def _hero(session):
    order = Order()
    session.add(order)
    session.flush()
    return order


def _create(session, cls=HkTwoStepWorkflow):
    wf = cls.create(hero=_hero(session))
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
    """Make the current scheduled execution overdue by ``age`` (its message was lost)."""
    _current(session, wf).scheduled_for = utcnow() - age
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
    from engine.testing import perform_next_step

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
    real = housekeeping._recover

    def recover(session, workflow, execution, now):
        if execution.id == poisoned:
            raise RuntimeError("poisoned row")
        real(session, workflow, execution, now)

    monkeypatch.setattr(housekeeping, "_recover", recover)
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
    from engine.testing import perform_next_step

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


def test_workflow_locked_elsewhere_is_skipped_this_run_on_postgresql(geneva_session):
    if geneva_session.get_bind().dialect.name != "postgresql":
        pytest.skip("SKIP LOCKED is PostgreSQL's; SQLite serializes housekeepers")
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
