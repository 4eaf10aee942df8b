"""The embedded default, recovery: an embedded worker process killed with SIGKILL mid-step
leaves its execution in_progress; housekeeping recovers it and a new worker finishes the
workflow. (Its own module, so its own database: no other worker may pick the step up.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from geneva_drive import housekeeping, settings
from geneva_drive.testing import expire_worker
from geneva_drive.transport import NullTransport
from tests.integration.conftest import (
    Process,
    SharedDatabase,
    create_workflow,
    executions,
    wait_for_state,
    wait_until,
)
from tests.integration.flows import ItSlowWorkflow, recorded
from tests.integration.test_embedded import start_embedded_worker

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def no_messages(use_transport) -> None:
    use_transport(NullTransport())


def test_worker_killed_mid_step_is_recovered_once_its_lease_expires(
    shared_database: SharedDatabase,
    tmp_path: Path,
    processes: list[Process],
    restore_settings: None,
) -> None:
    log = tmp_path / "steps.log"
    first = start_embedded_worker(shared_database, log, tmp_path / "worker1.log", processes)
    workflow_id = create_workflow(ItSlowWorkflow)
    wait_until(lambda: ("slow", "start") in recorded(log, workflow_id), what="the slow step")
    first.kill()
    (stuck,) = executions(workflow_id)
    assert stuck.state == "in_progress"

    assert stuck.worker_id is not None  # the start recorded the (now dead) embedded worker
    settings.stuck_in_progress_threshold = 1
    time.sleep(1.2)
    report = _housekeeping()
    # Past the age threshold, but a worker's step is judged by its lease, not yet expired.
    assert (report.stuck_in_progress_recovered, report.worker_recoveries) == (0, 0)
    expire_worker(stuck.worker_id)  # as if worker_lease had passed since the kill
    assert _housekeeping().worker_recoveries == 1
    second = start_embedded_worker(shared_database, log, tmp_path / "worker2.log", processes)
    wait_for_state(workflow_id, "finished")
    recovered = executions(workflow_id)[0]
    assert (recovered.state, recovered.outcome) == ("completed", "recovered")
    assert recorded(log, workflow_id) == [
        ("slow", "start"),
        ("slow", "start"),
        ("slow", "end"),
        ("after", "ran"),
    ]
    assert second.stop() == 0  # SIGTERM: a clean stop
    assert "embedded worker stopped" in second.output()


def _housekeeping() -> housekeeping.HousekeepingReport:
    """One housekeeping run of this process's own: a dispatcher of an earlier test (beat, a
    stopped worker) may still hold the run's lease for up to a minute."""
    deadline = time.monotonic() + 90
    while True:
        report = housekeeping.run()
        if not report.skipped_overlapping or time.monotonic() > deadline:
            return report
        time.sleep(0.5)
