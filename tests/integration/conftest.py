"""Real processes for the integration tests: a database several processes can open, worker
subprocesses stopped by their own PID, and the service checks.

A service that does not answer makes its tests skip, unless ``GENEVA_REQUIRE_SERVICES=1``
(CI), where it is a failure. Every process the tests start listens on 127.0.0.1 and runs in
its own session, so stopping it (SIGTERM, then SIGKILL) reaches its pool children too.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.engine.url import make_url

from geneva_drive import db, transport
from geneva_drive.celery import CeleryTransport, make_celery
from geneva_drive.config import settings
from geneva_drive.dialects import backend_name, dialect_for_url
from geneva_drive.models import Base, StepExecution
from geneva_drive.testing.pytest_plugin import (
    create_mysql_database,
    drop_mysql_database,
)
from geneva_drive.workflow import Workflow

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
REDIS_URL = os.environ.get("GENEVA_TEST_REDIS_URL", "redis://127.0.0.1:6379/11")
AMQP_URL = os.environ.get("GENEVA_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
WORKFLOW_MODULES = "tests.integration.flows"


def require_service(name: str, url: str) -> None:
    """Skip (or, with GENEVA_REQUIRE_SERVICES=1, fail) when ``url``'s host:port is closed."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or {"redis": 6379, "amqp": 5672, "postgresql": 5432, "mysql": 3306}.get(
        parts.scheme.split("+")[0], 0
    )
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError as exc:
        message = f"{name} does not answer at {host}:{port} ({exc})"
        if os.environ.get("GENEVA_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{message} and GENEVA_REQUIRE_SERVICES=1")
        pytest.skip(message)


