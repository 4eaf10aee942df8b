"""Inline successors: a worker runs an immediately-due next step itself instead of sending it.

Without this, every step of a workflow pays a broker round trip (publish, Redis, worker
receive, pool hand-off) between its predecessor's finalize and its own start. When the
finishing worker could run the successor itself, that message is pure cost: the worker claims
the successor's execution row and runs it, as the message's recipient would have.

The rules (docs/MANUAL.md, "How a step runs"):

* Only a successor **due now** (no ``wait``, no ``wait_until`` ahead), without a ``priority``
  job option of its own (the broker orders those among the waiting work: they are published),
  routed to a queue this worker consumes, of a workflow that is ``ready`` once the step's
  outcome is applied, is run inline. A resumable step's continuation (outcome ``continued``) always goes through the
  broker: yielding the worker is what the interruption is for.
* The step's outcome commits first, with the successor's row ``scheduled`` and **unsent**
  (``sent_at`` NULL, no message). The successor is then claimed like any delivered execution:
  its own transaction, under the workflow lock, with every prepare check (an operator's pause
  or cancel that landed in between is seen there). The row carries its job id like a
  published one. The dispatcher leaves such a held row (job id, no ``sent_at``) alone for one
  ``dispatch_interval``, so a sweep in the gap puts no duplicate message on the broker; a
  worker killed between the two leaves it due and unsent, and the first sweep after that
  sends it. The executor's state check under the lock keeps it from running twice.
  (Opt-in, ``settings.inline_successor_start_with_outcome``: a successor whose start runs no
  application code is started in the outcome's own commit instead, engine/executor.py
  ``_start_successor``; there is then no gap, and a worker killed after it leaves the successor
  in progress, recovered once that worker's lease has expired: engine/liveness.py.)
* A successor's own exception is its own: its outcome is committed and reported under its
  execution (and job id) like any step's, and the task that delivered the first step ends
  without raising it (that step succeeded). Nothing the
  successor's prepare does can take the finished step's outcome down: that is committed.
* A budget per task (``settings.inline_successor_max_steps`` steps,
  ``settings.inline_successor_max_time`` of wall time) bounds a chain; past it, or once a warm
  shutdown was requested, the successor's message is sent as without inline successors, so one
  long workflow never starves the queue and a shutdown stops at a step boundary.
* Sharing: after ``settings.inline_successor_yield_after`` steps (and every as many again) the
  worker asks whether other messages wait in the queues it consumes; if so the successor goes
  to the back of its queue. Under a backlog every queued message then stands for at most that
  many steps, so a new workflow does not wait behind whole chains.

The executor arms a :class:`Claim` on its session around each phase it commits; the scheduler
offers the claim each new execution's message (:func:`take`), and the executor settles the
claim right before the commit (:func:`settle`): either the successor runs here next, or its
message is queued for after commit exactly as it would have been.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from geneva_drive.config import settings
from geneva_drive.models import utcnow
from geneva_drive.shutdown import shutdown_requested
from geneva_drive.states import WorkflowState
from geneva_drive.transport import Message, enqueues_deferred, queue_message

if TYPE_CHECKING:
    from geneva_drive.models import StepExecution
    from geneva_drive.steps import StepDefinition
    from geneva_drive.workflow import Workflow

_CLAIM_KEY = "geneva_inline_claim"


def _any_queue(_queue: str | None) -> bool:
    return True


@dataclass
class Budget:
    """How far one task (one Celery message, one embedded work item) may run successors."""

    #: Whether a successor's queue (the ``queue`` job option, None for the default queue) is
    #: one this worker consumes.
    accepts_queue: Callable[[str | None], bool] = _any_queue
    max_steps: int = field(default_factory=lambda: settings.inline_successor_max_steps)
    max_seconds: float = field(
        default_factory=lambda: settings.inline_successor_max_time.total_seconds()
    )
    #: Called with a successor's execution id before the commit that makes it claimable (the
    #: embedded worker marks it in flight so its poller does not queue it a second time).
    on_claim: Callable[[int], None] | None = None
    #: Whether other work waits for this worker (messages in the queues it consumes); asked
    #: when a successor could run here once ``yield_after`` steps ran, and every
    #: ``yield_after`` steps again. None: never.
    others_waiting: Callable[[], bool] | None = None
    yield_after: int = field(default_factory=lambda: settings.inline_successor_yield_after)
    started: float = field(default_factory=time.monotonic)
    #: Steps run under this budget so far (the delivered one included).
    steps: int = 0
    _asked_at: int = field(default=-1, repr=False)
    _answer: bool = field(default=False, repr=False)

    def allows_another(self) -> bool:
        return (
            self.steps < self.max_steps
            and time.monotonic() - self.started < self.max_seconds
            and not shutdown_requested()
        )

    def should_yield(self) -> bool:
        """Share the worker: past ``yield_after`` steps, hand over when other work waits.

        Without this a queued message stands for a whole chain, and a new workflow's first step
        waits behind every chain queued before it (bench: "fresh workflow start delay").
        """
        if self.others_waiting is None or self.steps < self.yield_after:
            return False
        if self.steps % self.yield_after:
            return False
        if self._asked_at != self.steps:  # both phases of a step arm a claim: ask once
            self._asked_at = self.steps
            try:
                self._answer = self.others_waiting()
            except Exception:
                # Asking the broker is an optimisation; if it fails, behave as if others wait.
                self._answer = True
        return self._answer


def remembered(
    ask: Callable[[], bool], seconds: float, clock: Callable[[], float] = time.monotonic
) -> Callable[[], bool]:
    """``ask`` with its answer kept for ``seconds`` after it came back.

    A worker whose chains share every ``yield_after`` steps asks the broker a few hundred times
    a second under a backlog (one round trip each; keeping the answer 50 ms cut a B3
    deployment's CPU per step by 5 %), though a queue changes far slower than steps
    finish. What a kept answer costs: after a "no", a message that arrives meanwhile waits up to
    ``seconds`` longer for a chain to hand over; after a "yes", a chain may hand over once more
    although the queue has just drained (a publish and a task start, no lost work). A failed
    question is not kept (the budget counts it as others waiting, and the next one asks again).
    The time is taken when the answer arrives, so a slow broker still gets its answer reused.
    """
    answer = False
    answered_at: float | None = None

    def recent() -> bool:
        nonlocal answer, answered_at
        if answered_at is None or clock() - answered_at >= seconds:
            answer = ask()
            answered_at = clock()
        return answer

    return recent


def budget(
    accepts_queue: Callable[[str | None], bool] = _any_queue,
    on_claim: Callable[[int], None] | None = None,
    others_waiting: Callable[[], bool] | None = None,
) -> Budget | None:
    """A budget from the settings, or None when ``settings.inline_successors`` is off."""
    if not settings.inline_successors:
        return None
    return Budget(accepts_queue=accepts_queue, on_claim=on_claim, others_waiting=others_waiting)


@dataclass
class Claim:
    budget: Budget
    message: Message | None = None
    execution: StepExecution | None = None
    #: A second execution was created in the same phase: the first is swept as a stray.
    superseded: bool = False
    #: An execution id drawn for this phase's successor by the lock read (PostgreSQL, with
    #: ``settings.inline_successor_start_with_outcome``): see :func:`deferred_id`.
    next_id: int | None = None


def arm(session: Session, budget: Budget | None) -> None:
    """Before a phase: let the scheduler hand this phase's successor to the claim."""
    session.info.pop(_CLAIM_KEY, None)
    # Messages sent at once (enqueue_after_commit off, with_inline_enqueue) mean the caller
    # wants them on the transport now; the claim would only hold them back.
    if budget is not None and budget.allows_another() and enqueues_deferred():
        session.info[_CLAIM_KEY] = Claim(budget)


def disarm(session: Session) -> None:
    session.info.pop(_CLAIM_KEY, None)


def offer_id(session: Session, execution_id: int) -> None:
    """The phase's lock read drew ``execution_id`` from the executions' sequence for a
    successor this phase may create (:func:`deferred_id`)."""
    claim: Claim | None = session.info.get(_CLAIM_KEY)
    if claim is not None:
        claim.next_id = execution_id


def start_runs_no_code(workflow: Workflow, step_def: StepDefinition | None) -> bool:
    """Whether starting ``step_def`` runs no code of the application and checks nothing a
    predecessor's commit could not: no cancel condition on the class, and a step that is
    defined, not removed, without a skip condition and without a signal or children gate.
    (Its execution must also hold no limit slot and continue no chain: the callers check
    their row.) Such a start is the hero check and the start transition, nothing else."""
    return (
        not type(workflow)._cancel_conditions
        and step_def is not None
        and not step_def.removed
        and step_def.skip_if is None
        and not step_def.waits_for_signal
        and not step_def.wait_for_children
    )


def deferred_id(
    session: Session, workflow: Workflow, step_def: StepDefinition | None
) -> int | None:
    """The id the successor the claim just took (:func:`take`) is inserted under, with its row
     written at the phase's commit instead of now (``persistence.insert_new(deferred_id=)``),
     or None: insert it now.

     Only where the lock read drew an id, and only a successor whose start runs no code
     (:func:`start_runs_no_code`; the scheduler has ruled out limits and continuations): the
     executor then starts it before the commit (``Executor._start_successor``), and its row is
     inserted already started, in the one statement that also writes its predecessor's outcome
    . One id per phase."""
    claim: Claim | None = session.info.get(_CLAIM_KEY)
    if claim is None or claim.next_id is None or claim.message is None:
        return None
    if not start_runs_no_code(workflow, step_def):
        return None
    execution_id, claim.next_id = claim.next_id, None
    return execution_id


def take(session: Session, message: Message, *, continuation: bool) -> bool:
    """The scheduler offers a new execution's message; True: the claim holds it (not sent,
    the row is inserted unsent), and :func:`bind` gets the execution next."""
    claim: Claim | None = session.info.get(_CLAIM_KEY)
    if claim is None:
        return False
    if claim.message is not None:
        claim.superseded = True
        return False
    if continuation or message.countdown is not None:
        return False
    if message.priority is not None:
        # A step with its own priority is ordered by the broker among the work waiting there;
        # run here at once it would overtake (or undercut) that order: it is published.
        return False
    if not claim.budget.accepts_queue(message.queue):
        return False
    # Asked only now that there is a successor to run: a broker round trip, every
    # ``yield_after`` steps, never for the last step of a workflow.
    if claim.budget.should_yield():
        return False
    claim.message = message
    return True


def bind(session: Session, execution: StepExecution) -> None:
    claim: Claim | None = session.info.get(_CLAIM_KEY)
    if claim is not None and claim.message is not None and claim.execution is None:
        claim.execution = execution
        claim.message.execution_id = execution.id


def settle(session: Session, workflow: Workflow, *, runs_next: bool) -> StepExecution | None:
    """Right before the phase's commit: the successor this worker runs next, or None, with
    the successor's message queued as usual (``runs_next`` False: the step raised, or the
    phase did not finish a step)."""
    claim: Claim | None = session.info.pop(_CLAIM_KEY, None)
    if claim is None or claim.execution is None or claim.message is None:
        return None
    if claim.superseded:
        return None  # swept as a stray by the execution created after it; nothing to send
    execution = claim.execution
    if runs_next and workflow.state == WorkflowState.READY:
        if claim.budget.on_claim is not None:
            claim.budget.on_claim(execution.id)
        return execution
    # Sent exactly as the scheduler would have sent it (one UPDATE more, on this rare path);
    # the row already carries the message's job id.
    execution.sent_at = utcnow()
    queue_message(session, claim.message)
    return None
