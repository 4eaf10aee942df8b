"""Concurrency and rate limits per key (docs/MANUAL.md, "Concurrency and rate limits").

``ConcurrencyLimit(name, limit, key=None)`` bounds how many executions of the same ``(name,
key)`` *slot* are ``in_progress`` at once, across every process; ``RateLimit(name, limit, per,
key=None)`` admits at most ``limit`` starts per ``per``. A class's ``concurrency_limit`` covers
each of its steps; a step's ``concurrency_limit=`` and ``rate_limit=`` cover that step.

How it is kept, in the database and nowhere else:

- **Keys** are evaluated when an execution is created and stored on its row as ``name/key``
  slot strings (:func:`columns`): ``limit_slot``, ``step_limit_slot``, ``rate_slot``. A key
  callable that returns None leaves that execution unlimited. Executions of steps without
  limits get no slot and never reach anything below (B10: no added cost).
- **The claim** (:func:`claim`, in the executor's prepare, right before the start transition,
  under the workflow lock): each slot's row in ``geneva_drive_limits`` is created if missing and
  locked (:func:`_lock_slot_row`, through the dialect seam), in slot order so two
  claims never deadlock. Under that lock the count is read from the executions themselves (in
  progress, or started within the window), so no counter can drift: a slot held by a killed
  worker frees when stuck recovery moves its execution out of ``in_progress``. The lock is held
  until the start commits, so of many workers racing for the last slot exactly one wins.
- **Deferral**: an execution that finds no slot or token stays ``scheduled`` (no attempt, no
  outcome), records the slot in ``deferred_on``, and keeps its place: its id. A concurrency
  deferral is due again only at a backstop (:data:`RECHECK_AFTER`); the execution that frees a
  slot wakes the oldest deferred one at once (:func:`release`: due now, and its message sent
  when the freeing transaction commits). Woken executions older than a claimer keep their slot
  from it (oldest first within a key; keys never meet). A rate deferral is due when its token
  is: its turn in line (older deferred executions first) over the tokens the recent starts give
  back.

A limit's *current* definition decides: a changed ``limit`` applies at the next claim of each
deferred execution; a removed or renamed limit no longer holds back executions created under it.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import CursorResult, Table, func, or_, select, update
from sqlalchemy.orm import Session

from geneva_drive.dialects import dialect_for
from geneva_drive.errors import StepConfigurationError
from geneva_drive.instrumentation import limit_deferred
from geneva_drive.models import LimitSlot, StepExecution, utcnow
from geneva_drive.states import StepState, WorkflowState

if TYPE_CHECKING:
    from geneva_drive.steps import StepDefinition
    from geneva_drive.workflow import Workflow

log = logging.getLogger("geneva_drive.limits")

#: When a concurrency-deferred execution looks again on its own. Normally the execution that
#: frees a slot wakes it long before; this only covers slots freed elsewhere (stuck recovery,
#: an operator) and a wake-up message that was lost.
RECHECK_AFTER = timedelta(seconds=30)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$")
#: Keys longer than this are shortened (with a digest, so two long keys stay apart).
_MAX_KEY = 120

Key = Callable[[Any], Any] | str | None


def _check_common(label: str, kind: str, name: Any, limit: Any, key: Any) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise StepConfigurationError(
            f"{label} has {kind}(name={name!r}): a limit's name is 1 to 100 letters, digits, "
            "'_', '.', ':' or '-' (it is a metric label), e.g. \"tenant-sync\""
        )
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise StepConfigurationError(
            f"{label} has {kind}({name!r}, limit={limit!r}): limit must be a whole number of at "
            "least 1"
        )
    if key is not None and not (isinstance(key, str) or callable(key)):
        raise StepConfigurationError(
            f"{label} has {kind}({name!r}, key={key!r}): key must be a callable taking the "
            "workflow, the name of a workflow method, or None (one pool)"
        )


@dataclass(frozen=True)
class ConcurrencyLimit:
    """At most ``limit`` executions in progress at once per ``(name, key)`` (docs/MANUAL.md, "Concurrency and rate limits").

    ``key``: a callable taking the workflow (or a method name), evaluated when an execution is
    created; None (the default) makes one pool. A key that evaluates to None leaves that
    execution unlimited. One name used by several classes or steps is one pool.
    """

    name: str
    limit: int
    key: Key = None

    kind = "concurrency"

    def check(self, label: str) -> None:
        _check_common(label, "ConcurrencyLimit", self.name, self.limit, self.key)


@dataclass(frozen=True)
class RateLimit:
    """At most ``limit`` starts per ``per`` for each ``(name, key)``, bursts included."""

    name: str
    limit: int
    per: timedelta | float
    key: Key = None

    kind = "rate"

    def check(self, label: str) -> None:
        _check_common(label, "RateLimit", self.name, self.limit, self.key)
        per = self.per
        if isinstance(per, bool) or not isinstance(per, timedelta | int | float):
            raise StepConfigurationError(
                f"{label} has RateLimit({self.name!r}, per={per!r}): per must be a "
                "datetime.timedelta or seconds"
            )
        if self.window <= timedelta(0):
            raise StepConfigurationError(
                f"{label} has RateLimit({self.name!r}, per={per!r}): per must be positive"
            )

    @property
    def window(self) -> timedelta:
        per = self.per
        return per if isinstance(per, timedelta) else timedelta(seconds=float(per))


AnyLimit = ConcurrencyLimit | RateLimit

# --- validation at class definition ----------------------------------------------------------

#: name -> (kind, where it was first declared): one name is one pool, of one kind.
_declared: dict[str, tuple[str, str]] = {}


def _claim_name(limit: AnyLimit, class_name: str, where: str) -> None:
    known = _declared.get(limit.name)
    if known is not None and known[0] != limit.kind and not known[1].startswith(class_name + "."):
        raise StepConfigurationError(
            f"{where} uses the name {limit.name!r} for a {type(limit).__name__}, but {known[1]} "
            f"already uses it for a {'ConcurrencyLimit' if known[0] == 'concurrency' else 'RateLimit'}"
            "; one name is one pool: give one of them another name"
        )
    _declared[limit.name] = (limit.kind, where)


def check_class_limit(class_name: str, value: Any) -> ConcurrencyLimit | None:
    """A class's ``concurrency_limit =`` (None: no limit)."""
    label = f"{class_name}.concurrency_limit"
    if value is None:
        return None
    if isinstance(value, RateLimit):
        raise StepConfigurationError(
            f"{label} is a RateLimit: a rate limit covers one step's starts; put it on the step "
            "(@step(rate_limit=RateLimit(...)))"
        )
    if not isinstance(value, ConcurrencyLimit):
        raise StepConfigurationError(
            f"{label} is {value!r}; use ConcurrencyLimit(name, limit=..., key=...) or None"
        )
    value.check(label)
    _claim_name(value, class_name, f"{class_name}.concurrency_limit")
    return value


