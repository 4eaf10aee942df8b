"""Worker liveness on a real fleet: PostgreSQL, a private Redis, two prefork workers (``-c 2``)
and Celery beat as the dispatcher (docs/MANUAL.md, "When a worker dies").

* A pool process SIGKILLed mid-step, then a whole worker (main process and children) SIGKILLed
  mid-step: each killed step runs again in another worker process once the dead process's
  lease has expired and a sweep has run, the killed execution ends ``recovered``, the step's
  writes are committed exactly once, and the workers table shows the dead processes expired.
* With hundreds of step messages queued before them, time-outs of parked executions fire
  within a dispatch interval of their deadlines: beat runs the sweep in its own process, so it
  never waits behind the queue.

The settings are short so that the file stays bounded (about a minute): heartbeat every 1 s,
lease 4 s, a sweep every 1 s. The file uses a PostgreSQL schema of its own (on
``GENEVA_TEST_PG_URL``, not the suite's database), so it runs once, in the SQLite pass.
"""

from __future__ import annotations

import os
import shutil
import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import redis
from sqlalchemy import func, select, text

from geneva_drive import db
from geneva_drive.celery import CeleryTransport, make_celery
from geneva_drive.models import Base, StepExecution, Worker, utcnow
from geneva_drive.workflow import Workflow
from tests.integration.conftest import (
    BIN,
    Process,
    SharedDatabase,
    create_workflow,
    executions,
    process_env,
    require_service,
    wait_for_state,
    wait_until,
)
from tests.integration.liveness_flows import (
    DEADLINE,
    LvBacklogWorkflow,
    LvDeadlineWorkflow,
    LvHangWorkflow,
    ledger,
    ledger_metadata,
)

pytestmark = [pytest.mark.integration, pytest.mark.sqlite_pass]

PG_URL = os.environ.get("GENEVA_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")

HEARTBEAT = 1.0
LEASE = 4.0
DISPATCH = 1.0
#: From the SIGKILL to the rerun's start. The rule gives at most LEASE (the dead process's last
#: heartbeat is at most as old as the kill) + DISPATCH (the next sweep) + the sweep's own time
#: + a free pool process taking the message. The slack covers a loaded 2-core machine (a
#: starved beat, a sweep or a message pickup taking seconds); without liveness the step stayed
#: in_progress for stuck_in_progress_threshold (an hour), so the bound still tells.
RECOVERY_SLACK = 10.0
RECOVERY_BOUND = LEASE + DISPATCH + RECOVERY_SLACK
#: From a parked execution's deadline to its time-out firing: one sweep interval, plus slack for
#: a beat process starved on a loaded machine. The backlog below holds about 80 s of work for
#: its one-process worker: a sweep that waited behind it would be over a minute late.
TIMEOUT_SLACK = 4.0
TIMEOUT_BOUND = DISPATCH + TIMEOUT_SLACK
BACKLOG = 400


@dataclass
class Fleet:
    """A PostgreSQL schema, a private redis-server, and the Celery processes started on them."""

    database: SharedDatabase
    redis_url: str
    queue: str
    directory: Path
    processes: list[Process] = field(default_factory=list)

    @property
    def log(self) -> Path:
        return self.directory / "steps.log"

    def env(self) -> dict[str, str]:
        return process_env(
            self.database,
            self.log,
            GENEVA_WORKFLOW_MODULES="tests.integration.liveness_flows",
            GENEVA_BROKER_URL=self.redis_url,
            GENEVA_DEFAULT_QUEUE=self.queue,
            GENEVA_WORKER_HEARTBEAT_INTERVAL=str(HEARTBEAT),
            GENEVA_WORKER_LEASE=str(LEASE),
            GENEVA_DISPATCH_INTERVAL=str(DISPATCH),
            GENEVA_HOUSEKEEPING_INTERVAL="3600",
            GENEVA_INLINE_SUCCESSOR_MAX_TIME="60",
        )

    def worker(self, name: str, concurrency: int) -> Process:
        """``celery worker -P prefork -c N`` on the fleet's queue (not yet waited for)."""
        process = Process(
            [str(BIN / "celery"), "-A", "geneva_drive.celery", "worker", "--pool=prefork",
             "-c", str(concurrency), "--loglevel=INFO", "-Q", self.queue,
             "-n", f"{self.queue}-{name}@%h",
             "--without-gossip", "--without-mingle", "--without-heartbeat"],
            self.env(),
            self.directory / f"worker-{name}.log",
        )  # fmt: skip
        self.processes.append(process)
        return process

    def beat(self) -> Process:
        """``celery beat``: the dispatcher, its sweeps in threads of its own process."""
        process = Process(
            [str(BIN / "celery"), "-A", "geneva_drive.celery", "beat", "--loglevel=INFO",
             "-s", str(self.directory / "beat-schedule")],
            self.env(),
            self.directory / "beat.log",
        )  # fmt: skip
        self.processes.append(process)
        return process

    def queued(self) -> int:
        """Step messages waiting in the fleet's queue (every priority level's list)."""
        client = redis.Redis.from_url(self.redis_url)
        try:
            return sum(
                int(client.llen(key))
                for key in client.scan_iter(match=f"{self.queue}*")
                if client.type(key) == b"list"
            )
        finally:
            client.close()


