"""Operator actions on a workflow from outside its steps.

Each runs in the caller's transaction under the workflow lock, rechecks the state after taking
the lock, and refuses with :class:`InvalidStateError` naming the workflow and the way out.
The predicates live in :mod:`geneva_drive.states`; nothing here has its own copy of the rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import class_mapper

# persistence.flush, not Session.flush(): the engine writes its own rows by Core UPDATE, which
# also works for a workflow whose class is gone (loaded as plain Workflow), where the unit of
# work warns about the row's polymorphic identity.
from geneva_drive import persistence, registry, scheduling, signals, states, timeouts, transitions
from geneva_drive.errors import (
    DuplicateWorkflowError,
    InvalidInputError,
    InvalidStateError,
    StepNotDefinedError,
)
from geneva_drive.models import StepExecution
from geneva_drive.states import (
    TERMINAL_WORKFLOW_STATES,
    Operation,
    Outcome,
    StepState,
    WorkflowState,
)

if TYPE_CHECKING:
    from geneva_drive.workflow import Workflow


def _label(workflow: Workflow) -> str:
    return f"{type(workflow).__name__} #{workflow.id}"


def _refuse(action: Operation, workflow: Workflow, hint: str) -> InvalidStateError:
    verb = {Operation.SKIP: "skip on"}.get(action, action)
    return InvalidStateError(
        f"Cannot {verb} a {workflow.state} workflow ({_label(workflow)}). {hint}"
    )


_HINTS = {
    Operation.PAUSE: "Only a ready or performing workflow can be paused.",
    Operation.CANCEL: "Only an ongoing workflow (ready, performing or paused) can be canceled.",
    Operation.SKIP: "Only a ready or paused workflow can skip its current step.",
    Operation.RESUME: "Only a paused workflow can be resumed.",
    Operation.RESUME_AT: "Only a paused workflow can be resumed at a step; pause it first.",
}


def _check(action: Operation, workflow: Workflow, allowed: bool) -> None:
    if not allowed:
        raise _refuse(action, workflow, _HINTS[action])


def _locked(workflow: Workflow) -> Any:
    session = scheduling.session_of(workflow)
    scheduling.lock_workflow(session, workflow)
    return session


def pause(workflow: Workflow) -> None:
    """Pause: keeps the scheduled or parked execution, which is canceled if its job fires."""
    _check(Operation.PAUSE, workflow, states.can_pause(workflow.state))
    _locked(workflow)
    _check(Operation.PAUSE, workflow, states.can_pause(workflow.state))
    transitions.workflow_paused(workflow)
    persistence.flush(scheduling.session_of(workflow))


def cancel(workflow: Workflow) -> None:
    _check(Operation.CANCEL, workflow, states.can_cancel(workflow.state))
    session = _locked(workflow)
    _check(Operation.CANCEL, workflow, states.can_cancel(workflow.state))
    current = scheduling.current_execution(session, workflow)
    if current is not None:
        transitions.cancel_execution(current)
    transitions.workflow_canceled(workflow)
    persistence.flush(session)


def skip(workflow: Workflow) -> StepExecution | None:
    """Skip the current step and schedule the next one (or finish)."""
    _check(Operation.SKIP, workflow, states.can_skip(workflow.state))
    session = _locked(workflow)
    _check(Operation.SKIP, workflow, states.can_skip(workflow.state))
    if workflow.state == WorkflowState.PAUSED:
        # The step it was on (next_step_name; a running step's name is cleared with the pause)
        # is the one skipped: scheduling counts from it.
        transitions.workflow_ready(workflow)
        running = _release_running(session, workflow, StepState.SKIPPED)
        if running is not None:
            signals.settle_for_skipped(session, running)
        failed = session.scalars(
            select(StepExecution)
            .where(
                StepExecution.workflow_id == workflow.id,
                StepExecution.step_name == workflow.next_step_name,
                StepExecution.signal_id.is_not(None),
            )
            .order_by(StepExecution.created_at.desc(), StepExecution.id.desc())
            .limit(1)
        ).first()
        if failed is not None:
            signals.settle_for_skipped(session, failed)
    else:
        current = scheduling.current_execution(session, workflow)
        if current is not None:
            transitions.skip_execution(current)
            persistence.flush(session)
            signals.settle_for_skipped(session, current)
    return scheduling.schedule_next_step(session, workflow)


def _release_running(session: Any, workflow: Workflow, state: str) -> StepExecution | None:
    """Close the execution of a paused workflow whose step body is still running.

    ``pause()`` may land while a step runs; moving the workflow on (``skip``, ``resume_at``)
    must not leave that execution in_progress next to the new one (the one-active index would
    refuse the insert). Its finalize then finds it closed and leaves it alone, as after
    ``cancel()``.
    """
    running: StepExecution | None = session.scalars(
        select(StepExecution)
        .where(
            StepExecution.workflow_id == workflow.id,
            StepExecution.state == StepState.IN_PROGRESS,
        )
        .order_by(StepExecution.id)
        .limit(1)
    ).first()
    if running is None:
        return None
    if state == StepState.SKIPPED:
        transitions.skip_execution(running)
    else:
        transitions.cancel_execution(running)
    persistence.flush(session)
    return running


def resume(workflow: Workflow) -> StepExecution | None:
    """Resume a paused workflow.

    The preserved execution is re-sent (overdue ones run now); a parked one past its time-out
    fires it, otherwise it is re-matched against buffered signals; a resumable step paused
    mid-way continues from its cursor; a failed step is retried. A workflow stranded on a deleted step is refused *before* anything
    changes (the gem flips to ready first; we validate first so ``resume_at`` stays possible).
    """
    _check(Operation.RESUME, workflow, states.can_resume(workflow.state))
    session = _locked(workflow)
    _check(Operation.RESUME, workflow, states.can_resume(workflow.state))
    stranded = stranded_step(session, workflow)
    if stranded is not None:
        raise _stranded_error(workflow, stranded)
    current = scheduling.current_execution(session, workflow)
    continuation = None if current is not None else _continuation_point(session, workflow)
    if current is not None and current.state == StepState.IN_PROGRESS:
        # Paused while its step ran, resumed before the step ended: the step is still running,
        # so the workflow goes back to performing and the step's result is applied as usual.
        # (Ready here would make finalize discard the result and leave nothing scheduled.)
        transitions.workflow_performing(workflow, current.step_name)
        persistence.flush(session)
        return current
    transitions.workflow_ready(workflow)
    if current is not None:
        if current.state == StepState.WAITING:
            # Its deadline passed while paused: the time-out fires now (docs/MANUAL.md, "Time-bounded waits").
            if not timeouts.fire_on_resume(session, workflow, current):
                signals.rendezvous_waiting(session, workflow, current)
            return scheduling.current_execution(session, workflow)
        if current.state == StepState.SCHEDULED:
            scheduling.enqueue_execution(
                session, workflow, current, workflow.steps.named(current.step_name)
            )
        return current
    if continuation is not None:
        return scheduling.create_successor_execution(session, workflow, continuation)
    step_def = workflow.steps.named(workflow.next_step_name)
    assert step_def is not None
    return scheduling.create_step_execution(session, workflow, step_def, None)


def stranded_step(session: Any, workflow: Workflow) -> str | None:
    """The undefined step a resume of ``workflow`` would be stranded on (None: resumable).

    The one rule :func:`resume` refuses by and the bulk preview predicts with: nothing to pick
    up and a next step the class no longer defines, or parked on a step the class no longer
    defines ("resumed" would leave it parked for good: nothing can wake it).
    """
    current = scheduling.current_execution(session, workflow)
    if current is None:
        failed = _failed_not_defined(session, workflow)
        if failed is not None:
            return failed
        if (
            workflow.steps.named(workflow.next_step_name) is None
            and _continuation_point(session, workflow) is None
        ):
            return str(workflow.next_step_name)
        return None
    if current.state == StepState.WAITING and workflow.steps.named(current.step_name) is None:
        return str(current.step_name)
    return None


#: What the executor records on an execution whose step its class does not define.
_STEP_NOT_DEFINED = f"{StepNotDefinedError.__module__}.{StepNotDefinedError.__qualname__}"


def _failed_not_defined(session: Any, workflow: Workflow) -> str | None:
    """The step of the workflow's latest execution when it failed because the class does not
    define it (the pause the executor makes of a stranded run), and still does not.

    That execution, not ``next_step_name``, is where the workflow stopped: the two differ when
    the execution's step name was not the workflow's pointer, and running the pointer's step
    would start a step the operator never asked for."""
    last = session.scalars(
        select(StepExecution)
        .where(StepExecution.workflow_id == workflow.id)
        .order_by(StepExecution.id.desc())
        .limit(1)
    ).first()
    if (
        last is None
        or last.state != StepState.FAILED
        or last.error_class_name != _STEP_NOT_DEFINED
        or workflow.steps.named(last.step_name) is not None
    ):
        return None
    return str(last.step_name)


def unrunnable_current_step(workflow: Workflow) -> str | None:
    """The step a reattempt of a ready ``workflow`` would run, when its class no longer
    defines it (None: it can run). :func:`reattempt` refuses it by this rule."""
    name = scheduling.reference_step_name(workflow)
    return None if workflow.steps.named(name) is not None else str(name)


def _continuation_point(session: Any, workflow: Workflow) -> StepExecution | None:
    """A resumable execution to continue from: a workflow_paused marker (or one housekeeping
    recovered while the workflow was paused), or a failed one with a cursor, of the step the
    workflow is on. (The gem searches markers across all steps, so the marker of a step an
    operator skipped would hijack a later resume; we do not.)"""
    step_def = workflow.steps.named(workflow.next_step_name)
    markers = [Outcome.WORKFLOW_PAUSED]
    if step_def is not None and step_def.resumable:
        markers.append(Outcome.RECOVERED)
    marker = session.scalars(
        select(StepExecution)
        .where(
            StepExecution.workflow_id == workflow.id,
            StepExecution.step_name == workflow.next_step_name,
            StepExecution.state == StepState.COMPLETED,
            StepExecution.outcome.in_(markers),
        )
        .order_by(StepExecution.created_at.desc(), StepExecution.id.desc())
        .limit(1)
    ).first()
    if marker is not None and not _has_successor(session, marker):
        return marker  # type: ignore[no-any-return]
    failed = session.scalars(
        select(StepExecution)
        .where(
            StepExecution.workflow_id == workflow.id,
            StepExecution.step_name == workflow.next_step_name,
            StepExecution.state == StepState.FAILED,
        )
        .order_by(StepExecution.created_at.desc(), StepExecution.id.desc())
        .limit(1)
    ).first()
    if failed is not None and failed.cursor is not None and not _has_successor(session, failed):
        return failed  # type: ignore[no-any-return]
    return None


def _has_successor(session: Any, execution: StepExecution) -> bool:
    return (
        session.scalar(
            select(StepExecution.id).where(StepExecution.continues_from_id == execution.id).limit(1)
        )
        is not None
    )


def _runnable_names(workflow: Workflow) -> str:
    names = [s.name for s in workflow.steps.runnable]
    return ", ".join(names) if names else "(none)"


def _stranded_error(
    workflow: Workflow, step: str | None = None, verb: str = "resume"
) -> StepNotDefinedError:
    cls = type(workflow).__name__
    step = step or workflow.next_step_name
    return StepNotDefinedError(
        f"Cannot {verb} {_label(workflow)}: step '{step}' is no longer defined in {cls}. Pick "
        f"the step to continue from with resume_at(step_name) - the steps still defined are "
        f"{_runnable_names(workflow)} - or cancel() the workflow. To stop future removals from "
        f"stranding workflows this way, leave `{step} = removed_step()` in place of the deleted "
        f'step, or `{step} = renamed_step(to="new_name")` in place of a renamed one.',
        workflow=workflow,
    )


def resume_at(
    workflow: Workflow, step_name: Any, workflow_class: type[Workflow] | str | None = None
) -> StepExecution:
    """Resume a paused workflow at a chosen runnable step; returns the new execution.

    ``workflow_class`` (a registered class or its ``workflow_name``) moves a workflow whose
    class no longer exists (it loads as plain ``Workflow``) onto a class that does, and
    resumes it at a step of that class (docs/MANUAL.md, "Quick reference").
    """
    _check(Operation.RESUME_AT, workflow, states.can_resume_at(workflow.state))
    target = _target_class(workflow, workflow_class)
    name = str(step_name)
    step_def = target.steps.named(name)
    if step_def is None or step_def.removed:
        what = "a removed_step" if step_def is not None else "not defined"
        hint = ""
        if not target.steps.runnable:
            hint = (
                " Its class no longer exists; pass workflow_class= to resume it at a step of a "
                "class that does."
            )
        raise StepNotDefinedError(
            f"Cannot resume {_label(workflow)} at '{name}': that step is {what} in "
            f"{target.__name__}. The steps it can be resumed at are "
            f"{', '.join(s.name for s in target.steps.runnable) or '(none)'}.{hint}",
            workflow=workflow,
        )
    session = _locked(workflow)
    _check(Operation.RESUME_AT, workflow, states.can_resume_at(workflow.state))
    if target is not type(workflow):
        _check_slot_free(session, workflow, target)
        workflow.type = target.workflow_name
    _release_running(session, workflow, StepState.CANCELED)
    transitions.workflow_ready(workflow)
    return scheduling.create_step_execution(session, workflow, step_def, None)


def _base_class(workflow: Workflow) -> Any:
    """The mapped ``Workflow`` base, which rows of an unknown class load as (the single-table
    inheritance root; found through the mapper, so operations need not import the DSL)."""
    return class_mapper(type(workflow)).base_mapper.class_


def _target_class(workflow: Workflow, workflow_class: type[Workflow] | str | None) -> Any:
    if workflow_class is None:
        return type(workflow)
    known = registry.registered_workflows()
    if isinstance(workflow_class, str):
        target = known.get(workflow_class)
    else:
        target = workflow_class if workflow_class in known.values() else None
    if target is None:
        raise InvalidInputError(
            f"resume_at(workflow_class={workflow_class!r}): not a registered workflow class; "
            f"known: {', '.join(sorted(known)) or '(none)'}"
        )
    if target is not type(workflow) and type(workflow) is not _base_class(workflow):
        raise InvalidStateError(
            f"Cannot move {_label(workflow)} to {target.__name__}: only a workflow whose class no "
            "longer exists can be resumed at a step of another class."
        )
    return target


def _check_slot_free(session: Any, workflow: Workflow, target: Any) -> None:
    """Moving onto ``target`` must not give a hero two ongoing workflows of one class."""
    BaseWorkflow = _base_class(workflow)
    if workflow.allow_multiple or workflow.hero_type is None:
        return
    existing = session.scalar(
        select(BaseWorkflow.id)
        .where(
            BaseWorkflow.type == target.workflow_name,
            BaseWorkflow.hero_type == workflow.hero_type,
            BaseWorkflow.hero_id == workflow.hero_id,
            BaseWorkflow.state.not_in(list(TERMINAL_WORKFLOW_STATES)),
            BaseWorkflow.allow_multiple.is_(False),
            BaseWorkflow.id != workflow.id,
        )
        .limit(1)
    )
    if existing is not None:
        raise DuplicateWorkflowError(
            f"Cannot move {_label(workflow)} to {target.__name__}: an ongoing "
            f"{target.__name__} (workflow #{existing}) already exists for "
            f"{workflow.hero_type} #{workflow.hero_id}. Cancel one of them first."
        )


def reattempt(workflow: Workflow) -> StepExecution | None:
    """Operator reattempt: a paused workflow is resumed (retrying its step); a ready one runs
    its current step again now.

    A paused workflow stranded on a step its class no longer defines is refused, naming the
    way out (``resume_at``): a resume could only run another step than the one it stopped on,
    which is not what "run the current step again" promises (docs/MANUAL.md, "Recovering a
    stranded workflow with resume_at")."""
    if workflow.state == WorkflowState.PAUSED:
        session = _locked(workflow)
        if workflow.state == WorkflowState.PAUSED:
            stranded = stranded_step(session, workflow)
            if stranded is not None:
                raise _stranded_error(workflow, stranded, verb="reattempt")
        return resume(workflow)
    if workflow.state != WorkflowState.READY:
        raise InvalidStateError(
            f"Cannot reattempt a {workflow.state} workflow ({_label(workflow)}). Only a ready or "
            "paused workflow can run its step again."
        )
    session = _locked(workflow)
    if workflow.state != WorkflowState.READY:
        raise InvalidStateError(
            f"Cannot reattempt a {workflow.state} workflow ({_label(workflow)})."
        )
    missing = unrunnable_current_step(workflow)
    if missing is not None:
        raise StepNotDefinedError(
            f"Cannot reattempt {_label(workflow)}: step '{missing}' is no longer defined in "
            f"{type(workflow).__name__}. Pause it, then resume_at(step_name) one of "
            f"{_runnable_names(workflow)}, or cancel() it.",
            workflow=workflow,
        )
    return scheduling.reschedule_current_step(session, workflow, None)
