"""SignalMatcher: which signal a ``wait_for=`` step accepts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from geneva_drive.errors import StepConfigurationError


class SignalMatcher:
    """Matches signals by name, optionally narrowed by ``where(workflow, payload) -> bool``.

    Matchers are plain reusable objects (module-level constants shared across steps are fine).
    They run at the gate and inside ``signal()`` in the sender's process, so keep them cheap
    and free of side effects. Any object with a ``matches(signal) -> bool`` method works as
    ``wait_for=`` too; it receives the Signal (its workflow is ``signal.workflow``).
    """

    def __init__(self, name: Any, where: Callable[[Any, Any], Any] | None = None) -> None:
        if name is None or str(name).strip() == "":
            raise StepConfigurationError("SignalMatcher needs a signal name")
        if where is not None and not callable(where):
            raise StepConfigurationError(
                f"SignalMatcher where= must be callable (workflow, payload), got {where!r}"
            )
        self.name = str(name)
        self.where = where

    def matches(self, signal: Any) -> bool:
        if signal.name != self.name:
            return False
        if self.where is None:
            return True
        return bool(self.where(signal.workflow, signal.payload))

    def __str__(self) -> str:
        return self.name if self.where is None else f"{self.name} (narrowed by payload)"

    def __repr__(self) -> str:
        return f"SignalMatcher({str(self)!r})"


def matcher_name(matcher: Any) -> str | None:
    """The signal name a matcher waits for, when it has one."""
    name = getattr(matcher, "name", None)
    return str(name) if name is not None else None
