"""Step definitions, their validation, and the ordered step collection.

``@step``, ``@resumable_step``, ``removed_step()`` and ``renamed_step(to=...)`` leave a
:class:`StepSpec` in the class body; ``Workflow.__init_subclass__`` turns the specs into :class:`StepDefinition` objects in
definition order and validates them *when the class is defined*.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any, Protocol, cast, overload

from geneva_drive.errors import StepConfigurationError
from geneva_drive.job_options import validate_job_options
from geneva_drive.limits import ConcurrencyLimit, RateLimit, check_step_limits
from geneva_drive.policies import CombinedExceptionPolicy, ExceptionPolicy, step_policy_from_option
from geneva_drive.signal_matcher import SignalMatcher
from geneva_drive.states import ChildFailureAction, TimeoutAction


@dataclass
class StepSpec:
    """What a decorator leaves in a class body until the class is assembled."""

    fn: Callable[..., Any] | None
    options: dict[str, Any]
    resumable: bool = False
    removed: bool = False
    counter: int = 0
    #: ``renamed_step(to=...)``: the step this old name now stands for (not a step itself).
    renamed_to: str | None = None


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
    #: How long the step waits for its signal once parked (docs/MANUAL.md, "Time-bounded waits"); None: for ever.
    timeout: timedelta | None = None
    #: What happens when ``timeout`` runs out (set exactly when ``timeout`` is).
    on_timeout: TimeoutAction | None = None
    #: Parks until every child workflow started before it has ended (docs/MANUAL.md, "Fan-out and join: child workflows").
    wait_for_children: bool = False
    #: What a child that ended canceled does to the join (set exactly when waiting for them).
    on_child_failure: ChildFailureAction | None = None
    #: Limits of this step (docs/MANUAL.md, "Concurrency and rate limits", engine/limits.py).
    concurrency_limit: ConcurrencyLimit | None = None
    rate_limit: RateLimit | None = None

    @property
    def waits_for_signal(self) -> bool:
        return self.wait_for is not None

    @property
    def parks(self) -> bool:
        """Does the step park its execution (``waiting``) until something arrives: a signal
        or the end of its children?"""
        return self.wait_for is not None or self.wait_for_children

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
    wait_for_children, on_child_failure = _check_children(
        label,
        opts.pop("wait_for_children", False),
        opts.pop("on_child_failure", None),
        waits_for_signal=wait_for is not None,
    )
    timeout, on_timeout = _check_timeout(
        label,
        opts.pop("timeout", None),
        opts.pop("on_timeout", None),
        waits=wait_for is not None or wait_for_children,
    )
    max_iterations, max_runtime = _check_limits(
        label,
        f"Resumable step '{name}' of {class_name}",
        spec.resumable,
        opts.pop("max_iterations", None),
        opts.pop("max_runtime", None),
    )
    concurrency_limit, rate_limit = check_step_limits(
        label, class_name, name, opts.pop("concurrency_limit", None), opts.pop("rate_limit", None)
    )
    opts.pop("name", None)
    if opts:
        raise StepConfigurationError(f"{label} got unknown option(s): {', '.join(sorted(opts))}")

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
        timeout=timeout,
        on_timeout=on_timeout,
        wait_for_children=wait_for_children,
        on_child_failure=on_child_failure,
        concurrency_limit=concurrency_limit,
        rate_limit=rate_limit,
    )


_CHILD_FAILURE_ACTIONS = ", ".join(f'"{action}"' for action in ChildFailureAction)


def _check_children(
    label: str, wait_for_children: Any, on_child_failure: Any, *, waits_for_signal: bool
) -> tuple[bool, ChildFailureAction | None]:
    """``wait_for_children=`` and ``on_child_failure=`` (docs/MANUAL.md, "Fan-out and join: child workflows")."""
    if not isinstance(wait_for_children, bool):
        raise StepConfigurationError(
            f"{label} has invalid wait_for_children={wait_for_children!r}: use True or False"
        )
    if not wait_for_children:
        if on_child_failure is not None:
            raise StepConfigurationError(
                f"{label} has on_child_failure={on_child_failure!r} but does not wait for its "
                "children; add wait_for_children=True or remove on_child_failure="
            )
        return False, None
    if waits_for_signal:
        raise StepConfigurationError(
            f"{label} has both wait_for= and wait_for_children=True: a step waits for one "
            "thing; wait for the children in one step and for the signal in the next"
        )
    try:
        action = ChildFailureAction("pause" if on_child_failure is None else on_child_failure)
    except ValueError:
        raise StepConfigurationError(
            f"{label} has invalid on_child_failure={on_child_failure!r}: use one of "
            f"{_CHILD_FAILURE_ACTIONS}"
        ) from None
    return True, action


_TIMEOUT_ACTIONS = ", ".join(f'"{action}"' for action in TimeoutAction)


def _check_timeout(
    label: str, timeout: Any, on_timeout: Any, *, waits: bool
) -> tuple[timedelta | None, TimeoutAction | None]:
    """``timeout=`` and ``on_timeout=`` (docs/MANUAL.md, "Time-bounded waits"): a step that waits may give up, and its
    author says what happens then; the engine never picks an action for them.

    ``waits``: the step waits for something a time-out can end - a signal (``wait_for=``) or
    its child workflows (``wait_for_children=True``, docs/MANUAL.md, "Fan-out and join: child workflows").
    """
    if timeout is None:
        if on_timeout is not None:
            raise StepConfigurationError(
                f"{label} has on_timeout={on_timeout!r} but no timeout=; add timeout= (a "
                "timedelta or seconds) or remove on_timeout="
            )
        return None, None
    if not waits:
        raise StepConfigurationError(
            f"{label} has timeout= but does not wait for anything: timeout= bounds a wait for a "
            "signal or for child workflows, so use it with wait_for= or wait_for_children=True "
            "(to delay the step itself, use wait=)"
        )
    if isinstance(timeout, bool) or not isinstance(timeout, timedelta | int | float):
        raise StepConfigurationError(
            f"{label} has invalid timeout={timeout!r}: use a datetime.timedelta or seconds"
        )
    duration = timeout if isinstance(timeout, timedelta) else _seconds(label, timeout)
    if duration <= timedelta(0):
        raise StepConfigurationError(f"{label} has invalid timeout=: it must be positive")
    if on_timeout is None:
        raise StepConfigurationError(
            f"{label} has timeout= but no on_timeout=: say what happens when the wait runs out, "
            f"one of {_TIMEOUT_ACTIONS}"
        )
    try:
        action = TimeoutAction(on_timeout) if isinstance(on_timeout, str) else None
    except ValueError:
        action = None
    if action is None:
        raise StepConfigurationError(
            f"{label} has invalid on_timeout={on_timeout!r}: use one of {_TIMEOUT_ACTIONS}"
        )
    return duration, action


def _seconds(label: str, value: float) -> timedelta:
    try:
        return timedelta(seconds=value)
    except (OverflowError, ValueError) as error:  # NaN, infinity, beyond timedelta's range
        raise StepConfigurationError(
            f"{label} has invalid timeout={value!r}: use a finite number of seconds"
        ) from error


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
    """The ordered steps of a workflow class (gravestones included, but never scheduled).

    ``aliases`` maps the old names of renamed steps to their new names: a lookup by an old name
    (an execution scheduled or parked before the rename) finds the new step, while iteration,
    ``names`` and scheduling only ever see the new names.
    """

    def __init__(
        self, definitions: list[StepDefinition], aliases: dict[str, str] | None = None
    ) -> None:
        self._aliases = dict(aliases or {})
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
        return self._resolve(name) in self._by_name

    def _resolve(self, name: object) -> str:
        text = str(name)
        return self._aliases.get(text, text)

    @property
    def renamed(self) -> dict[str, str]:
        """``{old_name: new_name}`` of the class's ``renamed_step`` lines."""
        return dict(self._aliases)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self._steps]

    def named(self, name: Any) -> StepDefinition | None:
        if name is None:
            return None
        return self._by_name.get(self._resolve(name))

    def index(self, name: Any) -> int | None:
        wanted = self._resolve(name)
        return next((i for i, s in enumerate(self._steps) if s.name == wanted), None)

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
            raise StepConfigurationError(
                "step options are keyword arguments: write @step(wait=...) or bare @step"
            )

        def wrap(func: Callable[..., Any]) -> StepSpec:
            if not callable(func):
                kind = "resumable_step" if resumable else "step"
                raise StepConfigurationError(f"@{kind} decorates a function, got {func!r}")
            return StepSpec(fn=func, options=options, resumable=resumable, counter=_next_counter())

        return wrap

    return cast(StepDecorator, decorator)


