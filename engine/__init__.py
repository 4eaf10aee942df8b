"""GenevaDrive for Python: durable, multi-step workflows on SQLAlchemy and Celery.

Public API (docs/MANUAL.md, "Quick reference")::

    from geneva_drive import (Workflow, step, resumable_step, removed_step, renamed_step,
                        ExceptionPolicy, ConcurrencyLimit, RateLimit, Schedule,
                        SignalMatcher, IterableStep, settings, with_inline_enqueue)

and every error of :mod:`geneva_drive.errors` (``EngineError`` and its subclasses).
"""

from geneva_drive.config import settings
from geneva_drive.errors import (
    ArchiveError,
    ConfigurationError,
    CursorTooLargeError,
    DatabaseConnectionLostError,
    DuplicateWorkflowError,
    EngineError,
    InvalidInputError,
    InvalidStateError,
    InvalidStateTransition,
    InvalidTransitionError,
    NoOngoingWorkflowError,
    ReservedSignalNameError,
    ScheduleError,
    SignalPayloadTooLargeError,
    StepConfigurationError,
    StepExecutionError,
    StepNotDefinedError,
    UnsupportedDatabaseError,
    UsageError,
    WorkflowNotOngoing,
    WorkflowNotOngoingError,
)
from geneva_drive.iteration import IterableStep
from geneva_drive.limits import ConcurrencyLimit, RateLimit
from geneva_drive.policies import CombinedExceptionPolicy, ExceptionPolicy
from geneva_drive.recurrence import Schedule
from geneva_drive.signal_matcher import SignalMatcher
from geneva_drive.steps import removed_step, renamed_step, resumable_step, step
from geneva_drive.transport import with_inline_enqueue
from geneva_drive.workflow import Workflow, register_hero_class

__all__ = [
    "ArchiveError",
    "CombinedExceptionPolicy",
    "ConcurrencyLimit",
    "ConfigurationError",
    "CursorTooLargeError",
    "DatabaseConnectionLostError",
    "DuplicateWorkflowError",
    "EngineError",
    "ExceptionPolicy",
    "InvalidInputError",
    "InvalidStateError",
    "InvalidStateTransition",
    "InvalidTransitionError",
    "IterableStep",
    "NoOngoingWorkflowError",
    "RateLimit",
    "ReservedSignalNameError",
    "Schedule",
    "ScheduleError",
    "SignalMatcher",
    "SignalPayloadTooLargeError",
    "StepConfigurationError",
    "StepExecutionError",
    "StepNotDefinedError",
    "UnsupportedDatabaseError",
    "UsageError",
    "Workflow",
    "WorkflowNotOngoing",
    "WorkflowNotOngoingError",
    "register_hero_class",
    "removed_step",
    "renamed_step",
    "resumable_step",
    "settings",
    "step",
    "with_inline_enqueue",
]
