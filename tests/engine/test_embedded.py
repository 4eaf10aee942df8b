"""The embedded worker (in-process): runs due executions from the table, wakes on commits of
its own process, leaves future work alone, backs off from rows that cannot start, and on
stop lets a resumable step hand over at its next checkpoint."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from geneva_drive import IterableStep, Workflow, resumable_step, step, transport
from geneva_drive import embedded as embedded_module
from geneva_drive.embedded import EmbeddedWorker
from tests.engine.helpers import create_workflow, executions


class EmbeddedThreeStepWorkflow(Workflow):
    @step
    def a(self):
        pass

    @step
    def b(self):
        pass

    @step(wait=timedelta(days=1))
    def c(self):
        pass


_started = threading.Event()


class EmbeddedLongWalkWorkflow(Workflow):
    @resumable_step
    def walk(self, it: IterableStep):
        def slowly(item):
            _started.set()
            time.sleep(0.02)

        it.iterate_over(range(100_000), slowly)


@pytest.fixture
def worker(geneva_session):
    embedded = EmbeddedWorker(concurrency=2, poll_interval=0.02)
    previous = transport._transport
    transport.set_transport(embedded.transport)
    embedded.start()
    try:
        yield embedded
    finally:
        embedded.stop(timeout=10)
        transport.set_transport(previous)


def _wait(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("timed out")


def test_runs_due_steps_and_leaves_future_ones_scheduled(geneva_session, worker):
    wf = create_workflow(geneva_session, EmbeddedThreeStepWorkflow)
    _wait(lambda: len(executions(geneva_session, wf)) == 3)
    _wait(lambda: executions(geneva_session, wf)[1].state == "completed")
    time.sleep(0.2)  # several polls: the day-long wait must not be run early
    a, b, c = executions(geneva_session, wf)
    assert (a.state, b.state, c.state) == ("completed", "completed", "scheduled")
    assert worker.executed == 2


def test_stop_hands_a_running_resumable_step_over_at_its_checkpoint(geneva_session, worker):
    _started.clear()
    wf = create_workflow(geneva_session, EmbeddedLongWalkWorkflow)
    assert _started.wait(20)
    assert worker.stop(timeout=10)
    first, successor = executions(geneva_session, wf)
    assert (first.state, first.outcome) == ("completed", "continued")
    assert successor.state == "scheduled"
    assert successor.continues_from_id == first.id
    assert successor.cursor_value > 0


def test_row_that_cannot_start_is_backed_off_not_spun(geneva_session, worker, monkeypatch):
    calls: list[tuple[int, float]] = []

    def broken_execute(execution_id, **kwargs):
        calls.append((execution_id, time.monotonic()))
        raise RuntimeError("database is locked")

    monkeypatch.setattr("geneva_drive.embedded.executor.execute", broken_execute)
    create_workflow(geneva_session, EmbeddedThreeStepWorkflow)
    _wait(lambda: len(calls) >= 3)
    # Polls every 20 ms, but the first retry comes only RETRY_DELAY (0.5 s) after the failure,
    # the next twice as long after that. Each gap is measured between two attempts (not
    # against a sleep of the test's), so a loaded machine can only lengthen it.
    (first, at_1), (second, at_2), (third, at_3) = calls[:3]
    assert first == second == third
    assert at_2 - at_1 >= embedded_module.RETRY_DELAY
    assert at_3 - at_2 >= 2 * embedded_module.RETRY_DELAY


def test_a_finished_stop_does_not_leave_the_shutdown_flag_behind(geneva_session, worker):
    from geneva_drive import executor

    assert worker.stop(timeout=10)
    assert not executor.shutdown_requested()
