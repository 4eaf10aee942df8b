"""GenevaDrive for Python: durable, multi-step workflows on SQLAlchemy and Celery.

Public API (SPEC §2)::

    from engine import (Workflow, step, resumable_step, removed_step, ExceptionPolicy,
                        SignalMatcher, IterableStep, settings, with_inline_enqueue)
"""

from engine.config import settings
from engine.iteration import IterableStep
from engine.policies import CombinedExceptionPolicy, ExceptionPolicy
from engine.signal_matcher import SignalMatcher
from engine.steps import removed_step, resumable_step, step
from engine.transport import with_inline_enqueue
from engine.workflow import Workflow, register_hero_class

__all__ = [
    "CombinedExceptionPolicy",
    "ExceptionPolicy",
    "IterableStep",
    "SignalMatcher",
    "Workflow",
    "register_hero_class",
    "removed_step",
    "resumable_step",
    "settings",
    "step",
    "with_inline_enqueue",
]
