"""Crashes and faults with real processes: SIGKILL a worker inside a step body (one holding a
concurrency slot too), inside finalize and between commit and send; restart the broker while
messages are in flight; drop the database connection in the middle of a step.

After recovery (the dispatcher's sweep and housekeeping, run here with small thresholds, and
the killed workers aged past their lease)
every workflow ends where it would have ended without the fault, no execution row ran its
body twice, no committed step ran again, and the invariant checker finds nothing.

SQLite and PostgreSQL (per GENEVA_TEST_DATABASE_URL); the broker tests use a private
redis-server on a free port, started and killed by its own PID (never the machine's 6379).
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.engine.url import make_url

from geneva_drive import db, dispatch, housekeeping
from geneva_drive.celery import CeleryTransport, make_celery
from geneva_drive.config import settings
from geneva_drive.models import StepExecution, Worker, utcnow
from geneva_drive.testing import expire_worker
from geneva_drive.transport import NullTransport
from tests.integration.conftest import (
    BIN,
    Process,
    SharedDatabase,
    create_workflow,
    executions,
    process_env,
    wait_for_state,
    wait_until,
    workflow_state,
)
from tests.reliability.chaos import free_port
from tests.reliability.crash_flows import (
    CrashBodyWorkflow,
    CrashChildWorkflow,
    CrashDbDropWorkflow,
    CrashFinalizeWorkflow,
    CrashInlineWorkflow,
    CrashLimitWorkflow,
    CrashManyWorkflow,
    CrashNapDbWorkflow,
    CrashNapWorkflow,
    CrashParentWorkflow,
    CrashSendWorkflow,
    Ledger,
)
from tests.reliability.invariants import assert_invariants

pytestmark = pytest.mark.integration

MODULES = "tests.integration.flows,tests.reliability.crash_flows"


def _hung(log: Path, what: str, timeout: float = 60.0) -> None:
    wait_until(
        lambda: log.exists() and f" {what}" in log.read_text() and " hang " in log.read_text(),
        timeout,
        f"a worker to hang in {what}",
    )


def recover(*, in_progress_after: float = 0.3) -> None:
    """What the dispatcher process does after a crash: housekeeping (stuck rows) and the
    dispatch sweep (unsent or lost messages), with thresholds small enough for a test.

    ``in_progress_after`` must exceed the longest healthy step while workers run: recovery
    of a live execution runs its step a second time (that is what the threshold is for).
    """
    settings.stuck_in_progress_threshold = in_progress_after
    settings.stuck_scheduled_threshold = 2
    settings.dispatch_resend_after = 0.5
    time.sleep(0.6)
    _expire_dead_workers()
    housekeeping.run()
    dispatch.dispatch_due()


def _expire_dead_workers() -> None:
    """Age past their lease the workers whose process is gone (every worker here runs on this
    machine): what ``worker_lease`` seconds after the kill would do, without the wait. A live
    worker keeps its lease, so its running steps are never recovered."""
    with db.new_session() as session:
        rows = session.execute(select(Worker.id, Worker.pid).where(Worker.stopped_at.is_(None)))
        dead = [worker_id for worker_id, pid in rows if not _alive(pid)]
    for worker_id in dead:
        expire_worker(worker_id)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (killed, not yet reaped by its parent) answers signal 0 but runs nothing.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


class EmbeddedWorkers:
    """``geneva-drive worker`` processes (no broker; the execution table is the queue)."""

    def __init__(self, database: SharedDatabase, directory: Path, procs: list[Process]) -> None:
        self.database = database
        self.directory = directory
        self.procs = procs
        self.log = directory / "steps.log"
        self.count = 0

    def start(self, url: str | None = None, **env: str) -> Process:
        self.count += 1
        environment = process_env(self.database, self.log, GENEVA_WORKFLOW_MODULES=MODULES, **env)
        if url is not None:
            environment["GENEVA_DATABASE_URL"] = url
        process = Process(
            [
                str(BIN / "geneva-drive"),
                "worker",
                "--concurrency",
                "2",
                "--poll-interval",
                "0.02",
                "--no-housekeeping",
            ],
            environment,
            self.directory / f"worker-{self.count}.log",
        )
        self.procs.append(process)
        process.wait_for_output("embedded worker running", timeout=60)
        return process

    def ledger(self) -> Ledger:
        return Ledger(self.log)


@pytest.fixture
def embedded(
    shared_database: SharedDatabase,
    short_horizon: None,
    restore_settings: None,
    use_transport,
    processes: list[Process],
    tmp_path: Path,
) -> EmbeddedWorkers:
    use_transport(NullTransport())  # the embedded workers poll; the test sends nothing
    return EmbeddedWorkers(shared_database, tmp_path, processes)


def _assert_no_execution_ran_twice(ledger: Ledger, event_name: str = "start") -> None:
    twice = {x: n for x, n in ledger.runs_per_execution(event_name).items() if n > 1}
    assert not twice, f"execution rows whose body ran more than once: {twice}"


# --- SIGKILL inside a step body ---------------------------------------------------------------


def test_sigkill_inside_a_step_body(embedded: EmbeddedWorkers, shared_database) -> None:
    worker = embedded.start(GENEVA_CRASH_HANG_BODY="1")
    ids = [create_workflow(CrashBodyWorkflow) for _ in range(2)]
    wait_until(
        lambda: embedded.log.exists() and embedded.log.read_text().count(" body hang ") == 2,
        60,
        "both bodies to hang",
    )
    worker.kill()
    for workflow_id in ids:
        assert workflow_state(workflow_id) == "performing"
    assert_invariants(shared_database.engine)

    recover()
    embedded.start()  # the replacement worker (the hook is disarmed: it fired once per workflow)
    for workflow_id in ids:
        wait_for_state(workflow_id, "finished", timeout=60)
    ledger = embedded.ledger()
    for workflow_id in ids:
        # The killed body ran again in a new execution row; nothing after it ran twice.
        assert ledger.count(workflow_id, "body", "start") == 2
        assert ledger.count(workflow_id, "body", "end") == 1
        assert ledger.count(workflow_id, "after", "start") == 1
        states = [(e.step_name, e.state, e.outcome) for e in executions(workflow_id)]
        assert states == [
            ("body", "completed", "recovered"),
            ("body", "completed", "success"),
            ("after", "completed", "success"),
        ]
    _assert_no_execution_ran_twice(ledger)
    assert_invariants(shared_database.engine, quiescent=True)


# --- SIGKILL inside finalize ------------------------------------------------------------------


def test_sigkill_inside_finalize(embedded: EmbeddedWorkers, shared_database) -> None:
    worker = embedded.start(GENEVA_CRASH_HANG_FINALIZE="1")
    workflow_id = create_workflow(CrashFinalizeWorkflow)
    _hung(embedded.log, "finalize")
    worker.kill()
    # Finalize never committed: the execution is still in_progress, nothing was scheduled.
    assert workflow_state(workflow_id) == "performing"
    assert [(e.step_name, e.state) for e in executions(workflow_id)] == [("work", "in_progress")]
    assert_invariants(shared_database.engine)

    recover()
    embedded.start()
    wait_for_state(workflow_id, "finished", timeout=60)
    ledger = embedded.ledger()
    assert ledger.count(workflow_id, "work", "start") == 2  # its result was never committed
    assert ledger.count(workflow_id, "after", "start") == 1
    _assert_no_execution_ran_twice(ledger)
    assert_invariants(shared_database.engine, quiescent=True)


# --- SIGKILL while holding a concurrency slot --------------------------------------------------


def test_sigkill_while_holding_a_concurrency_slot(
    embedded: EmbeddedWorkers, shared_database
) -> None:
    """A worker is killed inside a step holding the only slot of its limit, with another
    execution deferred on it. The dead worker's slot stays taken (a replacement worker still
    defers the waiter) until stuck recovery ends the dead execution: then the waiter, the
    oldest in line, gets the slot and runs, and the recovered workflow's rerun after it."""
    worker = embedded.start(GENEVA_CRASH_HANG_LIMIT="1")
    holder = create_workflow(CrashLimitWorkflow)
    _hung(embedded.log, "limit")
    waiter = create_workflow(CrashLimitWorkflow)
    wait_until(
        lambda: executions(waiter)[0].deferred_on == "crash-slot/", 60, "the waiter's deferral"
    )
    worker.kill()
    assert [(e.state, e.outcome) for e in executions(holder)] == [("in_progress", None)]
    assert_invariants(shared_database.engine)

    embedded.start()  # no hang: the hook is not armed here
    # A deferred execution looks again when woken or at its backstop; make it due now, as a
    # stray message would: the slot is still held by the dead worker's execution.
    with db.transaction() as session:
        session.execute(
            update(StepExecution)
            .where(StepExecution.workflow_id == waiter)
            .values(scheduled_for=utcnow())
        )
    wait_until(
        lambda: executions(waiter)[0].scheduled_for > utcnow() + timedelta(seconds=5),
        60,
        "the replacement worker to defer the waiter again",
    )
    assert [(e.state, e.deferred_on) for e in executions(waiter)] == [("scheduled", "crash-slot/")]
    assert embedded.ledger().count(waiter, "body", "start") == 0

    recover()  # ends the dead execution: its slot frees, the waiter is woken
    # Woken by the recovery, not found by its backstop (RECHECK_AFTER, 30 s) later.
    wait_for_state(waiter, "finished", timeout=20)
    wait_for_state(holder, "finished", timeout=60)
    assert [(e.state, e.outcome) for e in executions(waiter)] == [("completed", "success")]
    assert [(e.state, e.outcome) for e in executions(holder)] == [
        ("completed", "recovered"),
        ("completed", "success"),
    ]
    ledger = embedded.ledger()
    # One slot: after the kill, each body ran alone, the waiter (older in line) first.
    assert [(wf, e) for wf, _s, e, _x in ledger.lines] == [
        (holder, "start"),
        (holder, "hang"),
        (waiter, "start"),
        (waiter, "end"),
        (holder, "start"),
        (holder, "end"),
    ]
    _assert_no_execution_ran_twice(ledger)
    assert_invariants(shared_database.engine, quiescent=True)


