"""Worker liveness: a dead worker's steps run again within seconds, a live one's never.

Every process that runs steps - each Celery pool process, each embedded worker - registers a
row in ``geneva_drive_workers`` when it starts (:func:`start_worker`) and renews its
``heartbeat_at`` every ``settings.worker_heartbeat_interval`` from a thread of its own, whatever
its steps are doing. It is *live* while that heartbeat is younger than ``settings.worker_lease``
and it has not stopped. The statement that starts an execution records the worker
(``worker_id``, engine/transitions.py).

:func:`recover_expired` - run by every dispatcher sweep and by housekeeping - recovers each
``in_progress`` execution whose worker is not live, at once, through
``settings.stuck_recovery_action`` (engine/recovery.py: outcome ``recovered``, its concurrency
slot freed, the workflow reattempted or canceled). Each recovery is its own transaction and asks
again under the workflow lock, so several dispatchers recover a row once. An execution whose
worker is live is never recovered, however long its step runs; the age rule
(``stuck_in_progress_threshold``) remains only for executions with no worker recorded.

A worker that stops cleanly finishes or hands back its steps first, then sets ``stopped_at``
(:meth:`Heartbeat.stop`). A worker whose lease expired while it still ran (a stall, a lost
database connection) finds its execution recovered at finalize, and the executor discards the
attempt, writes included.

Timestamps come from each process's clock: the lease (30 s by default) absorbs the small skew
of hosts kept in time by NTP, not minutes of it (docs/MANUAL.md, "When a worker dies").
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import socket
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, or_, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from geneva_drive import current_worker, db, recovery, transport
from geneva_drive.celery_client import CeleryTransport
from geneva_drive.config import process_variable, settings
from geneva_drive.errors import ConfigurationError
from geneva_drive.instrumentation import report_error, worker_recovered
from geneva_drive.models import Lease, StepExecution, Worker, utcnow
from geneva_drive.registry import registered_workflows
from geneva_drive.states import StepState
from geneva_drive.workflow import Workflow

log = logging.getLogger(__name__)

KINDS = ("celery", "embedded")
#: Rows of workers that stopped or expired this long ago, with no execution in progress, are
#: deleted by housekeeping (:func:`prune`).
KEEP_STOPPED_FOR = timedelta(days=1)
_wk = Worker.__table__.c
_ex = StepExecution.__table__.c


# --- who is live ---------------------------------------------------------------------------------


def lease_cutoff(now: datetime) -> datetime:
    """A worker whose heartbeat is older than this is expired."""
    return now - settings.worker_lease


def is_live(worker: Worker | None, now: datetime | None = None) -> bool:
    if worker is None or worker.stopped_at is not None:
        return False
    return worker.heartbeat_at > lease_cutoff(now or utcnow())


def state_of(worker: Worker, now: datetime | None = None) -> str:
    """``live``, ``stopped`` (a clean stop) or ``expired`` (its heartbeat stopped)."""
    if worker.stopped_at is not None:
        return "stopped"
    return "live" if is_live(worker, now) else "expired"


def live_workers(session: Session, now: datetime | None = None) -> list[Worker]:
    """The live workers, oldest first."""
    query = (
        select(Worker)
        .where(Worker.stopped_at.is_(None), Worker.heartbeat_at > lease_cutoff(now or utcnow()))
        .order_by(Worker.started_at, Worker.id)
    )
    return list(session.scalars(query))


def _expired_condition(now: datetime) -> object:
    """Executions in progress on a worker that is not live (or whose row is gone)."""
    return or_(
        _wk.id.is_(None),
        _wk.stopped_at.is_not(None),
        _wk.heartbeat_at <= lease_cutoff(now),
    )


def expired_execution_ids(session: Session, now: datetime, limit: int) -> list[int]:
    """In-progress executions whose worker is not live, oldest start first."""
    query = (
        select(_ex.id)
        .select_from(StepExecution.__table__.outerjoin(Worker.__table__, _wk.id == _ex.worker_id))
        .where(
            _ex.state == StepState.IN_PROGRESS,
            _ex.worker_id.is_not(None),
            _expired_condition(now),  # type: ignore[arg-type]
        )
        .order_by(_ex.started_at, _ex.id)
        .limit(limit)
    )
    return list(session.scalars(query))


# --- recovery ------------------------------------------------------------------------------------


def recover_expired(session: Session | None = None, now: datetime | None = None) -> int:
    """Recover every in-progress execution whose worker is not live; return how many.

    ``session`` is only read (the candidates); each recovery runs in a transaction of its own.
    A row another dispatcher recovers first, or whose worker renewed its lease meanwhile, is
    left alone (asked again under the lock).
    """
    moment = now or utcnow()
    batch = settings.housekeeping_batch_size
    excluded: set[int] = set()
    recovered = 0
    while True:
        if session is not None:
            ids = expired_execution_ids(session, moment, batch + len(excluded))
        else:
            with db.new_session() as own:
                ids = expired_execution_ids(own, moment, batch + len(excluded))
        ids = [execution_id for execution_id in ids if execution_id not in excluded]
        if not ids:
            return recovered
        for execution_id in ids:
            try:
                done = recovery.recover_execution(
                    execution_id,
                    lambda s, ex: _still_expired(s, ex, moment),
                    reason="expired worker's",
                    after=_announce,
                )
            except Exception as error:
                log.error("Failed to recover step execution %s: %s", execution_id, error)
                report_error(error, {"component": "liveness", "step_execution_id": execution_id})
                done = False
            if done:
                recovered += 1
            else:
                excluded.add(execution_id)
        if len(ids) < batch:
            return recovered


def recover_abandoned(worker_id: int) -> int:
    """Recover the executions this process's worker ``worker_id`` started and could not finish
    (a finalize whose connection died, a hook that raised): they are in progress under a live
    worker, whose lease never expires for them. Run by the heartbeat, so within one
    ``worker_heartbeat_interval``; the ones recovery cannot take now (the workflow is busy, the
    database is down) are tried again at the next beat. Returns how many were recovered."""
    recovered = 0
    for execution_id in current_worker.abandoned(worker_id):
        done = recovery.recover_execution(
            execution_id,
            lambda _s, ex: ex.state == StepState.IN_PROGRESS and ex.worker_id == worker_id,
            reason="abandoned",
        )
        if done:
            recovered += 1
            current_worker.settled(execution_id)
            continue
        with db.new_session() as session:
            row = session.get(StepExecution, execution_id)
            if row is None or row.state != StepState.IN_PROGRESS or row.worker_id != worker_id:
                current_worker.settled(execution_id)  # moved on: someone else settled it
    return recovered


def _still_expired(session: Session, execution: StepExecution, now: datetime) -> bool:
    if execution.state != StepState.IN_PROGRESS or execution.worker_id is None:
        return False
    worker = session.get(Worker, execution.worker_id, populate_existing=True)
    return not is_live(worker, now)


def _announce(workflow: Workflow, execution: StepExecution) -> None:
    with db.new_session() as session:
        worker = session.get(Worker, execution.worker_id) if execution.worker_id else None
        name = worker.name if worker is not None else f"#{execution.worker_id}"
    log.warning(
        "worker %s is not live (no heartbeat within %s s): execution %s of %s #%s (%s) "
        "recovered (%s)",
        name,
        settings.worker_lease.total_seconds(),
        execution.id,
        type(workflow).__name__,
        workflow.id,
        execution.step_name,
        settings.stuck_recovery_action,
    )
    if worker_recovered.receivers:
        worker_recovered.send(
            "engine",
            execution_id=execution.id,
            workflow_id=workflow.id,
            workflow_class=type(workflow).__name__,
            workflow_type=workflow.type,
            step_name=execution.step_name,
            worker_id=execution.worker_id,
            worker_name=name,
            action=settings.stuck_recovery_action,
        )


def prune(now: datetime | None = None) -> int:
    """Delete the rows of workers stopped or expired over ``KEEP_STOPPED_FOR`` ago that hold no
    execution in progress; return how many."""
    cutoff = (now or utcnow()) - KEEP_STOPPED_FOR
    holding = select(_ex.worker_id).where(
        _ex.state == StepState.IN_PROGRESS, _ex.worker_id.is_not(None)
    )
    with db.transaction() as session:
        result = session.execute(
            delete(Worker)
            .where(
                or_(Worker.stopped_at < cutoff, Worker.heartbeat_at < cutoff),
                Worker.id.not_in(holding),
            )
            .execution_options(synchronize_session=False)
        )
        return int(result.rowcount or 0)  # type: ignore[attr-defined]


# --- being a worker ------------------------------------------------------------------------------


def code_version(workflows: Iterable[tuple[str, type[Workflow]]] | None = None) -> str:
    """``GENEVA_CODE_VERSION`` if set, else a short digest of the registered workflow classes'
    step plans (their names, steps in order, removed steps): what ``check-deploy`` compares, so
    two workers with different plans show different versions."""
    given = process_variable("GENEVA_CODE_VERSION")
    if given:
        return given[:64]
    digest = hashlib.sha256()
    for name, cls in sorted(workflows if workflows is not None else registered_workflows().items()):
        plan = ",".join(
            f"{step.name}{'-' if step.removed else ''}{'?' if step.parks else ''}"
            for step in cls.steps
        )
        digest.update(f"{name}:{plan};".encode())
    return digest.hexdigest()[:12]


def check_settings() -> None:
    """Refuse a lease that one late heartbeat would let expire."""
    interval = settings.worker_heartbeat_interval
    lease = settings.worker_lease
    if interval <= timedelta(0):
        raise ConfigurationError(
            "GENEVA_WORKER_HEARTBEAT_INTERVAL must be positive (seconds between a worker's "
            f"heartbeats), got {interval.total_seconds()}"
        )
    if lease < 2 * interval:
        raise ConfigurationError(
            f"GENEVA_WORKER_LEASE ({lease.total_seconds()} s) must be at least twice "
            f"GENEVA_WORKER_HEARTBEAT_INTERVAL ({interval.total_seconds()} s): otherwise one late "
            "heartbeat expires a live worker and its running steps are recovered and run twice"
        )


@dataclass
class Heartbeat:
    """A registered worker and the thread that renews its lease."""

    worker_id: int
    name: str
    _stop: threading.Event
    _thread: threading.Thread | None = None
    _pid: int = 0

    def start(self) -> None:
        self._pid = os.getpid()
        self._thread = threading.Thread(
            target=self._loop, name=f"geneva-heartbeat-{self.worker_id}", daemon=True
        )
        self._thread.start()

    def _loop(self) -> None:
        lost = False
        while not self._stop.wait(settings.worker_heartbeat_interval.total_seconds()):
            try:
                now = utcnow()
                with db.transaction() as session:
                    previous = session.scalar(
                        select(Worker.heartbeat_at).where(Worker.id == self.worker_id)
                    )
                    session.execute(
                        update(Worker)
                        .where(Worker.id == self.worker_id, Worker.stopped_at.is_(None))
                        .values(heartbeat_at=now)
                        .execution_options(synchronize_session=False)
                    )
                if previous is not None and previous <= lease_cutoff(now):
                    log.warning(
                        "worker %s renewed its heartbeat after its lease had expired (last "
                        "beat %s): any step it was running was recovered, and that attempt "
                        "will be discarded at its end",
                        self.name,
                        previous.isoformat(),
                    )
                if lost:
                    log.info("worker %s: heartbeat renewed again", self.name)
                lost = False
            except Exception as error:
                if not lost:
                    log.warning("worker %s could not renew its heartbeat: %s", self.name, error)
                lost = True
                continue
            try:
                recover_abandoned(self.worker_id)
            except Exception as error:
                # Tried again at the next beat; the database may be down for a moment.
                log.warning(
                    "worker %s could not recover the steps it abandoned: %s", self.name, error
                )

    def beat(self, now: datetime | None = None) -> None:
        """Renew the heartbeat once, now (tests; the thread does this on its own)."""
        with db.transaction() as session:
            session.execute(
                update(Worker)
                .where(Worker.id == self.worker_id)
                .values(heartbeat_at=now or utcnow())
                .execution_options(synchronize_session=False)
            )

    def stop(self, *, clean: bool = True) -> None:
        """Stop renewing. ``clean``: the worker's steps have finished or were handed back, so
        the row is marked stopped (never recovered again); otherwise it simply expires."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        if current_worker.get() == self.worker_id:
            current_worker.set_process(None)
        if not clean or os.getpid() != self._pid:
            return
        try:
            with db.transaction() as session:
                session.execute(
                    update(Worker)
                    .where(Worker.id == self.worker_id)
                    .values(stopped_at=utcnow())
                    .execution_options(synchronize_session=False)
                )
            log.info("worker %s stopped", self.name)
        except Exception as error:
            # It will expire instead: its steps (none, on a clean stop) are recovered then.
            log.warning("worker %s could not record its stop: %s", self.name, error)


