"""``geneva_drive.health`` and ``geneva-drive doctor`` (docs/MANUAL.md, "Unexplained workflows:
`geneva-drive doctor`"): each shape of an
unexplained workflow, forced through the tables, is found with the rule it breaks and the fix;
healthy workflows in every explained state are not; the per-class counts behind the gauge."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import insert, update

from geneva_drive import Workflow, health, step
from geneva_drive.models import Signal, StepExecution, utcnow
from geneva_drive.testing import perform_next_step, speedrun_workflow
from tests.engine.helpers import create_workflow

GENEVA_DRIVE = str(Path(sys.executable).parent / "geneva-drive")
LONG_AGO = utcnow() - timedelta(hours=1)


class DoctorFlow(Workflow):
    @step
    def first(self):
        pass

    @step(wait_for="go")
    def gate(self):
        pass


def _set(session, workflow_id, **values):
    session.execute(update(Workflow).where(Workflow.id == workflow_id).values(**values))
    session.commit()


def _set_executions(session, workflow_id, **values):
    session.execute(
        update(StepExecution).where(StepExecution.workflow_id == workflow_id).values(**values)
    )
    session.commit()


def _ready_without_execution(session):
    wf = create_workflow(session, DoctorFlow)
    _set_executions(session, wf.id, state="canceled", outcome="canceled", finished_at=LONG_AGO)
    _set(session, wf.id, transitioned_at=LONG_AGO)
    return wf.id


def _performing_without_execution(session):
    wf = create_workflow(session, DoctorFlow)
    _set_executions(session, wf.id, state="canceled", outcome="canceled", finished_at=LONG_AGO)
    _set(session, wf.id, state="performing", current_step_name="first", transitioned_at=LONG_AGO)
    return wf.id


def _sent_never_started(session):
    wf = create_workflow(session, DoctorFlow, scheduled_for=LONG_AGO, sent_at=LONG_AGO)
    return wf.id


def _current_step_outside_performing(session):
    wf = create_workflow(session, DoctorFlow)
    _set(session, wf.id, current_step_name="first", transitioned_at=LONG_AGO)
    return wf.id


def _several_current_executions(session):
    wf = create_workflow(session, DoctorFlow)
    _set_executions(session, wf.id, state="waiting", waiting_since=LONG_AGO)
    session.execute(
        insert(StepExecution).values(
            workflow_id=wf.id, step_name="gate", state="scheduled", scheduled_for=utcnow()
        )
    )
    session.commit()
    return wf.id


def _parked_holding_signal(session):
    wf = create_workflow(session, DoctorFlow)
    perform_next_step(wf)
    perform_next_step(wf)  # parks at the gate
    session.commit()
    signal = Signal(workflow_id=wf.id, name="go", state="claimed", claimed=1, claimed_at=utcnow())
    session.add(signal)
    session.flush()
    _set_executions(session, wf.id, signal_id=signal.id)
    return wf.id


def _terminal_with_live_execution(session):
    wf = create_workflow(session, DoctorFlow)
    _set_executions(session, wf.id, state="waiting", waiting_since=LONG_AGO)
    _set(session, wf.id, state="finished", transitioned_at=LONG_AGO)
    return wf.id


SHAPES = {
    "ready_without_execution": _ready_without_execution,
    "performing_without_execution": _performing_without_execution,
    "sent_never_started": _sent_never_started,
    "current_step_outside_performing": _current_step_outside_performing,
    "several_current_executions": _several_current_executions,
    "parked_holding_signal": _parked_holding_signal,
    "terminal_with_live_execution": _terminal_with_live_execution,
}


def test_every_rule_has_a_shape_here():
    assert {rule.name for rule in health.RULES} == set(SHAPES)


@pytest.mark.parametrize("rule", sorted(SHAPES))
def test_each_unexplained_shape_is_found_with_its_rule_and_fix(geneva_session, rule):
    healthy = create_workflow(geneva_session, DoctorFlow)  # scheduled, due now: explained
    workflow_id = SHAPES[rule](geneva_session)
    findings = health.unexplained(geneva_session)
    assert [(f.workflow_id, f.rule) for f in findings] == [(workflow_id, rule)]
    (finding,) = findings
    assert finding.workflow_class == "DoctorFlow"
    assert finding.problem.startswith("breaks: ")
    assert finding.fix
    assert health.counts(geneva_session) == {"DoctorFlow": 1}
    assert healthy.id != workflow_id
    text = health.render(findings)
    assert f"DoctorFlow #{workflow_id} [{rule}]" in text and "fix: " in text
    assert health.exit_code(findings) == 1


def test_a_workflow_that_moved_within_the_grace_is_not_judged(geneva_session):
    wf = create_workflow(geneva_session, DoctorFlow)
    _set_executions(geneva_session, wf.id, state="canceled", outcome="canceled")
    assert health.unexplained(geneva_session) == []  # transitioned just now
    later = utcnow() + health.GRACE + timedelta(seconds=1)
    assert [f.rule for f in health.unexplained(geneva_session, now=later)] == [
        "ready_without_execution"
    ]


def test_explained_workflows_in_every_state_are_not_reported(geneva_session):
    scheduled = create_workflow(geneva_session, DoctorFlow)
    parked = create_workflow(geneva_session, DoctorFlow)
    perform_next_step(parked)
    perform_next_step(parked)
    paused = create_workflow(geneva_session, DoctorFlow)
    paused.pause()
    finished = create_workflow(geneva_session, DoctorFlow)
    finished.signal("go")  # buffered: the gate takes it without parking
    speedrun_workflow(finished)
    # A worker is running its step now (as the executor leaves the rows mid-step).
    running = create_workflow(geneva_session, DoctorFlow)
    _set_executions(geneva_session, running.id, state="in_progress", started_at=utcnow())
    _set(geneva_session, running.id, state="performing", current_step_name="first")
    # Paused by an operator while its step was running: the step is still in progress.
    paused_running = create_workflow(geneva_session, DoctorFlow)
    _set_executions(geneva_session, paused_running.id, state="in_progress", started_at=utcnow())
    _set(geneva_session, paused_running.id, state="paused")  # pausing clears current_step_name
    geneva_session.commit()
    geneva_session.expire_all()
    assert scheduled.state == "ready" and scheduled.current_execution.state == "scheduled"
    assert parked.state == "ready" and parked.current_execution.state == "waiting"
    assert paused.state == "paused" and paused.current_execution.state == "scheduled"
    assert finished.state == "finished"
    assert running.state == "performing"
    assert running.current_execution.state == "in_progress"
    assert paused_running.state == "paused"
    assert paused_running.current_execution.state == "in_progress"
    # Past the grace, within the dispatcher's resend window.
    later = utcnow() + health.GRACE + timedelta(seconds=5)
    assert health.unexplained(geneva_session, now=later) == []
    assert health.counts(geneva_session, now=later) == {}
    assert health.render([]).startswith("doctor: OK")


def test_doctor_command(geneva_database, geneva_session):
    url = geneva_database.url
    if geneva_database.schema is not None:
        url += ("&" if "?" in url else "?") + f"options=-csearch_path%3D{geneva_database.schema}"
    env = {**os.environ, "GENEVA_DATABASE_URL": url, "GENEVA_LOG_LEVEL": "WARNING"}

    def doctor(*args):
        return subprocess.run(
            [GENEVA_DRIVE, "doctor", *args], env=env, capture_output=True, text=True, timeout=120
        )

    clean = doctor()
    assert clean.returncode == 0, clean.stderr
    workflow_id = _ready_without_execution(geneva_session)
    found = doctor("--json")
    assert found.returncode == 1, found.stderr
    (finding,) = json.loads(found.stdout)["unexplained"]
    assert finding["workflow_id"] == workflow_id
    assert finding["rule"] == "ready_without_execution"
    assert (
        finding["fix"]
        == f"session.get(Workflow, {workflow_id}).reattempt()  # schedules its next step again"
    )
    env["GENEVA_DATABASE_URL"] = "postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=2"
    broken = doctor()
    assert broken.returncode == 2 and "could not check" in broken.stderr


SCANNED = ("geneva_drive_workflows", "geneva_drive_step_executions")


def _statements(session, fn):
    from sqlalchemy import event

    engine = session.get_bind()
    found = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("SELECT"):
            found.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        fn(session)
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    return found


@pytest.mark.parametrize("reader", [health.counts, health.unexplained])
def test_the_rules_read_only_the_live_set_through_indexes(geneva_session, reader):
    """No walk of a whole table: SQLite names every one ``SCAN``; PostgreSQL, with sequential
    scans disabled, still shows ``Seq Scan`` where no index can serve (see
    test_security_hardening's filter plans). MariaDB has no such switch."""
    dialect = geneva_session.get_bind().dialect.name
    if dialect in ("mysql", "mariadb"):
        pytest.skip("MariaDB's optimizer has no enable_seqscan; checked on SQLite and PostgreSQL")
    for shape in SHAPES.values():
        shape(geneva_session)
    statements = _statements(geneva_session, reader)
    assert statements
    connection = geneva_session.connection()
    sqlite = dialect == "sqlite"
    if not sqlite:
        connection.exec_driver_sql("SET LOCAL enable_seqscan = off")
    for statement, parameters in statements:
        explain = "EXPLAIN QUERY PLAN " if sqlite else "EXPLAIN "
        rows = connection.exec_driver_sql(explain + statement, parameters).fetchall()
        plan = "\n".join(str(row[-1]) if sqlite else str(row[0]) for row in rows)
        scans = [
            line
            for line in plan.splitlines()
            for table in SCANNED
            if f"SCAN {table}" in line or f"Seq Scan on {table}" in line
        ]
        assert not scans, (statement, plan)
    geneva_session.rollback()


def _executions_read(node: dict) -> int:
    """Rows a PostgreSQL plan (EXPLAIN ANALYZE, JSON) actually read from the executions."""
    own = 0
    if node.get("Relation Name") == "geneva_drive_step_executions":
        own = int(node["Actual Rows"]) * int(node["Actual Loops"])
    return own + sum(_executions_read(child) for child in node.get("Plans", []))


def test_several_current_executions_reads_the_parked_ones_not_every_current_one(geneva_session):
    """The one-active index leaves a waiting execution in every breach of this rule, so the
    rule starts from the parked executions: 300 scheduled workflows beside one breach cost it
    the breach's rows, not 300 (at B9's 250,000 current executions the grouping of every
    one took 0.25-1.4 s of every gauge refresh)."""
    if geneva_session.get_bind().dialect.name != "postgresql":
        pytest.skip("rows read per plan node come from PostgreSQL's EXPLAIN ANALYZE")
    for _ in range(300):
        create_workflow(geneva_session, DoctorFlow)
    breach = _several_current_executions(geneva_session)
    (rule,) = [r for r in health.RULES if r.name == "several_current_executions"]
    connection = geneva_session.connection()
    connection.exec_driver_sql("ANALYZE geneva_drive_step_executions")
    ((statement, parameters),) = _statements(
        geneva_session, lambda session: session.execute(rule.query(utcnow())).all()
    )
    (plan,) = connection.exec_driver_sql(
        "EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters
    ).scalar_one()
    assert _executions_read(plan["Plan"]) <= 4, json.dumps(plan, indent=1)
    assert [f.workflow_id for f in health.unexplained(geneva_session)] == [breach]


@pytest.mark.parametrize("paused", [False, True], ids=["ongoing", "paused"])
@pytest.mark.parametrize(
    "rule",
    ["current_step_outside_performing", "several_current_executions", "parked_holding_signal"],
)
def test_the_printed_fix_runs_whatever_the_workflow_state(geneva_session, rule, paused):
    """The fix is code an operator pastes: on a paused workflow it must not start with
    ``wf.pause()`` (which refuses a paused workflow)."""
    workflow_id = SHAPES[rule](geneva_session)
    if paused:
        _set(geneva_session, workflow_id, state="paused", transitioned_at=LONG_AGO)
    geneva_session.expire_all()
    (finding,) = health.unexplained(geneva_session)
    assert finding.rule == rule
    assert ("wf.pause()" in finding.fix) is not paused
    exec(finding.fix, {"session": geneva_session, "Workflow": Workflow})  # must not raise
    geneva_session.commit()
    assert geneva_session.get(Workflow, workflow_id).state == "ready"