# --- SIGKILL during a child workflow's join -----------------------------------------------------


def test_sigkill_while_a_child_reports_its_end_to_the_parent(
    embedded: EmbeddedWorkers, shared_database
) -> None:
    """A worker dies in the finalize of a child's last step, after the child's end was written
    to its parent (the signal, the counter) and before the commit. Both roll back together:
    after recovery the child's step runs again and reports then; the parent's join runs once."""
    worker = embedded.start(GENEVA_CRASH_HANG_CHILD_FINALIZE="1")
    parent_id = create_workflow(CrashParentWorkflow)
    _hung(embedded.log, "finalize")
    worker.kill()
    assert workflow_state(parent_id) == "ready"  # parked on its join, or about to
    assert_invariants(shared_database.engine)

    recover()
    embedded.start()
    wait_for_state(parent_id, "finished", timeout=90)
    ledger = embedded.ledger()
    assert ledger.count(parent_id, "join", "start") == 1
    with db.new_session() as session:
        from sqlalchemy import func, select

        from geneva_drive.children import CHILD_ENDED
        from geneva_drive.models import Signal
        from geneva_drive.workflow import Workflow

        kids = list(session.scalars(select(Workflow).where(Workflow.parent_id == parent_id)))
        assert [type(k) for k in kids] == [CrashChildWorkflow] * 2
        assert {k.state for k in kids} == {"finished"}
        parent = session.get(Workflow, parent_id)
        assert parent is not None and parent.children_open == 0
        reports = session.scalar(
            select(func.count()).where(Signal.workflow_id == parent_id, Signal.name == CHILD_ENDED)
        )
        assert reports == 2
    _assert_no_execution_ran_twice(ledger)
    assert_invariants(shared_database.engine, quiescent=True)