def register(kind: str, queues: Iterable[str] = (), *, name: str | None = None) -> Heartbeat:
    """Write this process's worker row (not yet renewed: :meth:`Heartbeat.start`)."""
    if kind not in KINDS:
        raise ConfigurationError(f"worker kind must be one of {KINDS}, got {kind!r}")
    check_settings()
    hostname = socket.gethostname()[:200]
    pid = os.getpid()
    name = name or f"{kind}@{hostname}/{pid}"
    now = utcnow()
    row = Worker(
        name=name[:255],
        hostname=hostname,
        pid=pid,
        kind=kind,
        queues=",".join(sorted(set(queues)))[:1024],
        code_version=code_version(),
        started_at=now,
        heartbeat_at=now,
    )
    with db.transaction() as session:
        session.add(row)
        session.flush()
        worker_id = row.id
    return Heartbeat(worker_id=worker_id, name=name, _stop=threading.Event())


def start_worker(
    kind: str, queues: Iterable[str] = (), *, name: str | None = None, process: bool = True
) -> Heartbeat:
    """Register this process (``process``) or the calling code's threads as a worker and start
    its heartbeat thread. A process-wide worker is stopped cleanly at interpreter exit."""
    heartbeat = register(kind, queues, name=name)
    heartbeat.start()
    if process:
        current_worker.set_process(heartbeat.worker_id, heartbeat.name)
        atexit.register(heartbeat.stop)
    log.info(
        "worker %s registered (id %s; lease %s s, heartbeat every %s s)",
        heartbeat.name,
        heartbeat.worker_id,
        settings.worker_lease.total_seconds(),
        settings.worker_heartbeat_interval.total_seconds(),
    )
    return heartbeat


