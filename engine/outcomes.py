"""One table from a step run's outcome to its transitions.

A step run ends in one of a few ways: its body returned, a resumable step stopped at a
checkpoint, the body called flow control (``cancel()``, ``pause()``, ``skip()``,
``reattempt()``, ``finish()``, ``suspend()``), or it raised and an exception policy chose an
action. Each way is a :class:`Decision` - the execution's final state and outcome, the
workflow's one new state, and what is scheduled next - read from :data:`OUTCOMES`, keyed by
who decided (:class:`Cause`) and the action's name. The executor records a decision; it no
longer maps flow actions and policy strings to transitions in two copies that could drift
(they had: the copies differed only where the gem's rules differ, and that is now data).

The model is procrastinate's ``RetryDecision``: an immutable record of what happens next,
computed first and applied in one place. Nothing here touches the database or an object;
:mod:`geneva_drive.transitions` still writes every state, :mod:`geneva_drive.states` still
says which moves are legal (tests/engine/test_outcomes_table.py checks every row against it).

Rows (the gem's rules)::

    cause  action       step state / outcome        workflow   then
    step   completed    completed / success*        ready      next step (or finished)
    step   interrupted  completed / continued       ready      successor link
    step   cancel       canceled / canceled         canceled   -
    step   pause        canceled / canceled         paused     -     (resumable: completed /
                                                                      workflow_paused, cursor kept)
    step   reattempt    completed / reattempted     ready      the same step again
    step   skip         skipped / skipped           ready      next step (or finished)
    step   finished     completed / success*        finished   -     (next_step_name kept)
    step   suspend      completed / continued       ready      successor link
    error  reattempt    completed / reattempted     ready      the same step again
    error  cancel       failed / canceled  + error  canceled   -
    error  skip         skipped / skipped           ready      next step (or finished)
    error  finished     completed / success         finished   -
    error  pause        failed / failed    + error  paused     -     (also any other action)

    * ``timed_out`` instead after ``on_timeout="run"`` (transitions.run_outcome)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from geneva_drive.flow_control import FlowAction
from geneva_drive.states import Outcome, StepState, WorkflowState


class Cause(StrEnum):
    """Who chose the outcome."""

    #: The step: its body returned, stopped at a checkpoint, or called flow control.
    STEP = "step"
    #: An exception: the exception policy (or its handler) chose the action.
    ERROR = "error"


class Action(StrEnum):
    """The outcomes that are not flow actions (those are :class:`FlowAction`'s values)."""

    #: The body returned.
    COMPLETED = "completed"
    #: A resumable step stopped at a checkpoint (max_iterations, max_runtime, shutdown).
    INTERRUPTED = "interrupted"


class Follow(StrEnum):
    """What is scheduled once the execution is closed."""

    #: Nothing: the workflow is paused, canceled or finished.
    NOTHING = "nothing"
    #: The next runnable step after the one that ran; when none is left the workflow
    #: finishes instead of becoming ready (one transition: performing -> finished).
    NEXT_STEP = "next_step"
    #: The same step again: a successor link (cursor and signal pin kept) for a resumable
    #: step, a new execution otherwise.
    SAME_STEP = "same_step"
    #: The next link of a resumable chain.
    SUCCESSOR = "successor"


@dataclass(frozen=True, slots=True)
class Decision:
    """What one step run leads to. Immutable: look it up, then apply it."""

    #: The execution's final state.
    step_state: StepState
    #: Its outcome; None: the body's own (``success``, or ``timed_out`` after
    #: ``on_timeout="run"``; see transitions.run_outcome).
    outcome: Outcome | None
    #: The workflow's one new state. With :attr:`Follow.NEXT_STEP` it is ``ready`` while a
    #: step follows and ``finished`` when none does.
    workflow_state: WorkflowState
    follow: Follow
    #: The step ended cleanly: the signal it claimed is consumed.
    resolves_signal: bool = False
    #: The step's exception is written on the execution (error columns and metadata).
    records_error: bool = False
    #: A resumable step gets this decision instead (pause keeps the cursor for resume()).
    when_resumable: Decision | None = None

    @property
    def reattempts(self) -> bool:
        """The step runs again; its execution records why (``reattempt_reason``)."""
        return self.outcome == Outcome.REATTEMPTED


_NEXT = Decision(
    StepState.COMPLETED, None, WorkflowState.READY, Follow.NEXT_STEP, resolves_signal=True
)
_CONTINUE = Decision(StepState.COMPLETED, Outcome.CONTINUED, WorkflowState.READY, Follow.SUCCESSOR)
_REATTEMPT = Decision(
    StepState.COMPLETED, Outcome.REATTEMPTED, WorkflowState.READY, Follow.SAME_STEP
)
_SKIP = Decision(
    StepState.SKIPPED, Outcome.SKIPPED, WorkflowState.READY, Follow.NEXT_STEP, resolves_signal=True
)
_ERROR_PAUSE = Decision(
    StepState.FAILED, Outcome.FAILED, WorkflowState.PAUSED, Follow.NOTHING, records_error=True
)

#: The table: (cause, action) -> decision. Actions are :class:`Action` and
#: :class:`FlowAction` values (a policy's action strings are the same names).
OUTCOMES: dict[tuple[Cause, str], Decision] = {
    (Cause.STEP, Action.COMPLETED): _NEXT,
    (Cause.STEP, Action.INTERRUPTED): _CONTINUE,
    (Cause.STEP, FlowAction.CANCEL): Decision(
        StepState.CANCELED, Outcome.CANCELED, WorkflowState.CANCELED, Follow.NOTHING
    ),
    (Cause.STEP, FlowAction.PAUSE): Decision(
        StepState.CANCELED,
        Outcome.CANCELED,
        WorkflowState.PAUSED,
        Follow.NOTHING,
        when_resumable=Decision(
            StepState.COMPLETED, Outcome.WORKFLOW_PAUSED, WorkflowState.PAUSED, Follow.NOTHING
        ),
    ),
    (Cause.STEP, FlowAction.REATTEMPT): _REATTEMPT,
    (Cause.STEP, FlowAction.SKIP): _SKIP,
    (Cause.STEP, FlowAction.FINISHED): Decision(
        StepState.COMPLETED, None, WorkflowState.FINISHED, Follow.NOTHING, resolves_signal=True
    ),
    (Cause.STEP, FlowAction.SUSPEND): _CONTINUE,
    (Cause.ERROR, FlowAction.REATTEMPT): _REATTEMPT,
    (Cause.ERROR, FlowAction.CANCEL): Decision(
        StepState.FAILED,
        Outcome.CANCELED,
        WorkflowState.CANCELED,
        Follow.NOTHING,
        records_error=True,
    ),
    (Cause.ERROR, FlowAction.SKIP): _SKIP,
    # The gem's policy path completes with success even after on_timeout="run".
    (Cause.ERROR, FlowAction.FINISHED): Decision(
        StepState.COMPLETED,
        Outcome.SUCCESS,
        WorkflowState.FINISHED,
        Follow.NOTHING,
        resolves_signal=True,
    ),
    (Cause.ERROR, FlowAction.PAUSE): _ERROR_PAUSE,
}


def decide(cause: Cause, action: str, *, resumable: bool = False) -> Decision:
    """The decision for ``action`` chosen by ``cause`` (for a resumable step if ``resumable``).

    An exception policy's unknown action (an imperative handler calling ``suspend()``, say)
    pauses, as in the gem; an unknown step action is a bug and raises KeyError.
    """
    key = (cause, str(action))
    decision = OUTCOMES.get(key) if cause == Cause.ERROR else OUTCOMES[key]
    if decision is None:
        decision = _ERROR_PAUSE
    if resumable and decision.when_resumable is not None:
        return decision.when_resumable
    return decision


def prepare_failed(decision: Decision) -> Decision:
    """A policy's decision for an exception raised before the body ran.

    The execution fails whatever the policy says, and only the workflow follows the policy;
    ``finished`` pauses it (the gem's rule: its prepare handler knows no finish).
    """
    moved = _ERROR_PAUSE if decision.workflow_state == WorkflowState.FINISHED else decision
    return replace(
        moved,
        step_state=StepState.FAILED,
        outcome=Outcome.FAILED,
        records_error=True,
        resolves_signal=False,
    )


__all__ = ["OUTCOMES", "Action", "Cause", "Decision", "Follow", "decide", "prepare_failed"]