# --- the database connection dropped mid-step (PostgreSQL, MariaDB) ----------------------------


@contextmanager
def _killable_connections(shared_database) -> Iterator[tuple[str, Callable[[], int]]]:  # type: ignore[no-untyped-def]
    """A database URL for a worker, and a function that ends every connection opened with it
    from the server side (how many it ended), as a server restart or an idle kill would.

    PostgreSQL tags the connections with ``application_name``. MariaDB shows no client tag
    without performance_schema, so the worker connects as a user of its own, dropped after.
    """
    tag = f"gd_crash_{uuid.uuid4().hex[:8]}"
    engine = shared_database.engine
    if shared_database.schema is not None:

        def kill_pg() -> int:
            with engine.begin() as connection:
                return int(
                    connection.execute(
                        text(
                            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                            "WHERE application_name = :name"
                        ),
                        {"name": tag},
                    ).scalar_one()
                )

        yield f"{shared_database.url}&application_name={tag}", kill_pg
        return
    if shared_database.database is None:
        pytest.skip("ending a connection from the server side needs PostgreSQL or MariaDB")
    with engine.begin() as connection:
        connection.execute(text(f"CREATE USER '{tag}'@'%'"))
        connection.execute(text(f"GRANT ALL ON `{shared_database.database}`.* TO '{tag}'@'%'"))

    def kill_mysql() -> int:
        with engine.begin() as connection:
            ids = connection.execute(
                text("SELECT id FROM information_schema.processlist WHERE user = :user"),
                {"user": tag},
            ).scalars()
            killed = 0
            for connection_id in list(ids):
                connection.execute(text(f"KILL CONNECTION {int(connection_id)}"))
                killed += 1
            return killed

    url = make_url(shared_database.url).set(username=tag, password=None)
    try:
        yield url.render_as_string(hide_password=False), kill_mysql
    finally:
        with engine.begin() as connection:
            connection.execute(text(f"DROP USER IF EXISTS '{tag}'@'%'"))