# --- one at a time -------------------------------------------------------------------------------


@contextmanager
def hold_lease(name: str, duration: timedelta, holder: str | None = None) -> Iterator[bool]:
    """Hold the named lease for the block if no one else holds it; yields whether it did.

    Used so that two housekeeping runs (two beats, a beat and a ``geneva-drive dispatcher``)
    never overlap. While the block runs, a thread renews the lease every third of ``duration``;
    a holder that dies (or is killed mid-run) lets it lapse within ``duration``.
    """
    me = (holder or f"{socket.gethostname()[:200]}/{os.getpid()}/{threading.get_ident()}")[:255]
    if not _take_lease(name, me, duration):
        yield False
        return
    done = threading.Event()

    def renew() -> None:
        while not done.wait(duration.total_seconds() / 3):
            try:
                with db.transaction() as session:
                    session.execute(
                        update(Lease)
                        .where(Lease.name == name, Lease.holder == me)
                        .values(expires_at=utcnow() + duration)
                        .execution_options(synchronize_session=False)
                    )
            except Exception as error:
                log.warning("could not renew lease %s: %s", name, error)

    renewer = threading.Thread(target=renew, name=f"geneva-lease-{name}", daemon=True)
    renewer.start()
    _held[(name, me)] = done
    try:
        yield True
    finally:
        done.set()
        renewer.join(5.0)
        _held.pop((name, me), None)
        _hand_back(name, me)


