"""Flow control inside a step: non-local exits that user code cannot swallow.

The gem uses Ruby's ``throw``/``catch``, which a ``rescue => e`` in a step does not intercept.
The Python equivalent is an exception that derives from ``BaseException`` (not ``Exception``),
so ``except Exception`` in a step body lets it pass while ``finally`` blocks still run. The
executor catches these explicitly; outside a step they propagate to the caller.
"""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum
from typing import Any


class FlowAction(StrEnum):
    CANCEL = "cancel"
    PAUSE = "pause"
    REATTEMPT = "reattempt"
    SKIP = "skip"
    FINISHED = "finished"
    SUSPEND = "suspend"


class FlowInterrupt(BaseException):
    """Raised by ``cancel()``, ``pause()``, ``skip()``, ``reattempt()``, ``finish()`` and
    ``suspend()`` inside a step; the executor turns it into the step's outcome.

    A non-local exit, not a workflow signal (those are ``geneva_drive.signals``): the gem's
    ``throw``. It was called ``FlowControlSignal`` before an earlier review."""

    def __init__(self, action: FlowAction, **options: Any) -> None:
        super().__init__(action.value)
        self.action = action
        self.options = options

    @property
    def wait(self) -> timedelta | None:
        value = self.options.get("wait")
        return value if isinstance(value, timedelta) or value is None else timedelta(seconds=value)


class Interrupt(BaseException):
    """Raised at a resumable checkpoint to end this execution and continue in a successor."""

    def __init__(self, wait: timedelta | None = None) -> None:
        super().__init__("interrupt")
        self.wait = wait
