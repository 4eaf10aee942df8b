"""Job options: how a step's message is sent (queue, priority, delay).

Three levels merge, later wins: the class's ``step_job_options`` (parents under children) <
the instance's ``step_job_options`` (stored in workflow metadata) < the step's
``job_options``. The result maps onto Celery's ``queue``, ``priority``, ``countdown`` and
``eta`` for every send of that step: first sends, reattempts, successors, resumes and
dispatcher sends alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from geneva_drive.errors import StepConfigurationError

ALLOWED_KEYS = ("wait", "wait_until", "queue", "priority")


def validate_job_options(options: Any, context: str) -> dict[str, Any]:
    """Return a validated copy of ``options`` (string keys); raise naming ``context``."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise StepConfigurationError(
            f"{context} has invalid job_options: expected a dict, got {type(options).__name__}"
        )
    result: dict[str, Any] = {}
    unknown = [str(k) for k in options if str(k) not in ALLOWED_KEYS]
    if unknown:
        raise StepConfigurationError(
            f"{context} has unknown job_options key(s): {', '.join(sorted(unknown))}. "
            f"Only these are recognized: {', '.join(ALLOWED_KEYS)}"
        )
    for key, value in options.items():
        key = str(key)
        if value is not None and not _valid(key, value):
            raise StepConfigurationError(
                f"{context} has invalid job_options[{key!r}]: {value!r} ({type(value).__name__}); "
                + _expectation(key)
            )
        result[key] = value
    return result


def _seconds(value: Any) -> bool:
    """A real number that converts to a timedelta / timestamp (finite, in datetime's range)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        timedelta(seconds=value)
        datetime.fromtimestamp(abs(value), UTC)
    except (OverflowError, ValueError, OSError):
        return False
    return True


def _valid(key: str, value: Any) -> bool:
    if key == "wait":
        if isinstance(value, timedelta):
            return value >= timedelta(0)
        return _seconds(value) and value >= 0
    if key == "wait_until":
        return isinstance(value, datetime) or _seconds(value)
    if key == "queue":
        return isinstance(value, str) and bool(value.strip())
    if key == "priority":
        return isinstance(value, int) and not isinstance(value, bool)
    return False


def _expectation(key: str) -> str:
    return {
        "wait": "expected a non-negative timedelta or number of seconds",
        "wait_until": "expected a datetime or a UNIX timestamp",
        "queue": "expected a non-empty queue name",
        "priority": "expected an integer",
    }[key]


def to_json_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Job options as stored in workflow metadata (JSON-safe)."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        if isinstance(value, timedelta):
            value = value.total_seconds()
        elif isinstance(value, datetime):
            value = value.timestamp()
        out[key] = value
    return out


def merge(*levels: Mapping[str, Any] | None) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for level in levels:
        if level:
            merged.update({k: v for k, v in level.items()})
    return merged