#: Leases this process holds now, handed back at exit too: a housekeeping run in a daemon
#: thread (beat's) is cut short when its process exits, without reaching its ``finally``.
_held: dict[tuple[str, str], threading.Event] = {}


def _hand_back(name: str, me: str) -> None:
    try:
        with db.transaction() as session:
            session.execute(
                update(Lease)
                .where(Lease.name == name, Lease.holder == me)
                .values(expires_at=utcnow())
                .execution_options(synchronize_session=False)
            )
    except Exception as error:
        log.warning("could not hand back lease %s (it lapses by itself): %s", name, error)


@atexit.register
def _hand_back_all() -> None:
    for (name, me), done in list(_held.items()):
        done.set()
        _hand_back(name, me)


def _take_lease(name: str, me: str, duration: timedelta) -> bool:
    now = utcnow()
    with db.transaction() as session:
        db.begin_write(session)
        taken = session.execute(
            update(Lease)
            .where(Lease.name == name, Lease.expires_at <= now)
            .values(holder=me, expires_at=now + duration)
            .execution_options(synchronize_session=False)
        ).rowcount  # type: ignore[attr-defined]
    if taken:
        return True
    try:
        with db.transaction() as session:
            session.add(Lease(name=name, holder=me, expires_at=now + duration))
        return True
    except IntegrityError:
        return False  # someone holds it (the row exists and has not lapsed)


