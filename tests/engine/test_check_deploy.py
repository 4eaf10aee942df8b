"""``geneva_drive.deploy.check`` and ``geneva-drive check-deploy`` (docs/MANUAL.md, "Check
before each deploy: `geneva-drive check-deploy`"): each
kind of problem a deploy would cause is caught with its count, an example id and the fix,
and the fixed code passes. "The new code" is the workflow class defined again under the same
name, as a host's next release would define it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from geneva_drive import Workflow, deploy, removed_step, renamed_step, step
from geneva_drive.testing import perform_next_step
from geneva_drive.workflow import unregister
from tests.engine.helpers import make_order

GENEVA_DRIVE = str(Path(sys.executable).parent / "geneva-drive")


def _mine(report, name):
    return [f for f in report.problems if f.workflow_class == name]


def _old_code(session, name, park=False):
    """The code before the deploy: ``capture`` waits for ``payment_confirmed``, then ``ship``."""

    class Old(Workflow):
        workflow_name = name

        @step(wait_for="payment_confirmed")
        def capture(self):
            pass

        @step
        def ship(self):
            pass

    wf = Old.create(hero=make_order(session))
    if park:
        perform_next_step(wf)
    session.commit()
    return wf.id


def _new_code(name, body):
    return type("NewCode", (Workflow,), {"workflow_name": name, **body})


def _noop(self):
    pass


def test_a_step_renamed_under_scheduled_executions_is_caught_then_passes_with_renamed_step(
    geneva_session,
):
    workflow_id = _old_code(geneva_session, "CdScheduled")
    _new_code(
        "CdScheduled",
        {"capture_payment": step(wait_for="payment_confirmed")(_noop), "ship": step(_noop)},
    )
    report = deploy.check(geneva_session)
    (finding,) = _mine(report, "CdScheduled")
    assert (finding.kind, finding.step, finding.count, finding.example_id) == (
        "undefined_step",
        "capture",
        1,
        workflow_id,
    )
    assert finding.fix.startswith('capture = renamed_step(to="capture_payment")')
    assert report.exit_code == deploy.EXIT_PROBLEMS
    text = deploy.render(report)
    assert "[undefined_step] CdScheduled.capture: 1 (e.g. workflow #" in text

    _new_code(
        "CdScheduled",
        {
            "capture": renamed_step(to="capture_payment"),
            "capture_payment": step(wait_for="payment_confirmed")(_noop),
            "ship": step(_noop),
        },
    )
    assert _mine(deploy.check(geneva_session), "CdScheduled") == []


def test_a_deleted_step_under_parked_executions_is_caught_then_passes_with_a_gravestone(
    geneva_session,
):
    _old_code(geneva_session, "CdParked", park=True)
    _new_code("CdParked", {"ship": step(_noop)})
    (finding,) = _mine(deploy.check(geneva_session), "CdParked")
    assert finding.kind == "undefined_step" and finding.fix.startswith("capture = removed_step()")
    _new_code("CdParked", {"capture": removed_step(), "ship": step(_noop)})
    report = deploy.check(geneva_session)
    assert _mine(report, "CdParked") == []
    assert not any(d.workflow_class == "CdParked" for d in report.drained)  # still in flight


def test_paused_workflows_already_stranded_get_resume_at(geneva_session):
    workflow_id = _old_code(geneva_session, "CdStranded")
    wf = geneva_session.get(Workflow, workflow_id)
    wf.pause()
    geneva_session.commit()
    from geneva_drive.models import StepExecution

    for execution in geneva_session.query(StepExecution).filter_by(workflow_id=workflow_id):
        geneva_session.delete(execution)  # paused with its execution gone (resume re-creates)
    geneva_session.commit()
    _new_code("CdStranded", {"charge": step(_noop), "ship": step(_noop)})
    (finding,) = _mine(deploy.check(geneva_session), "CdStranded")
    assert finding.kind == "stranded"
    assert finding.fix.startswith(f'session.get(Workflow, {workflow_id}).resume_at("charge")')


def test_ongoing_workflows_of_a_class_no_module_defines(geneva_session):
    workflow_id = _old_code(geneva_session, "CdGoneClass")
    unregister("CdGoneClass")
    (finding,) = _mine(deploy.check(geneva_session), "CdGoneClass")
    assert (finding.kind, finding.count, finding.example_id) == (
        "class_not_defined",
        1,
        workflow_id,
    )
    assert "workflow_class=" in finding.fix


@pytest.mark.parametrize(
    ("new_wait", "says"),
    [("payment_received", "waits for 'payment_received'"), (None, "waits for no signal")],
)
def test_a_wait_for_changed_under_parked_executions(geneva_session, new_wait, says):
    name = f"CdWait{'Changed' if new_wait else 'Dropped'}"
    workflow_id = _old_code(geneva_session, name, park=True)
    capture = step(wait_for=new_wait)(_noop) if new_wait else step(_noop)
    _new_code(name, {"capture": capture, "ship": step(_noop)})
    (finding,) = _mine(deploy.check(geneva_session), name)
    assert (finding.kind, finding.step, finding.example_id) == (
        "wait_for_changed",
        "capture",
        workflow_id,
    )
    assert says in finding.problem
    assert finding.fix.startswith('@step(wait_for="payment_confirmed")')
    _new_code(name, {"capture": step(wait_for="payment_confirmed")(_noop), "ship": step(_noop)})
    assert _mine(deploy.check(geneva_session), name) == []


def test_drained_gravestones_and_renames_are_listed_and_do_not_fail(geneva_session):
    _new_code(
        "CdDrained",
        {"old": removed_step(), "was": renamed_step(to="now"), "now": step(_noop)},
    )
    report = deploy.check(geneva_session)
    mine = [d.line for d in report.drained if d.workflow_class == "CdDrained"]
    assert mine == ["old = removed_step()", 'was = renamed_step(to="now")']
    assert _mine(report, "CdDrained") == []
    assert "safe to delete the line" in deploy.render(report)
    assert json.loads(deploy.render(report, as_json=True))["drained"]


# --- the command, as CI runs it ---------------------------------------------------------------


OLD_MODULE = """
from geneva_drive import Workflow, step

