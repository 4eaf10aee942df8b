"""engine.settings (docs/MANUAL.md, "Settings"): the gem's defaults, run-time
assignment with coercion and validation, and GENEVA_* environment variables."""

from __future__ import annotations

from datetime import timedelta

import pytest

from geneva_drive import settings
from geneva_drive.config import Settings

# Does not use the suite's database (settings objects only): the SQLite pass runs it once.
pytestmark = pytest.mark.sqlite_pass


@pytest.fixture
def fresh():
    return Settings()


def test_defaults_match_the_gem(fresh):
    assert fresh.delete_completed_workflows_after == timedelta(days=30)
    assert fresh.stuck_in_progress_threshold == timedelta(hours=1)
    assert fresh.stuck_scheduled_threshold == timedelta(minutes=15)
    assert fresh.housekeeping_batch_size == 1000
    assert fresh.stuck_recovery_action == "reattempt"
    assert fresh.max_cursor_size == 128 * 1024
    assert fresh.max_signal_payload_size == 128 * 1024
    assert fresh.waiting_visibility_threshold == timedelta(days=7)
    # the gem's default is "not in tests"; ours sends after commit everywhere (test helpers commit)
    assert fresh.enqueue_after_commit is True
    # not the gem's: PostgreSQL commits a step's start without waiting for its WAL flush
    assert fresh.synchronous_start_commit is False
    assert fresh.dispatch_interval == timedelta(seconds=5)
    assert fresh.dispatch_horizon == timedelta(seconds=60)


def test_engine_settings_is_a_settings_instance():
    assert isinstance(settings, Settings)


def test_durations_accept_timedelta_or_seconds(fresh):
    fresh.stuck_in_progress_threshold = 90
    assert fresh.stuck_in_progress_threshold == timedelta(seconds=90)
    fresh.stuck_scheduled_threshold = 1.5
    assert fresh.stuck_scheduled_threshold == timedelta(seconds=1.5)
    fresh.dispatch_horizon = timedelta(minutes=2)
    assert fresh.dispatch_horizon == timedelta(minutes=2)


@pytest.mark.parametrize(
    "name",
    [
        "delete_completed_workflows_after",
        "waiting_visibility_threshold",
        "max_cursor_size",
        "max_signal_payload_size",
    ],
)
def test_none_disables_where_the_gem_allows_it(fresh, name):
    setattr(fresh, name, None)
    assert getattr(fresh, name) is None


@pytest.mark.parametrize(
    "name",
    [
        "stuck_in_progress_threshold",
        "housekeeping_batch_size",
        "stuck_recovery_action",
        "dispatch_interval",
    ],
)
def test_none_is_refused_elsewhere(fresh, name):
    with pytest.raises(ValueError, match=f"settings.{name} cannot be None"):
        setattr(fresh, name, None)


@pytest.mark.parametrize(
    ("name", "value", "error", "message"),
    [
        ("stuck_in_progress_threshold", -5, ValueError, "must not be negative"),
        ("stuck_in_progress_threshold", "1 hour", TypeError, "timedelta or a number of seconds"),
        ("dispatch_interval", True, TypeError, "timedelta or a number of seconds"),
        ("housekeeping_batch_size", 0, ValueError, "positive integer"),
        ("housekeeping_batch_size", 2.5, ValueError, "positive integer"),
        ("max_cursor_size", -1, ValueError, "positive integer"),
        ("stuck_recovery_action", "explode", ValueError, "Unknown stuck_recovery_action: explode"),
        ("enqueue_after_commit", "false", TypeError, "must be True or False"),
    ],
)
def test_invalid_values_are_refused(fresh, name, value, error, message):
    before = getattr(fresh, name)
    with pytest.raises(error, match=message):
        setattr(fresh, name, value)
    assert getattr(fresh, name) == before


def test_stuck_recovery_action_accepts_the_gems_spelling(fresh):
    fresh.stuck_recovery_action = "cancel!"
    assert fresh.stuck_recovery_action == "cancel"
    fresh.stuck_recovery_action = "reattempt"
    assert fresh.stuck_recovery_action == "reattempt"


def test_unknown_setting_is_an_attribute_error(fresh):
    with pytest.raises(AttributeError, match="no setting 'stuck_executing_threshold'"):
        fresh.stuck_executing_threshold = 5


def test_reset_restores_defaults(fresh):
    fresh.housekeeping_batch_size = 5
    fresh.max_cursor_size = None
    fresh.reset()
    assert fresh.housekeeping_batch_size == 1000
    assert fresh.max_cursor_size == 128 * 1024