# --- publishers and the queues the workers consume ---------------------------------------------


def publishing_queue() -> str | None:
    """The queue this process sends a step without a ``queue`` job option to (its Celery app's
    default queue), or None when its transport is not Celery's (embedded, a test's)."""
    current = transport.get_transport()
    if not isinstance(current, CeleryTransport):
        return None
    return str(current.celery.conf.task_default_queue)


def require_fed_queue(role: str, session: Session | None = None) -> None:
    """Refuse to start ``role`` when live Celery workers are registered and none of them
    consumes the queue this process would send default steps to (a Flask-free CLI sending to
    ``default`` while a host's workers consume ``celery``): its messages would wait unread
    until the dispatcher sent them again. With no live Celery worker there is nothing to
    compare against, and it passes."""
    queue = publishing_queue()
    if queue is None:
        return
    query = select(Worker.queues).where(
        Worker.kind == "celery",
        Worker.stopped_at.is_(None),
        Worker.heartbeat_at > lease_cutoff(utcnow()),
    )
    try:
        if session is not None:
            rows = list(session.scalars(query))
        else:
            with db.new_session() as own:
                rows = list(own.scalars(query))
    except SQLAlchemyError as error:
        # A schema before worker liveness (not migrated yet): nothing to compare with. Said,
        # not hidden; the process's other checks name the migration.
        log.warning(
            "%s: could not read the workers' queues (%s); run geneva-drive migrate", role, error
        )
        if session is not None:
            session.rollback()
        return
    consumed = {name for row in rows for name in row.split(",") if name}
    if not rows or not consumed or queue in consumed:
        return
    raise ConfigurationError(
        f"{role} would send steps without a queue option to Celery queue {queue!r}, but no live "
        f"worker consumes it (the live workers consume: {', '.join(sorted(consumed))}). Set "
        "GENEVA_DEFAULT_QUEUE to the queue your workers' Celery app uses by default (Celery's "
        "own default is 'celery'), or start the workers with -Q including "
        f"{queue!r}. Nothing was sent."
    )
