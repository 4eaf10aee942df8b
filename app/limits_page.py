"""What waits behind each concurrency and rate limit, per key, for ``/limits`` and the overview.

Per key: the executions **waiting** to start (due now and not tried yet, or **deferred**:
tried and held back by the limit), how many of the deferred are late (engine/lateness.py),
the oldest wait's start, the slots in use, and the executions that **finished** under the key
in the last :data:`PACE_WINDOW`, which give the estimate of the time to drain the wait:
``waiting ÷ (finished per minute)``. Every statement reads at most :data:`ROW_CAP` rows through
the partial slot indexes (or the ``finished_at`` index), so a flood of any size costs the same;
a limit whose rows reached the cap says so (its counts are then "at least").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from geneva_drive import lateness, limits
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.states import StepState
from geneva_drive.workflow import Workflow

#: The recent pace the time to drain is estimated from.
PACE_WINDOW = timedelta(minutes=10)
#: Rows one statement reads at most.
ROW_CAP = 10_000

_ex = StepExecution.__table__.c
_SLOTS = (_ex.limit_slot, _ex.step_limit_slot, _ex.rate_slot)


@dataclass
class KeyBacklog:
    key: str
    due: int = 0
    deferred: int = 0
    late: int = 0
    in_use: int = 0
    finished: int = 0
    oldest: datetime | None = None

    @property
    def waiting(self) -> int:
        return self.due + self.deferred

    def _older(self, since: datetime | None) -> None:
        if since is not None and (self.oldest is None or since < self.oldest):
            self.oldest = since

    def drain(self) -> timedelta | None:
        """The time to start what waits at the recent pace (None: nothing finished lately)."""
        if not self.finished:
            return None
        return PACE_WINDOW * (self.waiting / self.finished)

    @property
    def per_minute(self) -> float:
        return self.finished / (PACE_WINDOW.total_seconds() / 60)


@dataclass
class LimitBacklog:
    use: limits.LimitUse
    total: KeyBacklog
    #: The keys with the most waiting and the keys with the most deferred, most waiting first.
    keys: list[KeyBacklog] = field(default_factory=list)
    #: How many keys have something waiting.
    waiting_keys: int = 0
    #: A statement reached ROW_CAP: the counts are at least these.
    capped: bool = False


def _runnable() -> Any:
    return Workflow.state.in_(sorted(lateness.OVERDUE_WORKFLOW_STATES))


def _capped(rows: Sequence[Any]) -> tuple[Sequence[Any], bool]:
    return rows[:ROW_CAP], len(rows) > ROW_CAP


def backlog(session: Session, *, top: int = 10, now: datetime | None = None) -> list[LimitBacklog]:
    """Every limit (declared, or with executions under it) with its busiest keys."""
    now = now or utcnow()
    keys: dict[str, dict[str, KeyBacklog]] = {}
    capped: set[str] = set()

    def entry(slot: str) -> KeyBacklog:
        name, key = limits.split_slot(slot)
        return keys.setdefault(name, {}).setdefault(key, KeyBacklog(key))

    # Deferred: the deferred_on index, of workflows that would run.
    held = lateness.held_since_column()
    rows, over = _capped(
        session.execute(
            select(_ex.deferred_on, held, lateness.held_late_condition(now))
            .join(Workflow, Workflow.id == _ex.workflow_id)
            .where(_ex.deferred_on.is_not(None), _ex.state == StepState.SCHEDULED, _runnable())
            .limit(ROW_CAP + 1)
        ).all()
    )
    for slot, since, late in rows:
        item = entry(slot)
        item.deferred += 1
        item.late += 1 if late else 0
        item._older(_aware(since))
    if over:
        capped.update(limits.split_slot(r[0])[0] for r in rows)
    # Due and not tried yet: each slot column's index.
    for column in _SLOTS:
        rows, over = _capped(
            session.execute(
                select(column, _ex.scheduled_for)
                .join(Workflow, Workflow.id == _ex.workflow_id)
                .where(
                    column.is_not(None),
                    _ex.state == StepState.SCHEDULED,
                    _ex.deferred_on.is_(None),
                    _ex.scheduled_for <= now,
                    _runnable(),
                )
                .limit(ROW_CAP + 1)
            ).all()
        )
        for slot, due_at in rows:
            item = entry(slot)
            item.due += 1
            item._older(_aware(due_at))
        if over:
            capped.update(limits.split_slot(r[0])[0] for r in rows)
    # In use: grouped on the concurrency slot indexes (a slot is an execution in progress).
    for column in _SLOTS[:2]:
        for slot, count in session.execute(
            select(column, func.count())
            .where(column.is_not(None), _ex.state == StepState.IN_PROGRESS)
            .group_by(column)
        ):
            entry(slot).in_use += int(count)
    # The pace: executions under a slot that finished lately (the finished_at index).
    rows, over = _capped(
        session.execute(
            select(*_SLOTS)
            .where(_ex.finished_at > now - PACE_WINDOW, or_(*(c.is_not(None) for c in _SLOTS)))
            .order_by(_ex.finished_at.desc())
            .limit(ROW_CAP + 1)
        ).all()
    )
    for row in rows:
        for slot in {s for s in row if s is not None}:
            entry(slot).finished += 1
    if over:
        capped.update(limits.split_slot(s)[0] for row in rows for s in row if s is not None)
    declared = {limit.name: limit for limit in limits.declared_limits()}
    return [
        _limit(name, declared.get(name), keys.get(name, {}), top, name in capped)
        for name in sorted(set(declared) | set(keys))
    ]


def _limit(
    name: str, limit: limits.AnyLimit | None, keys: dict[str, KeyBacklog], top: int, capped: bool
) -> LimitBacklog:
    total = KeyBacklog("")
    for item in keys.values():
        total.due += item.due
        total.deferred += item.deferred
        total.late += item.late
        total.in_use += item.in_use
        total.finished += item.finished
        total._older(item.oldest)
    waiting = [k for k in keys.values() if k.waiting]
    by_waiting = sorted(waiting, key=lambda k: (-k.waiting, k.key))[:top]
    deferred = [k for k in waiting if k.deferred]
    by_deferred = sorted(deferred, key=lambda k: (-k.deferred, k.key))[:top]
    shown = {k.key: k for k in [*by_waiting, *by_deferred]}
    use = limits.LimitUse(
        name=name,
        kind=limit.kind if limit is not None else "concurrency",
        limit=limit.limit if limit is not None else None,
        per=limit.window if isinstance(limit, limits.RateLimit) else None,
        in_use=total.in_use,
        waiting=total.deferred,
        top_keys=[],
        keyed=limit is None or limit.key is not None,
    )
    return LimitBacklog(
        use=use,
        total=total,
        keys=sorted(shown.values(), key=lambda k: (-k.waiting, -k.deferred, k.key)),
        waiting_keys=len(waiting),
        capped=capped,
    )


def deferring_most(session: Session, count: int = 3) -> list[LimitBacklog]:
    """The limits holding the most back (deferred, then waiting), for the overview."""
    busy = [b for b in backlog(session, top=1) if b.total.waiting]
    return sorted(busy, key=lambda b: (-b.total.deferred, -b.total.waiting, b.use.name))[:count]


def _aware(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=utcnow().tzinfo)
    return None


__all__ = ["PACE_WINDOW", "KeyBacklog", "LimitBacklog", "backlog", "deferring_most"]
