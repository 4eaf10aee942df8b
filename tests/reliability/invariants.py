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


# --- rules over a whole run: limits, waits, joins ------------------------------------------------
#
# These read the executions' timestamps after a run (the chaos run's check): each rule is one
# the manual states for every moment, derived afterwards from when each execution started and
# ended. An execution holds its concurrency slot exactly while it is ``in_progress``: from
# ``started_at`` (its start commits under the slot's lock, so a later claim sees it) to
# ``finished_at`` (whatever closed it: its outcome, an operator, a recovery).


@dataclass(frozen=True)
class Window:
    """A stretch of the run during which a rule's timing is not judged (a server was down)."""

    start: datetime
    end: datetime
    kind: str

    def overlaps(self, start: datetime, end: datetime) -> bool:
        return self.start <= end and start <= self.end


def limits_of(
    classes: Iterable[type[Workflow]],
) -> tuple[dict[str, int], dict[str, tuple[int, Any]]]:
    """({concurrency limit name: limit}, {rate limit name: (limit, window)}) of ``classes``."""
    concurrency: dict[str, int] = {}
    rates: dict[str, tuple[int, Any]] = {}
    for cls in classes:
        limit = getattr(cls, "concurrency_limit", None)
        if limit is not None:
            concurrency[limit.name] = limit.limit
        for step_def in cls.steps:
            if step_def.concurrency_limit is not None:
                concurrency[step_def.concurrency_limit.name] = step_def.concurrency_limit.limit
            if step_def.rate_limit is not None:
                rates[step_def.rate_limit.name] = (
                    step_def.rate_limit.limit,
                    step_def.rate_limit.window,
                )
    return concurrency, rates


def check_concurrency(
    target: Engine | Connection | Session, limits: dict[str, int]
) -> tuple[list[str], dict[str, int]]:
    """(violations, the most executions in progress at once per slot): no slot ``name/key``
    ever had more than its limit ``in_progress`` at once (intervals started_at..finished_at;
    one still open counts until now)."""
    connection, own = _connection_of(target)
    try:
        rows = list(
            connection.execute(
                select(
                    _ex.c.id,
                    _ex.c.limit_slot,
                    _ex.c.step_limit_slot,
                    _ex.c.started_at,
                    _ex.c.finished_at,
                ).where(
                    _ex.c.started_at.is_not(None),
                    (_ex.c.limit_slot.is_not(None)) | (_ex.c.step_limit_slot.is_not(None)),
                )
            )
        )
    finally:
        if own:
            connection.close()
    events: defaultdict[str, list[tuple[datetime, int, int]]] = defaultdict(list)
    for row in rows:
        for slot in {row.limit_slot, row.step_limit_slot} - {None}:
            end = row.finished_at or datetime.max.replace(tzinfo=row.started_at.tzinfo)
            # At one instant an end sorts before a start: a slot freed and taken in the same
            # microsecond was handed over, not shared.
            events[slot].append((row.started_at, 1, row.id))
            events[slot].append((end, 0, row.id))
    violations: list[str] = []
    peaks: dict[str, int] = {}
    for slot, slot_events in sorted(events.items()):
        name = slot.partition("/")[0]
        limit = limits.get(name)
        running: set[int] = set()
        peak = 0
        reported = False
        for at, kind, execution_id in sorted(slot_events):
            if kind == 0:
                running.discard(execution_id)
                continue
            running.add(execution_id)
            peak = max(peak, len(running))
            if limit is not None and len(running) > limit and not reported:
                reported = True  # the first breach of each slot; the peak tells the rest
                violations.append(
                    f"concurrency limit {slot} (limit {limit}): {len(running)} executions in "
                    f"progress at once at {at.isoformat()}: {sorted(running)}"
                )
        peaks[slot] = peak
    return violations, peaks