class CliCheckout(Workflow):
    @step(wait_for="payment_confirmed")
    def capture(self):
        pass

    @step
    def ship(self):
        pass
"""
STRANDING_MODULE = OLD_MODULE.replace("def capture(", "def capture_payment(")
FIXED_MODULE = STRANDING_MODULE.replace(
    "class CliCheckout(Workflow):\n",
    'class CliCheckout(Workflow):\n    capture = renamed_step(to="capture_payment")\n',
).replace("import Workflow, step", "import Workflow, renamed_step, step")


@pytest.fixture
def check_deploy(geneva_database, tmp_path):
    url = geneva_database.url
    if geneva_database.schema is not None:
        url += ("&" if "?" in url else "?") + f"options=-csearch_path%3D{geneva_database.schema}"
    for name, source in (
        ("cd_stranding", STRANDING_MODULE),
        ("cd_fixed", FIXED_MODULE),
        (
            "cd_misconfigured",
            "from geneva_drive import Workflow, renamed_step\n"
            "class Broken(Workflow):\n    old = renamed_step(to='')\n",
        ),
        ("cd_syntax_error", "def broken(:\n"),
        ("cd_name_error", "undefined_name_in_module\n"),
    ):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))

    def run(module, *args, database=url):
        env = {
            **os.environ,
            "GENEVA_DATABASE_URL": database,
            "GENEVA_WORKFLOW_MODULES": module,
            "PYTHONPATH": str(tmp_path),
            "GENEVA_LOG_LEVEL": "WARNING",
        }
        return subprocess.run(
            [GENEVA_DRIVE, "check-deploy", *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )

    return run


def test_check_deploy_exit_codes_for_ci(check_deploy, geneva_session):
    namespace: dict[str, object] = {}
    exec(compile(OLD_MODULE, "old_code", "exec"), namespace)
    wf = namespace["CliCheckout"].create(hero=make_order(geneva_session))
    perform_next_step(wf)
    geneva_session.commit()

    stranding = check_deploy("cd_stranding", "--json")
    assert stranding.returncode == 1, stranding.stderr
    (problem,) = json.loads(stranding.stdout)["problems"]
    assert problem["kind"] == "undefined_step" and problem["example_id"] == wf.id
    assert problem["fix"].startswith('capture = renamed_step(to="capture_payment")')

    fixed = check_deploy("cd_fixed")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert fixed.stdout.startswith("check-deploy: OK")

    missing = check_deploy("cd_no_such_module")
    assert missing.returncode == 2 and "could not check" in missing.stderr
    # A module that fails on import for any other reason is "could not check" too, naming the
    # module and the error, not a traceback with exit 1.
    for module, error in [
        ("cd_misconfigured", "StepConfigurationError"),
        ("cd_syntax_error", "SyntaxError"),
        ("cd_name_error", "NameError"),
    ]:
        broken = check_deploy(module)
        assert broken.returncode == 2, (module, broken.stderr)
        assert "could not check" in broken.stderr and module in broken.stderr, broken.stderr
        assert error in broken.stderr and "Traceback" not in broken.stderr, broken.stderr
    unreachable = check_deploy(
        "cd_fixed", database="postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=2"
    )
    assert unreachable.returncode == 2 and "could not check" in unreachable.stderr


def test_workflows_show_explains_a_workflow_parked_on_a_renamed_step(
    geneva_database, geneva_session, tmp_path
):
    """The first symptom of a step deleted under parked executions: ``geneva-drive workflows show``
    said "waiting for signal `None`". With the new code loaded, it says the workflow is stranded and
    why."""
    namespace: dict[str, object] = {}
    exec(compile(OLD_MODULE, "old_code", "exec"), namespace)
    wf = namespace["CliCheckout"].create(hero=make_order(geneva_session))
    perform_next_step(wf)
    geneva_session.commit()
    (tmp_path / "cd_renamed_show.py").write_text(textwrap.dedent(STRANDING_MODULE))
    url = geneva_database.url
    if geneva_database.schema is not None:
        url += ("&" if "?" in url else "?") + f"options=-csearch_path%3D{geneva_database.schema}"
    shown = subprocess.run(
        [GENEVA_DRIVE, "workflows", "show", str(wf.id)],
        env={
            **os.environ,
            "GENEVA_DATABASE_URL": url,
            "GENEVA_WORKFLOW_MODULES": "cd_renamed_show",
            "PYTHONPATH": str(tmp_path),
            "GENEVA_LOG_LEVEL": "WARNING",
        },
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    why = next(line for line in shown.stdout.splitlines() if line.strip().startswith("why:"))
    assert "None" not in why
    assert "stranded: parked on `capture`, which is no longer defined" in why


def test_a_partial_module_list_reports_the_classes_it_does_not_load(check_deploy, geneva_session):
    """``GENEVA_WORKFLOW_MODULES`` naming only some of the modules: the ongoing workflows of the
    classes it leaves out are a problem (count, example, the fix), never an "OK"."""
    namespace: dict[str, object] = {}
    exec(compile(OLD_MODULE, "old_code", "exec"), namespace)
    loaded = namespace["CliCheckout"].create(hero=make_order(geneva_session))
    other: dict[str, object] = {}
    exec(compile(OTHER_MODULE, "other_code", "exec"), other)
    left_out = [
        other["CdLeftOut"].create(hero=make_order(geneva_session), allow_multiple=True)
        for _ in range(2)
    ]
    left_out[1].pause()
    geneva_session.commit()
    unregister("CdLeftOut")
    assert loaded.state == "ready"

    partial = check_deploy("cd_fixed")
    assert partial.returncode == 1, partial.stdout + partial.stderr
    assert not partial.stdout.startswith("check-deploy: OK")
    assert f"[class_not_defined] CdLeftOut: 2 (e.g. workflow #{left_out[0].id})" in partial.stdout
    assert "GENEVA_WORKFLOW_MODULES" in partial.stdout
    as_json = json.loads(check_deploy("cd_fixed", "--json").stdout)
    assert as_json["ok"] is False
    (problem,) = [p for p in as_json["problems"] if p["workflow_class"] == "CdLeftOut"]
    assert (problem["kind"], problem["count"]) == ("class_not_defined", 2)
    assert problem["fix"].startswith('add the module that defines "CdLeftOut" to')


OTHER_MODULE = """
from geneva_drive import Workflow, step

