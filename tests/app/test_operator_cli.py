"""``geneva-drive workflows …`` and ``geneva-drive signal``, run as the operator runs them: the
installed command in a subprocess, against the test database, reading back the rows it
changed and the audit rows it wrote (actor ``cli:<OS user>``, from the effective uid: the
``USER``/``LOGNAME`` the fixture sets to ``ops-test`` must not change it)."""

from __future__ import annotations

import json
import os
import pwd
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
#: The audit actor of every command these tests run: the OS user, not $USER or $LOGNAME.
CLI_ACTOR = f"cli:{pwd.getpwuid(os.geteuid()).pw_name}"

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

    run.env = env  # type: ignore[attr-defined]
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
    assert (row.actor, row.action, row.result) == (CLI_ACTOR, "pause", "ok")
    assert (row.from_state, row.to_state) == ("ready", "paused")


def test_a_refusal_exits_non_zero_with_the_engines_message(demo, cli):
    workflow_id = demo["ready"][0]
    refused = cli("workflows", "resume", str(workflow_id))
    assert refused.returncode == 1
    assert "Only a paused workflow can be resumed." in refused.stderr
    assert _workflow(workflow_id).state == "ready"
    (row,) = _audit(workflow_id=workflow_id)
    assert (row.actor, row.result) == (CLI_ACTOR, "refused")

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
    assert batch.actor == CLI_ACTOR and batch.result == "ok"
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
    assert (row.actor, row.action, row.result) == (CLI_ACTOR, "signal", "ok")