def _private_redis(directory: Path) -> tuple[Process, str]:
    """A redis-server of our own on a free loopback port, no persistence; stopped by its PID."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = Process(
        [shutil.which("redis-server") or "redis-server", "--port", str(port),
         "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(directory)],
        {"PATH": "/usr/bin:/bin"},
        directory / "redis.log",
    )  # fmt: skip
    server.wait_for_output("Ready to accept connections", timeout=30)
    return server, f"redis://127.0.0.1:{port}/0"


@pytest.fixture
def fleet(tmp_path: Path, use_transport) -> Iterator[Fleet]:
    require_service("PostgreSQL", PG_URL)
    if shutil.which("redis-server") is None:
        message = "redis-server is not installed"
        if os.environ.get("GENEVA_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{message} and GENEVA_REQUIRE_SERVICES=1")
        pytest.skip(message)
    schema = f"gd_lv_{uuid.uuid4().hex[:10]}"
    admin = db.make_engine(PG_URL)
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    admin.dispose()
    separator = "&" if "?" in PG_URL else "?"
    url = f"{PG_URL}{separator}options=-csearch_path%3D{schema}"
    database = SharedDatabase(url, db.make_engine(url), schema, PG_URL)
    redis_server: Process | None = None
    previous = db._engine
    celery = None
    started: Fleet | None = None
    try:
        Base.metadata.create_all(database.engine)
        ledger_metadata.create_all(database.engine)
        db.configure(engine=database.engine)
        redis_server, redis_url = _private_redis(tmp_path)
        queue = f"gd-lv-{uuid.uuid4().hex[:8]}"
        celery = make_celery(redis_url)
        celery.conf.task_default_queue = queue
        use_transport(CeleryTransport(celery))
        started = Fleet(database, redis_url, queue, tmp_path)
        yield started
    finally:
        # Workers and beat first (they hold connections to both), then Redis, then the schema.
        for process in reversed(started.processes if started else []):
            process.stop()
        if celery is not None:
            celery.close()
        if redis_server is not None:
            redis_server.stop()
        if previous is not None:
            db.configure(engine=previous)
        database.dispose()


# --- helpers ---------------------------------------------------------------------------------


def _started_pid(log: Path, workflow_id: int, nth: int = 1) -> int | None:
    """The pid of the process whose ``hang`` body started for the ``nth`` time."""
    if not log.exists():
        return None
    pids = [
        int(fields[3])
        for fields in (line.split(" ") for line in log.read_text().splitlines())
        if fields[0] == str(workflow_id) and fields[1:3] == ["hang", "start"]
    ]
    return pids[nth - 1] if len(pids) >= nth else None


def _children(pid: int) -> set[int]:
    """The living children of ``pid``: a killed child stays listed as a zombie until its parent
    reaps it, and counting it let a test go on before Celery had replaced it."""
    try:
        listed = {int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except FileNotFoundError:
        return set()
    return {child for child in listed if _alive(child)}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def _worker_row(worker_id: int) -> Worker:
    with db.new_session() as session:
        row = session.get(Worker, worker_id)
        assert row is not None, f"no worker row {worker_id}"
        return row


def _rows_of(pids: set[int]) -> list[Worker]:
    with db.new_session() as session:
        return list(session.scalars(select(Worker).where(Worker.pid.in_(sorted(pids)))))


def _expired(row: Worker, now: datetime) -> bool:
    return row.stopped_at is None and row.heartbeat_at <= now - timedelta(seconds=LEASE)


def _ledger_pids(workflow_id: int) -> list[int]:
    with db.new_session() as session:
        return list(
            session.scalars(select(ledger.c.pid).where(ledger.c.workflow_id == workflow_id))
        )


def _events(log: Path, workflow_id: int) -> list[tuple[str, str]]:
    found = []
    for line in log.read_text().splitlines():
        wf, step_name, event, _pid = line.split(" ")
        if int(wf) == workflow_id:
            found.append((step_name, event))
    return found


def _kill_mid_step_and_check_the_rerun(
    fleet: Fleet, workflow_id: int, kill: object, what: str
) -> tuple[StepExecution, StepExecution]:
    """Wait for ``hang`` to block, call ``kill(pid)``, then check the rerun; return both runs."""
    pid = wait_until(lambda: _started_pid(fleet.log, workflow_id), 60, f"{what}: hang to start")
    (hung,) = executions(workflow_id)
    assert hung.state == "in_progress" and hung.worker_id is not None, (hung.state, what)
    assert _worker_row(hung.worker_id).pid == pid
    killed_at = utcnow()
    kill(pid)  # type: ignore[operator]

    def rerun() -> StepExecution | None:
        rows = executions(workflow_id)
        later = [e for e in rows if e.step_name == "hang" and e.id != hung.id]
        return later[0] if later and later[0].started_at is not None else None

    # Waited for longer than the bound, so that a late rerun fails with its delay below.
    again = wait_until(rerun, RECOVERY_BOUND + 60, f"{what}: the killed step to run again")
    delay = (again.started_at - killed_at).total_seconds()
    assert delay <= RECOVERY_BOUND, (
        f"{what}: the step ran again {delay:.1f} s after the SIGKILL; the bound is "
        f"{RECOVERY_BOUND} s (lease {LEASE} s + dispatch interval {DISPATCH} s + "
        f"{RECOVERY_SLACK} s slack)"
    )
    print(f"{what}: ran again {delay:.2f} s after the SIGKILL (bound {RECOVERY_BOUND} s)")
    wait_for_state(workflow_id, "finished", timeout=60)
    old, new, after = executions(workflow_id)
    assert (old.id, old.state, old.outcome) == (hung.id, "completed", "recovered"), what
    assert (new.step_name, new.state, new.outcome) == ("hang", "completed", "success"), what
    assert (after.step_name, after.state) == ("after", "completed"), what
    # Another worker process ran it; and the dead one was recovered only once its lease ran out.
    assert new.worker_id is not None and new.worker_id != old.worker_id, what
    dead = _worker_row(old.worker_id)  # type: ignore[arg-type]
    assert dead.pid == pid and _expired(dead, utcnow()), (what, dead.heartbeat_at, dead.stopped_at)
    assert old.finished_at >= dead.heartbeat_at + timedelta(seconds=LEASE), what
    # Exactly one committed ledger row (the rerun's): the killed run's insert was rolled back.
    rerun_pid = _worker_row(new.worker_id).pid
    assert _ledger_pids(workflow_id) == [rerun_pid], what
    assert rerun_pid != pid
    assert _events(fleet.log, workflow_id) == [
        ("hang", "start"),
        ("hang", "start"),
        ("hang", "end"),
        ("after", "ran"),
    ], what
    return old, new


# --- the tests -------------------------------------------------------------------------------


def test_steps_of_a_killed_pool_process_and_a_killed_worker_run_again_elsewhere(
    fleet: Fleet,
) -> None:
    first, second = fleet.worker("a", 2), fleet.worker("b", 2)
    beat = fleet.beat()
    for process in (first, second):
        process.wait_for_output(" ready.", timeout=90)
    beat.wait_for_output("GenevaDrive dispatcher running in beat", timeout=90)

    def live_children() -> bool:
        pids = _children(first.pid) | _children(second.pid)
        rows = [r for r in _rows_of(pids) if r.stopped_at is None]
        return len(pids) == 4 and len(rows) == 4

    wait_until(live_children, 60, "four pool processes to register")

    # (a) One pool process dies mid-step; its worker's main process and the other child live.
    one = create_workflow(LvHangWorkflow)
    _kill_mid_step_and_check_the_rerun(
        fleet, one, lambda pid: os.kill(pid, signal.SIGKILL), "pool process SIGKILL"
    )
    assert first.popen.poll() is None and second.popen.poll() is None
    # Celery's pool replaces the killed process on its own time (seconds on a loaded machine):
    # (b) kills a whole worker, both of its pool processes.
    wait_until(live_children, 60, "the killed pool process to be replaced")

    # (b) The whole worker whose child runs the step dies: main process and both children.
    two = create_workflow(LvHangWorkflow)
    killed: list[Process] = []
    dead_pids: set[int] = set()

    def kill_worker(pid: int) -> None:
        owner = first if _parent(pid) == first.pid else second
        children = _children(owner.pid)
        assert pid in children and len(children) == 2, (pid, owner.pid, children)
        owner.kill()  # SIGKILL to its process group: the main process and its children
        killed.append(owner)
        dead_pids.update(children)

    _kill_mid_step_and_check_the_rerun(fleet, two, kill_worker, "worker SIGKILL")
    (gone,) = killed
    survivor = second if gone is first else first
    assert gone.popen.poll() is not None and survivor.popen.poll() is None
    # Its idle child expired too: every pool process of the killed worker shows as expired.
    wait_until(
        lambda: all(_expired(row, utcnow()) for row in _rows_of(dead_pids)),
        LEASE + 30,
        "the killed worker's pool processes to show as expired",
    )
    assert len(_rows_of(dead_pids)) == 2
    # The rerun ran in the surviving worker.
    _old, new = executions(two)[:2]
    assert _worker_row(new.worker_id).pid in _children(survivor.pid)  # type: ignore[arg-type]
    assert "is not live (no heartbeat within" in beat.output()


def test_time_outs_fire_within_a_sweep_of_their_deadline_behind_a_backlog(fleet: Fleet) -> None:
    worker = fleet.worker("busy", 1)
    beat = fleet.beat()
    worker.wait_for_output(" ready.", timeout=90)
    beat.wait_for_output("GenevaDrive dispatcher running in beat", timeout=90)

    parked = [create_workflow(LvDeadlineWorkflow) for _ in range(5)]

    def all_parked() -> list[StepExecution] | None:
        rows = [executions(workflow_id) for workflow_id in parked]
        ready = [r[0] for r in rows if len(r) == 1 and r[0].timeout_at is not None]
        return ready if len(ready) == len(parked) else None

    waiting = wait_until(all_parked, 60, "the deadline workflows to park")
    assert all(e.state == "waiting" for e in waiting)
    # Hundreds of step messages queued behind them: 400 x 0.2 s, 80 s of work for one process.
    with db.transaction() as session:
        for _ in range(BACKLOG):
            LvBacklogWorkflow.create(session=session, allow_multiple=True)
    first_deadline = min(e.timeout_at for e in waiting)  # type: ignore[type-var]
    assert utcnow() < first_deadline, "the backlog took longer to create than the deadline"
    assert fleet.queued() >= BACKLOG - 20

    def fired() -> list[StepExecution] | None:
        rows = [executions(workflow_id)[0] for workflow_id in parked]
        return rows if all(e.timed_out_at is not None for e in rows) else None

    done = wait_until(fired, DEADLINE.total_seconds() + TIMEOUT_BOUND + 60, "the time-outs to fire")
    # The backlog was still queued when they fired.
    assert fleet.queued() >= BACKLOG // 2, fleet.queued()
    for execution in done:
        assert (execution.state, execution.outcome) == ("canceled", "timed_out")
        late = (execution.timed_out_at - execution.timeout_at).total_seconds()  # type: ignore[operator]
        print(f"time-out fired {late:.2f} s after its deadline (bound {TIMEOUT_BOUND} s)")
        assert 0 <= late <= TIMEOUT_BOUND, (
            f"time-out of workflow {execution.workflow_id} fired {late:.2f} s after its deadline; "
            f"the bound is {TIMEOUT_BOUND} s (dispatch interval {DISPATCH} s + {TIMEOUT_SLACK} s "
            "slack)"
        )
    for workflow_id in parked:
        wait_for_state(workflow_id, "canceled")
    with db.new_session() as session:
        finished = session.scalar(
            select(func.count()).select_from(Workflow).where(Workflow.state == "finished")
        )
    assert finished is not None and finished < BACKLOG
