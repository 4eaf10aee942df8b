"""``geneva-drive workflows …`` and ``geneva-drive signal``, run as the operator runs them: the
installed command in a subprocess, against the test database, reading back the rows it
changed and the audit rows it wrote (actor ``cli:<user>``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from geneva_drive import db
from geneva_drive.models import Base, OperatorAction, Signal, StepExecution
from geneva_drive.workflow import Workflow

GENEVA_DRIVE = str(Path(sys.executable).parent / "geneva-drive")
REDIS_URL = os.environ.get("GENEVA_TEST_REDIS_URL", "redis://127.0.0.1:6379/11")
ROOT = Path(__file__).resolve().parents[2]

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def demo(geneva_database, geneva_transport) -> dict[str, list[int]]:  # type: ignore[no-untyped-def]
    """Two paused broken feeds, two parked payments, one ready onboarding."""
    from geneva_drive.examples import DEMO_TABLES, seed
    from geneva_drive.examples.flaky import FeedImportWorkflow
    from geneva_drive.examples.models import DemoCustomer, DemoFeed, DemoOrder
    from geneva_drive.examples.onboarding import OnboardingWorkflow
    from geneva_drive.examples.payment import PaymentWorkflow

    Base.metadata.create_all(geneva_database.engine, tables=DEMO_TABLES)
    seed._work.enabled = False
    try:
        feeds = []
        for i in range(2):
            wf = seed._create(FeedImportWorkflow, DemoFeed(url=f"https://f/{i}", kind="broken"))
            seed._advance(wf, 2)
            feeds.append(wf)
        payments = []
        for _ in range(2):
            wf = seed._create(PaymentWorkflow, DemoOrder(amount_cents=1200, voided=False))
            seed._advance(wf, 2)
            payments.append(wf)
        ready = [seed._create(OnboardingWorkflow, DemoCustomer(email="a@example.com"))]
    finally:
        seed._work.enabled = True
    return {"feeds": feeds, "payments": payments, "ready": ready}


@pytest.fixture
def cli(geneva_database) -> Iterator[Run]:  # type: ignore[no-untyped-def]
    url = geneva_database.url
    if geneva_database.schema is not None:
        url += ("&" if "?" in url else "?") + f"options=-csearch_path%3D{geneva_database.schema}"
    # Messages for the steps an action schedules go to a queue of this test's own.
    queue = f"h18-cli-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "GENEVA_DATABASE_URL": url,
        "GENEVA_WORKFLOW_MODULES": "geneva_drive.examples",
        "GENEVA_BROKER_URL": REDIS_URL,
        "GENEVA_DEFAULT_QUEUE": queue,
        "GENEVA_LOG_LEVEL": "WARNING",
        "USER": "ops-test",
        "LOGNAME": "ops-test",
    }

    def run(*args: str, extra_env: dict[str, str] | None = None) -> Any:
        return subprocess.run(
            [GENEVA_DRIVE, *args],
            env={**env, **(extra_env or {})},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    yield run
    try:
        import redis

        redis.Redis.from_url(REDIS_URL).delete(queue)
    except Exception:  # Redis not running: nothing was queued there either
        pass


def _workflow(workflow_id: int) -> Workflow:
    with db.new_session() as session:
        workflow = session.get(Workflow, workflow_id)
        assert workflow is not None
        session.expunge(workflow)
        return workflow


def _audit(**where: Any) -> list[OperatorAction]:
    with db.new_session() as session:
        stmt = select(OperatorAction).order_by(OperatorAction.id)
        for key, value in where.items():
            stmt = stmt.where(getattr(OperatorAction, key) == value)
        rows = list(session.scalars(stmt))
        session.expunge_all()
        return rows


def test_list_and_show_answer_what_is_paused_and_why(demo, cli):
    listed = cli("workflows", "list", "--state", "paused", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)["workflows"]
    assert sorted(r["id"] for r in rows) == sorted(demo["feeds"])
    assert all(r["why"] == "paused after `ValueError` in `parse`" for r in rows)

    text = cli("workflows", "list", "--class", "PaymentWorkflow")
    assert text.returncode == 0
    assert "waiting for signal `payment_confirmed`" in text.stdout

    shown = cli("workflows", "show", str(demo["feeds"][0]))
    assert shown.returncode == 0, shown.stderr
    assert "paused after `ValueError` in `parse`" in shown.stdout
    assert "parse [current]" in shown.stdout
    assert "malformed row 17" in shown.stdout
    data = json.loads(cli("workflows", "show", str(demo["feeds"][0]), "--json").stdout)
    assert data["row"]["state"] == "paused"


def test_pause_by_id_is_audited_with_the_cli_actor(demo, cli):
    workflow_id = demo["ready"][0]
    done = cli("workflows", "pause", str(workflow_id))
    assert done.returncode == 0, done.stderr
    assert f"#{workflow_id}: Paused." in done.stdout
    assert _workflow(workflow_id).state == "paused"
    (row,) = _audit(workflow_id=workflow_id)
    assert (row.actor, row.action, row.result) == ("cli:ops-test", "pause", "ok")
    assert (row.from_state, row.to_state) == ("ready", "paused")


def test_a_refusal_exits_non_zero_with_the_engines_message(demo, cli):
    workflow_id = demo["ready"][0]
    refused = cli("workflows", "resume", str(workflow_id))
    assert refused.returncode == 1
    assert "Only a paused workflow can be resumed." in refused.stderr
    assert _workflow(workflow_id).state == "ready"
    (row,) = _audit(workflow_id=workflow_id)
    assert (row.actor, row.result) == ("cli:ops-test", "refused")

    missing = cli("workflows", "cancel", "987654", str(workflow_id))
    assert missing.returncode == 1
    assert "No such workflow: #987654. Nothing was changed." in missing.stderr
    assert _workflow(workflow_id).state == "ready"

    nothing = cli("workflows", "cancel")
    assert nothing.returncode == 1
    assert "Name the workflows" in nothing.stderr


def test_resume_at_by_filter_previews_then_acts_under_one_batch(demo, cli):
    feeds = demo["feeds"]
    args = ("workflows", "resume-at", "publish", "--class", "FeedImportWorkflow")
    preview = cli(*args, "--state", "paused", "--dry-run")
    assert preview.returncode == 0, preview.stderr
    assert "Resume at publish: 2 workflows would be changed (dry run" in preview.stdout
    assert {_workflow(i).state for i in feeds} == {"paused"}
    assert _audit() == []

    done = cli(*args, "--state", "paused", "--json")
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout)
    assert (outcome["count"], outcome["done"], outcome["refused"]) == (2, 2, 0)
    for workflow_id in feeds:
        workflow = _workflow(workflow_id)
        assert (workflow.state, workflow.next_step_name) == ("ready", "publish")
    (batch,) = _audit(action="bulk_resume_at")
    assert batch.actor == "cli:ops-test" and batch.result == "ok"
    assert batch.params is not None and batch.params["step"] == "publish"
    assert len(_audit(action="resume_at")) == 2


def test_the_bulk_cap_refuses_before_anything_changes(demo, cli):
    over = cli(
        "workflows", "pause", "--class", "PaymentWorkflow", extra_env={"GENEVA_BULK_CAP": "1"}
    )
    assert over.returncode == 1
    assert "More than 1 workflows match" in over.stderr
    assert {_workflow(i).state for i in demo["payments"]} == {"ready"}
    assert _audit() == []


def test_signal_delivers_to_a_parked_payment(demo, cli):
    workflow_id = demo["payments"][0]
    bad = cli("signal", "payment_confirmed", str(workflow_id), "--payload", "{nope")
    assert bad.returncode == 1
    assert "--payload is not valid JSON" in bad.stderr

    sent = cli(
        "signal",
        "payment_confirmed",
        str(workflow_id),
        "--payload",
        '{"amount_cents": 1200}',
        "--idempotency-key",
        "evt-cli-1",
    )
    assert sent.returncode == 0, sent.stderr
    assert "Signal `payment_confirmed` delivered" in sent.stdout
    with db.new_session() as session:
        signal = session.scalars(select(Signal).where(Signal.workflow_id == workflow_id)).one()
        assert signal.idempotency_key == "evt-cli-1"
        assert signal.payload_json == {"amount_cents": 1200}
        waiting = session.scalars(
            select(StepExecution).where(
                StepExecution.workflow_id == workflow_id, StepExecution.state == "waiting"
            )
        ).all()
        assert waiting == []  # the parked step was woken
    (row,) = _audit(workflow_id=workflow_id)
    assert (row.actor, row.action, row.result) == ("cli:ops-test", "signal", "ok")
