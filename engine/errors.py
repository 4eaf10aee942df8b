"""Errors raised by the engine.

::

    EngineError
    ├── InvalidStateError            operator action on a workflow in the wrong state
    ├── InvalidStateTransition       an illegal executor transition (engine bug or forced state)
    ├── StepConfigurationError       the workflow class is misconfigured (raised at class definition)
    ├── StepExecutionError           carries .step_execution and .workflow
    │   └── StepNotDefinedError      the step named by an execution no longer exists
    ├── CursorTooLargeError          a resumable cursor over settings.max_cursor_size
    ├── SignalPayloadTooLargeError   a signal payload over settings.max_signal_payload_size
    ├── WorkflowNotOngoing           signal() on a finished or canceled workflow
    └── DuplicateWorkflowError       a second ongoing workflow of one class for one hero

Flow-control interrupts are *not* errors; they live in :mod:`geneva_drive.flow_control`. A
step's own exception (or a condition's) is re-raised as itself once its outcome is committed,
so the gem's StepFailedError and PreconditionError have no Python counterpart.
"""

from __future__ import annotations

from typing import Any


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class ConfigurationError(EngineError):
    """A setting is missing or wrong; the message names the setting and how to set it."""


class InvalidStateError(EngineError):
    pass


class InvalidStateTransition(EngineError):
    pass


class StepConfigurationError(EngineError):
    pass


class StepExecutionError(EngineError):
    def __init__(self, message: str, *, step_execution: Any = None, workflow: Any = None) -> None:
        super().__init__(message)
        self.step_execution = step_execution
        self.workflow = workflow


class StepNotDefinedError(StepExecutionError):
    pass


class CursorTooLargeError(EngineError):
    pass


class SignalPayloadTooLargeError(EngineError):
    pass


class WorkflowNotOngoing(EngineError):
    pass


class DuplicateWorkflowError(EngineError):
    pass


# The gem's name for the transition error is kept; this alias follows the house style's name.
InvalidTransitionError = InvalidStateTransition
