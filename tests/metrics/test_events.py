"""Event metrics in one process: the executor, signals, operator actions and housekeeping
feed the counters and histograms through the blinker events (geneva_drive.prometheus.install)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from blinker import NamedSignal
from prometheus_client import REGISTRY
from sqlalchemy import update

from geneva_drive import Workflow, housekeeping, instrumentation, prometheus, step
from geneva_drive.housekeeping import HousekeepingReport
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.testing import expire_wait, perform_next_step, speedrun_workflow
from tests.engine.helpers import make_order


@pytest.fixture(autouse=True)
def installed():  # type: ignore[no-untyped-def]
    return prometheus.install()


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class MetricsEventsWorkflow(Workflow):
    workflow_name = "metrics_events_flow"

    @step
    def first(self):
        pass

    @step(skip_if=lambda wf: True)
    def skipped(self):
        pass

    @step(on_exception="cancel")
    def broken(self):
        raise ValueError("boom")


class MetricsTimeoutWorkflow(Workflow):
    workflow_name = "metrics_timeout_flow"

    @step(wait_for="paid", timeout=timedelta(days=3), on_timeout="cancel")
    def capture(self):
        pass


class MetricsSignalWorkflow(Workflow):
    workflow_name = "metrics_signal_flow"

    @step(wait_for="go")
    def wait_here(self):
        pass


def test_step_outcomes_and_durations_are_counted(geneva_session):
    labels = {"workflow": "metrics_events_flow"}
    before = {
        "completed": value("geneva_drive_step_executions_total", **labels, step="first",
                           outcome="completed"),
        "skipped": value("geneva_drive_step_executions_total", **labels, step="skipped",
                         outcome="precondition_skipped"),
        "exception": value("geneva_drive_step_executions_total", **labels, step="broken",
                           outcome="exception"),
        "duration": value("geneva_drive_step_duration_seconds_count", **labels, step="first"),
    }  # fmt: skip
    wf = MetricsEventsWorkflow.create(hero=make_order(geneva_session))
    with pytest.raises(ValueError):
        speedrun_workflow(wf)
    assert wf.state == "canceled"

    assert value("geneva_drive_step_executions_total", **labels, step="first",
                 outcome="completed") == before["completed"] + 1  # fmt: skip
    assert value("geneva_drive_step_executions_total", **labels, step="skipped",
                 outcome="precondition_skipped") == before["skipped"] + 1  # fmt: skip
    assert value("geneva_drive_step_executions_total", **labels, step="broken",
                 outcome="exception") == before["exception"] + 1  # fmt: skip
    assert (
        value("geneva_drive_step_duration_seconds_count", **labels, step="first")
        == before["duration"] + 1
    )
    # The skipped step's body never ran: no duration for it.
    assert value("geneva_drive_step_duration_seconds_count", **labels, step="skipped") == 0


def test_start_delay_is_started_at_minus_scheduled_for(geneva_session):
    labels = {"workflow": "metrics_events_flow"}
    count = value("geneva_drive_step_start_delay_seconds_count", **labels)
    total = value("geneva_drive_step_start_delay_seconds_sum", **labels)
    le30 = value("geneva_drive_step_start_delay_seconds_bucket", **labels, le="30.0")
    le60 = value("geneva_drive_step_start_delay_seconds_bucket", **labels, le="60.0")

    wf = MetricsEventsWorkflow.create(hero=make_order(geneva_session))
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == wf.id)
        .values(scheduled_for=utcnow() - timedelta(seconds=42))
    )
    perform_next_step(wf)

    assert value("geneva_drive_step_start_delay_seconds_count", **labels) == count + 1
    delay = value("geneva_drive_step_start_delay_seconds_sum", **labels) - total
    assert 42 <= delay < 50
    assert value("geneva_drive_step_start_delay_seconds_bucket", **labels, le="30.0") == le30
    assert value("geneva_drive_step_start_delay_seconds_bucket", **labels, le="60.0") == le60 + 1


def test_signals_are_counted_by_result_under_the_stored_type(geneva_session):
    labels = {"workflow": "metrics_signal_flow"}
    delivered = value("geneva_drive_signals_total", **labels, result="delivered")
    duplicate = value("geneva_drive_signals_total", **labels, result="duplicate")

    wf = MetricsSignalWorkflow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    wf.signal("go", {"n": 1}, idempotency_key="k-1")
    wf.signal("go", {"n": 1}, idempotency_key="k-1")
    geneva_session.commit()

    assert value("geneva_drive_signals_total", **labels, result="delivered") == delivered + 1
    assert value("geneva_drive_signals_total", **labels, result="duplicate") == duplicate + 1


def test_wait_time_outs_are_counted_by_workflow_step_and_action(geneva_session):
    labels = {"workflow": "metrics_timeout_flow", "step": "capture", "action": "cancel"}
    before = value("geneva_drive_wait_timeouts_total", **labels)
    wf = MetricsTimeoutWorkflow.create(hero=make_order(geneva_session))
    perform_next_step(wf)  # parks
    expire_wait(wf)
    assert wf.state == "canceled"
    assert value("geneva_drive_wait_timeouts_total", **labels) == before + 1


def test_operator_actions_are_counted_with_a_bounded_label():
    pause = value("geneva_drive_operator_actions_total", action="pause")
    other = value("geneva_drive_operator_actions_total", action="other")
    instrumentation.operator_action.send("app", action="pause", workflow_id=7, actor="alice")
    instrumentation.operator_action.send("app", action="Robert'); DROP TABLE", workflow_id=8)
    assert value("geneva_drive_operator_actions_total", action="pause") == pause + 1
    assert value("geneva_drive_operator_actions_total", action="other") == other + 1


def test_housekeeping_reports_are_counted():
    runs = value("geneva_drive_housekeeping_runs_total")
    cleaned = value("geneva_drive_housekeeping_cleaned_up_total", kind="step_executions")
    recovered = value("geneva_drive_housekeeping_recovered_total", kind="stuck_scheduled")
    report = HousekeepingReport(step_executions_cleaned_up=12, stuck_scheduled_recovered=3)
    instrumentation.housekeeping_performed.send("engine", report=report)
    assert value("geneva_drive_housekeeping_runs_total") == runs + 1
    assert value("geneva_drive_housekeeping_cleaned_up_total", kind="step_executions") == (
        cleaned + 12
    )
    assert value("geneva_drive_housekeeping_recovered_total", kind="stuck_scheduled") == (
        recovered + 3
    )


def test_a_real_housekeeping_run_is_counted(geneva_session):
    runs = value("geneva_drive_housekeeping_runs_total")
    started = utcnow().timestamp()
    housekeeping.run()
    assert value("geneva_drive_housekeeping_runs_total") == runs + 1
    assert value("geneva_drive_housekeeping_last_run_timestamp_seconds") >= started - 1


def test_a_stranded_waiter_released_by_housekeeping_is_counted(geneva_session):
    """A waiting execution whose step a deploy removed is released by housekeeping,
    and the release reaches ``housekeeping_recovered_total{kind="stranded_waiting"}``."""

    class BeforeDeploy(Workflow):
        workflow_name = "metrics_stranded_waiter_flow"

        @step(wait_for="paid")
        def capture(self):
            pass

    wf = BeforeDeploy.create(hero=make_order(geneva_session))
    perform_next_step(wf)  # parks on `capture`
    geneva_session.commit()
    assert wf.current_execution.state == "waiting"

    class AfterDeploy(Workflow):  # the deploy removed `capture`, leaving no gravestone
        workflow_name = "metrics_stranded_waiter_flow"

        @step
        def ship(self):
            pass

    before = value("geneva_drive_housekeeping_recovered_total", kind="stranded_waiting")
    assert housekeeping.run().stranded_waiting_released == 1
    assert value("geneva_drive_housekeeping_recovered_total", kind="stranded_waiting") == (
        before + 1
    )
    # A second run finds nothing left to release, and counts nothing.
    assert housekeeping.run().stranded_waiting_released == 0
    assert value("geneva_drive_housekeeping_recovered_total", kind="stranded_waiting") == (
        before + 1
    )


def test_install_is_idempotent_and_uninstall_disconnects(installed):
    assert prometheus.install() is installed
    prometheus.uninstall()
    try:
        assert prometheus.installed() is None
        # Events sent now reach no receiver and raise nothing.
        instrumentation.operator_action.send("app", action="pause")
        # Every event the metrics listen to is disconnected (a receiver left behind keeps its
        # sender building payloads for nobody, as limit_deferred's did).
        for name in dir(instrumentation):
            event = getattr(instrumentation, name)
            if isinstance(event, NamedSignal) and event.name.endswith(".geneva_drive"):
                assert not any(
                    getattr(r, "__module__", "") == prometheus.__name__
                    for r in event.receivers.values()
                ), name
    finally:
        again = prometheus.install()
    assert again is not installed
    assert prometheus.install() is again


class MetricsChildWorkflow(Workflow):
    workflow_name = "metrics_child_flow"

    @step
    def work(self):
        pass


class MetricsParentWorkflow(Workflow):
    workflow_name = "metrics_parent_flow"

    @step
    def fan_out(self):
        for _ in range(3):
            self.start_child(MetricsChildWorkflow, hero=self.hero, allow_multiple=True)

    @step(wait_for_children=True, on_child_failure="continue")
    def join(self):
        pass


def test_children_started_and_joined_are_counted_by_the_parents_class(geneva_session):
    from geneva_drive.testing import speedrun_children

    labels = {"workflow": "metrics_parent_flow"}
    started = value("geneva_drive_children_started_total", **labels)
    finished = value("geneva_drive_children_joined_total", **labels, state="finished")
    canceled = value("geneva_drive_children_joined_total", **labels, state="canceled")
    wf = MetricsParentWorkflow.create(hero=make_order(geneva_session))
    speedrun_workflow(wf)
    assert value("geneva_drive_children_started_total", **labels) == started + 3
    wf.children[0].cancel()
    geneva_session.commit()
    speedrun_children(wf)
    speedrun_workflow(wf)
    assert wf.state == "finished"
    assert value("geneva_drive_children_joined_total", **labels, state="finished") == finished + 2
    assert value("geneva_drive_children_joined_total", **labels, state="canceled") == canceled + 1
