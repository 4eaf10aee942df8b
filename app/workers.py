"""The workers an operator sees: the ``/workers`` page and ``geneva-drive workers``.

One read, :func:`workers_view`, for both: the live workers and those that stopped or expired
within :data:`RECENT` (housekeeping prunes older rows, engine/liveness.py), each with the steps
it is running now. Whether a worker is live, stopped or expired is
:func:`geneva_drive.liveness.state_of`'s answer, never a rule of this module's own.

Two things are pointed out, because they need an operator:

* **an expired worker still holding running steps**: its process died or stalled; the next
  dispatcher sweep recovers those steps (``settings.stuck_recovery_action``). If it stays on
  the page, no sweep is running (docs/MANUAL.md, "When a worker dies").
* **a live worker on another code version** than most live workers: a deploy in progress, or
  a worker a deploy left behind, which may run steps the new code renamed or removed.

No Flask here: the command runs where ``import flask`` fails (app/operator_cli.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from geneva_drive import liveness
from geneva_drive.models import StepExecution, Worker, utcnow
from geneva_drive.states import StepState
from geneva_drive.workflow import Workflow

#: Stopped and expired workers are listed this long after their last heartbeat (as long as
#: housekeeping keeps their rows).
RECENT = liveness.KEEP_STOPPED_FOR
#: The most workers one page lists (live first); a fleet larger than this is cut, and says so.
LIMIT = 500

#: The badge tone of each worker state (the word itself is always shown).
STATE_TONES = {"live": "ok", "expired": "bad", "stopped": "muted"}
#: Display order: the workers that run steps, then those that need a look, then the past.
STATE_ORDER = {"live": 0, "expired": 1, "stopped": 2}


@dataclass(frozen=True)
class RunningStep:
    """An ``in_progress`` execution a worker started."""

    execution_id: int
    workflow_id: int
    workflow_class: str
    step_name: str
    started_at: datetime | None


@dataclass(frozen=True)
class WorkerRow:
    """One worker as the page and the command show it."""

    id: int
    name: str
    hostname: str
    pid: int
    kind: str
    queues: list[str]
    code_version: str
    #: ``live``, ``stopped`` or ``expired`` (:func:`geneva_drive.liveness.state_of`).
    state: str
    started_at: datetime
    heartbeat_at: datetime
    stopped_at: datetime | None
    running: list[RunningStep] = field(default_factory=list)
    #: A live worker whose code version is not the one most live workers run.
    other_version: bool = False

    @property
    def state_tone(self) -> str:
        return STATE_TONES.get(self.state, "muted")

    @property
    def recovering(self) -> bool:
        """Expired (or stopped) with steps still in progress: the next sweep recovers them."""
        return self.state != "live" and bool(self.running)


@dataclass(frozen=True)
class WorkersView:
    """Every row of the page, and the figures above it."""

    rows: list[WorkerRow]
    #: The code version most live workers run (None without live workers).
    common_version: str | None
    #: How many distinct code versions the live workers run.
    live_versions: int
    #: True when more than :data:`LIMIT` workers matched (the oldest stopped ones are left off).
    truncated: bool
    taken_at: datetime

    def age(self, since: datetime) -> timedelta:
        """How long ago ``since`` was, in whole seconds ("for 40 s", not "for 40.3 s")."""
        return timedelta(seconds=max(0, int((self.taken_at - since).total_seconds())))

    def count(self, state: str) -> int:
        return sum(1 for row in self.rows if row.state == state)

    @property
    def recovering(self) -> list[WorkerRow]:
        return [row for row in self.rows if row.recovering]

    @property
    def other_version(self) -> list[WorkerRow]:
        return [row for row in self.rows if row.other_version]


def workers_view(session: Session, now: datetime | None = None) -> WorkersView:
    """The live workers, and those stopped or expired within :data:`RECENT` or still holding a
    running step (two queries: the workers, then their running steps)."""
    now = now or utcnow()
    holding = select(StepExecution.worker_id).where(
        StepExecution.state == StepState.IN_PROGRESS, StepExecution.worker_id.is_not(None)
    )
    workers = list(
        session.scalars(
            select(Worker)
            .where(or_(Worker.heartbeat_at >= now - RECENT, Worker.id.in_(holding)))
            .order_by(Worker.heartbeat_at.desc(), Worker.id.desc())
            .limit(LIMIT + 1)
        )
    )
    truncated = len(workers) > LIMIT
    workers = workers[:LIMIT]
    running = _running_steps(session, [w.id for w in workers])
    states = {w.id: liveness.state_of(w, now) for w in workers}
    versions = Counter(w.code_version for w in workers if states[w.id] == "live")
    common = _most_common(versions, workers, states)
    rows = [
        WorkerRow(
            id=w.id,
            name=w.name,
            hostname=w.hostname,
            pid=w.pid,
            kind=w.kind,
            queues=w.queue_list,
            code_version=w.code_version,
            state=states[w.id],
            started_at=w.started_at,
            heartbeat_at=w.heartbeat_at,
            stopped_at=w.stopped_at,
            running=running.get(w.id, []),
            other_version=states[w.id] == "live" and w.code_version != common,
        )
        for w in workers
    ]
    rows.sort(key=lambda r: (STATE_ORDER.get(r.state, 3), not r.recovering, r.name, r.id))
    return WorkersView(rows, common, len(versions), truncated, now)


def _most_common(
    versions: Counter[str], workers: list[Worker], states: dict[int, str]
) -> str | None:
    """The code version most live workers run; on a tie, the one the newest live worker runs
    (a deploy rolls the new version out by starting workers)."""
    if not versions:
        return None
    top = max(versions.values())
    tied = {version for version, count in versions.items() if count == top}
    newest = max(
        (w for w in workers if states[w.id] == "live" and w.code_version in tied),
        key=lambda w: (w.started_at, w.id),
    )
    return newest.code_version


def _running_steps(session: Session, worker_ids: list[int]) -> dict[int, list[RunningStep]]:
    if not worker_ids:
        return {}
    rows = session.execute(
        select(
            StepExecution.worker_id,
            StepExecution.id,
            StepExecution.workflow_id,
            Workflow.type,
            StepExecution.step_name,
            StepExecution.started_at,
        )
        .join(Workflow, Workflow.id == StepExecution.workflow_id)
        .where(
            StepExecution.state == StepState.IN_PROGRESS,
            StepExecution.worker_id.in_(worker_ids),
        )
        .order_by(StepExecution.started_at, StepExecution.id)
    )
    found: dict[int, list[RunningStep]] = {}
    for worker_id, execution_id, workflow_id, workflow_type, step_name, started_at in rows:
        assert worker_id is not None  # the query asks for these workers' executions only
        found.setdefault(worker_id, []).append(
            RunningStep(execution_id, workflow_id, workflow_type, step_name, started_at)
        )
    return found


def as_dict(row: WorkerRow, now: datetime) -> dict[str, object]:
    """One row for ``--json`` (times as ISO 8601 UTC, ages in seconds)."""
    return {
        "id": row.id,
        "name": row.name,
        "hostname": row.hostname,
        "pid": row.pid,
        "kind": row.kind,
        "queues": row.queues,
        "code_version": row.code_version,
        "state": row.state,
        "other_version": row.other_version,
        "recovering": row.recovering,
        "started_at": row.started_at.isoformat(),
        "heartbeat_at": row.heartbeat_at.isoformat(),
        "heartbeat_age_seconds": round(max(0.0, (now - row.heartbeat_at).total_seconds()), 1),
        "stopped_at": row.stopped_at.isoformat() if row.stopped_at else None,
        "running": [
            {
                "execution_id": step.execution_id,
                "workflow_id": step.workflow_id,
                "workflow_class": step.workflow_class,
                "step": step.step_name,
                "started_at": step.started_at.isoformat() if step.started_at else None,
            }
            for step in row.running
        ],
    }


def seconds_text(value: timedelta) -> str:
    """A setting's duration as the page says it: "30 s", "2.5 s"."""
    return f"{value.total_seconds():g} s"