def test_database_connection_terminated_mid_step(
    embedded: EmbeddedWorkers, shared_database
) -> None:
    with _killable_connections(shared_database) as (url, kill):
        embedded.start(url=url)
        workflow_id = create_workflow(CrashDbDropWorkflow)
        wait_until(
            lambda: embedded.ledger().count(workflow_id, "walk", "item-3") >= 1, 60, "item 3"
        )
        killed = kill()
        assert killed >= 1
        _after_the_mid_step_drop(embedded, shared_database, workflow_id)


def _after_the_mid_step_drop(embedded: EmbeddedWorkers, shared_database, workflow_id: int) -> None:  # type: ignore[no-untyped-def]

    # No housekeeping needed: the checkpoint that lost its connection ends the execution as
    # an interruption, and the successor continues from the last committed cursor.
    wait_for_state(workflow_id, "finished", timeout=60)
    kinds = [(e.step_name, e.state, e.outcome) for e in executions(workflow_id)]
    assert ("walk", "completed", "continued") in kinds, kinds
    ledger = embedded.ledger()
    items = [ledger.count(workflow_id, "walk", f"item-{n}") for n in range(12)]
    assert all(count >= 1 for count in items), items
    # Only the item in flight when the connection died may run again (it was not checkpointed).
    assert sum(items) <= 13, items
    assert ledger.count(workflow_id, "after", "start") == 1
    assert_invariants(shared_database.engine, quiescent=True)


@pytest.mark.parametrize("flow", [CrashNapWorkflow, CrashNapDbWorkflow])
def test_database_connections_terminated_while_a_plain_step_runs(
    embedded: EmbeddedWorkers, shared_database, flow
) -> None:
    """CrashNapWorkflow's body holds no connection: finalize gets a fresh one (pre-ping) and
    commits. CrashNapDbWorkflow's body uses its session's dead connection afterwards: the
    failure must be recorded at once (the policy reattempts), not left in_progress."""
    with _killable_connections(shared_database) as (url, kill):
        embedded.start(url=url)
        workflow_id = create_workflow(flow)
        wait_until(lambda: embedded.ledger().count(workflow_id, "nap", "start") >= 1, 60, "the nap")
        kill()
        wait_for_state(workflow_id, "finished", timeout=30)
    ledger = embedded.ledger()
    assert ledger.count(workflow_id, "nap", "end") == 1
    assert ledger.count(workflow_id, "nap", "start") == (1 if flow is CrashNapWorkflow else 2)
    assert ledger.count(workflow_id, "after", "start") == 1
    _assert_no_execution_ran_twice(ledger)
    assert_invariants(shared_database.engine, quiescent=True)


