"""Step definitions, their validation, and the ordered step collection.

``@step``, ``@resumable_step`` and ``removed_step()`` leave a :class:`StepSpec` in the class
body; ``Workflow.__init_subclass__`` turns the specs into :class:`StepDefinition` objects in
definition order and validates them *when the class is defined* (reference engine-core §3.1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any, Protocol, cast, overload

from geneva_drive.errors import StepConfigurationError
from geneva_drive.job_options import validate_job_options
from geneva_drive.policies import CombinedExceptionPolicy, ExceptionPolicy, step_policy_from_option
from geneva_drive.signal_matcher import SignalMatcher


@dataclass
class StepSpec:
    """What a decorator leaves in a class body until the class is assembled."""

    fn: Callable[..., Any] | None
    options: dict[str, Any]
    resumable: bool = False
    removed: bool = False
    counter: int = 0


@dataclass
class StepDefinition:
    name: str
    fn: Callable[..., Any] | None
    wait: timedelta | None = None
    wait_for: Any = None
    skip_if: Any = None
    on_exception: Any = None
    exception_policy: ExceptionPolicy | CombinedExceptionPolicy | None = None
    before_step: str | None = None
    after_step: str | None = None
    job_options: dict[str, Any] = field(default_factory=dict)
    resumable: bool = False
    removed: bool = False
    max_iterations: int | None = None
    max_runtime: timedelta | None = None
    #: The workflow method that runs the step (so a subclass may override it by name).
    method_name: str | None = None

    @property
    def waits_for_signal(self) -> bool:
        return self.wait_for is not None

    @property
    def signal_matcher(self) -> Any:
        return self.wait_for

    @property
    def on_exception_action(self) -> str | None:
        policy = self.exception_policy
        if isinstance(policy, ExceptionPolicy) and policy.is_declarative:
            return policy.action
        return None

    def should_skip(self, workflow: Any) -> bool:
        return evaluate_condition(self.skip_if, workflow)

    def run(self, workflow: Any, *args: Any) -> Any:
        if self.method_name is not None:
            return getattr(workflow, self.method_name)(*args)
        assert self.fn is not None, f"step {self.name!r} has no body"
        return self.fn(workflow, *args)


def evaluate_condition(condition: Any, workflow: Any) -> bool:
    """A skip_if / cancel_if condition: a method name, a callable taking the workflow, or a bool."""
    if condition is None:
        return False
    if isinstance(condition, bool):
        return condition
    if isinstance(condition, str):
        return bool(getattr(workflow, condition)())
    if callable(condition):
        return bool(condition(workflow))
    return bool(condition)


def _is_duration_like(value: Any) -> bool:
    return isinstance(value, timedelta | datetime | date) or (
        isinstance(value, int | float) and not isinstance(value, bool)
    )


def build_definition(
    class_name: str, name: str, fn: Callable[..., Any] | None, spec: StepSpec
) -> StepDefinition:
    """Validate one step's options, in the gem's order, and build its definition.

    One check per option below; the exception-policy options go through the one path of
    ExceptionPolicy (policies.step_policy_from_option).
    """
    label = f"Step '{name}' of {class_name}"
    opts = dict(spec.options)
    if spec.removed:
        return StepDefinition(name=name, fn=None, removed=True)
    if fn is None or not callable(fn):
        raise StepConfigurationError(f"{label} requires a function or a method to run")

    wait = _check_wait(label, opts.pop("wait", None))
    max_given = "max_reattempts" in opts
    max_reattempts = opts.pop("max_reattempts", None)
    terminal_action = opts.pop("terminal_action", None)
    on_exception = opts.pop("on_exception", None)
    policy = step_policy_from_option(
        label, on_exception, max_reattempts, max_given, terminal_action
    )
    before = opts.pop("before_step", None)
    after = opts.pop("after_step", None)
    if before is not None and after is not None:
        raise StepConfigurationError(
            f"{label} cannot specify both before_step= and after_step=; pick one"
        )
    skip_if = _check_skip_if(label, opts.pop("skip_if", None))
    job_options = validate_job_options(opts.pop("job_options", None), f"Step '{name}'")
    wait_for = _check_wait_for(label, opts.pop("wait_for", None))
    max_iterations, max_runtime = _check_limits(
        label,
        f"Resumable step '{name}' of {class_name}",
        spec.resumable,
        opts.pop("max_iterations", None),
        opts.pop("max_runtime", None),
    )
    opts.pop("name", None)
    if opts:
        raise TypeError(f"{label} got unknown option(s): {', '.join(sorted(opts))}")

    return StepDefinition(
        name=name,
        fn=fn,
        wait=wait,
        wait_for=wait_for,
        skip_if=skip_if,
        on_exception=on_exception,
        exception_policy=policy,
        before_step=str(before) if before is not None else None,
        after_step=str(after) if after is not None else None,
        job_options=job_options,
        resumable=spec.resumable,
        max_iterations=max_iterations,
        max_runtime=max_runtime,
    )


def _check_wait(label: str, wait: Any) -> timedelta | None:
    if wait is None:
        return None
    if isinstance(wait, str) or hasattr(wait, "matches"):
        raise StepConfigurationError(
            f"{label} has wait={wait!r} — wait= takes a duration; to wait for a signal, use "
            "wait_for="
        )
    if isinstance(wait, bool) or not isinstance(wait, timedelta | int | float):
        raise StepConfigurationError(
            f"{label} has invalid wait={wait!r}: use a datetime.timedelta or seconds"
        )
    duration = wait if isinstance(wait, timedelta) else timedelta(seconds=wait)
    if duration < timedelta(0):
        raise StepConfigurationError(f"{label} has invalid wait value: must be non-negative")
    return duration


def _check_skip_if(label: str, skip_if: Any) -> Any:
    if skip_if is not None and not (isinstance(skip_if, str | bool) or callable(skip_if)):
        raise StepConfigurationError(
            f"{label} has invalid skip_if=: must be a method name, a callable taking the workflow, "
            f"a bool, or None, but was {type(skip_if).__name__}"
        )
    return skip_if


def _check_wait_for(label: str, wait_for: Any) -> Any:
    if wait_for is None:
        return None
    if _is_duration_like(wait_for):
        raise StepConfigurationError(
            f"{label} has wait_for={wait_for!r} — wait_for= takes a signal name or matcher; "
            "to delay the step, use wait="
        )
    if isinstance(wait_for, str):
        if not wait_for.strip():
            raise StepConfigurationError(f"{label} has an empty wait_for= signal name")
        return SignalMatcher(wait_for)
    if not callable(getattr(wait_for, "matches", None)):
        raise StepConfigurationError(
            f"{label} has invalid wait_for=: must be a signal name, a SignalMatcher, or an "
            f"object with matches(signal), but was {type(wait_for).__name__}"
        )
    return wait_for


def _check_limits(
    label: str, resumable_label: str, resumable: bool, max_iterations: Any, max_runtime: Any
) -> tuple[Any, Any]:
    """``max_iterations=`` and ``max_runtime=``: resumable steps only, both positive."""
    if not resumable:
        if max_iterations is not None or max_runtime is not None:
            raise StepConfigurationError(
                f"{label} has max_iterations=/max_runtime=, which only resumable steps take; use "
                "@resumable_step"
            )
        return None, None
    if max_iterations is not None and (
        isinstance(max_iterations, bool)
        or not isinstance(max_iterations, int)
        or max_iterations <= 0
    ):
        raise StepConfigurationError(
            f"{resumable_label} has invalid max_iterations: must be a positive integer"
        )
    if max_runtime is not None:
        if isinstance(max_runtime, int | float) and not isinstance(max_runtime, bool):
            max_runtime = timedelta(seconds=max_runtime)
        if not isinstance(max_runtime, timedelta) or max_runtime <= timedelta(0):
            raise StepConfigurationError(
                f"{resumable_label} has invalid max_runtime: must be a positive duration"
            )
    return max_iterations, max_runtime


class StepCollection:
    """The ordered steps of a workflow class (gravestones included, but never scheduled)."""

    def __init__(self, definitions: list[StepDefinition]) -> None:
        ordered: list[StepDefinition] = [
            d for d in definitions if not (d.before_step or d.after_step)
        ]
        for d in definitions:
            ref = d.before_step or d.after_step
            if not ref:
                continue
            index = next((i for i, s in enumerate(ordered) if s.name == ref), None)
            if index is None:
                continue
            ordered.insert(index if d.before_step else index + 1, d)
        self._steps = ordered
        self._by_name = {s.name: s for s in ordered}

    def __iter__(self) -> Iterator[StepDefinition]:
        return iter(self._steps)

    def __len__(self) -> int:
        return len(self._steps)

    def __getitem__(self, index: int) -> StepDefinition:
        return self._steps[index]

    def __contains__(self, name: object) -> bool:
        return str(name) in self._by_name

    @property
    def names(self) -> list[str]:
        return [s.name for s in self._steps]

    def named(self, name: Any) -> StepDefinition | None:
        if name is None:
            return None
        return self._by_name.get(str(name))

    def index(self, name: Any) -> int | None:
        return next((i for i, s in enumerate(self._steps) if s.name == str(name)), None)

    def first(self) -> StepDefinition | None:
        return self._steps[0] if self._steps else None

    def last(self) -> StepDefinition | None:
        return self._steps[-1] if self._steps else None

    def next_after(self, name: str | None) -> StepDefinition | None:
        """The next runnable step after ``name`` (the first runnable one for None)."""
        if name is None:
            return next((s for s in self._steps if not s.removed), None)
        index = self.index(name)
        if index is None:
            return None
        return next((s for s in self._steps[index + 1 :] if not s.removed), None)

    def previous_before(self, name: str | None) -> StepDefinition | None:
        if name is None:
            return None
        index = self.index(name)
        if not index:
            return None
        return next((s for s in reversed(self._steps[:index]) if not s.removed), None)

    @property
    def runnable(self) -> list[StepDefinition]:
        return [s for s in self._steps if not s.removed]

    @property
    def removed(self) -> list[StepDefinition]:
        return [s for s in self._steps if s.removed]


class StepDecorator(Protocol):
    """The type of ``step`` and ``resumable_step``: typed so that a host's ``mypy --strict``
    accepts ``@step(wait=...)`` as well as bare ``@step``."""

    @overload
    def __call__(self, fn: Callable[..., Any], /) -> StepSpec: ...

    @overload
    def __call__(self, /, **options: Any) -> Callable[[Callable[..., Any]], StepSpec]: ...


def _make_decorator(resumable: bool) -> StepDecorator:
    def decorator(fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
        if fn is not None and callable(fn) and not options:
            return StepSpec(fn=fn, options={}, resumable=resumable, counter=_next_counter())
        if fn is not None:
            raise TypeError(
                "step options are keyword arguments: write @step(wait=...) or bare @step"
            )

        def wrap(func: Callable[..., Any]) -> StepSpec:
            if not callable(func):
                kind = "resumable_step" if resumable else "step"
                raise TypeError(f"@{kind} decorates a function, got {func!r}")
            return StepSpec(fn=func, options=options, resumable=resumable, counter=_next_counter())

        return wrap

    return cast(StepDecorator, decorator)


_counter = 0


def _next_counter() -> int:
    global _counter
    _counter += 1
    return _counter


#: ``@step`` / ``@step(name=None, wait=None, wait_for=None, skip_if=None, on_exception=None,
#: max_reattempts=…, terminal_action=None, before_step=None, after_step=None, job_options=None)``
step = _make_decorator(resumable=False)
#: ``@resumable_step`` / ``@resumable_step(max_iterations=None, max_runtime=None, …step options)``;
#: the method takes an ``IterableStep``.
resumable_step = _make_decorator(resumable=True)


def removed_step(name: str | None = None) -> StepSpec:
    """A gravestone for a deleted step: ``capture_payment = removed_step()``.

    It keeps its position and name, so executions scheduled by old code are skipped cleanly
    and ``removed_steps_in_flight()`` can tell when it is safe to delete the line.
    """
    options = {"name": str(name)} if name is not None else {}
    return StepSpec(fn=None, options=options, removed=True, counter=_next_counter())


__all__ = [
    "StepCollection",
    "StepDefinition",
    "StepSpec",
    "build_definition",
    "evaluate_condition",
    "removed_step",
    "resumable_step",
    "step",
]
