"""Errors raised by the engine.

::

    EngineError
    ├── ConfigurationError           a setting is missing or wrong (names the setting)
    │   └── UnsupportedDatabaseError a URL of a database the engine has no dialect for
    ├── InvalidStateError            operator action on a workflow in the wrong state
    ├── InvalidTransitionError       an illegal executor transition (engine bug or forced state)
    ├── StepConfigurationError       the workflow class is misconfigured (raised at class definition)
    │   └── ScheduleError            a Schedule's cron, interval, zone or policy is not valid
    ├── InvalidInputError            a value passed at run time cannot be taken (a payload, an
    │                                argument, an operator's form field); says what would be
    ├── UsageError                   an engine function called where it cannot work (outside a
    │                                session or a worker, in the wrong order); says where to call it
    ├── ArchiveError                 an archive file could not be written, verified or restored
    ├── StepExecutionError           carries the execution's and the workflow's ids and names
    │   ├── StepNotDefinedError      the step named by an execution no longer exists
    │   └── DatabaseConnectionLostError  the connection died after the step wrote: attempt failed
    ├── CursorTooLargeError          a resumable cursor over settings.max_cursor_size
    ├── SignalPayloadTooLargeError   a signal payload over settings.max_signal_payload_size
    ├── ReservedSignalNameError      a signal name under ``geneva_drive.`` (also a ValueError)
    ├── WorkflowNotOngoingError      signal() on a finished or canceled workflow
    ├── NoOngoingWorkflowError       signal_hero() for a hero with no ongoing workflow of the class
    └── DuplicateWorkflowError       a second ongoing workflow of one class for one hero

Flow-control interrupts are *not* errors; they live in :mod:`geneva_drive.flow_control`. A
step's own exception (or a condition's) is re-raised as itself once its outcome is committed,
so the gem's StepFailedError and PreconditionError have no Python counterpart.

The errors that replace a built-in exception keep it as a base: ``ConfigurationError``,
``StepConfigurationError`` and ``InvalidInputError`` are also ``ValueError`` and ``TypeError``,
``UsageError`` also ``RuntimeError``, so code written as ``except ValueError`` around a call
keeps catching what that call raised before it raised a typed error.

``InvalidStateTransition`` and ``WorkflowNotOngoing``, the gem's names (docs/MANUAL.md, "Quick reference" lists them), are
kept as aliases of the same classes: ``except`` either name catches the error.
"""

from __future__ import annotations

from typing import Any


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class ConfigurationError(EngineError, ValueError, TypeError):
    """A setting is missing or wrong; the message names the setting and how to set it."""


class UnsupportedDatabaseError(ConfigurationError):
    """A database URL or engine of a backend the engine has no dialect module for."""


class InvalidStateError(EngineError):
    pass


class InvalidTransitionError(EngineError):
    pass


class StepConfigurationError(EngineError, ValueError, TypeError):
    """The workflow class (a step's options, a policy, a limit, a wait) is misconfigured: raised
    when the class is defined, naming the class, the step and the option to fix."""


class ScheduleError(StepConfigurationError):
    """A schedule's definition is not valid; the message names the field and the fix."""


class InvalidInputError(EngineError, ValueError, TypeError):
    """A value passed at run time cannot be taken: a payload that JSON cannot hold, an unknown
    action, an empty signal name, a malformed form field. Operators get it as a 400."""


class UsageError(EngineError, RuntimeError):
    """An engine function was called where it cannot work: outside the session or the worker it
    needs, or before the step it depends on. The message says where to call it instead."""


class ArchiveError(EngineError):
    """An archive file could not be written, verified or restored; the message names it."""


class StepExecutionError(EngineError):
    """Names what failed by ids and names, not by ORM objects: the error is raised after the
    commit and outlives its session (logged, reported, pickled), where a row would be detached,
    fail on attribute access and keep the session's objects alive. The constructor takes the
    execution and the workflow (the gem's ``step_execution:`` and ``workflow:``) and keeps
    only their identities."""

    def __init__(self, message: str, *, step_execution: Any = None, workflow: Any = None) -> None:
        super().__init__(message)
        self.step_execution_id: int | None = getattr(step_execution, "id", None)
        self.step_name: str | None = getattr(step_execution, "step_name", None)
        self.workflow_id: int | None = getattr(workflow, "id", None)
        self.workflow_class: str | None = None if workflow is None else type(workflow).__name__


class StepNotDefinedError(StepExecutionError):
    pass


class DatabaseConnectionLostError(StepExecutionError):
    """The database connection died after a step wrote through ``self.session``: those writes
    were rolled back with it, so the attempt failed (never recorded as a success without them).
    The step's exception policy decides what happens next; ``__cause__`` is the driver's error.
    """


class CursorTooLargeError(EngineError):
    pass


class SignalPayloadTooLargeError(EngineError):
    pass


class ReservedSignalNameError(EngineError, ValueError):
    """A signal name under ``geneva_drive.``: the engine's own signals (a child's end reaching
    its parent) cannot be sent from outside, or a parent could be told a child ended that did
    not."""


class WorkflowNotOngoingError(EngineError):
    pass


class DuplicateWorkflowError(EngineError):
    pass


class NoOngoingWorkflowError(EngineError, LookupError):
    """``signal_hero()`` found no ongoing workflow of the class for that hero (a webhook for an
    order whose workflow ended, or never started). Also a ``LookupError``."""


# The gem's names (docs/MANUAL.md, "Quick reference"): the same classes, so code written against either keeps working.
InvalidStateTransition = InvalidTransitionError
WorkflowNotOngoing = WorkflowNotOngoingError