_counter = 0


def _next_counter() -> int:
    global _counter
    _counter += 1
    return _counter


#: ``@step`` / ``@step(name=None, wait=None, wait_for=None, timeout=None, on_timeout=None,
#: skip_if=None, on_exception=None, max_reattempts=…, terminal_action=None, before_step=None,
#: after_step=None, job_options=None)``
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


def renamed_step(to: str, name: str | None = None) -> StepSpec:
    """The old name of a renamed step: ``capture = renamed_step(to="capture_payment")``.

    Executions scheduled or parked under the old name run as the new step; nothing is ever
    scheduled under the old name again. ``renamed_steps_in_flight()`` (and the Definitions
    page) tells when no ongoing workflow refers to the old name and the line can go.
    """
    if not isinstance(to, str) or not to.strip():
        raise StepConfigurationError(
            f"renamed_step(to={to!r}) needs the new step's name as a non-empty string, e.g. "
            '`old_name = renamed_step(to="new_name")`'
        )
    options = {"name": str(name)} if name is not None else {}
    return StepSpec(fn=None, options=options, renamed_to=to, counter=_next_counter())


__all__ = [
    "StepCollection",
    "StepDefinition",
    "StepSpec",
    "build_definition",
    "evaluate_condition",
    "removed_step",
    "renamed_step",
    "resumable_step",
    "step",
]
