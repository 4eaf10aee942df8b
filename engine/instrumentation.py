"""Instrumentation events and the pluggable error reporter.

Events are blinker signals on a private namespace (named after the gem's
``precondition.geneva_drive``, ``step.geneva_drive`` and ``finalize.geneva_drive``). Each is
sent once the measured block is over, with ``duration`` (seconds) in the payload::

    from geneva_drive.instrumentation import step_performed

    @step_performed.connect
    def on_step(sender, **payload): ...

Common payload: ``execution_id``, ``workflow_id``, ``workflow_class``, ``step_name``, plus
``resumable=True`` for resumable steps.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from blinker import Namespace

from geneva_drive import tracing
from geneva_drive.logsafe import escape

_signals = Namespace()

precondition_evaluated = _signals.signal("precondition.geneva_drive")
step_performed = _signals.signal("step.geneva_drive")
step_finalized = _signals.signal("finalize.geneva_drive")
signal_delivered = _signals.signal("signal.geneva_drive")
operator_action = _signals.signal("operator_action.geneva_drive")
housekeeping_performed = _signals.signal("housekeeping.geneva_drive")
#: Sent when a worker is about to run a successor itself (engine/inline.py), after the
#: predecessor's outcome committed and before the successor is claimed: ``execution_id`` (the
#: successor), ``predecessor_id``, ``workflow_id``, ``steps`` (run under this budget so far).
inline_successor = _signals.signal("inline_successor.geneva_drive")
#: Sent when a wait for a signal timed out and its ``on_timeout`` action was applied
#: (engine/timeouts.py): ``execution_id``, ``workflow_id``, ``workflow_class``,
#: ``workflow_type``, ``step_name``, ``action``.
wait_timed_out = _signals.signal("wait_timeout.geneva_drive")
#: Sent when a step started a child workflow (engine/children.py): ``workflow_id``,
#: ``workflow_type`` (the parent's), ``child_id``, ``child_type``.
child_started = _signals.signal("child_started.geneva_drive")
#: Sent when a child's end reached its parent (once per child): ``workflow_id``,
#: ``workflow_type`` (the parent's), ``child_id``, ``child_type``, ``state``.
child_joined = _signals.signal("child_joined.geneva_drive")
#: Sent when an execution found no slot or token of a concurrency or rate limit at its start
#: and was deferred (engine/limits.py): ``limit`` (the name), ``kind`` (``concurrency`` or
#: ``rate``), ``execution_id``, ``workflow_id``, ``workflow_class``, ``step_name``.
limit_deferred = _signals.signal("limit_deferred.geneva_drive")
#: Sent when an execution whose worker's lease expired was recovered (engine/liveness.py):
#: ``execution_id``, ``workflow_id``, ``workflow_class``, ``workflow_type``, ``step_name``,
#: ``worker_id``, ``worker_name``, ``action`` (``stuck_recovery_action``).
worker_recovered = _signals.signal("worker_recovered.geneva_drive")
#: Sent for each tick of a schedule once its transaction committed (engine/schedules.py):
#: ``schedule`` (the name), ``result`` (``created``, ``skipped_overlap``, ``missed``, ``failed``).
schedule_ticked = _signals.signal("schedule_ticked.geneva_drive")

EVENTS = {
    "precondition": precondition_evaluated,
    "step": step_performed,
    "finalize": step_finalized,
}

# Under the package's namespace, like every engine logger ("engine" was outside it: a host
# configuring logging.getLogger("geneva_drive") did not reach the error reports).
log = logging.getLogger(__name__)


@contextmanager
def instrument(event: str, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Measure the block and send ``event`` with ``payload`` (which the block may extend)."""
    started = time.perf_counter()
    try:
        yield payload
    finally:
        payload["duration"] = time.perf_counter() - started
        signal = EVENTS[event]
        if signal.receivers:
            signal.send("engine", **payload)


ErrorReporter = Callable[[BaseException, dict[str, Any]], None]