def test_signal_waiting_only_delivers_to_the_waiters_and_refuses_the_rest(demo, cli):
    """The inbox's bulk deliver on the command line: the same preview, refusals and audit."""
    waiter, moved_on = demo["payments"]
    not_parked = demo["ready"][0]
    with db.new_session() as session:
        workflow = session.get(Workflow, moved_on)
        assert workflow is not None
        workflow.signal("payment_confirmed", {"from": "webhook"})
        session.commit()
    ids = [str(waiter), str(moved_on), str(not_parked)]
    dry = cli("signal", "payment_confirmed", *ids, "--waiting-only", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "1 workflow would be changed, 2 would not be done" in dry.stdout
    assert "2 no longer waiting for a signal (ready)" in dry.stdout
    assert _audit() == []

    sent = cli("signal", "payment_confirmed", *ids, "--waiting-only", "--payload", '{"n": 1}')
    assert sent.returncode == 1
    assert "Signal payment_confirmed: 1 done, 2 refused." in sent.stderr
    with db.new_session() as session:
        payloads = {
            s.workflow_id: s.payload_json
            for s in session.scalars(
                select(Signal).where(Signal.workflow_id.in_([waiter, moved_on, not_parked]))
            )
        }
    # Nothing stored for the workflow that was not parked, nothing more for the one that moved on.
    assert payloads == {waiter: {"n": 1}, moved_on: {"from": "webhook"}}
    [batch] = _audit(action="bulk_signal")
    assert (batch.actor, batch.result) == (CLI_ACTOR, "partial")
    assert batch.params["waiting_only"] is True


# --- without Flask -------------------------------------------------------------------------------

#: Installed through PYTHONPATH: every import of Flask or its extensions raises, as in a
#: process where Flask is not installed.
NO_FLASK = """
import importlib.abc
import sys

BLOCKED = ("flask", "flask_sqlalchemy", "flask_migrate", "flask_login", "htmx_flask")


class NoFlask(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked in this test: no Flask here")
        return None


sys.meta_path.insert(0, NoFlask())
"""


@pytest.fixture
def no_flask(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "sitecustomize.py").write_text(NO_FLASK)
    return {"PYTHONPATH": str(tmp_path)}


def test_every_operator_command_runs_where_import_flask_fails(demo, cli, no_flask):
    probe = subprocess.run(
        [sys.executable, "-c", "import flask"], env={**os.environ, **no_flask}, capture_output=True
    )
    assert probe.returncode == 1 and b"no Flask here" in probe.stderr

    feed, other_feed = demo["feeds"]
    ready = demo["ready"][0]
    payment, other_payment = demo["payments"]

    def ok(*args: str) -> str:
        done = cli(*args, extra_env=no_flask)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        assert "blocked" not in done.stderr
        return done.stdout

    assert str(feed) in ok("workflows", "list", "--state", "paused")
    assert "paused after `ValueError` in `parse`" in ok("workflows", "show", str(feed))
    ok("workflows", "pause", str(ready))
    ok("workflows", "resume", str(ready))
    assert _workflow(ready).state == "ready"
    assert "Step scheduled to run again." in ok("workflows", "reattempt", str(ready))
    ok("workflows", "skip", str(feed))
    assert _workflow(feed).next_step_name == "publish"
    ok("workflows", "resume-at", "publish", str(other_feed))
    assert (_workflow(other_feed).state, _workflow(other_feed).next_step_name) == (
        "ready",
        "publish",
    )
    ok("workflows", "cancel", str(other_payment))
    assert _workflow(other_payment).state == "canceled"
    ok("signal", "payment_confirmed", str(payment), "--payload", '{"amount_cents": 1200}')
    ok("housekeeping")
    actions = [(row.action, row.result, row.actor) for row in _audit()]
    assert actions == [
        ("pause", "ok", CLI_ACTOR),
        ("resume", "ok", CLI_ACTOR),
        ("reattempt", "ok", CLI_ACTOR),
        ("skip", "ok", CLI_ACTOR),
        ("resume_at", "ok", CLI_ACTOR),
        ("cancel", "ok", CLI_ACTOR),
        ("signal", "ok", CLI_ACTOR),
    ]


# --- the audit actor -----------------------------------------------------------------------------


def test_the_actor_is_the_os_user_whatever_logname_says(demo, cli):
    workflow_id = demo["ready"][0]
    done = cli("workflows", "pause", str(workflow_id), extra_env={"LOGNAME": "op", "USER": "admin"})
    assert done.returncode == 0, done.stderr
    (row,) = _audit(workflow_id=workflow_id)
    assert row.actor == CLI_ACTOR
    assert "op" not in row.actor.removeprefix("cli:").split() and "admin" not in row.actor


def test_an_explicit_actor_is_audited_as_such_beside_the_os_user(demo, cli):
    workflow_id = demo["ready"][0]
    done = cli("workflows", "pause", str(workflow_id), "--actor", "alice")
    assert done.returncode == 0, done.stderr
    # Posing as another CLI user only names the pose: the OS user stays in front.
    posed = cli("workflows", "resume", str(workflow_id), "--actor", "cli:root\nforged line")
    assert posed.returncode == 0, posed.stderr
    actors = [row.actor for row in _audit(workflow_id=workflow_id)]
    assert actors == [f"{CLI_ACTOR} as alice", f"{CLI_ACTOR} as cli:root forged line"]
    empty = cli("workflows", "pause", str(workflow_id), "--actor", " ")
    assert empty.returncode == 1 and "--actor needs a name" in empty.stderr


# --- what the CLI assumes, it says: the default database, unknown classes and steps --------------


def _bare_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENEVA_")}
    return {**env, "GENEVA_LOG_LEVEL": "WARNING", **extra}


@pytest.mark.skipif(
    bool(os.environ.get("GENEVA_TEST_DATABASE_URL")),
    reason="the embedded default is a SQLite file: runs once, in the SQLite pass",
)
def test_beside_up_the_cli_uses_the_embedded_default_file_and_says_so(tmp_path: Path):
    def run(*args: str, cwd: Path = tmp_path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [GENEVA_DRIVE, *args], env=_bare_env(), cwd=cwd, capture_output=True, text=True
        )

    nowhere = tmp_path / "elsewhere"
    nowhere.mkdir()
    refused = run("workflows", "list", cwd=nowhere)
    assert refused.returncode == 2
    assert "GENEVA_DATABASE_URL is not set" in refused.stderr
    assert str(nowhere / "var" / "geneva_drive.sqlite3") in refused.stderr
    assert not (nowhere / "var").exists()  # no empty file made on the way

    assert run("migrate").returncode == 0  # what `geneva-drive up` does first, here
    listed = run("workflows", "list")
    assert listed.returncode == 0, listed.stderr
    assert f"using the embedded default {tmp_path / 'var' / 'geneva_drive.sqlite3'}" in (
        listed.stderr
    )
    assert "No workflows match." in listed.stderr


def test_without_workflow_modules_a_paused_workflow_is_unknown_not_stranded(demo, cli):
    blind = {"GENEVA_WORKFLOW_MODULES": ""}
    listed = cli("workflows", "list", "--state", "paused", "--json", extra_env=blind)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)["workflows"]
    assert sorted(r["id"] for r in rows) == sorted(demo["feeds"])
    for row in rows:
        assert "stranded" not in row["badges"]
        assert "unknown (set GENEVA_WORKFLOW_MODULES)" in row["badges"]
    text = cli("workflows", "list", "--state", "paused", extra_env=blind).stdout
    assert "stranded" not in text and "unknown (set GENEVA_WORKFLOW_MODULES)" in text
    shown = cli("workflows", "show", str(demo["feeds"][0]), extra_env=blind)
    assert "stranded" not in shown.stdout and "set GENEVA_WORKFLOW_MODULES" in shown.stdout

    guess = cli("workflows", "list", "--stranded", "parse", extra_env=blind)
    assert guess.returncode == 1
    assert "set GENEVA_WORKFLOW_MODULES" in guess.stderr

    # With the modules it knows: broken feeds are paused on a step that exists.
    known = json.loads(cli("workflows", "list", "--state", "paused", "--json").stdout)
    assert all(r["badges"] == ["paused"] for r in known["workflows"])


