"""A step parks in a real Celery worker; another process (no HTTP, just ``signal()``) delivers
the signal, which wakes the parked execution; the worker finishes the workflow. Against Redis
and RabbitMQ, on the shared test database."""

from __future__ import annotations

import subprocess
import sys

import pytest
from sqlalchemy import select

from geneva_drive import db
from geneva_drive.models import Signal
from tests.integration.conftest import (
    ROOT,
    Worker,
    create_workflow,
    executions,
    process_env,
    wait_for_state,
    wait_until,
    workflow_state,
)
from tests.integration.flows import ItSignalWorkflow, recorded

pytestmark = pytest.mark.integration

SENDER = """
import sys
from geneva_drive import db
from geneva_drive.bootstrap import import_workflow_modules
from geneva_drive.workflow import Workflow

import_workflow_modules()
with db.transaction() as session:
    workflow = session.get(Workflow, int(sys.argv[1]))
    signal = workflow.signal("go", payload={"n": 7}, idempotency_key="evt-1")
    session.flush()
    print("signal", signal.id, signal.duplicate_delivery, flush=True)
"""


def send_from_another_process(worker: Worker, workflow_id: int) -> str:
    env = process_env(
        worker.database,
        worker.log,
        GENEVA_BROKER_URL=worker.broker.url,
        GENEVA_DEFAULT_QUEUE=worker.queue,
    )
    done = subprocess.run(
        [sys.executable, "-c", SENDER, str(workflow_id)],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout.strip().splitlines()[-1]


def test_signal_from_another_process_wakes_a_parked_step(worker: Worker, use_transport) -> None:
    use_transport(worker.transport)
    workflow_id = create_workflow(ItSignalWorkflow)
    wait_until(
        lambda: [e.state for e in executions(workflow_id)] == ["waiting"],
        what="the step to park in the worker",
    )
    (parked,) = executions(workflow_id)
    assert parked.waiting_since is not None
    assert workflow_state(workflow_id) == "ready"
    assert recorded(worker.log, workflow_id) == []

    line = send_from_another_process(worker, workflow_id)
    assert line.startswith("signal ") and line.endswith(" False")
    wait_for_state(workflow_id, "finished")
    assert recorded(worker.log, workflow_id) == [("wait_here", "got-7"), ("after", "ran")]
    woken = executions(workflow_id)[0]
    assert woken.id == parked.id  # the parked execution itself was woken, not replaced
    assert (woken.state, woken.outcome) == ("completed", "success")

    with db.new_session() as session:
        signal = session.scalars(select(Signal).where(Signal.workflow_id == workflow_id)).one()
    assert woken.signal_id == signal.id
    assert (signal.state, signal.claimed, signal.consumed) == ("consumed", 1, 1)

    # The webhook sender retries after the workflow finished: a known key is not an error.
    again = send_from_another_process(worker, workflow_id)
    assert again == f"signal {signal.id} True"
    assert recorded(worker.log, workflow_id) == [("wait_here", "got-7"), ("after", "ran")]