def check_step_limits(
    label: str, class_name: str, step_name: str, concurrency: Any, rate: Any
) -> tuple[ConcurrencyLimit | None, RateLimit | None]:
    """A step's ``concurrency_limit=`` and ``rate_limit=``."""
    if concurrency is not None:
        if isinstance(concurrency, RateLimit):
            raise StepConfigurationError(
                f"{label} has concurrency_limit={concurrency!r}: that is a RateLimit; pass it as "
                "rate_limit= instead"
            )
        if not isinstance(concurrency, ConcurrencyLimit):
            raise StepConfigurationError(
                f"{label} has concurrency_limit={concurrency!r}; use ConcurrencyLimit(name, "
                "limit=..., key=...)"
            )
        concurrency.check(label)
        _claim_name(concurrency, class_name, f"{class_name}.{step_name}")
    if rate is not None:
        if isinstance(rate, ConcurrencyLimit):
            raise StepConfigurationError(
                f"{label} has rate_limit={rate!r}: that is a ConcurrencyLimit; pass it as "
                "concurrency_limit= instead"
            )
        if not isinstance(rate, RateLimit):
            raise StepConfigurationError(
                f"{label} has rate_limit={rate!r}; use RateLimit(name, limit=..., per=..., key=...)"
            )
        rate.check(label)
        _claim_name(rate, class_name, f"{class_name}.{step_name}")
    return concurrency, rate


def check_key_methods(cls: type[Workflow]) -> None:
    """Keys given as method names must name a method of the class (checked once the whole
    class body exists, so the method may come after the step)."""
    found: list[tuple[str, AnyLimit]] = []
    if cls.concurrency_limit is not None:
        found.append((f"{cls.__name__}.concurrency_limit", cls.concurrency_limit))
    for definition in cls._step_definitions:
        for limit in (definition.concurrency_limit, definition.rate_limit):
            if limit is not None:
                found.append((f"Step '{definition.name}' of {cls.__name__}", limit))
    for label, limit in found:
        if isinstance(limit.key, str) and not callable(getattr(cls, limit.key, None)):
            raise StepConfigurationError(
                f"{label} has {type(limit).__name__}({limit.name!r}, key={limit.key!r}), but "
                f"{cls.__name__} defines no method {limit.key!r}; define it or pass a callable "
                "taking the workflow"
            )


