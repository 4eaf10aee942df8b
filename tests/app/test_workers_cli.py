"""``geneva-drive workers``, run as the operator runs it (the installed command in a subprocess,
where ``import flask`` fails, against the test database): the Workers page's table, with the
database's text escaped, and the same rows as JSON."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from sqlalchemy import select, update

from geneva_drive import liveness
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.testing import expire_worker
from geneva_drive.workflow import Workflow
from tests.app.test_operator_cli import cli, no_flask  # noqa: F401  (the command's fixtures)


def _register(name: str, monkeypatch: Any, version: str) -> int:
    monkeypatch.setenv("GENEVA_CODE_VERSION", version)
    return liveness.register("celery", ["default"], name=name).worker_id


def _run_on(session: Any, workflow: Any, worker_id: int) -> None:
    execution = session.scalars(
        select(StepExecution.id).where(StepExecution.workflow_id == workflow.id)
    ).one()
    session.execute(
        update(StepExecution)
        .where(StepExecution.id == execution)
        .values(
            state="in_progress", started_at=utcnow() - timedelta(seconds=90), worker_id=worker_id
        )
    )
    session.execute(update(Workflow).where(Workflow.id == workflow.id).values(state="performing"))
    session.commit()


def test_workers_prints_the_table_escaped_and_as_json(
    cli: Any,  # noqa: F811
    no_flask: Any,  # noqa: F811
    geneva_session: Any,
    make_workflow: Any,
    monkeypatch: Any,
) -> None:
    live = _register("celery@alpha/812", monkeypatch, "v2")
    _register("celery@alpha/813", monkeypatch, "v2")
    forged = _register("celery@evil\x1b[2J\nfake-row/1", monkeypatch, "v1")
    dead = _register("celery@gamma/9", monkeypatch, "v2")
    running, orphan = make_workflow(), make_workflow()
    _run_on(geneva_session, running, live)
    _run_on(geneva_session, orphan, dead)
    expire_worker(dead)

    done = cli("workers", extra_env=no_flask)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:3] == ["NAME", "STATE", "HOST"]
    assert len(lines) == 1 + 4  # the header and one line per worker: no forged line
    assert "\x1b" not in done.stdout
    assert "celery@evil\\x1b[2J\\x0afake-row/1" in done.stdout
    [forged_line] = [line for line in lines if "fake-row" in line]
    assert "v1 (deploy in progress)" in forged_line
    [live_line] = [line for line in lines if line.startswith("celery@alpha/812 ")]
    assert f"DashPayment #{running.id} authorize for 1 min" in live_line
    [dead_line] = [line for line in lines if line.startswith("celery@gamma/9 ")]
    assert "expired, steps to recover" in dead_line and f"#{orphan.id}" in dead_line
    assert "3 live · 1 expired · 0 stopped" in done.stderr
    assert "1 expired worker(s) still hold running steps" in done.stderr

    as_json = cli("workers", "--json", extra_env=no_flask)
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert data["counts"] == {"live": 3, "expired": 1, "stopped": 0}
    assert data["common_version"] == "v2"
    by_id = {w["id"]: w for w in data["workers"]}
    assert by_id[forged]["name"] == "celery@evil\x1b[2J\nfake-row/1"  # JSON escapes it itself
    assert by_id[forged]["other_version"] is True
    assert [s["workflow_id"] for s in by_id[live]["running"]] == [running.id]
    assert (by_id[dead]["state"], by_id[dead]["recovering"]) == ("expired", True)
    assert by_id[live]["heartbeat_age_seconds"] < 60


def test_workers_without_any_says_how_they_appear(
    cli: Any,  # noqa: F811
    geneva_session: Any,
) -> None:
    done = cli("workers")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert "No workers have registered in the last day" in done.stderr
