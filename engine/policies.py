"""Exception policies: what happens to a workflow when a step raises.

Ported from geneva_drive's ``exception_policy.rb`` and ``combined_exception_policy.rb``
(docs/MANUAL.md, "Exception policies"). A policy is declarative
(``ExceptionPolicy("reattempt", wait=…, max_reattempts=3)``) or imperative
(``ExceptionPolicy(handler=lambda wf, error: wf.skip())``).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from geneva_drive.config import to_timedelta
from geneva_drive.errors import StepConfigurationError
from geneva_drive.flow_control import FlowAction, FlowInterrupt
from geneva_drive.outcomes import Cause, Decision, decide

log = logging.getLogger("geneva_drive.policies")

ACTIONS: tuple[str, ...] = (
    FlowAction.PAUSE,
    FlowAction.CANCEL,
    FlowAction.REATTEMPT,
    FlowAction.SKIP,
)
TERMINAL_ACTIONS: tuple[str, ...] = (FlowAction.PAUSE, FlowAction.CANCEL, FlowAction.SKIP)
REPORT_MODES = ("always", "never", "terminal_only")


def normalize_action(value: Any) -> str:
    """Accept ``"pause"`` or the gem's ``"pause!"`` spelling."""
    return str(value).rstrip("!") if value is not None else ""


@dataclass
class PolicyResult:
    action: str
    error: BaseException
    report: str = "always"
    wait: timedelta | None = None
    terminal: bool = False

    @property
    def decision(self) -> Decision:
        """What the action does to the step and the workflow (engine/outcomes.py)."""
        return decide(Cause.ERROR, self.action)


class LazyExceptionMatcher:
    """Matches by dotted class name, resolved at match time; an unknown name never matches."""

    def __init__(self, name: str) -> None:
        self.name = name

    def _resolve(self) -> type[BaseException] | None:
        module_name, _, attr = self.name.rpartition(".")
        candidates = [(module_name, attr)] if module_name else [("builtins", attr)]
        for mod, cls_name in candidates:
            try:
                resolved = getattr(importlib.import_module(mod), cls_name)
            except (ImportError, AttributeError, ValueError):
                continue
            if isinstance(resolved, type) and issubclass(resolved, BaseException):
                return resolved
        return None

    def matches(self, error: BaseException) -> bool:
        cls = self._resolve()
        return cls is not None and isinstance(error, cls)

    def __repr__(self) -> str:
        return f"LazyExceptionMatcher({self.name!r})"


Matcher = type[BaseException] | LazyExceptionMatcher | Callable[[BaseException], bool]


def build_matcher(item: Any, error_cls: type[Exception] = ValueError) -> Matcher:
    if isinstance(item, str):
        return LazyExceptionMatcher(item)
    if isinstance(item, type):
        if not issubclass(item, BaseException):
            raise error_cls(f"Expected an Exception subclass, got {item.__name__}")
        return item
    if isinstance(item, LazyExceptionMatcher) or callable(item):
        return item  # type: ignore[no-any-return]
    raise error_cls(
        "Expected an exception matcher (Exception subclass, dotted-path string, or a callable "
        f"taking the exception), got {item!r}"
    )


def _matcher_matches(matcher: Matcher, error: BaseException) -> bool:
    if isinstance(matcher, type):
        return isinstance(error, matcher)
    if isinstance(matcher, LazyExceptionMatcher):
        return matcher.matches(error)
    return bool(matcher(error))


# The rules of a policy's options, checked here only: ``ExceptionPolicy(...)`` and the step
# option ``@step(on_exception="...", max_reattempts=..., terminal_action=...)`` both build
# through ExceptionPolicy.__init__ (step_policy_from_option adds the step's name).


def _check_handler(
    handler: Any, action: Any, wait: Any, max_reattempts: Any, terminal: str
) -> None:
    if action is not None or wait is not None or max_reattempts is not None or terminal != "pause":
        raise StepConfigurationError(
            "Cannot pass action, wait, max_reattempts, or terminal_action when a handler is given"
        )
    if not callable(handler):
        raise StepConfigurationError(f"handler must be callable (workflow, error), got {handler!r}")


def _check_declarative(
    action: Any, wait: Any, max_reattempts: Any, terminal: str, terminal_action: Any
) -> str:
    """The normalized action, once every option fits it."""
    if action is None:
        raise StepConfigurationError("Either an action or a handler is required")
    act = normalize_action(action)
    if act not in ACTIONS:
        raise StepConfigurationError(
            f"Invalid action {action!r}: must be one of pause, cancel, reattempt, skip"
        )
    if wait is not None and act != "reattempt":
        raise StepConfigurationError('wait= only makes sense with action "reattempt"')
    if max_reattempts is not None:
        if act != "reattempt":
            raise StepConfigurationError('max_reattempts= only makes sense with action "reattempt"')
        positive = isinstance(max_reattempts, int) and not isinstance(max_reattempts, bool)
        if not positive or max_reattempts <= 0:
            raise StepConfigurationError(
                f"max_reattempts= must be a positive integer or None, got {max_reattempts!r}"
            )
    if terminal not in TERMINAL_ACTIONS:
        raise StepConfigurationError(
            f"terminal_action= must be one of pause, cancel, skip, got {terminal_action!r}"
        )
    if terminal != "pause" and act != "reattempt":
        raise StepConfigurationError('terminal_action= only makes sense with action "reattempt"')
    return act