# --- keys, when an execution is created ------------------------------------------------------


def has_limits(workflow: Workflow, step_def: StepDefinition | None) -> bool:
    return type(workflow).concurrency_limit is not None or (
        step_def is not None
        and (step_def.concurrency_limit is not None or step_def.rate_limit is not None)
    )


def slot_of(name: str, key: Any) -> str:
    """The ``name/key`` slot string (a pool without key: ``name/``)."""
    text = "" if key is None else str(key)
    if len(text) > _MAX_KEY:
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        text = f"{text[: _MAX_KEY - 17]}~{digest}"
    return f"{name}/{text}"


def split_slot(slot: str) -> tuple[str, str]:
    name, _, key = slot.partition("/")
    return name, key


def _evaluate(limit: AnyLimit, workflow: Workflow, step_name: str | None) -> str | None:
    key = limit.key
    if key is None:
        return slot_of(limit.name, None)
    try:
        value = getattr(workflow, key)() if isinstance(key, str) else key(workflow)
    except Exception as error:
        # The key's own error, raised where the execution is created (create(), or the
        # previous step's finalize), with a note naming what was being evaluated.
        error.add_note(
            f"while evaluating the key of {type(limit).__name__}({limit.name!r}) for step "
            f"{step_name!r} of {type(workflow).__name__} #{workflow.id}: a key must be "
            "computable from the workflow (return None to leave the execution unlimited)"
        )
        raise
    if value is None:
        return None  # this execution is not limited (docs/MANUAL.md, "Concurrency and rate limits")
    return slot_of(limit.name, value)


def columns(workflow: Workflow, step_def: StepDefinition | None) -> dict[str, Any]:
    """The slot columns of a new execution of ``step_def`` (only the ones that are set)."""
    values: dict[str, Any] = {}
    name = step_def.name if step_def is not None else None
    class_limit = type(workflow).concurrency_limit
    if class_limit is not None:
        values["limit_slot"] = _evaluate(class_limit, workflow, name)
    if step_def is not None:
        if step_def.concurrency_limit is not None:
            values["step_limit_slot"] = _evaluate(step_def.concurrency_limit, workflow, name)
        if step_def.rate_limit is not None:
            values["rate_slot"] = _evaluate(step_def.rate_limit, workflow, name)
    return {name: value for name, value in values.items() if value is not None}


# --- the claim ---------------------------------------------------------------------------------

_EXECUTIONS = cast(Table, StepExecution.__table__)
_LIMITS = cast(Table, LimitSlot.__table__)


def _lock_slot_row(session: Session, slot: str) -> None:
    """Create the slot's row if it is missing and hold its row lock until the transaction
    ends (the dialect's ``lock_or_create``: one upsert that locks on PostgreSQL and MariaDB,
    the database write lock already held on SQLite)."""
    connection = session.connection()
    dialect_for(connection).lock_or_create(connection, _LIMITS, "slot", slot)


def _in_use_query(slot: str) -> Any:
    return (
        select(func.count())
        .select_from(_EXECUTIONS)
        .where(
            _EXECUTIONS.c.state == StepState.IN_PROGRESS,
            or_(_EXECUTIONS.c.limit_slot == slot, _EXECUTIONS.c.step_limit_slot == slot),
        )
    )


def in_use(session: Session, slot: str) -> int:
    """Executions in progress on ``slot`` (class and step limits of one name are one pool)."""
    return int(session.execute(_in_use_query(slot)).scalar_one())


def _ahead_query(slot: str, execution_id: int, due_before: datetime | None) -> Any:
    """Deferred executions on ``slot`` in line before this one (of ready workflows; with
    ``due_before``: only the ones due by then, i.e. woken)."""
    workflows = _workflows_table()
    query = (
        select(func.count())
        .select_from(_EXECUTIONS.join(workflows, workflows.c.id == _EXECUTIONS.c.workflow_id))
        .where(
            _EXECUTIONS.c.deferred_on == slot,
            _EXECUTIONS.c.state == StepState.SCHEDULED,
            _EXECUTIONS.c.id < execution_id,
            workflows.c.state == WorkflowState.READY,
        )
    )
    if due_before is not None:
        query = query.where(_EXECUTIONS.c.scheduled_for <= due_before)
    return query


