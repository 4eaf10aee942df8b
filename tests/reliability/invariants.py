"""The invariant checker: what must hold in a GenevaDrive database whatever happened to it.

Every reliability test (races, crashes, soak) ends with :func:`assert_invariants`. The rules
are read from :mod:`geneva_drive.states` (the one state machine); nothing here keeps its own copy
of which states or outcomes exist.

Always (even while workers run):

* at most one ``scheduled``/``in_progress`` execution per workflow (ACTIVE_STEP_STATES), and
  at most one current one, ``waiting`` included (CURRENT_STEP_STATES);
* no signal is attached to two current executions, an execution's signal exists and belongs
  to the execution's workflow, and a parked (``waiting``) execution carries no signal yet;
* signal counters are consistent: ``0 <= consumed <= claimed``; ``pending`` iff nothing was
  claimed; ``consumed`` only when something was consumed; the timestamps match the counters;
* every workflow state, step state, signal state and (step state, outcome) pair is legal;
* no execution or signal without its workflow (orphans);
* a finished or canceled workflow has no current execution;
* ``current_step_name`` is set exactly while the workflow is ``performing`` (a step body runs
  for it); otherwise scheduling would count from a step the workflow already left;
* a closed execution (FINAL_STEP_STATES) has ``finished_at``.

And, given the (execution id, time) of each body run a test recorded
(:func:`check_body_runs`): no body runs for an execution that is no longer in progress.

And, given a ledger of committed writes (:func:`check_writes`: a table with one row per
attempt that a step body inserted through ``self.session``): a body's writes commit if and only
if its attempt's outcome commits as success - exactly one row for each execution of a writing
step that ended ``completed``/``success``, none for any other execution (failed, reattempted,
canceled, skipped, discarded by an operator, lost to a dead connection, stale).

When ``quiescent=True`` (no worker, dispatcher or operator is running any more, after recovery):

* nothing is ``in_progress`` and no workflow is ``performing``;
* every ``ready`` workflow has exactly one current execution, otherwise nothing would ever run
  it again (lost work).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, Table, func, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from geneva_drive import states
from geneva_drive.models import Signal, StepExecution
from geneva_drive.workflow import Workflow

_wf = Workflow.__table__
_ex = StepExecution.__table__
_sig = Signal.__table__


@dataclass
class InvariantReport:
    workflows: int = 0
    executions: int = 0
    signals: int = 0
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def add(self, message: str) -> None:
        self.violations.append(message)

    def __str__(self) -> str:
        head = f"{self.workflows} workflows, {self.executions} executions, {self.signals} signals: "
        if self.ok:
            return head + "all invariants hold"
        shown = "\n  ".join(self.violations[:50])
        more = f"\n  ... and {len(self.violations) - 50} more" if len(self.violations) > 50 else ""
        return head + f"{len(self.violations)} violation(s):\n  {shown}{more}"


def _connection_of(target: Engine | Connection | Session) -> tuple[Connection, bool]:
    if isinstance(target, Session):
        return target.connection(), False
    if isinstance(target, Engine):
        return target.connect(), True
    return target, False


def check_invariants(
    target: Engine | Connection | Session, *, quiescent: bool = False
) -> InvariantReport:
    """Inspect the database behind ``target`` and return every violation found."""
    connection, own = _connection_of(target)
    try:
        workflows = {
            row.id: row
            for row in connection.execute(
                select(
                    _wf.c.id,
                    _wf.c.state,
                    _wf.c.type,
                    _wf.c.current_step_name,
                    _wf.c.next_step_name,
                )
            )
        }
        executions = list(
            connection.execute(
                select(
                    _ex.c.id,
                    _ex.c.workflow_id,
                    _ex.c.step_name,
                    _ex.c.state,
                    _ex.c.outcome,
                    _ex.c.signal_id,
                    _ex.c.finished_at,
                )
            )
        )
        signals = {
            row.id: row
            for row in connection.execute(
                select(
                    _sig.c.id,
                    _sig.c.workflow_id,
                    _sig.c.name,
                    _sig.c.state,
                    _sig.c.claimed,
                    _sig.c.consumed,
                    _sig.c.claimed_at,
                    _sig.c.consumed_at,
                )
            )
        }
    finally:
        if own:
            connection.close()
    return evaluate(workflows, executions, signals, quiescent=quiescent)


def evaluate(
    workflows: dict[int, Any],
    executions: list[Any],
    signals: dict[int, Any],
    *,
    quiescent: bool = False,
) -> InvariantReport:
    """The rules themselves, on plain rows (``.id``, ``.state``, … attributes)."""
    report = InvariantReport(len(workflows), len(executions), len(signals))
    workflow_states = {s.value for s in states.WorkflowState}
    step_states = {s.value for s in states.StepState}
    signal_states = {s.value for s in states.SignalState}

    for wf in workflows.values():
        if wf.state not in workflow_states:
            report.add(f"workflow {wf.id}: unknown state {wf.state!r}")
        performing = wf.state == states.WorkflowState.PERFORMING
        if performing != (wf.current_step_name is not None):
            report.add(
                f"workflow {wf.id}: {wf.state} with current_step_name={wf.current_step_name!r} "
                "(set exactly while performing)"
            )

    active: Counter[int] = Counter()
    current: defaultdict[int, list[Any]] = defaultdict(list)
    attached_current: defaultdict[int, list[int]] = defaultdict(list)
    for ex in executions:
        label = f"execution {ex.id} (workflow {ex.workflow_id}, step {ex.step_name!r})"
        if ex.workflow_id not in workflows:
            report.add(f"{label}: orphaned, its workflow does not exist")
        if ex.state not in step_states:
            report.add(f"{label}: unknown state {ex.state!r}")
        elif not states.is_legal_step_outcome(ex.state, ex.outcome):
            report.add(f"{label}: illegal state/outcome pair {ex.state}/{ex.outcome}")
        if ex.state in states.ACTIVE_STEP_STATES:
            active[ex.workflow_id] += 1
        if ex.state in states.CURRENT_STEP_STATES:
            current[ex.workflow_id].append(ex)
            if ex.signal_id is not None:
                attached_current[ex.signal_id].append(ex.id)
        if ex.state in states.FINAL_STEP_STATES and ex.finished_at is None:
            report.add(f"{label}: {ex.state} without finished_at")
        if ex.state == states.StepState.WAITING and ex.signal_id is not None:
            report.add(f"{label}: parked at the gate but already holds signal {ex.signal_id}")
        if ex.signal_id is not None:
            sig = signals.get(ex.signal_id)
            if sig is None:
                report.add(f"{label}: attached signal {ex.signal_id} does not exist")
            else:
                if sig.workflow_id != ex.workflow_id:
                    report.add(
                        f"{label}: attached signal {sig.id} belongs to workflow {sig.workflow_id}"
                    )
                if sig.state == states.SignalState.PENDING or (sig.claimed or 0) < 1:
                    report.add(
                        f"{label}: attached signal {sig.id} was never claimed "
                        f"(state {sig.state}, claimed {sig.claimed})"
                    )

    for workflow_id, count in active.items():
        if count > 1:
            report.add(f"workflow {workflow_id}: {count} scheduled/in_progress executions")
    for workflow_id, rows in current.items():
        if len(rows) > 1:
            listing = ", ".join(f"{r.id}:{r.step_name}:{r.state}" for r in rows)
            report.add(f"workflow {workflow_id}: {len(rows)} current executions ({listing})")
        wf = workflows.get(workflow_id)
        if wf is not None and states.is_terminal(wf.state):
            listing = ", ".join(f"{r.id}:{r.state}" for r in rows)
            report.add(
                f"workflow {workflow_id} is {wf.state} but has current execution(s) {listing}"
            )
    for signal_id, ids in attached_current.items():
        if len(ids) > 1:
            report.add(f"signal {signal_id}: attached to {len(ids)} current executions {ids}")

    for sig in signals.values():
        label = f"signal {sig.id} ({sig.name!r}, workflow {sig.workflow_id})"
        if sig.workflow_id not in workflows:
            report.add(f"{label}: orphaned, its workflow does not exist")
        claimed, consumed = sig.claimed or 0, sig.consumed or 0
        if sig.state not in signal_states:
            report.add(f"{label}: unknown state {sig.state!r}")
        if not 0 <= consumed <= claimed:
            report.add(f"{label}: counters claimed={claimed} consumed={consumed}")
        if (sig.state == states.SignalState.PENDING) != (claimed == 0):
            report.add(f"{label}: state {sig.state} with claimed={claimed}")
        if sig.state == states.SignalState.CONSUMED and consumed == 0:
            report.add(f"{label}: consumed with consumed=0")
        if (sig.claimed_at is not None) != (claimed > 0):
            report.add(f"{label}: claimed_at={sig.claimed_at} with claimed={claimed}")
        if (sig.consumed_at is not None) != (sig.state == states.SignalState.CONSUMED):
            report.add(f"{label}: consumed_at={sig.consumed_at} in state {sig.state}")

    if quiescent:
        for ex in executions:
            if ex.state == states.StepState.IN_PROGRESS:
                report.add(f"execution {ex.id} (workflow {ex.workflow_id}): still in_progress")
        for wf in workflows.values():
            if wf.state == states.WorkflowState.PERFORMING:
                report.add(f"workflow {wf.id}: still performing")
            if wf.state == states.WorkflowState.READY and len(current.get(wf.id, [])) != 1:
                report.add(
                    f"workflow {wf.id}: ready with {len(current.get(wf.id, []))} current "
                    "executions (nothing would run it)"
                )
    return report


def check_body_runs(
    target: Engine | Connection | Session, runs: Iterable[tuple[int, datetime]]
) -> list[str]:
    """Every body run recorded at a time after its execution was closed (``finished_at``)."""
    runs = list(runs)
    connection, own = _connection_of(target)
    try:
        rows = connection.execute(
            select(_ex.c.id, _ex.c.finished_at).where(
                _ex.c.id.in_({execution_id for execution_id, _ in runs})
            )
        )
        closed = {row.id: row.finished_at for row in rows}
    finally:
        if own:
            connection.close()
    return [
        f"execution {execution_id}: body ran at {at} after it was closed at {closed[execution_id]}"
        for execution_id, at in runs
        if closed.get(execution_id) is not None and at > closed[execution_id]
    ]


def assert_body_runs_in_progress(
    target: Engine | Connection | Session, runs: Iterable[tuple[int, datetime]]
) -> None:
    """Raise AssertionError when a body ran for an execution no longer in progress."""
    violations = check_body_runs(target, runs)
    assert not violations, "\n".join(violations)


#: The (state, outcome) of an execution whose body's writes commit with it (the ledger rule).
WRITES_COMMIT_WITH = frozenset({(states.StepState.COMPLETED, states.Outcome.SUCCESS)})


def check_writes(
    target: Engine | Connection | Session,
    ledger: Table,
    writing_steps: Iterable[str],
    *,
    commit_with: frozenset[tuple[str, str]] = WRITES_COMMIT_WITH,
) -> list[str]:
    """The ledger rule: every violation of "a body's writes commit iff its outcome does".

    ``ledger`` has an ``execution_id`` column, one row per attempt of the ``writing_steps``
    (step names whose bodies always write their row before they can succeed). An execution of
    such a step that ended in ``commit_with`` must have exactly one row (none: the writes were
    lost; two: doubled); any other execution none (the writes of a failed or discarded attempt
    committed). Rows of executions that do not exist are reported too.
    """
    names = set(writing_steps)
    connection, own = _connection_of(target)
    try:
        rows = dict(
            connection.execute(
                select(ledger.c.execution_id, func.count()).group_by(ledger.c.execution_id)
            ).all()
        )
        executions = list(
            connection.execute(
                select(_ex.c.id, _ex.c.workflow_id, _ex.c.step_name, _ex.c.state, _ex.c.outcome)
            )
        )
    finally:
        if own:
            connection.close()
    violations: list[str] = []
    known = set()
    for ex in executions:
        known.add(ex.id)
        if ex.step_name not in names:
            continue
        written = rows.get(ex.id, 0)
        label = f"execution {ex.id} (workflow {ex.workflow_id}, step {ex.step_name!r})"
        if (ex.state, ex.outcome) in commit_with:
            if written == 0:
                violations.append(f"{label}: {ex.state}/{ex.outcome} but its writes were lost")
            elif written > 1:
                violations.append(f"{label}: {ex.state}/{ex.outcome} with {written} writes")
        elif written:
            violations.append(
                f"{label}: {ex.state}/{ex.outcome} but {written} of its writes committed"
            )
    for execution_id, written in rows.items():
        if execution_id not in known:
            violations.append(f"{written} writes of execution {execution_id}, which does not exist")
    return violations


def assert_writes(
    target: Engine | Connection | Session, ledger: Table, writing_steps: Iterable[str]
) -> None:
    """Raise AssertionError listing every violation of the ledger rule."""
    violations = check_writes(target, ledger, writing_steps)
    assert not violations, "\n".join(violations)


def assert_invariants(
    target: Engine | Connection | Session, *, quiescent: bool = False
) -> InvariantReport:
    """Raise AssertionError listing every violation; return the report when all hold."""
    report = check_invariants(target, quiescent=quiescent)
    assert report.ok, str(report)
    return report
