"""No silent broker (docs/MANUAL.md, "Three process roles"): a process that would publish step
messages and was given no broker - neither ``GENEVA_BROKER_URL`` nor the host's Celery app - refuses
to start, naming the setting, and changes nothing. Only the embedded ``geneva-drive up``/``worker``
run without one (they poll the database).

Each role runs as its operator starts it: the installed command in a subprocess, with
``GENEVA_BROKER_URL`` (and Celery's own ``CELERY_BROKER_URL``) removed from its environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import select

from geneva_drive import Workflow, celery_client, db, step, transport
from geneva_drive.dashboard import GenevaDrive
from geneva_drive.errors import ConfigurationError
from geneva_drive.models import StepExecution
from geneva_drive.transport import Message

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
MODULES = "tests.integration.test_no_silent_broker"

Run = Callable[..., subprocess.CompletedProcess[str]]


class BrokerlessWorkflow(Workflow):
    may_proceed_without_hero = True

    @step
    def one(self) -> None:
        pass

    @step
    def two(self) -> None:
        pass


def _database_url(geneva_database: Any) -> str:
    url = str(geneva_database.url)
    if geneva_database.schema is not None:
        url += ("&" if "?" in url else "?") + f"options=-csearch_path%3D{geneva_database.schema}"
    return url


@pytest.fixture
def env(geneva_database: Any) -> dict[str, str]:
    """The environment of a process given no broker, on the test database."""
    values = {
        key: value
        for key, value in os.environ.items()
        if key not in ("GENEVA_BROKER_URL", "CELERY_BROKER_URL", "BROKER_URL")
    }
    values.update(
        GENEVA_DATABASE_URL=_database_url(geneva_database),
        GENEVA_WORKFLOW_MODULES=MODULES,
        GENEVA_SECRET_KEY="a-secret-key-long-enough-for-the-dashboard-0123",
        GENEVA_LOG_LEVEL="WARNING",
        PYTHONPATH=str(ROOT),
    )
    return values


@pytest.fixture
def run(env: dict[str, str]) -> Run:
    """Run a command without any broker in its environment, against the test database."""

    def call(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )

    return call


@pytest.fixture
def ready_workflow(geneva_session: Any) -> int:
    """A ready workflow whose first execution is due and unsent (nothing published yet)."""
    workflow = BrokerlessWorkflow.create(session=geneva_session)
    geneva_session.commit()
    geneva_session.execute(
        StepExecution.__table__.update()
        .where(StepExecution.workflow_id == workflow.id)
        .values(sent_at=None, job_id=None)
    )
    geneva_session.commit()
    return int(workflow.id)


def _unchanged(workflow_id: int) -> None:
    """Nothing was published and nothing changed: still ready, its execution unsent."""
    with db.new_session() as session:
        workflow = session.get(Workflow, workflow_id)
        assert workflow is not None and workflow.state == "ready"
        rows = list(
            session.execute(
                select(StepExecution.state, StepExecution.sent_at).where(
                    StepExecution.workflow_id == workflow_id
                )
            )
        )
    assert rows == [("scheduled", None)], rows


def _refused(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode != 0, (result.stdout, result.stderr)
    assert "GENEVA_BROKER_URL" in result.stderr, result.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["dispatcher"],
        ["housekeeping"],
        ["workflows", "pause", "{id}"],
        ["workflows", "cancel", "{id}"],
        ["signal", "go", "{id}"],
    ],
    ids=["dispatcher", "housekeeping", "workflows-pause", "workflows-cancel", "signal"],
)
def test_a_publishing_command_refuses_to_start_without_a_broker(run, ready_workflow, argv):
    args = [a.replace("{id}", str(ready_workflow)) for a in argv]
    result = run(str(BIN / "geneva-drive"), *args)
    _refused(result)
    assert result.returncode == 2
    _unchanged(ready_workflow)


def test_a_dry_run_publishes_nothing_and_needs_no_broker(run, ready_workflow):
    result = run(str(BIN / "geneva-drive"), "workflows", "pause", str(ready_workflow), "--dry-run")
    assert result.returncode == 0, result.stderr
    _unchanged(ready_workflow)


@pytest.mark.parametrize("role", ["worker", "beat"])
def test_celery_worker_and_beat_refuse_to_start_without_a_broker(
    run, ready_workflow, role, tmp_path
):
    extra = ["--schedule", str(tmp_path / "beat-schedule")] if role == "beat" else []
    result = run(
        str(BIN / "celery"),
        "-A",
        "geneva_drive.celery",
        role,
        "--loglevel",
        "WARNING",
        *extra,
        timeout=90,
    )
    _refused(result)
    _unchanged(ready_workflow)


def test_the_standalone_dashboard_refuses_to_start_without_a_broker(run, ready_workflow):
    result = run(sys.executable, "-c", "import geneva_drive.dashboard.wsgi")
    _refused(result)
    _unchanged(ready_workflow)


def test_the_embedded_worker_needs_no_broker(env, ready_workflow):
    """``geneva-drive worker`` polls the database: it starts, and runs the workflow."""
    worker = subprocess.Popen(
        [str(BIN / "geneva-drive"), "worker", "--poll-interval", "0.05", "--no-housekeeping"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        state = ""
        while time.monotonic() < deadline:
            with db.new_session() as session:
                state = session.scalar(select(Workflow.state).where(Workflow.id == ready_workflow))
            if state == "finished":
                break
            assert worker.poll() is None, worker.stdout.read() if worker.stdout else ""
            time.sleep(0.1)
        assert state == "finished"
    finally:
        worker.terminate()
        worker.wait(30)
        if worker.stdout is not None:
            worker.stdout.close()


# --- in process: the Flask extension and the transport's own backstop ---------------------------


@pytest.fixture
def no_broker(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No GENEVA_BROKER_URL, Celery's transport, the engine's own unconfigured app."""
    monkeypatch.delenv("GENEVA_BROKER_URL", raising=False)
    monkeypatch.setattr(celery_client, "_default", celery_client.new_app())
    monkeypatch.setattr(celery_client, "_host_given", False)
    previous = transport._transport
    transport.set_transport(None)
    try:
        yield
    finally:
        transport.set_transport(previous)


def _host(geneva_database: Any) -> tuple[Flask, SQLAlchemy]:
    app = Flask("host")
    app.config.update(
        SECRET_KEY="a-host-key-long-and-random-enough-0123456789", **geneva_database.flask_config()
    )
    sa = SQLAlchemy()
    sa.init_app(app)
    return app, sa


def test_the_flask_extension_refuses_without_a_broker_or_a_celery_app(geneva_database, no_broker):
    app, sa = _host(geneva_database)
    try:
        with pytest.raises(ConfigurationError, match="GENEVA_BROKER_URL"):
            GenevaDrive(app, db=sa)
    finally:
        with app.app_context():
            sa.engine.dispose()


def test_the_flask_extension_accepts_the_hosts_celery_app(geneva_database, no_broker):
    app, sa = _host(geneva_database)
    host_celery = Celery("host", broker="memory://", set_as_current=False)
    try:
        GenevaDrive(app, db=sa, celery=host_celery)
    finally:
        with app.app_context():
            sa.engine.dispose()


def test_the_celery_transport_never_sends_to_a_broker_it_was_not_given(no_broker):
    with pytest.raises(ConfigurationError, match="GENEVA_BROKER_URL"):
        celery_client.CeleryTransport().send(Message(execution_id=1, job_id="j"))
    with pytest.raises(ConfigurationError, match="GENEVA_BROKER_URL"):
        transport.require_publisher("a test role")
