"""The Celery side, without a broker: the task delegates to the executor (and is harmless for
a missing row), the transport maps a message onto Celery options, the Flask hook is duck-typed,
and a warm shutdown asks resumable steps to stop."""

from __future__ import annotations

import contextlib
from datetime import timedelta

import pytest

from geneva_drive import Workflow, executor, step
from geneva_drive.celery import (
    PERFORM_STEP_TASK,
    CeleryTransport,
    _on_worker_shutting_down,
    celery_init_app,
    make_celery,
    perform_step,
)
from geneva_drive.transport import Message
from tests.engine.helpers import create_workflow


class CeleryTaskWorkflow(Workflow):
    @step
    def go(self):
        pass


class CeleryFailingWorkflow(Workflow):
    @step
    def boom(self):
        raise RuntimeError("step failed")


def test_perform_step_runs_the_execution(geneva_session, geneva_transport):
    wf = create_workflow(geneva_session, CeleryTaskWorkflow)
    perform_step(geneva_transport.execution_ids[0])
    geneva_session.expire_all()
    assert wf.state == "finished"


def test_perform_step_reraises_the_steps_error_after_recording_it(geneva_session, geneva_transport):
    wf = create_workflow(geneva_session, CeleryFailingWorkflow)
    with pytest.raises(RuntimeError, match="step failed"):
        perform_step(geneva_transport.execution_ids[0])
    geneva_session.expire_all()
    assert wf.state == "paused"


def test_perform_step_for_a_missing_row_does_nothing(geneva_session):
    perform_step(987654)  # logs and returns


class _FakeCelery:
    def __init__(self):
        self.sent = []

    def send_task(self, name, args, **options):
        self.sent.append((name, args, options))


def test_transport_maps_queue_priority_and_countdown():
    fake = _FakeCelery()
    CeleryTransport(fake).send(
        Message(execution_id=7, job_id="j1", queue="payments", priority=5, countdown=12.5)
    )
    CeleryTransport(fake).send(Message(execution_id=8, job_id="j2"))
    assert fake.sent == [
        (
            PERFORM_STEP_TASK,
            [7],
            {"task_id": "j1", "queue": "payments", "priority": 5, "countdown": 12.5},
        ),
        (PERFORM_STEP_TASK, [8], {"task_id": "j2"}),
    ]


def test_make_celery_configures_late_acks_and_sends_no_sweep_messages():
    """The sweeps run inside the beat process (never as messages behind the steps)."""
    app = make_celery("memory://")
    assert app.conf.task_acks_late and app.conf.task_ignore_result
    assert app.conf.worker_prefetch_multiplier == 1
    tasks = {entry["task"] for entry in (app.conf.beat_schedule or {}).values()}
    assert not tasks & {"geneva_drive.dispatch_due", "geneva_drive.housekeeping"}
    assert PERFORM_STEP_TASK in app.tasks


def test_beat_runs_the_dispatcher_in_its_own_process(geneva_session, monkeypatch):
    """beat_init starts the dispatcher loop (sweeps and housekeeping) in the beat process; the
    beat of an app GenevaDrive was not registered on is left alone."""
    from celery import Celery

    from geneva_drive import celery as gd_celery

    started = []
    monkeypatch.setattr(gd_celery, "start_dispatcher_thread", lambda: started.append(True))
    app = make_celery("memory://")
    gd_celery._on_beat_init(sender=type("Beat", (), {"app": app})())
    assert started == [True]
    other = Celery("someone-else", broker="memory://", set_as_current=False)
    gd_celery._on_beat_init(sender=type("Beat", (), {"app": other})())
    assert started == [True]


def test_celery_init_app_runs_tasks_inside_the_flask_app_context():
    entered = []

    class FakeFlask:
        config = {"BROKER_URL": "memory://flask"}
        extensions: dict = {}

        @contextlib.contextmanager
        def app_context(self):
            entered.append(True)
            yield

    flask_app = FakeFlask()
    celery = celery_init_app(flask_app, make_celery("memory://"))
    assert flask_app.extensions["celery"] is celery
    assert celery.conf.broker_url == "memory://flask"

    @celery.task(name="test.ping")
    def ping():
        return "pong"

    assert ping() == "pong"
    assert entered == [True]


def test_warm_shutdown_asks_resumable_steps_to_stop():
    executor.clear_shutdown()
    try:
        _on_worker_shutting_down(sig="SIGTERM", how="warm", exitcode=0)
        assert executor.shutdown_requested()
    finally:
        executor.clear_shutdown()


def test_nothing_long_is_sent_with_a_countdown(geneva_session, geneva_transport):
    class CeleryLaterWorkflow(Workflow):
        @step(wait=timedelta(days=7))
        def much_later(self):
            pass

    create_workflow(geneva_session, CeleryLaterWorkflow)
    assert geneva_transport.messages == []


def test_a_worker_process_whose_registration_failed_registers_before_its_first_step(
    geneva_session, geneva_transport, monkeypatch
):
    """Celery logs a failing worker_process_init and lets the child run tasks: unregistered,
    its steps would carry no worker, and nothing would recover them if it died (until the
    hour-long threshold). Its first task registers it, so the step records its worker."""
    from geneva_drive import celery as celery_module
    from geneva_drive import current_worker
    from geneva_drive.models import StepExecution, Worker

    monkeypatch.setattr(celery_module, "_consumed_queues", frozenset({"celery"}))
    monkeypatch.setattr(celery_module, "_heartbeat", None)
    current_worker.set_process(None)
    assert current_worker.get() is None
    create_workflow(geneva_session, CeleryTaskWorkflow)
    execution_id = geneva_transport.execution_ids[0]
    try:
        perform_step(execution_id)
        geneva_session.expire_all()
        execution = geneva_session.get(StepExecution, execution_id)
        assert execution.state == "completed" and execution.worker_id is not None
        worker = geneva_session.get(Worker, execution.worker_id)
        assert worker.kind == "celery" and worker.queues == "celery"
    finally:
        if celery_module._heartbeat is not None:
            celery_module._heartbeat.stop()
        current_worker.set_process(None)