def _ahead(session: Session, slot: str, execution_id: int, due_before: datetime | None) -> int:
    return int(session.execute(_ahead_query(slot, execution_id, due_before)).scalar_one())


def _in_use_and_ahead(
    session: Session, slot: str, execution_id: int, now: datetime
) -> tuple[int, int]:
    """Both counts of a concurrency claim in one round trip."""
    row = session.execute(
        select(
            _in_use_query(slot).scalar_subquery(),
            _ahead_query(slot, execution_id, now).scalar_subquery(),
        )
    ).one()
    return int(row[0]), int(row[1])


def _workflows_table() -> Table:
    # By name: this module sits below the Workflow class (the layers in pyproject.toml).
    return StepExecution.metadata.tables["geneva_drive_workflows"]


def recent_starts(
    session: Session, slot: str, limit: int, window: timedelta, now: datetime
) -> list[datetime]:
    """The last ``limit`` starts on a rate slot within the window, oldest first."""
    rows = session.execute(
        select(_EXECUTIONS.c.started_at)
        .where(_EXECUTIONS.c.rate_slot == slot, _EXECUTIONS.c.started_at > now - window)
        .order_by(_EXECUTIONS.c.started_at.desc())
        .limit(limit)
    ).scalars()
    return sorted(value for value in rows if value is not None)


