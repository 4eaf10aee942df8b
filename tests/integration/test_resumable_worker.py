"""A long resumable step in a real Celery worker, interrupted by the worker's warm shutdown:
the step stops at its next checkpoint (completed/continued, successor scheduled and sent), and
a restarted worker finishes it without reprocessing a checkpointed item. Against Redis and
RabbitMQ, on the shared test database (SQLite, or PostgreSQL with GENEVA_TEST_DATABASE_URL)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from tests.integration.conftest import (
    Broker,
    SharedDatabase,
    Worker,
    create_workflow,
    executions,
    wait_for_state,
    wait_until,
)
from tests.integration.flows import ItLongResumableWorkflow, recorded

pytestmark = pytest.mark.integration

ITEMS = [f"item-{n}" for n in range(30)]


@pytest.fixture(params=["solo-sigterm", "prefork-sigterm", "prefork-ctrl-c"])
def stoppable_worker(
    request: pytest.FixtureRequest,
    broker: Broker,
    shared_database: SharedDatabase,
    short_horizon: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Worker, str]]:
    pool = request.param.split("-")[0]
    started = Worker(
        shared_database, broker, tmp_path_factory.mktemp(f"{broker.name}-{pool}"), pool, 1
    )
    try:
        yield started, request.param
    finally:
        started.close()


def _items(worker: Worker, workflow_id: int) -> list[str]:
    return [event for step_name, event in recorded(worker.log, workflow_id) if step_name == "walk"]


def test_warm_shutdown_hands_a_resumable_step_to_a_restarted_worker(
    stoppable_worker: tuple[Worker, str], use_transport
) -> None:
    worker, how = stoppable_worker
    use_transport(worker.transport)
    workflow_id = create_workflow(ItLongResumableWorkflow)
    wait_until(lambda: len(_items(worker, workflow_id)) >= 3, what="a few items")

    if how.endswith("sigterm"):
        # A warm shutdown of the worker's main process (celery multi, a process manager);
        # with prefork, the main process forwards it to the pool child running the step.
        os.kill(worker.process.pid, signal.SIGTERM)
    else:
        os.killpg(worker.process.pid, signal.SIGINT)  # Ctrl-C in the worker's terminal
    assert worker.process.popen.wait(30) is not None

    first, successor = executions(workflow_id)
    assert (first.state, first.outcome) == ("completed", "continued")
    checkpointed = first.cursor_value
    assert 3 <= checkpointed < 30, "the step stopped at a checkpoint, before the end"
    assert (successor.state, successor.continues_from_id) == ("scheduled", first.id)
    assert successor.cursor_value == checkpointed
    assert successor.sent_at is not None  # sent at the commit, waiting in the broker
    assert _items(worker, workflow_id) == ITEMS[:checkpointed]

    worker.restart()
    wait_for_state(workflow_id, "finished", timeout=60)
    assert _items(worker, workflow_id) == ITEMS  # each item exactly once
    walk = [e for e in executions(workflow_id) if e.step_name == "walk"]
    assert [(e.state, e.outcome) for e in walk] == [
        ("completed", "continued"),
        ("completed", "success"),
    ]
    assert walk[-1].cursor_value == 30
    assert recorded(worker.log, workflow_id)[-1] == ("after", "ran")