class ExceptionPolicy:
    """A rule for one kind of exception.

    ``ExceptionPolicy(action=None, *, matching=None, wait=None, max_reattempts=None,
    terminal_action="pause", report="always", handler=None)``
    """

    def __init__(
        self,
        action: str | None = None,
        *,
        matching: Any = None,
        wait: timedelta | float | None = None,
        max_reattempts: int | None = None,
        terminal_action: str = "pause",
        report: str = "always",
        handler: Callable[[Any, BaseException], Any] | None = None,
    ) -> None:
        if report not in REPORT_MODES:
            raise StepConfigurationError(
                f"report: must be one of always, never, terminal_only, got {report!r}"
            )
        terminal = normalize_action(terminal_action)
        if handler is not None:
            _check_handler(handler, action, wait, max_reattempts, terminal)
            self.action: str | None = None
        else:
            self.action = _check_declarative(
                action, wait, max_reattempts, terminal, terminal_action
            )
        self.wait = to_timedelta(wait, "wait") if wait is not None else None
        if self.wait is not None and self.wait < timedelta(0):
            raise StepConfigurationError("wait= must not be negative")
        self.max_reattempts = max_reattempts
        self.terminal_action = terminal
        self.report = report
        self.handler = handler
        items: Sequence[Any]
        if matching is None:
            items = []
        elif isinstance(matching, list | tuple):
            items = matching
        else:
            items = [matching]
        self.exception_matchers: list[Matcher] = [build_matcher(i) for i in items]

    @property
    def is_specific(self) -> bool:
        return bool(self.exception_matchers)

    @property
    def is_blanket(self) -> bool:
        return not self.exception_matchers

    @property
    def is_declarative(self) -> bool:
        return self.handler is None

    @property
    def policies(self) -> list[ExceptionPolicy]:
        return [self]

    def captures(self, error: BaseException) -> bool:
        return not self.exception_matchers or any(
            _matcher_matches(m, error) for m in self.exception_matchers
        )

    matches = captures

    def leaf_for(self, error: BaseException) -> ExceptionPolicy:
        return self

    def apply(self, error: BaseException, reattempt_count: int, workflow: Any) -> PolicyResult:
        if self.handler is None:
            assert self.action is not None
            if (
                self.action == "reattempt"
                and self.max_reattempts is not None
                and reattempt_count >= self.max_reattempts
            ):
                return PolicyResult(self.terminal_action, error, self.report, terminal=True)
            return PolicyResult(self.action, error, self.report, wait=self.wait)
        try:
            self.handler(workflow, error)
        except FlowInterrupt as signal:
            return PolicyResult(signal.action.value, error, self.report, wait=signal.wait)
        except Exception as handler_error:
            # A broken handler must not leave the step in progress (the gem let it escape and
            # roll back the outcome): pause, and keep the handler's error on the step's own.
            log.exception("exception handler %r raised while handling %r", self.handler, error)
            error.add_note(
                f"The exception handler raised {type(handler_error).__name__}: {handler_error}"
            )
        return PolicyResult("pause", error, self.report)

    def describe(self) -> str:
        if self.handler is not None:
            what = f"handler {getattr(self.handler, '__name__', repr(self.handler))}"
        else:
            what = str(self.action)
            if self.wait is not None:
                what += f" after {self.wait}"
            if self.max_reattempts is not None:
                what += f" up to {self.max_reattempts}x then {self.terminal_action}"
        if self.exception_matchers:
            names = [
                getattr(m, "__name__", None) or getattr(m, "name", None) or repr(m)
                for m in self.exception_matchers
            ]
            what += f" on {', '.join(str(n) for n in names)}"
        return what

    def __repr__(self) -> str:
        return f"ExceptionPolicy({self.describe()})"