# --- Celery on a private Redis: between commit and send; broker restart ---------------------------


class PrivateRedis:
    """A redis-server of our own on a free port, no persistence; killed by its own PID."""

    def __init__(self, directory: Path, procs: list[Process]) -> None:
        self.port = free_port()
        self.directory = directory
        self.procs = procs
        self.process: Process | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = Process(
            [
                shutil.which("redis-server") or "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
            ],
            {"PATH": "/usr/bin:/bin"},
            self.directory / f"redis-{len(self.procs)}.log",
        )
        self.procs.append(self.process)
        self.process.wait_for_output("Ready to accept connections", timeout=30)

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()


@pytest.fixture
def private_redis(processes: list[Process], tmp_path: Path) -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = PrivateRedis(tmp_path, processes)
    server.start()
    yield server


class CeleryWorker:
    def __init__(
        self, database: SharedDatabase, redis: PrivateRedis, directory: Path, procs: list[Process]
    ) -> None:
        self.database = database
        self.redis = redis
        self.directory = directory
        self.procs = procs
        self.queue = f"gd-crash-{uuid.uuid4().hex[:8]}"
        self.log = directory / "steps.log"
        celery = make_celery(redis.url)
        celery.conf.task_default_queue = self.queue
        celery.conf.broker_connection_retry = False
        celery.conf.broker_transport_options = {"max_retries": 1}
        self.transport = CeleryTransport(celery)
        self.count = 0

    def start(self, **env: str) -> Process:
        self.count += 1
        environment = process_env(
            self.database,
            self.log,
            GENEVA_BROKER_URL=self.redis.url,
            GENEVA_DEFAULT_QUEUE=self.queue,
            GENEVA_WORKFLOW_MODULES=MODULES,
            **env,
        )
        process = Process(
            [
                str(BIN / "celery"),
                "-A",
                "geneva_drive.celery",
                "worker",
                "--pool=prefork",
                "-c",
                "2",
                "--loglevel=INFO",
                "-Q",
                self.queue,
                "-n",
                f"{self.queue}-{self.count}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
            environment,
            self.directory / f"celery-{self.count}.log",
        )
        self.procs.append(process)
        process.wait_for_output(" ready.", timeout=60)
        return process

    def ledger(self) -> Ledger:
        return Ledger(self.log)


@pytest.fixture
def celery_worker(
    shared_database: SharedDatabase,
    private_redis: PrivateRedis,
    short_horizon: None,
    restore_settings: None,
    use_transport,
    processes: list[Process],
    tmp_path: Path,
) -> Iterator[CeleryWorker]:
    worker = CeleryWorker(shared_database, private_redis, tmp_path, processes)
    use_transport(worker.transport)
    yield worker
    worker.transport.celery.close()


def test_sigkill_between_commit_and_send(celery_worker: CeleryWorker, shared_database) -> None:
    # The published path: with inline successors the worker would run ``two`` itself and
    # send nothing (test_sigkill_between_the_commit_and_an_inline_successor covers that).
    worker = celery_worker.start(GENEVA_CRASH_HANG_SEND="1", GENEVA_INLINE_SUCCESSORS="false")
    workflow_id = create_workflow(CrashSendWorkflow)
    _hung(celery_worker.log, "send:")
    worker.kill()
    one, two = executions(workflow_id)
    assert (one.state, one.outcome) == ("completed", "success")
    assert two.state == "scheduled" and two.sent_at is not None  # committed as sent, never sent
    assert workflow_state(workflow_id) == "ready"
    assert_invariants(shared_database.engine, quiescent=True)

    celery_worker.start()
    recover()  # the dispatcher resends what was marked sent but never started
    wait_for_state(workflow_id, "finished", timeout=60)
    ledger = celery_worker.ledger()
    assert ledger.count(workflow_id, "one", "start") == 1
    assert ledger.count(workflow_id, "two", "start") == 1
    _assert_no_execution_ran_twice(ledger)
    assert_invariants(shared_database.engine, quiescent=True)


def test_sigkill_between_the_commit_and_an_inline_successor(
    celery_worker: CeleryWorker, shared_database
) -> None:
    """Inline successors: the worker commits ``one``'s outcome with ``two`` scheduled and
    unsent, and is killed before it claims ``two``. One dispatcher sweep sends ``two`` (no
    ``dispatch_resend_after`` to wait out), another worker runs it once, and nothing ran twice.

    The chain's wall-time budget (200 ms by default) is not what this test is about: on a
    loaded machine it can run out between ``one``'s commit and the claim of ``two``, which then
    is published instead of run inline and the hang below never comes. A generous budget
    keeps the path under test; the hang in ``inline:`` (the ``inline_successor`` signal, sent
    only when this worker claims ``two`` itself) shows it was taken."""
    worker = celery_worker.start(
        GENEVA_CRASH_HANG_INLINE="1", GENEVA_INLINE_SUCCESSOR_MAX_TIME="60"
    )
    workflow_id = create_workflow(CrashInlineWorkflow)
    _hung(celery_worker.log, "inline:")
    worker.kill()
    one, two = executions(workflow_id)
    assert (one.state, one.outcome) == ("completed", "success")
    # Committed with the outcome, held for the worker that died: due, scheduled, never sent,
    # with its job id (inline rows look like published ones).
    assert (two.step_name, two.state, two.sent_at) == ("two", "scheduled", None)
    assert two.job_id is not None
    assert workflow_state(workflow_id) == "ready"
    assert_invariants(shared_database.engine, quiescent=True)

    celery_worker.start()
    # Only the dispatcher's sweep: the resend delay stays at its default (minutes). A held row
    # is left to its worker for one dispatch_interval (no duplicate from a sweep in the gap),
    # then the first sweep sends it.
    assert settings.dispatch_resend_after.total_seconds() >= 60
    assert dispatch.dispatch_due(now=utcnow() + settings.dispatch_interval) == 1
    wait_for_state(workflow_id, "finished", timeout=60)
    ledger = celery_worker.ledger()
    for name in ("one", "two", "three"):
        assert ledger.count(workflow_id, name, "start") == 1, name
    assert [(e.step_name, e.state, e.outcome) for e in executions(workflow_id)] == [
        ("one", "completed", "success"),
        ("two", "completed", "success"),
        ("three", "completed", "success"),
    ]
    _assert_no_execution_ran_twice(ledger)
    assert_invariants(shared_database.engine, quiescent=True)


def test_broker_restart_with_executions_in_flight(
    celery_worker: CeleryWorker,
    private_redis: PrivateRedis,
    shared_database,
) -> None:
    worker = celery_worker.start()
    ids = [create_workflow(CrashManyWorkflow) for _ in range(30)]
    wait_until(
        lambda: sum(celery_worker.ledger().count(w, "a", "start") for w in ids) >= 10,
        60,
        "the first steps to run",
    )
    private_redis.kill()  # every queued and countdown message in Redis is gone
    ids += [create_workflow(CrashManyWorkflow) for _ in range(5)]  # sends fail: broker down
    time.sleep(1.0)
    private_redis.start()  # same port, empty

    def all_finished() -> bool:
        # The worker must ride out the outage itself (Celery 5.7.0's exited instead, which is
        # why the package excludes it): say so at once rather than after the timeout.
        assert worker.popen.poll() is None, (
            f"the Celery worker exited ({worker.popen.returncode}) after the broker restart:\n"
            f"{worker.output()[-3000:]}"
        )
        with db.new_session() as session:
            from sqlalchemy import func, select

            from geneva_drive.workflow import Workflow

            done = session.scalar(
                select(func.count()).where(Workflow.id.in_(ids), Workflow.state == "finished")
            )
        if done == len(ids):
            return True
        recover(in_progress_after=10)
        return False

    wait_until(all_finished, 120, "every workflow to finish after the broker restart")
    ledger = celery_worker.ledger()
    for workflow_id in ids:
        for name in ("a", "b", "c"):
            assert ledger.count(workflow_id, name, "start") == 1, (workflow_id, name)
    _assert_no_execution_ran_twice(ledger)
    assert_invariants(shared_database.engine, quiescent=True)