def check_rates(
    target: Engine | Connection | Session, limits: dict[str, tuple[int, Any]]
) -> list[str]:
    """No window of a rate limit's length held more starts of one slot than its limit."""
    connection, own = _connection_of(target)
    try:
        rows = list(
            connection.execute(
                select(_ex.c.id, _ex.c.rate_slot, _ex.c.started_at).where(
                    _ex.c.rate_slot.is_not(None), _ex.c.started_at.is_not(None)
                )
            )
        )
    finally:
        if own:
            connection.close()
    starts: defaultdict[str, list[tuple[datetime, int]]] = defaultdict(list)
    for row in rows:
        starts[row.rate_slot].append((row.started_at, row.id))
    violations: list[str] = []
    for slot, found in sorted(starts.items()):
        name = slot.partition("/")[0]
        if name not in limits:
            continue
        limit, window = limits[name]
        found.sort()
        first = 0
        for index, (at, _execution_id) in enumerate(found):
            # The starts in (at - window, at]: the engine admits a start only while fewer than
            # ``limit`` started after now - window.
            while found[first][0] <= at - window:
                first += 1
            if index - first + 1 > limit:
                ids = [execution_id for _, execution_id in found[first : index + 1]]
                violations.append(
                    f"rate limit {slot} ({limit} per {window.total_seconds():g} s): "
                    f"{index - first + 1} starts within {window.total_seconds():g} s up to "
                    f"{at.isoformat()}: executions {ids}"
                )
                break
    return violations


def check_waits(
    target: Engine | Connection | Session,
    *,
    late_after: Any = None,
    exempt_windows: Iterable[Window] = (),
    exempt_workflows: Iterable[int] = (),
) -> tuple[list[str], dict[str, Any]]:
    """(violations, figures) of the time-bounded waits.

    Each wait went one way: an execution the time-out fired on holds no signal (a signal
    claimed by it woke it first; firing on it anyway is a double wake-up), and one woken by a
    signal has no ``timed_out_at``; outcome ``timed_out`` iff ``timed_out_at``. A carried-over
    run of an ``on_timeout="run"`` step (its ``timed_out_at`` precedes its creation) may attach
    a signal that arrived meanwhile, as the manual says. With ``late_after`` (a timedelta:
    the dispatch interval plus slack): no time-out fired before its deadline, none more than
    ``late_after`` after it, and no signal woke an execution more than ``late_after`` past its
    deadline (the time-out should have fired first) - except where a window of
    ``exempt_windows`` (a server down) overlaps, or for ``exempt_workflows`` (an operator
    paused or moved them: a paused workflow's deadline waits for resume()).
    """
    connection, own = _connection_of(target)
    try:
        rows = list(
            connection.execute(
                select(
                    _ex.c.id,
                    _ex.c.workflow_id,
                    _ex.c.step_name,
                    _ex.c.state,
                    _ex.c.outcome,
                    _ex.c.created_at,
                    _ex.c.timeout_at,
                    _ex.c.timed_out_at,
                    _ex.c.signal_id,
                    _sig.c.claimed_at,
                    _sig.c.created_at.label("signal_created_at"),
                )
                .select_from(_ex.outerjoin(_sig, _sig.c.id == _ex.c.signal_id))
                .where(
                    (_ex.c.timeout_at.is_not(None))
                    | (_ex.c.timed_out_at.is_not(None))
                    | (_ex.c.outcome == states.Outcome.TIMED_OUT)
                )
            )
        )
    finally:
        if own:
            connection.close()
    windows = list(exempt_windows)
    exempt = set(exempt_workflows)
    violations: list[str] = []
    timed_out = woken = exempted = 0
    worst = 0.0
    for ex in rows:
        label = f"execution {ex.id} (workflow {ex.workflow_id}, step {ex.step_name!r})"
        final = ex.state in states.FINAL_STEP_STATES
        # (A run body that failed after its time-out keeps timed_out_at with outcome failed.)
        if final and ex.outcome == states.Outcome.TIMED_OUT and ex.timed_out_at is None:
            violations.append(
                f"{label}: {ex.state}/{ex.outcome} with timed_out_at={ex.timed_out_at}"
            )
        carried = ex.timed_out_at is not None and ex.timed_out_at < ex.created_at
        if ex.timed_out_at is not None and not carried:
            timed_out += 1
            if ex.signal_id is not None:
                violations.append(
                    f"{label}: timed out at {ex.timed_out_at.isoformat()} but holds signal "
                    f"{ex.signal_id} (claimed at {ex.claimed_at}): a wait that went both ways"
                )
        elif ex.signal_id is not None and ex.timeout_at is not None:
            woken += 1
        if late_after is None or ex.timeout_at is None or carried:
            continue
        if ex.timed_out_at is not None:
            if ex.timed_out_at < ex.timeout_at:
                violations.append(
                    f"{label}: timed out at {ex.timed_out_at.isoformat()}, before its deadline "
                    f"{ex.timeout_at.isoformat()}"
                )
                continue
            moment, what = ex.timed_out_at, "timed out"
        elif ex.signal_id is not None and ex.signal_created_at is not None:
            moment, what = max(ex.signal_created_at, ex.timeout_at), "was woken by a signal sent"
        else:
            continue
        late = (moment - ex.timeout_at).total_seconds()
        if late <= late_after.total_seconds():
            worst = max(worst, late)
            continue
        if ex.workflow_id in exempt or any(w.overlaps(ex.timeout_at, moment) for w in windows):
            exempted += 1
            continue
        violations.append(
            f"{label}: {what} {late:.1f} s after its deadline {ex.timeout_at.isoformat()} "
            f"(allowed {late_after.total_seconds():g} s; the time-out did not fire on time)"
        )
    figures = {
        "timed_out": timed_out,
        "woken_by_signal": woken,
        "late_exempted": exempted,
        "latest_on_time_s": round(worst, 2),
    }
    return violations, figures


