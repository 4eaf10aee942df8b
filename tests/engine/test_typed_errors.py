"""Every error the engine and the dashboard raise on purpose is a typed error from
``geneva_drive.errors``, exported at the package root; the typed errors that replaced a
built-in exception keep it as a base, so ``except ValueError`` written against the old
behaviour still catches them (docs/MANUAL.md, "Errors")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import geneva_drive
from geneva_drive import errors
from geneva_drive.config import settings

ROOT = Path(__file__).resolve().parents[2]
BUILTINS = {"ValueError", "TypeError", "RuntimeError"}


def _raised_builtins() -> list[str]:
    found = []
    for path in sorted((ROOT / "engine").rglob("*.py")) + sorted((ROOT / "app").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Raise) and node.exc is not None:
                target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(target, ast.Name) and target.id in BUILTINS:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {target.id}")
    return found


@pytest.mark.sqlite_pass
def test_no_bare_builtin_error_is_raised():
    assert _raised_builtins() == []


@pytest.mark.sqlite_pass
def test_every_error_is_exported_at_the_root():
    defined = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, errors.EngineError)
    }
    assert defined <= set(geneva_drive.__all__)
    for name in defined:
        assert getattr(geneva_drive, name) is getattr(errors, name)


@pytest.mark.sqlite_pass
def test_typed_errors_keep_the_builtin_they_replaced():
    assert issubclass(errors.ConfigurationError, ValueError)
    assert issubclass(errors.StepConfigurationError, TypeError)
    assert issubclass(errors.InvalidInputError, ValueError)
    assert issubclass(errors.UsageError, RuntimeError)
    assert issubclass(errors.ScheduleError, errors.StepConfigurationError)
    assert issubclass(errors.UnsupportedDatabaseError, errors.ConfigurationError)


@pytest.mark.sqlite_pass
def test_a_bad_setting_is_a_configuration_error_naming_it():
    with pytest.raises(errors.ConfigurationError, match=r"settings\.worker_lease"):
        settings.worker_lease = None  # type: ignore[assignment]


@pytest.mark.sqlite_pass
def test_a_bad_policy_is_a_step_configuration_error():
    with pytest.raises(errors.StepConfigurationError, match="wait="):
        geneva_drive.ExceptionPolicy("pause", wait=5)


@pytest.mark.sqlite_pass
def test_a_value_json_cannot_hold_is_invalid_input():
    from geneva_drive.serialization import to_json_value

    with pytest.raises(errors.InvalidInputError, match="payload"):
        to_json_value({"at": object()}, path="payload")