def _message(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:  # a broken __str__ must not hide the error itself
        return f"<{type(error).__name__} whose str() raised>"


def safe_traceback(error: BaseException, _seen: set[int] | None = None) -> str:
    """The traceback the logging module would print, with every exception's message escaped
    to one line (:func:`geneva_drive.logsafe.escape`): the message comes from the step, and so
    from its input, and a newline in it would print a forged line under the real ones. The
    frames come from the code's own files; chained causes and contexts are kept."""
    seen = _seen if _seen is not None else set()
    seen.add(id(error))
    parts: list[str] = []
    cause, context = error.__cause__, error.__context__
    if cause is not None and id(cause) not in seen:
        parts.append(safe_traceback(cause, seen))
        parts.append("\nThe above exception was the direct cause of the following exception:\n\n")
    elif context is not None and not error.__suppress_context__ and id(context) not in seen:
        parts.append(safe_traceback(context, seen))
        parts.append("\nDuring handling of the above exception, another exception occurred:\n\n")
    if error.__traceback__ is not None:
        parts.append("Traceback (most recent call last):\n")
        parts.extend(traceback.format_tb(error.__traceback__))
    kind = type(error)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    parts.append(f"{name}: {escape(_message(error), 2000)}")
    return "".join(parts)


def _log_reporter(error: BaseException, context: dict[str, Any]) -> None:
    record = log.makeRecord(
        log.name,
        logging.ERROR,
        __file__,
        0,
        "Step raised %s: %s",
        # One line: the message comes from the step (and so from its input); a newline in it
        # would forge a log line.
        (type(error).__name__, escape(_message(error), 2000)),
        (type(error), error, error.__traceback__),
        extra={"geneva_drive": _with_trace_ids(context)},
    )
    # The formatter prints a record's exc_text when it is set, instead of formatting exc_info
    # itself (which would print the raw message again, newlines and all); handlers that read
    # exc_info (an error tracker's) still get the exception.
    record.exc_text = safe_traceback(error)
    if log.isEnabledFor(logging.ERROR):
        log.handle(record)


_reporter: ErrorReporter = _log_reporter


def set_error_reporter(reporter: ErrorReporter | None) -> None:
    """Plug in an error tracker (Sentry, Rollbar…): ``reporter(error, context)``.

    ``context`` holds workflow_id, workflow_class, step_execution_id, step_name, hero_type and
    hero_id (None entries dropped). ``None`` restores the default, which logs the error.
    """
    global _reporter
    _reporter = reporter or _log_reporter


def report_error(error: BaseException, context: dict[str, Any]) -> None:
    try:
        _reporter(error, {k: v for k, v in context.items() if v is not None})
    except Exception:
        # A broken reporter must not change what happens to the workflow.
        log.exception("The error reporter itself raised while reporting %r", error)


def log_context(workflow: Any, execution: Any) -> dict[str, Any]:
    """What every log line about one step execution carries (:class:`ContextAdapter` prints it):
    the workflow's class and id, its hero, the execution's id and step."""
    return {
        "workflow": type(workflow).__name__,
        "workflow_id": workflow.id,
        "hero_type": workflow.hero_type,
        "hero_id": workflow.hero_id,
        "execution_id": execution.id,
        "step": execution.step_name,
    }


def report_context(workflow: Any, execution: Any) -> dict[str, Any]:
    """The ``context`` an error reporter gets for one step execution (:func:`set_error_reporter`
    names its keys)."""
    return {
        "workflow_id": workflow.id,
        "workflow_class": type(workflow).__name__,
        "step_execution_id": execution.id,
        "step_name": execution.step_name,
        "hero_type": workflow.hero_type,
        "hero_id": workflow.hero_id,
    }


def _with_trace_ids(context: Mapping[str, Any]) -> Mapping[str, Any]:
    """``context`` with the current trace and span ids when a span is current (docs/MANUAL.md,
    "Tracing"): a log line then names the trace it belongs to. Unchanged with tracing off."""
    ids = tracing.log_ids()
    return context if ids is None else {**context, **ids}


class ContextAdapter(logging.LoggerAdapter[logging.Logger]):
    """Prefixes log lines with workflow id, class, hero, step and execution id, and with the
    trace and span ids when tracing is on (docs/MANUAL.md, "Tracing").

    The hero id, the step name and text arguments (error messages, signal names) come from
    outside the engine: they are escaped (:func:`geneva_drive.logsafe.escape`) so that none of
    them can end the line and write a forged one after it.
    """

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        extra = _with_trace_ids(self.extra or {})
        prefix = " ".join(f"{k}={escape(v)}" for k, v in extra.items() if v is not None)
        kwargs.setdefault("extra", {})["geneva_drive"] = dict(extra)
        return f"[{prefix}] {msg}", kwargs

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        if not self.isEnabledFor(level):
            return
        safe = tuple(
            escape(arg, ARG_LIMIT) if isinstance(arg, str | BaseException) else arg for arg in args
        )
        super().log(level, msg, *safe, **kwargs)


#: Longest text argument an engine log line keeps (error messages can be long).
ARG_LIMIT = 2000