def test_resume_at_an_unknown_step_is_refused_even_in_a_dry_run(demo, cli):
    feed = demo["feeds"][0]
    for extra in ((), ("--dry-run",)):
        refused = cli("workflows", "resume-at", "nosuchstep", str(feed), *extra)
        assert refused.returncode == 1, refused.stdout
        assert "would be changed" not in refused.stdout
        assert "Unknown step `nosuchstep`" in refused.stderr
        assert "Its steps are fetch, parse, publish; run resume-at with one of them." in (
            refused.stderr
        )
    assert _workflow(feed).state == "paused"
    assert _audit() == []


def test_the_more_cursor_stands_apart_from_the_last_row(demo, cli):
    merged = subprocess.run(
        [GENEVA_DRIVE, "workflows", "list", "--limit", "2"],
        env={**cli.env, "PYTHONUNBUFFERED": ""},  # type: ignore[attr-defined]
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    assert merged.returncode == 0
    lines = merged.stdout.splitlines()
    assert lines[:2] and all(line.startswith("#") for line in lines[:2])
    # The rows, a blank line, then the cursor (not glued to the last row).
    second_newest = sorted(i for ids in demo.values() for i in ids)[-2]
    assert lines[2:] == ["", f"More: --after {second_newest}"]


def test_a_dry_run_counts_only_what_will_be_done(demo, cli):
    ready = [demo["ready"][0], *demo["payments"]]  # ready (two parked for a signal)
    feed = demo["feeds"][0]
    nothing = cli("workflows", "resume", *map(str, ready), "--dry-run")
    assert nothing.returncode == 0, nothing.stderr
    assert (
        "Resume: 0 workflows would be changed, 3 would not be done (3 ready (only a paused "
        "workflow can be resumed))" in nothing.stdout
    )
    mixed = cli("workflows", "resume", str(feed), *map(str, ready), "--dry-run", "--json")
    preview = json.loads(mixed.stdout)
    assert (preview["count"], preview["ids"], preview["refused_count"]) == (1, [feed], 3)
    assert preview["dry_run"] is True
    # A selection that matches nothing, without --dry-run: no claim of a dry run.
    empty = cli("workflows", "pause", "--class", "OnboardingWorkflow", "--state", "canceled")
    assert empty.returncode == 0, empty.stderr
    assert "(nothing changed)." in empty.stdout and "dry run" not in empty.stdout
    assert _audit() == []


def test_a_bulk_action_with_workflows_gone_meanwhile_is_not_ok(capsys):
    """A workflow deleted between the selection and the action was not done: the command
    says how many, in text and JSON, and exits 1 (a script must not read it as success)."""
    from geneva_drive.dashboard.operator_cli import report_outcome

    def outcome() -> dict[str, Any]:
        return {"action": "cancel", "count": 3, "done": 2, "refused": 0, "gone": 1}

    text = {**outcome(), "messages": ["#9: Workflow #9 does not exist."], "batch": 7}
    assert report_outcome("Cancel", text, as_json=False) == 1
    err = capsys.readouterr().err
    assert "Cancel: 2 done, 1 no longer exist." in err and "#9: Workflow #9" in err

    as_json = {**outcome(), "messages": [], "batch": 7}
    assert report_outcome("Cancel", as_json, as_json=True) == 1
    printed = json.loads(capsys.readouterr().out)
    assert (printed["gone"], printed["ok"]) == (1, False)


# --- stranded workflows --------------------------------------------------------------------------


def _stranded_onboarding() -> int:
    """An onboarding paused on ``send_sms``, a step its class does not define, while the
    workflow's own pointer still names ``send_welcome`` (the demo's stranded rows)."""
    from geneva_drive.examples import seed
    from geneva_drive.examples.models import DemoCustomer
    from geneva_drive.examples.onboarding import OnboardingWorkflow

    seed._work.enabled = False
    try:
        workflow_id = seed._create(OnboardingWorkflow, DemoCustomer(email="sms@example.com"))
        seed._move_current(workflow_id, step_name="send_sms")
        seed._advance(workflow_id, 1)
    finally:
        seed._work.enabled = True
    assert _workflow(workflow_id).state == "paused"
    return workflow_id


def _executions(workflow_id: int) -> list[tuple[str, str]]:
    with db.new_session() as session:
        return [
            (e.step_name, e.state)
            for e in session.scalars(
                select(StepExecution)
                .where(StepExecution.workflow_id == workflow_id)
                .order_by(StepExecution.id)
            )
        ]


def test_reattempt_of_a_stranded_workflow_is_refused_with_the_apis_message(demo, cli):
    """Reattempt would run `send_welcome`, not the `send_sms` it stopped on: refused, with the
    way out (resume_at), in the words the Python API uses; nothing is scheduled."""
    workflow_id = _stranded_onboarding()
    before = _executions(workflow_id)
    with db.new_session() as session:
        workflow = session.get(Workflow, workflow_id)
        assert workflow is not None
        with pytest.raises(Exception) as info:
            workflow.reattempt()
        session.rollback()
    api_message = str(info.value)
    assert api_message.startswith(
        f"Cannot reattempt OnboardingWorkflow #{workflow_id}: step 'send_sms' is no longer "
        "defined in OnboardingWorkflow."
    )
    assert "resume_at(step_name)" in api_message

    refused = cli("workflows", "reattempt", str(workflow_id))
    assert refused.returncode == 1, refused.stdout
    assert f"#{workflow_id}: {api_message}" in refused.stderr
    assert "Step scheduled to run again" not in refused.stdout + refused.stderr
    assert _executions(workflow_id) == before
    assert _workflow(workflow_id).state == "paused"
    (row,) = _audit(workflow_id=workflow_id)
    assert (row.action, row.result) == ("reattempt", "refused")

    resumed = cli("workflows", "resume", str(workflow_id))
    assert resumed.returncode == 1
    assert "step 'send_sms' is no longer defined" in resumed.stderr
    assert _executions(workflow_id) == before

    dry = cli("workflows", "reattempt", str(workflow_id), "--dry-run")
    assert "0 workflows would be changed, 1 would not be done" in dry.stdout
    assert "stranded on a step OnboardingWorkflow no longer defines (use resume-at" in dry.stdout


# --- database text on a terminal -----------------------------------------------------------------

#: What a hostile or broken row may hold: a colour escape, a CR that rewinds the line and a
#: newline that starts a forged one.
HOSTILE = "\x1b[31mred\rback\nforged #1\tOnboardingWorkflow"


def _no_raw_control(text: str) -> None:
    for raw in ("\x1b", "\r"):
        assert raw not in text, text
    assert not any(line.startswith("forged") for line in text.splitlines()), text


def test_database_text_is_printed_escaped(demo, cli):
    """Error messages, step names and class names from the database reach the terminal as one
    escaped line each, in list, show, an action's messages and a dry run's reasons."""
    from sqlalchemy import update

    feed = demo["feeds"][0]
    ready = demo["ready"][0]
    with db.transaction() as session:
        session.execute(
            update(StepExecution)
            .where(StepExecution.workflow_id == feed, StepExecution.state == "failed")
            .values(error_message=HOSTILE, error_class_name=f"Err{HOSTILE}")
        )
        session.execute(
            update(Workflow).where(Workflow.id == feed).values(next_step_name=f"step{HOSTILE}")
        )
        session.execute(update(Workflow).where(Workflow.id == ready).values(type=f"Gone{HOSTILE}"))
    listed = cli("workflows", "list")
    assert listed.returncode == 0, listed.stderr
    _no_raw_control(listed.stdout + listed.stderr)
    rows = [line for line in listed.stdout.splitlines() if line.startswith("#")]
    assert all(len(line.split("\t")) == 5 for line in rows), rows  # the columns stay aligned
    assert "\\x1b[31mred\\x0dback\\x0aforged #1\\x09OnboardingWorkflow" in listed.stdout

    shown = cli("workflows", "show", str(feed))
    assert shown.returncode == 0, shown.stderr
    _no_raw_control(shown.stdout)
    assert "\\x1b[31mred" in shown.stdout

    gone = cli("workflows", "show", str(ready))
    _no_raw_control(gone.stdout + gone.stderr)

    skipped = cli("workflows", "skip", str(feed))  # "Skipped `step…`." names the step
    _no_raw_control(skipped.stdout + skipped.stderr)
    assert "Skipped `step\\x1b[31mred" in skipped.stdout + skipped.stderr

    dry = cli("workflows", "reattempt", str(ready), "--dry-run")
    _no_raw_control(dry.stdout + dry.stderr)


def test_error_filter_takes_the_short_class_name_the_list_prints(demo, cli):
    """The list prints "paused after `LabelPrinterOffline` in `print_label`"; ``--error`` with
    that short name finds the same workflows as the full dotted name."""
    import random

    from geneva_drive.examples import seed

    seed._work.enabled = False
    try:
        seed._seed_failed_wave(random.Random(7), 1.0)
    finally:
        seed._work.enabled = True
    short = cli("workflows", "list", "--error", "LabelPrinterOffline", "--json")
    assert short.returncode == 0, short.stderr
    rows = json.loads(short.stdout)["workflows"]
    assert len(rows) == 4
    assert all(r["why"] == "paused after `LabelPrinterOffline` in `print_label`" for r in rows)
    full = cli(
        "workflows",
        "list",
        "--error",
        "geneva_drive.examples.fulfilment.LabelPrinterOffline",
        "--json",
    )
    assert sorted(r["id"] for r in json.loads(full.stdout)["workflows"]) == sorted(
        r["id"] for r in rows
    )
    # A short name matches a whole last component only, never a suffix of one.
    none = cli("workflows", "list", "--error", "PrinterOffline", "--json")
    assert json.loads(none.stdout)["workflows"] == []