class CdLeftOut(Workflow):
    @step
    def only(self):
        pass
"""


EVIL = "cap\x1b[31mture\r\nimport os\u2028"


def test_names_from_the_database_are_escaped_in_the_text_and_quoted_in_the_fix(geneva_session):
    """A step or class name holding a terminal escape, CR or newline neither forges a line nor
    colours the terminal, and the fix line quotes it with repr() instead of pasting it raw."""
    from sqlalchemy import update

    from geneva_drive.models import StepExecution

    on_step = _old_code(geneva_session, "CdEvilStep")
    geneva_session.execute(
        update(StepExecution).where(StepExecution.workflow_id == on_step).values(step_name=EVIL)
    )
    gone_class = _old_code(geneva_session, "CdEvilGone")
    geneva_session.execute(
        update(Workflow).where(Workflow.id == gone_class).values(type=f"Evil\x1b[2J{EVIL}")
    )
    geneva_session.commit()
    _new_code("CdEvilStep", {"ship": step(_noop)})
    report = deploy.check(geneva_session)
    text = deploy.render(report)
    for raw in ("\x1b", "\r", "\u2028"):
        assert raw not in text
    assert "import os" not in [line.strip() for line in text.splitlines()]
    (on_step_finding,) = _mine(report, "CdEvilStep")
    quoted = '"' + repr(EVIL)[1:-1] + '"'
    assert on_step_finding.fix.startswith(f"old_step = removed_step(name={quoted})")
    assert f"fix: old_step = removed_step(name={quoted})" in text  # pasteable as printed
    assert "CdEvilStep.cap\\x1b[31mture\\x0d\\x0aimport os" in text
    (gone,) = _mine(report, f"Evil\x1b[2J{EVIL}")
    assert "workflow_name = " + '"' + repr(f"Evil\x1b[2J{EVIL}")[1:-1] + '"' in gone.fix
    for finding in report.problems:
        assert "\n" not in finding.fix and "\x1b" not in finding.fix
    # The JSON keeps the names as they are stored, escaped by JSON itself.
    assert json.loads(deploy.render(report, as_json=True))["problems"]
