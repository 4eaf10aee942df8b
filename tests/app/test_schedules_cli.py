"""``geneva-drive schedules``, run as the operator runs it (the installed command in a
subprocess, where ``import flask`` fails, against the test database): the Schedules page's
table with the database's text escaped, the same rows as JSON, and pause / resume / run-now
with the dashboard's refusals and audit rows (actor ``cli:<OS user>``)."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select, update

from geneva_drive import Schedule, db
from geneva_drive.examples.recurring import QueueProbeWorkflow
from geneva_drive.models import OperatorAction, ScheduleRow
from geneva_drive.workflow import Workflow
from tests.app.test_operator_cli import CLI_ACTOR, cli, no_flask  # noqa: F401  (fixtures)


def _row(name: str) -> ScheduleRow:
    with db.new_session() as session:
        row = session.scalars(select(ScheduleRow).where(ScheduleRow.name == name)).one()
        session.expunge(row)
        return row


def _audit(action: str) -> list[OperatorAction]:
    with db.new_session() as session:
        rows = list(
            session.scalars(
                select(OperatorAction)
                .where(OperatorAction.action == action)
                .order_by(OperatorAction.id)
            )
        )
        session.expunge_all()
        return rows


def test_list_prints_the_table_escaped_and_as_json(
    cli: Any,  # noqa: F811
    no_flask: Any,  # noqa: F811
    geneva_session: Any,
) -> None:
    Schedule.create(geneva_session, "queue-probe", QueueProbeWorkflow, every=30)
    Schedule.create(
        geneva_session, "nightly", QueueProbeWorkflow, cron="0 3 * * *", timezone="Europe/Berlin"
    )
    geneva_session.execute(
        update(ScheduleRow)
        .where(ScheduleRow.name == "nightly")
        .values(ticks_skipped=2, last_skip_reason="evil\x1b[2J\nfake-row  paused")
    )
    geneva_session.commit()

    listed = cli("schedules", extra_env=no_flask)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == [
        "NAME",
        "STATE",
        "WHEN",
        "NEXT",
        "FIRE",
        "LAST",
        "RUN",
        "SKIPPED",
        "MISSED",
        "SOURCE",
    ]
    assert len(lines) == 3, listed.stdout  # the forged newline made no row of its own
    nightly = next(line for line in lines if line.startswith("nightly"))
    assert "At 03:00 every day (Europe/Berlin)" in nightly
    assert "2 (evil\\x1b[2J\\x0afake-row  paused)" in nightly
    assert "\x1b" not in listed.stdout
    assert "Europe/Berlin" in nightly and "runtime" in nightly
    assert "2 active · 0 paused · 0 disabled" in listed.stderr

    data = json.loads(cli("schedules", "list", "--json", extra_env=no_flask).stdout)
    by_name = {s["name"]: s for s in data["schedules"]}
    assert by_name["queue-probe"]["description"] == "every 30 s"
    assert len(by_name["nightly"]["next_fire_times"]) == 3
    assert by_name["nightly"]["last_skip_reason"] == "evil\x1b[2J\nfake-row  paused"
    assert data["counts"] == {"active": 2, "paused": 0, "disabled": 0}


def test_pause_resume_and_run_now_are_audited_and_refused_like_the_dashboard(
    cli: Any,  # noqa: F811
    no_flask: Any,  # noqa: F811
    geneva_session: Any,
) -> None:
    Schedule.create(geneva_session, "queue-probe", QueueProbeWorkflow, every=30)
    geneva_session.commit()

    paused = cli("schedules", "pause", "queue-probe", extra_env=no_flask)
    assert paused.returncode == 0, paused.stderr
    assert "Paused schedule `queue-probe`" in paused.stdout
    assert _row("queue-probe").paused is True

    again = cli("schedules", "pause", "queue-probe", extra_env=no_flask)
    assert again.returncode == 1
    assert "schedule 'queue-probe' is paused already" in again.stderr
    assert [(a.actor, a.params, a.result) for a in _audit("schedule_pause")] == [
        (CLI_ACTOR, {"schedule": "queue-probe"}, "ok"),
        (CLI_ACTOR, {"schedule": "queue-probe"}, "refused"),
    ]

    resumed = cli("schedules", "resume", "queue-probe", "--actor", "alice", extra_env=no_flask)
    assert resumed.returncode == 0, resumed.stderr
    assert _row("queue-probe").paused is False
    assert _audit("schedule_resume")[0].actor == f"{CLI_ACTOR} as alice"

    before = _row("queue-probe").next_fire_at
    ran = cli("schedules", "run-now", "queue-probe", "--json", extra_env=no_flask)
    assert ran.returncode == 0, ran.stderr
    outcome = json.loads(ran.stdout)
    assert outcome["ok"] is True
    with db.new_session() as session:
        workflow = session.get(Workflow, outcome["workflow_id"])
        assert workflow is not None
        assert workflow.type == "QueueProbeWorkflow"
        assert (workflow.metadata_ or {})["schedule"] == "queue-probe"
    after = _row("queue-probe")
    assert (after.next_fire_at, after.last_workflow_id) == (before, outcome["workflow_id"])
    [run] = _audit("schedule_run_now")
    assert (run.workflow_id, run.actor, run.result) == (outcome["workflow_id"], CLI_ACTOR, "ok")

    unknown = cli("schedules", "resume", "no-such", extra_env=no_flask)
    assert unknown.returncode == 1
    assert "no schedule named 'no-such'" in unknown.stderr