class CombinedExceptionPolicy:
    """An ordered list of policies; the first that captures the error applies (single pass).

    ``max_reattempts`` is the global cap: the minimum over every member. When the applied
    policy says "reattempt" and the count has reached the cap, the matched leaf's terminal
    action applies instead (the gem would crash on a nested combination here; we use the leaf).
    """

    def __init__(self, policies: Sequence[ExceptionPolicy | CombinedExceptionPolicy]) -> None:
        self.children = list(policies)

    @property
    def policies(self) -> list[ExceptionPolicy]:
        out: list[ExceptionPolicy] = []
        for child in self.children:
            out.extend(child.policies)
        return out

    @property
    def max_reattempts(self) -> int | None:
        caps = [p.max_reattempts for p in self.policies if p.max_reattempts is not None]
        return min(caps) if caps else None

    def captures(self, error: BaseException) -> bool:
        return any(child.captures(error) for child in self.children)

    matches = captures

    def leaf_for(self, error: BaseException) -> ExceptionPolicy | None:
        for child in self.children:
            if child.captures(error):
                return child.leaf_for(error)
        return None

    def apply(
        self, error: BaseException, reattempt_count: int, workflow: Any
    ) -> PolicyResult | None:
        child = next((c for c in self.children if c.captures(error)), None)
        if child is None:
            return None
        result = child.apply(error, reattempt_count, workflow)
        if result is None:
            return None
        cap = self.max_reattempts
        if cap is not None and result.action == "reattempt" and reattempt_count >= cap:
            leaf = child.leaf_for(error)
            terminal = leaf.terminal_action if leaf is not None else "pause"
            return PolicyResult(terminal, error, result.report, terminal=True)
        return result


DEFAULT_POLICY = ExceptionPolicy("pause")


def step_policy_from_option(
    step_label: str,
    on_exception: Any,
    max_reattempts: Any,
    max_reattempts_given: bool,
    terminal_action: Any,
) -> ExceptionPolicy | CombinedExceptionPolicy | None:
    """Build the step-level policy of ``@step(on_exception=…)``.

    Raises StepConfigurationError with the gem's messages, naming the step.
    """
    policy_like = isinstance(on_exception, ExceptionPolicy | list | tuple) or (
        callable(on_exception) and not isinstance(on_exception, str)
    )
    if max_reattempts_given and max_reattempts is not None and policy_like:
        raise StepConfigurationError(
            f"{step_label} has max_reattempts= but on_exception= is an ExceptionPolicy, callable, "
            "or list (set max_reattempts on the policy instead)"
        )
    if terminal_action is not None and policy_like:
        raise StepConfigurationError(
            f"{step_label} has terminal_action= but on_exception= is an ExceptionPolicy, callable, "
            "or list (set terminal_action on the policy instead)"
        )
    if on_exception is None:
        if max_reattempts_given and max_reattempts is not None:
            raise StepConfigurationError(
                f'{step_label} has max_reattempts= but on_exception= is not "reattempt"; add '
                'on_exception="reattempt" or drop max_reattempts='
            )
        if terminal_action is not None:
            raise StepConfigurationError(
                f'{step_label} has terminal_action= but on_exception= is not "reattempt"; add '
                'on_exception="reattempt" or drop terminal_action='
            )
        return None
    if isinstance(on_exception, ExceptionPolicy):
        return on_exception
    if isinstance(on_exception, list | tuple):
        for element in on_exception:
            if not isinstance(element, ExceptionPolicy):
                raise StepConfigurationError(
                    f"{step_label} has invalid on_exception list element: every element must be an "
                    f"ExceptionPolicy, got {element!r}"
                )
        return CombinedExceptionPolicy(list(on_exception))
    if isinstance(on_exception, str):
        # The step's shorthand for an ExceptionPolicy, checked by the same rules. A reattempting
        # step without max_reattempts= gets the gem's cap of 100.
        reattempts = normalize_action(on_exception) == "reattempt"
        cap = max_reattempts if max_reattempts_given else (100 if reattempts else None)
        try:
            return ExceptionPolicy(
                on_exception,
                max_reattempts=cap,
                terminal_action="pause" if terminal_action is None else terminal_action,
            )
        except ValueError as error:
            raise StepConfigurationError(
                f"{step_label} has an invalid on_exception={on_exception!r}: {error}"
            ) from error
    if callable(on_exception):
        return ExceptionPolicy(handler=on_exception)
    raise StepConfigurationError(
        f"{step_label} has invalid on_exception={on_exception!r}: must be an action string, an "
        "ExceptionPolicy, a callable (workflow, error), or a list of ExceptionPolicy"
    )


def resolution_stack(
    step_policy: ExceptionPolicy | CombinedExceptionPolicy | None,
    class_policies: Sequence[ExceptionPolicy],
) -> CombinedExceptionPolicy:
    """Step-level first, then class-level specific (newest first), blanket (newest first),
    then the default pause. ``class_policies`` is ordered subclass-first already."""
    stack: list[ExceptionPolicy | CombinedExceptionPolicy] = []
    if step_policy is not None:
        stack.append(step_policy)
    stack.extend(p for p in class_policies if p.is_specific)
    stack.extend(p for p in class_policies if p.is_blanket)
    stack.append(DEFAULT_POLICY)
    return CombinedExceptionPolicy(stack)