def next_token(
    starts: list[datetime], limit: int, window: timedelta, position: int, now: datetime
) -> datetime:
    """When the ``position``-th waiter (0: the first) gets a token: free tokens first (now),
    then each recorded start's token as it leaves the window, one window later per round."""
    free = limit - len(starts)
    if position < free:
        return now
    index = position - max(free, 0)
    if not starts:
        return now + window * (index // limit + 1)
    return max(now, starts[index % len(starts)] + window * (index // len(starts) + 1))


@dataclass
class Deferral:
    slot: str
    kind: str
    until: datetime


def _applicable(
    workflow: Workflow, execution: StepExecution, step_def: StepDefinition
) -> list[tuple[str, AnyLimit]]:
    """The slots of this execution whose limit its class still defines, under that name."""
    found: list[tuple[str, AnyLimit]] = []
    pairs: tuple[tuple[str | None, AnyLimit | None], ...] = (
        (execution.limit_slot, type(workflow).concurrency_limit),
        (execution.step_limit_slot, step_def.concurrency_limit),
        (execution.rate_slot, step_def.rate_limit),
    )
    for slot, limit in pairs:
        if slot is not None and limit is not None and split_slot(slot)[0] == limit.name:
            found.append((slot, limit))
    return found


#: ``scheduling.enqueue_execution`` (passed in by the callers: scheduling sits above this
#: module): queue an execution's message for after commit.
Enqueue = Callable[..., Any]


def claim(
    session: Session,
    workflow: Workflow,
    execution: StepExecution,
    step_def: StepDefinition,
    enqueue: Enqueue,
) -> bool:
    """May this execution start now? True: it takes its slots (its start transition, in this
    transaction, is what holds them). False: it was deferred (still ``scheduled``, due again
    when it is woken or its token is due) and must not start."""
    checks = _applicable(workflow, execution, step_def)
    if not checks:
        execution.deferred_on = None
        return True
    now = utcnow()
    for slot in sorted({slot for slot, _limit in checks}):
        _lock_slot_row(session, slot)
    deferral: Deferral | None = None
    for slot, limit in checks:
        if isinstance(limit, ConcurrencyLimit):
            used, ahead = _in_use_and_ahead(session, slot, execution.id, now)
            if used + ahead >= limit.limit:
                deferral = Deferral(slot, "concurrency", now + RECHECK_AFTER)
                execution.merge_metadata(limit_in_use=used)
                break
        else:
            window = limit.window
            starts = recent_starts(session, slot, limit.limit, window, now)
            position = _ahead(session, slot, execution.id, None)
            if len(starts) + position >= limit.limit:
                until = next_token(starts, limit.limit, window, position, now)
                deferral = Deferral(slot, "rate", max(until, now + timedelta(milliseconds=1)))
                break
    if deferral is None:
        execution.deferred_on = None
        return True
    if execution.deferred_on is None or execution.deferred_since is None:
        execution.deferred_since = now  # the wait starts (a re-deferral keeps its start)
    execution.deferred_on = deferral.slot
    execution.scheduled_for = deferral.until
    execution.sent_at = None
    if deferral.kind == "rate":
        # Due in a moment: its message (with a countdown) leaves at commit, or, beyond the
        # dispatch horizon, the dispatcher sends it when due.
        enqueue(session, workflow, execution, step_def)
    name, key = split_slot(deferral.slot)
    log.info(
        "execution %s of %s #%s (step %s) deferred by %s limit %r [%s] until %s",
        execution.id,
        type(workflow).__name__,
        workflow.id,
        execution.step_name,
        deferral.kind,
        name,
        key,
        deferral.until.isoformat(),
    )
    if limit_deferred.receivers:
        limit_deferred.send(
            "engine",
            limit=name,
            kind=deferral.kind,
            execution_id=execution.id,
            workflow_id=workflow.id,
            workflow_class=type(workflow).__name__,
            step_name=execution.step_name,
        )
    return False


def release(session: Session, execution: StepExecution, enqueue: Enqueue) -> int:
    """The execution left ``in_progress``: wake the oldest deferred execution of each of its
    concurrency slots (due now, its message sent when this transaction commits). Returns how
    many were woken."""

    slots = {s for s in (execution.limit_slot, execution.step_limit_slot) if s is not None}
    woken = 0
    now = utcnow()
    workflows = _workflows_table()
    for slot in sorted(slots):
        row = session.execute(
            select(_EXECUTIONS.c.id, _EXECUTIONS.c.workflow_id)
            .select_from(_EXECUTIONS.join(workflows, workflows.c.id == _EXECUTIONS.c.workflow_id))
            .where(
                _EXECUTIONS.c.deferred_on == slot,
                _EXECUTIONS.c.state == StepState.SCHEDULED,
                _EXECUTIONS.c.scheduled_for > now,
                workflows.c.state == WorkflowState.READY,
            )
            .order_by(_EXECUTIONS.c.id)
            .limit(1)
        ).first()
        if row is None:
            continue
        waiter_id = row[0]
        # Guarded: the waiter may have started or been canceled since the read.
        moved: CursorResult[Any] = session.execute(  # type: ignore[assignment]
            update(_EXECUTIONS)
            .where(
                _EXECUTIONS.c.id == waiter_id,
                _EXECUTIONS.c.state == StepState.SCHEDULED,
                _EXECUTIONS.c.deferred_on == slot,
            )
            .values(scheduled_for=now, sent_at=None)
        )
        if not moved.rowcount:
            continue
        waiter = session.get(StepExecution, waiter_id)
        if waiter is None:
            continue
        session.refresh(waiter)
        waiter_workflow = waiter.workflow
        enqueue(
            session,
            waiter_workflow,
            waiter,
            waiter_workflow.steps.named(waiter.step_name),
            force=True,
        )
        woken += 1
        log.debug("execution %s woken: a slot of %s freed", waiter_id, slot)
    return woken


# --- operators -------------------------------------------------------------------------------


def _display(slot: str) -> str:
    name, key = split_slot(slot)
    return f"`{name}` [{key}]" if key else f"`{name}`"


def why_deferred(
    session: Session, workflow: Workflow, execution: StepExecution, now: datetime, since: str = ""
) -> str | None:
    """The why-line of a deferred execution (docs/MANUAL.md, "Concurrency and rate limits"), or None when it is not deferred.

    ``since`` (" since 17 min (late)", the caller's judgement of the wait) follows the slot.
    """
    slot = execution.deferred_on
    if slot is None or execution.state != StepState.SCHEDULED:
        return None
    limit = _limit_for(workflow, execution, slot)
    if isinstance(limit, RateLimit) or (limit is None and slot == execution.rate_slot):
        wait = execution.scheduled_for - now
        # A token whose time has come is due, not "in 0 ms": a worker takes it next.
        turn = (
            f"next start in {_short(wait)}"
            if wait >= timedelta(milliseconds=1)
            else "its token is due now"
        )
        return f"waiting for a token of {_display(slot)}{since}: {turn}"
    used = in_use(session, slot)
    of = f" of {limit.limit}" if limit is not None else ""
    return f"waiting for a slot of {_display(slot)} ({used}{of} in use){since}"


def _limit_for(workflow: Workflow, execution: StepExecution, slot: str) -> AnyLimit | None:
    name = split_slot(slot)[0]
    step_def = (
        type(workflow).steps.named(execution.step_name)
        if hasattr(type(workflow), "steps")
        else None
    )
    candidates: list[AnyLimit | None] = [getattr(type(workflow), "concurrency_limit", None)]
    if step_def is not None:
        candidates += [step_def.concurrency_limit, step_def.rate_limit]
    for limit in candidates:
        if limit is not None and limit.name == name:
            return limit
    return declared_limit(name)


def declared_limit(name: str) -> AnyLimit | None:
    """The limit of that name among the registered workflow classes (the /limits page)."""
    for limit in declared_limits():
        if limit.name == name:
            return limit
    return None


def declared_limits() -> list[AnyLimit]:
    """Every limit the registered workflow classes declare, one per name, by name."""
    from geneva_drive.registry import registered_workflows

    found: dict[str, AnyLimit] = {}
    for cls in registered_workflows().values():
        limits: list[AnyLimit | None] = [cls.concurrency_limit]
        for definition in cls._step_definitions:
            limits += [definition.concurrency_limit, definition.rate_limit]
        for limit in limits:
            if limit is not None:
                found.setdefault(limit.name, limit)
    return [found[name] for name in sorted(found)]


def _short(wait: timedelta) -> str:
    seconds = wait.total_seconds()
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    if seconds < 60:
        return f"{seconds:.1f} s".replace(".0 s", " s")
    if seconds < 3600:
        return f"{int(seconds // 60)} min"
    return f"{int(seconds // 3600)} h"


@dataclass
class LimitUse:
    """One limit on the /limits page and in the metrics."""

    name: str
    kind: str
    limit: int | None
    per: timedelta | None
    in_use: int
    waiting: int
    #: (key, waiting, in use) of the keys with most waiting, most first.
    top_keys: list[tuple[str, int, int]]
    #: Whether the limit has a key (else it is one pool).
    keyed: bool = True

    @property
    def window_text(self) -> str:
        """A rate limit's window as text ("1 s", "500 ms", "2 min")."""
        return _short(self.per) if self.per is not None else ""


def usage(session: Session, *, top: int = 5) -> list[LimitUse]:
    """In use and waiting per limit name (bounded: grouped over limited rows only)."""
    declared = {limit.name: limit for limit in declared_limits()}
    running: dict[str, dict[str, int]] = {}
    for column in (_EXECUTIONS.c.limit_slot, _EXECUTIONS.c.step_limit_slot):
        for slot, count in session.execute(
            select(column, func.count())
            .where(column.is_not(None), _EXECUTIONS.c.state == StepState.IN_PROGRESS)
            .group_by(column)
        ):
            name, key = split_slot(slot)
            running.setdefault(name, {})
            running[name][key] = running[name].get(key, 0) + int(count)
    waiting: dict[str, dict[str, int]] = {}
    for slot, count in session.execute(
        select(_EXECUTIONS.c.deferred_on, func.count())
        .where(
            _EXECUTIONS.c.deferred_on.is_not(None),
            _EXECUTIONS.c.state == StepState.SCHEDULED,
        )
        .group_by(_EXECUTIONS.c.deferred_on)
    ):
        name, key = split_slot(slot)
        waiting.setdefault(name, {})[key] = int(count)
    result = []
    for name in sorted(set(declared) | set(running) | set(waiting)):
        limit = declared.get(name)
        keys = waiting.get(name, {})
        top_keys = sorted(keys.items(), key=lambda item: (-item[1], item[0]))[:top]
        result.append(
            LimitUse(
                name=name,
                kind=limit.kind if limit is not None else "concurrency",
                limit=limit.limit if limit is not None else None,
                per=limit.window if isinstance(limit, RateLimit) else None,
                in_use=sum(running.get(name, {}).values()),
                waiting=sum(keys.values()),
                top_keys=[
                    (key, count, running.get(name, {}).get(key, 0)) for key, count in top_keys
                ],
                keyed=limit is None or limit.key is not None,
            )
        )
    return result


__all__ = [
    "RECHECK_AFTER",
    "ConcurrencyLimit",
    "LimitUse",
    "RateLimit",
    "claim",
    "columns",
    "declared_limits",
    "has_limits",
    "in_use",
    "release",
    "slot_of",
    "split_slot",
    "usage",
    "why_deferred",
]
