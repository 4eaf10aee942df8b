"""Concurrency limits across real Celery worker processes: eight prefork processes
race for two slots per key; the step log (one O_APPEND line per body start and end, in the
order they happened) never shows a third body of one key running."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from geneva_drive.dispatch import dispatch_due
from geneva_drive.models import StepExecution
from tests.integration.conftest import (
    REDIS_URL,
    Broker,
    SharedDatabase,
    Worker,
    create_workflow,
    executions,
    require_service,
    wait_until,
    workflow_state,
)
from tests.integration.flows import ItLimitedWorkflow

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fleet(
    shared_database: SharedDatabase, short_horizon: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    require_service("Redis", REDIS_URL)
    started = Worker(
        shared_database, Broker("redis", REDIS_URL), tmp_path_factory.mktemp("limits"), "prefork", 8
    )
    try:
        yield started
    finally:
        started.close()


def _max_overlap(lines: list[str], ids: set[int]) -> dict[str, int]:
    """Per key: the most bodies between their start and end at once, in log order."""
    running: dict[str, int] = {}
    most: dict[str, int] = {}
    for line in lines:
        workflow_id, _step, event, _pid = line.split(" ")
        if int(workflow_id) not in ids:
            continue
        edge, _, key = event.partition("-")
        running[key] = running.get(key, 0) + (1 if edge == "start" else -1)
        most[key] = max(most.get(key, 0), running[key])
    return most


def test_eight_worker_processes_never_run_more_than_the_limit_per_key(
    fleet: Worker, use_transport
) -> None:
    use_transport(fleet.transport)
    ids = {create_workflow(ItLimitedWorkflow) for _ in range(16)}

    last_sweep = [0.0]

    def all_finished() -> bool:
        # The dispatcher's sweep, once a second as a deployment runs it (the backstop for a
        # lost message); the wake-ups of freed slots do the work.
        if time.monotonic() - last_sweep[0] > 1:
            dispatch_due()
            last_sweep[0] = time.monotonic()
        return all(workflow_state(i) == "finished" for i in ids)

    wait_until(all_finished, timeout=240, what="every limited workflow to finish")
    overlap = _max_overlap(fleet.log.read_text().splitlines(), ids)
    assert set(overlap) == {"even", "odd"}
    assert max(overlap.values()) <= 2, overlap
    rows: list[StepExecution] = [e for i in ids for e in executions(i)]
    assert sorted({(e.step_name, e.state) for e in rows}) == [
        ("one", "completed"),
        ("two", "completed"),
    ]
    # Deferred at least once (the claim records the slot's use when it defers).
    assert any("limit_in_use" in (e.metadata_ or {}) for e in rows)
