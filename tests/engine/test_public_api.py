"""Every public name imports from the one ``geneva_drive`` namespace (docs/MANUAL.md,
"Quick reference")."""

from __future__ import annotations

import importlib

import pytest

# Does not use the suite's database (imports only): the SQLite pass runs it once.
pytestmark = pytest.mark.sqlite_pass

SPEC_NAMES = {
    "geneva_drive": [
        "Workflow",
        "step",
        "resumable_step",
        "removed_step",
        "renamed_step",
        "ExceptionPolicy",
        "SignalMatcher",
        "IterableStep",
        "settings",
        "with_inline_enqueue",
    ],
    "geneva_drive.errors": [
        "InvalidStateError",
        "StepConfigurationError",
        "StepNotDefinedError",
        "CursorTooLargeError",
        "SignalPayloadTooLargeError",
        "WorkflowNotOngoing",
        "InvalidStateTransition",
        "DuplicateWorkflowError",
        "ConfigurationError",
    ],
    "geneva_drive.models": ["Base", "StepExecution", "Signal"],
    "geneva_drive.testing": [
        "speedrun_workflow",
        "perform_next_step",
        "perform_step_inline",
        "speedrun_current_step",
        "run_iterations",
        "assert_step_executed",
        "assert_workflow_state",
        "assert_cursor",
        "assert_step_has_successor",
        "assert_waiting_for_signal",
        "assert_signal_state",
    ],
    "geneva_drive.executor": ["execute"],
    "geneva_drive.dispatch": ["dispatch_due", "run_dispatcher"],
    "geneva_drive.housekeeping": ["run"],
    "geneva_drive.celery": ["app", "make_celery", "register", "PERFORM_STEP_TASK"],
    "geneva_drive.migrations": ["upgrade", "exclude_engine_tables", "VERSION_TABLE"],
    "geneva_drive.dashboard": ["create_app", "GenevaDrive"],
    "geneva_drive.dashboard.auth": ["DashboardUser"],
}


@pytest.mark.parametrize(("module", "names"), sorted(SPEC_NAMES.items()))
def test_public_names_import_from_the_namespace(module, names):
    imported = importlib.import_module(module)
    missing = [name for name in names if not hasattr(imported, name)]
    assert missing == [], f"{module} lacks {missing}"


def test_the_step_task_keeps_its_stable_name():
    from geneva_drive.celery import PERFORM_STEP_TASK, app

    assert PERFORM_STEP_TASK == "geneva_drive.perform_step"
    assert PERFORM_STEP_TASK in app.tasks


def test_the_wsgi_entry_refuses_to_start_without_a_database(tmp_path):
    """``gunicorn geneva_drive.dashboard.wsgi:app`` (run for real in test_wheel_host_app)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("GENEVA_")}
    done = subprocess.run(
        [sys.executable, "-c", "import geneva_drive.dashboard.wsgi"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "GENEVA_DATABASE_URL is not set" in done.stderr


def test_cli_roles_refuse_an_unset_database_url(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if not k.startswith("GENEVA_")}
    cli = str(Path(sys.executable).parent / "geneva-drive")
    for role in ("worker", "dispatcher", "housekeeping"):
        done = subprocess.run(
            [cli, role],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, (role, done.stderr)
        assert "GENEVA_DATABASE_URL is not set" in done.stderr
    assert not (tmp_path / "var").exists()


def test_a_host_module_passes_mypy_strict(tmp_path):
    """@step(...), Workflow.create(session=db.session) and for_hero() keep a host's types."""
    import subprocess
    import sys
    from pathlib import Path

    sample = Path(__file__).parent / "typing_samples" / "host_module.py"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path),
            str(sample),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
