"""GenevaDrive for Python: durable, multi-step workflows on SQLAlchemy and Celery.

Public API (docs/MANUAL.md, "Quick reference")::

    from geneva_drive import (Workflow, step, resumable_step, removed_step, renamed_step,
                        ExceptionPolicy, ConcurrencyLimit, RateLimit, Schedule,
                        SignalMatcher, IterableStep, settings, with_inline_enqueue)
"""

from geneva_drive.config import settings
from geneva_drive.iteration import IterableStep
from geneva_drive.limits import ConcurrencyLimit, RateLimit
from geneva_drive.policies import CombinedExceptionPolicy, ExceptionPolicy
from geneva_drive.recurrence import Schedule
from geneva_drive.signal_matcher import SignalMatcher
from geneva_drive.steps import removed_step, renamed_step, resumable_step, step
from geneva_drive.transport import with_inline_enqueue
from geneva_drive.workflow import Workflow, register_hero_class

__all__ = [
    "CombinedExceptionPolicy",
    "ConcurrencyLimit",
    "ExceptionPolicy",
    "IterableStep",
    "RateLimit",
    "Schedule",
    "SignalMatcher",
    "Workflow",
    "register_hero_class",
    "removed_step",
    "renamed_step",
    "resumable_step",
    "settings",
    "step",
    "with_inline_enqueue",
]