def test_environment_variables_are_parsed(fresh):
    fresh.load_env(
        {
            "GENEVA_DELETE_COMPLETED_WORKFLOWS_AFTER": "none",
            "GENEVA_STUCK_IN_PROGRESS_THRESHOLD": "7200",
            "GENEVA_STUCK_SCHEDULED_THRESHOLD": " 60.5 ",
            "GENEVA_HOUSEKEEPING_BATCH_SIZE": "250",
            "GENEVA_STUCK_RECOVERY_ACTION": "cancel",
            "GENEVA_MAX_CURSOR_SIZE": "off",
            "GENEVA_MAX_SIGNAL_PAYLOAD_SIZE": "4096",
            "GENEVA_WAITING_VISIBILITY_THRESHOLD": "",
            "GENEVA_ENQUEUE_AFTER_COMMIT": "no",
            "GENEVA_SYNCHRONOUS_START_COMMIT": "yes",
            "GENEVA_DISPATCH_INTERVAL": "2",
            "GENEVA_DISPATCH_HORIZON": "30",
            "UNRELATED": "x",
        }
    )
    assert fresh.delete_completed_workflows_after is None
    assert fresh.stuck_in_progress_threshold == timedelta(hours=2)
    assert fresh.stuck_scheduled_threshold == timedelta(seconds=60.5)
    assert fresh.housekeeping_batch_size == 250
    assert fresh.stuck_recovery_action == "cancel"
    assert fresh.max_cursor_size is None
    assert fresh.max_signal_payload_size == 4096
    assert fresh.waiting_visibility_threshold is None
    assert fresh.enqueue_after_commit is False
    assert fresh.synchronous_start_commit is True
    assert fresh.dispatch_interval == timedelta(seconds=2)
    assert fresh.dispatch_horizon == timedelta(seconds=30)


@pytest.mark.parametrize("raw", ["1", "true", "YES", "on"])
def test_boolean_environment_values(fresh, raw):
    fresh.enqueue_after_commit = False
    fresh.load_env({"GENEVA_ENQUEUE_AFTER_COMMIT": raw})
    assert fresh.enqueue_after_commit is True


def test_missing_variables_leave_settings_alone(fresh):
    fresh.housekeeping_batch_size = 77
    fresh.load_env({})
    assert fresh.housekeeping_batch_size == 77


@pytest.mark.parametrize(
    ("key", "raw", "fragment"),
    [
        ("GENEVA_HOUSEKEEPING_BATCH_SIZE", "lots", "invalid literal"),
        ("GENEVA_HOUSEKEEPING_BATCH_SIZE", "0", "positive integer"),
        ("GENEVA_STUCK_IN_PROGRESS_THRESHOLD", "1h", "could not convert"),
        ("GENEVA_STUCK_IN_PROGRESS_THRESHOLD", "-3", "must not be negative"),
        ("GENEVA_STUCK_IN_PROGRESS_THRESHOLD", "none", "could not convert"),
        ("GENEVA_ENQUEUE_AFTER_COMMIT", "maybe", "expected true or false"),
        ("GENEVA_STUCK_RECOVERY_ACTION", "retry", "Unknown stuck_recovery_action: retry"),
    ],
)
def test_invalid_environment_values_name_the_variable(fresh, key, raw, fragment):
    with pytest.raises(ValueError) as info:
        fresh.load_env({key: raw})
    message = str(info.value)
    assert message.startswith(f"{key}={raw.strip()!r} is not valid:")
    assert fragment in message


def test_process_variables_are_read_at_each_call_and_listed_in_config(monkeypatch):
    """The process-level GENEVA_* variables (database, broker, queue, workflow modules, worker
    metrics) are read in config.py only, when used: a CLI or a test sets them first."""
    from geneva_drive.celery_client import broker_url, default_queue
    from geneva_drive.config import PROCESS_VARIABLES, process_variable

    monkeypatch.setenv("GENEVA_DEFAULT_QUEUE", " steps ")
    monkeypatch.setenv("GENEVA_BROKER_URL", "redis://127.0.0.1:6379/9")
    assert (default_queue(), broker_url()) == ("steps", "redis://127.0.0.1:6379/9")
    monkeypatch.delenv("GENEVA_DEFAULT_QUEUE")
    assert default_queue() == "default" and process_variable("GENEVA_DEFAULT_QUEUE") == ""
    assert "GENEVA_DATABASE_URL" in PROCESS_VARIABLES
    with pytest.raises(KeyError, match="GENEVA_NOPE is not a process-level variable"):
        process_variable("GENEVA_NOPE")


def test_no_environment_read_outside_config():
    """Every GENEVA_* variable is read through config.py (``settings`` or ``process_variable``),
    so each is listed once with what it does: no ``os.environ``/``os.getenv`` read elsewhere in
    the package. Setting one (the embedded default for a child process) is allowed; the test
    plugin's own ``GENEVA_TEST_DATABASE_URL`` is not a product setting."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    read = re.compile(r"os\.environ\.get\(|os\.getenv\(|os\.environ\[[^\]]+\](?!\s*=)")
    offenders = [
        f"{path.relative_to(root)}:{number}: {line.strip()}"
        for folder in ("engine", "app")
        for path in sorted((root / folder).rglob("*.py"))
        if path.name != "config.py" and "testing" not in path.parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if read.search(line)
    ]
    assert offenders == [], "\n".join(offenders)