@dataclass
class SharedDatabase:
    """A database the test and its subprocesses open by URL."""

    url: str
    engine: Engine
    schema: str | None
    admin_url: str | None
    #: MariaDB/MySQL: the module's own database (dropped by dispose()); None elsewhere.
    database: str | None = None

    @property
    def backend(self) -> str:
        """``PostgreSQL``, ``MariaDB``/``MySQL`` or ``SQLite`` (for reports)."""
        name = backend_name(self.engine)
        return {"postgresql": "PostgreSQL", "mariadb": "MariaDB", "mysql": "MySQL"}.get(
            name, "SQLite"
        )

    def dispose(self) -> None:
        self.engine.dispose()
        if self.schema and self.admin_url:
            admin = db.make_engine(self.admin_url)
            with admin.begin() as connection:
                connection.execute(text(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE'))
            admin.dispose()
        if self.database and self.admin_url:
            drop_mysql_database(self.admin_url, self.database)


@pytest.fixture(scope="module")
def shared_database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedDatabase]:
    """An empty database with the engine's tables; the engine's session factory points at it."""
    pg = os.environ.get("GENEVA_TEST_DATABASE_URL")
    if pg and make_url(pg).get_backend_name() == "postgresql":
        require_service("PostgreSQL", pg.replace("postgresql+psycopg", "postgresql"))
        schema = f"gd_it_{uuid.uuid4().hex[:10]}"
        admin = db.make_engine(pg)
        with admin.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
        admin.dispose()
        separator = "&" if "?" in pg else "?"
        url = f"{pg}{separator}options=-csearch_path%3D{schema}"
        database = SharedDatabase(url, db.make_engine(url), schema, pg)
    elif pg and dialect_for_url(pg).name == "mysql":
        require_service("MariaDB", pg)
        name, url = create_mysql_database(pg, prefix="gd_it")
        database = SharedDatabase(url, db.make_engine(url), None, pg, database=name)
    else:
        path = tmp_path_factory.mktemp("db") / "integration.sqlite3"
        url = f"sqlite:///{path}"
        database = SharedDatabase(url, db.make_engine(url), None, None)
    Base.metadata.create_all(database.engine)
    previous = db._engine
    db.configure(engine=database.engine)
    try:
        yield database
    finally:
        if previous is not None:
            db.configure(engine=previous)
        database.dispose()


@pytest.fixture(scope="module")
def short_horizon() -> Iterator[None]:
    """A 1 s dispatch horizon here and in the workers (GENEVA_DISPATCH_HORIZON=1)."""
    previous = settings.dispatch_horizon
    settings.dispatch_horizon = 1
    try:
        yield
    finally:
        settings.dispatch_horizon = previous


@pytest.fixture
def restore_settings() -> Iterator[None]:
    snapshot = {k: v for k, v in vars(settings).items() if not k.startswith("_")}
    try:
        yield
    finally:
        for key, value in snapshot.items():
            setattr(settings, key, value)


@pytest.fixture
def use_transport() -> Iterator[Callable[[transport.Transport], None]]:
    previous = transport._transport

    def use(chosen: transport.Transport) -> None:
        transport.set_transport(chosen)

    try:
        yield use
    finally:
        transport.set_transport(previous)


class Process:
    """A subprocess in its own session, logging to a file; stopped by its own PID."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.args = args
        self.log_path = log_path
        # The child writes the log through its own copy of the descriptor; ours is closed at
        # once (output() reads the file by path), so no process the test lets go of leaves an
        # unclosed file behind (pytest's filterwarnings = error).
        with open(log_path, "ab") as log:
            self.popen = subprocess.Popen(
                args,
                cwd=env.get("GENEVA_TEST_CWD", str(ROOT)),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_output(self, needle: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.output()
            if needle in out:
                return out
            if self.popen.poll() is not None:
                raise AssertionError(
                    f"{self.args[0]} exited ({self.popen.returncode}) before printing "
                    f"{needle!r}:\n{out[-4000:]}"
                )
            time.sleep(0.05)
        raise AssertionError(f"no {needle!r} after {timeout} s:\n{self.output()[-4000:]}")

    def _signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.pid, signum)  # the group id is our child's own PID
        except ProcessLookupError:
            pass

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (a warm shutdown), then SIGKILL if it does not exit in ``timeout`` s."""
        if self.popen.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.popen.wait(10)
        self._signal_group(signal.SIGKILL)  # stray pool children, if any
        return self.popen.returncode

    def kill(self) -> None:
        self._signal_group(signal.SIGKILL)
        self.popen.wait(10)


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    """Processes started by a test; whatever is still running at its end is stopped."""
    started: list[Process] = []
    try:
        yield started
    finally:
        for process in started:
            if process.popen.poll() is None:
                process.stop()


def process_env(database: SharedDatabase, log: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENEVA_")}
    env.update(
        GENEVA_DATABASE_URL=database.url,
        GENEVA_WORKFLOW_MODULES=WORKFLOW_MODULES,
        GENEVA_TEST_LOG=str(log),
        GENEVA_DISPATCH_HORIZON="1",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")


def create_workflow(cls: type[Workflow]) -> int:
    with db.transaction() as session:
        workflow = cls.create(session=session, allow_multiple=True)
        session.flush()
        return int(workflow.id)


def workflow_state(workflow_id: int) -> str | None:
    with db.new_session() as session:
        return session.scalar(select(Workflow.state).where(Workflow.id == workflow_id))


def wait_for_state(workflow_id: int, state: str, timeout: float = 30.0) -> None:
    wait_until(
        lambda: workflow_state(workflow_id) == state,
        timeout,
        f"workflow {workflow_id} to be {state} (it is {workflow_state(workflow_id)})",
    )


def executions(workflow_id: int) -> list[StepExecution]:
    with db.new_session() as session:
        return list(
            session.scalars(
                select(StepExecution)
                .where(StepExecution.workflow_id == workflow_id)
                .order_by(StepExecution.id)
            )
        )


# --- real Celery workers, on Redis and on RabbitMQ ------------------------------------------

BROKERS = {"redis": ("Redis", REDIS_URL), "rabbitmq": ("RabbitMQ", AMQP_URL)}


@dataclass
class Broker:
    name: str
    url: str


@pytest.fixture(scope="module", params=sorted(BROKERS))
def broker(request: pytest.FixtureRequest) -> Broker:
    label, url = BROKERS[request.param]
    require_service(label, url)
    return Broker(request.param, url)


class Worker:
    """``celery -A geneva_drive.celery worker`` on its own queue; restartable on the same queue."""

    def __init__(
        self,
        database: SharedDatabase,
        broker: Broker,
        directory: Path,
        pool: str,
        concurrency: int,
        loglevel: str = "INFO",
        **env: str,
    ) -> None:
        self.loglevel = loglevel
        self.env = env
        self.database = database
        self.broker = broker
        self.directory = directory
        self.pool = pool
        self.concurrency = concurrency
        self.queue = f"gd-it-{uuid.uuid4().hex[:8]}"
        self.log = directory / f"{self.queue}.steps.log"
        celery = make_celery(broker.url)
        celery.conf.task_default_queue = self.queue
        self.transport = CeleryTransport(celery)
        self.process = self._start(1)

    def _start(self, generation: int) -> Process:
        env = process_env(
            self.database,
            self.log,
            GENEVA_BROKER_URL=self.broker.url,
            GENEVA_DEFAULT_QUEUE=self.queue,
            # The inline chain's wall-time budget (200 ms by default) is not what these tests
            # are about: on a loaded machine it can run out between two steps and publish a
            # successor that test_immediately_due_successors_run_in_the_worker_that_finished_
            # the_step expects run inline (its own test passes ``max_seconds``).
            GENEVA_INLINE_SUCCESSOR_MAX_TIME="60",
            **self.env,
        )
        name = f"{self.queue}-{generation}"
        process = Process(
            [
                str(BIN / "celery"),
                "-A",
                "geneva_drive.celery",
                "worker",
                f"--pool={self.pool}",
                "-c",
                str(self.concurrency),
                f"--loglevel={self.loglevel}",
                "-Q",
                self.queue,
                "-n",
                f"{name}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
            env,
            self.directory / f"{name}.worker.log",
        )
        process.wait_for_output(" ready.", timeout=60)
        return process

    def restart(self) -> None:
        self.process = self._start(2)

    def close(self) -> None:
        self.process.stop()
        self.transport.celery.close()


@pytest.fixture(scope="module")
def worker(
    broker: Broker,
    shared_database: SharedDatabase,
    short_horizon: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Worker]:
    started = Worker(shared_database, broker, tmp_path_factory.mktemp(broker.name), "prefork", 2)
    try:
        yield started
    finally:
        started.close()
