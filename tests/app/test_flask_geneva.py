"""``flask geneva …`` in the example host app (examples/host_app): the ``geneva-drive``
commands on the host's database session and the host's Celery app.

The command runs as a host's operator runs it, ``flask --app app geneva workflows resume ID``
in a subprocess from the host's directory, against the test database; the step message it
publishes must show up on the host's broker (its ``SHOP_BROKER_URL``, a Redis database of this
test run), not on the engine's own (``GENEVA_BROKER_URL`` points nowhere real).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from geneva_drive import db
from geneva_drive.models import Base, OperatorAction, StepExecution
from geneva_drive.workflow import Workflow
from tests.app.test_operator_cli import CLI_ACTOR

FLASK = str(Path(sys.executable).parent / "flask")
ROOT = Path(__file__).resolve().parents[2]
HOST_APP = ROOT / "examples" / "host_app"
REDIS_URL = os.environ.get("GENEVA_TEST_REDIS_URL", "redis://127.0.0.1:6379/11")
#: The host app's Celery app has no queue of its own: its messages go to Celery's default.
HOST_QUEUE = "celery"


@pytest.fixture
def redis_client() -> Any:
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.exceptions.ConnectionError:
        if os.environ.get("GENEVA_REQUIRE_SERVICES"):
            raise
        pytest.skip(f"Redis does not answer at {REDIS_URL}")
    client.delete(HOST_QUEUE)
    yield client
    client.delete(HOST_QUEUE)


@pytest.fixture
def paused_onboarding(geneva_database, geneva_transport) -> int:  # type: ignore[no-untyped-def]
    from geneva_drive.examples import DEMO_TABLES, seed
    from geneva_drive.examples.models import DemoCustomer
    from geneva_drive.examples.onboarding import OnboardingWorkflow

    Base.metadata.create_all(geneva_database.engine, tables=DEMO_TABLES)
    seed._work.enabled = False
    try:
        workflow_id = seed._create(OnboardingWorkflow, DemoCustomer(email="host@example.com"))
        with db.transaction() as session:
            workflow = session.get(Workflow, workflow_id)
            assert workflow is not None
            workflow.pause()
    finally:
        seed._work.enabled = True
    return workflow_id


def _flask_geneva(database: Any, *args: str) -> subprocess.CompletedProcess[str]:
    url = database.url
    if database.schema is not None:
        url += ("&" if "?" in url else "?") + f"options=-csearch_path%3D{database.schema}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GENEVA_", "SHOP_"))}
    env.update(
        SHOP_DATABASE_URL=url,
        SHOP_BROKER_URL=REDIS_URL,
        SHOP_SECRET_KEY=secrets.token_urlsafe(32),
        # The engine's own Celery client would publish into memory, where nobody sees it.
        GENEVA_BROKER_URL="memory://",
        GENEVA_WORKFLOW_MODULES="geneva_drive.examples",
        GENEVA_LOG_LEVEL="WARNING",
    )
    return subprocess.run(
        [FLASK, "--app", "app", "geneva", *args],
        cwd=HOST_APP,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _published(client: Any) -> list[tuple[str, list[Any]]]:
    """(task name, args) of every message on the host's queue."""
    found = []
    for raw in client.lrange(HOST_QUEUE, 0, -1):
        message = json.loads(raw)
        body = json.loads(base64.b64decode(message["body"]))
        found.append((message["headers"]["task"], body[0]))
    return found


def test_flask_geneva_resume_publishes_through_the_hosts_celery_app(
    geneva_database, paused_onboarding, redis_client
):
    workflow_id = paused_onboarding
    listed = _flask_geneva(geneva_database, "workflows", "list", "--state", "paused")
    assert listed.returncode == 0, listed.stderr
    assert f"#{workflow_id}\tOnboardingWorkflow" in listed.stdout

    done = _flask_geneva(geneva_database, "workflows", "resume", str(workflow_id))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"#{workflow_id}: Resumed." in done.stdout

    with db.new_session() as session:
        workflow = session.get(Workflow, workflow_id)
        assert workflow is not None and workflow.state == "ready"
        execution = session.scalars(
            select(StepExecution).where(
                StepExecution.workflow_id == workflow_id, StepExecution.state == "scheduled"
            )
        ).one()
        (audit,) = session.scalars(
            select(OperatorAction).where(OperatorAction.workflow_id == workflow_id)
        ).all()
        assert (audit.action, audit.result, audit.actor) == ("resume", "ok", CLI_ACTOR)
    assert ("geneva_drive.perform_step", [execution.id]) in _published(redis_client)


def test_flask_geneva_offers_the_host_commands_only(geneva_database):
    helped = _flask_geneva(geneva_database, "--help")
    assert helped.returncode == 0, helped.stderr
    for name in ("workflows", "signal", "housekeeping", "check-deploy", "doctor", "archive"):
        assert name in helped.stdout
    for name in ("up", "worker", "dispatcher", "migrate"):
        assert f"  {name} " not in helped.stdout
    options = _flask_geneva(geneva_database, "workflows", "resume", "--help")
    assert options.returncode == 0 and "--dry-run" in options.stdout
    assert "usage: flask geneva workflows resume" in options.stdout


def test_flask_geneva_check_deploy_and_doctor_read_the_hosts_database(
    geneva_database, paused_onboarding
):
    """``flask geneva check-deploy`` / ``doctor`` (docs/MANUAL.md, "Changing workflows in
    production"): on the host's database,
    where the paused onboarding workflow lives (the engine's own URL is not even set)."""
    checked = _flask_geneva(geneva_database, "check-deploy", "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert json.loads(checked.stdout)["ok"] is True

    with db.transaction() as session:  # the deploy deletes the step the workflow waits on
        session.execute(
            StepExecution.__table__.update()
            .where(StepExecution.workflow_id == paused_onboarding)
            .values(step_name="a_step_no_release_defines")
        )
    checked = _flask_geneva(geneva_database, "check-deploy", "--json")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    (problem,) = json.loads(checked.stdout)["problems"]
    assert (problem["step"], problem["example_id"]) == (
        "a_step_no_release_defines",
        paused_onboarding,
    )

    doctor = _flask_geneva(geneva_database, "doctor")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert doctor.stdout.startswith("doctor: OK")


def test_flask_geneva_archive_runs_on_the_hosts_database(geneva_database, tmp_path):
    """``flask geneva archive``: the same command, on the host's database."""
    archived = _flask_geneva(
        geneva_database, "archive", "--older-than", "30d", "--to", str(tmp_path)
    )
    assert archived.returncode == 0, archived.stdout + archived.stderr
    assert '"workflows": 0' in archived.stdout
    refused = _flask_geneva(
        geneva_database, "archive", "--older-than", "soon", "--to", str(tmp_path)
    )
    assert refused.returncode == 2 and "30d, 12h" in refused.stderr