def check_joins(
    target: Engine | Connection | Session,
    join_steps: dict[str, str],
    moved_by_operator: Iterable[int] = (),
) -> list[str]:
    """Each parent's join (``join_steps``: parent type → step name) ran at most once, exactly
    once for a finished parent whose join was not skipped (``moved_by_operator``: parents an
    operator may have skipped past it), and only after every child had ended; a finished
    parent has no child still open."""
    moved = set(moved_by_operator)
    connection, own = _connection_of(target)
    try:
        parents = {
            row.id: row
            for row in connection.execute(
                select(_wf.c.id, _wf.c.type, _wf.c.state, _wf.c.children_open).where(
                    _wf.c.type.in_(list(join_steps))
                )
            )
        }
        children: defaultdict[int, list[Any]] = defaultdict(list)
        for row in connection.execute(
            select(_wf.c.id, _wf.c.parent_id, _wf.c.state).where(_wf.c.parent_id.is_not(None))
        ):
            children[row.parent_id].append(row)
        child_end = dict(
            connection.execute(
                select(_ex.c.workflow_id, func.max(_ex.c.finished_at))
                .where(_ex.c.workflow_id.in_(select(_wf.c.id).where(_wf.c.parent_id.is_not(None))))
                .group_by(_ex.c.workflow_id)
            ).all()
        )
        joins: defaultdict[int, list[Any]] = defaultdict(list)
        for row in connection.execute(
            select(
                _ex.c.id,
                _ex.c.workflow_id,
                _ex.c.step_name,
                _ex.c.state,
                _ex.c.outcome,
                _ex.c.started_at,
            ).where(_ex.c.workflow_id.in_(list(parents)) if parents else _ex.c.id < 0)
        ):
            if row.step_name == join_steps.get(parents[row.workflow_id].type):
                joins[row.workflow_id].append(row)
    finally:
        if own:
            connection.close()
    violations: list[str] = []
    for parent_id, parent in parents.items():
        ran = [
            j
            for j in joins[parent_id]
            if j.state == states.StepState.COMPLETED and j.outcome == states.Outcome.SUCCESS
        ]
        skipped = [j for j in joins[parent_id] if j.state == states.StepState.SKIPPED]
        label = f"parent {parent_id} ({parent.type}, {parent.state})"
        if len(ran) > 1:
            violations.append(f"{label}: its join ran {len(ran)} times: {[j.id for j in ran]}")
        finished = parent.state == states.WorkflowState.FINISHED
        if finished and not ran and not skipped and parent_id not in moved:
            violations.append(f"{label}: finished without its join running")
        # A parent moved past its join stops counting its children's ends (nobody waits).
        if finished and parent.children_open and parent_id not in moved:
            violations.append(f"{label}: finished with children_open={parent.children_open}")
        for join in ran:
            for child in children[parent_id]:
                ended = child_end.get(child.id)
                if not states.is_terminal(child.state) or ended is None:
                    violations.append(
                        f"{label}: join {join.id} ran while child {child.id} is {child.state}"
                    )
                elif join.started_at is not None and ended > join.started_at:
                    violations.append(
                        f"{label}: join {join.id} started at {join.started_at.isoformat()}, "
                        f"before child {child.id} ended at {ended.isoformat()}"
                    )
    return violations
