"""Shared tools of the reliability suite: thread storms, body-run ledgers, draining."""

from __future__ import annotations

import os
import threading
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.engine.url import make_url
from sqlalchemy.orm import Session

from geneva_drive import db, executor
from geneva_drive.models import StepExecution
from geneva_drive.states import RUNNABLE_WORKFLOW_STATES, StepState
from geneva_drive.workflow import Workflow
from tests.conftest import Order


def backend() -> str:
    """``postgresql``, ``mysql`` (MariaDB or MySQL) or ``sqlite``."""
    url = os.environ.get("GENEVA_TEST_DATABASE_URL")
    if url and make_url(url).get_backend_name() == "postgresql":
        return "postgresql"
    if url and make_url(url).get_backend_name() in ("mysql", "mariadb"):
        return "mysql"
    return "sqlite"


#: Row locks and SKIP LOCKED: PostgreSQL or MariaDB/MySQL (the name is historical).
requires_postgres = pytest.mark.skipif(
    backend() not in ("postgresql", "mysql"),
    reason="needs GENEVA_TEST_DATABASE_URL=postgresql+psycopg://… or mysql+pymysql://… "
    "(row locks, SKIP LOCKED)",
)
requires_server_database = requires_postgres
requires_sqlite = pytest.mark.skipif(backend() != "sqlite", reason="SQLite variant")


class Ledger:
    """Counts step-body runs, thread-safe, keyed by (workflow id, step name)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.runs: Counter[tuple[int, str]] = Counter()

    def record(self, workflow_id: int, step_name: str) -> None:
        with self._lock:
            self.runs[(workflow_id, step_name)] += 1

    def clear(self) -> None:
        with self._lock:
            self.runs.clear()

    def count(self, workflow_id: int, step_name: str) -> int:
        return self.runs[(workflow_id, step_name)]


class FileLedger:
    """Body runs appended to a file (O_APPEND, one line per run): works across processes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def record(self, workflow_id: int, step_name: str) -> None:
        line = f"{workflow_id} {step_name}\n".encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def runs(self) -> Counter[tuple[int, str]]:
        counter: Counter[tuple[int, str]] = Counter()
        for line in self.path.read_text().splitlines():
            wf, name = line.split(" ", 1)
            counter[(int(wf), name)] += 1
        return counter


@dataclass
class Storm:
    """What a thread storm returned: per-thread results and exceptions."""

    results: list[Any] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)

    def errors_of(self, kind: type[BaseException]) -> list[BaseException]:
        return [e for e in self.errors if isinstance(e, kind)]

    def unexpected(self, *allowed: type[BaseException]) -> list[str]:
        return [
            "".join(traceback.format_exception(e))
            for e in self.errors
            if not isinstance(e, allowed)
        ]


def storm(fns: list[Callable[[], Any]], timeout: float = 60.0) -> Storm:
    """Run every callable in its own thread, released together by a barrier."""
    barrier = threading.Barrier(len(fns))
    out = Storm()
    lock = threading.Lock()

    def runner(fn: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout)
            value = fn()
            with lock:
                out.results.append(value)
        except BaseException as error:
            with lock:
                out.errors.append(error)

    threads = [threading.Thread(target=runner, args=(fn,), daemon=True) for fn in fns]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive(), "a storm thread hung (deadlock?)"
    return out


@contextmanager
def session_scope() -> Iterator[Session]:
    """A fresh session on the test database, committed on success (an entry point's unit)."""
    with db.transaction() as session:
        yield session


def new_workflow(cls: type[Workflow], **kwargs: Any) -> int:
    with session_scope() as session:
        order = Order()
        session.add(order)
        session.flush()
        workflow = cls.create(hero=order, session=session, **kwargs)
        return int(workflow.id)


def current_execution_id(workflow_id: int) -> int | None:
    with session_scope() as session:
        return session.scalar(
            select(StepExecution.id)
            .where(
                StepExecution.workflow_id == workflow_id,
                StepExecution.state.in_([StepState.SCHEDULED, StepState.WAITING]),
            )
            .order_by(StepExecution.id)
            .limit(1)
        )


def workflow_state(workflow_id: int) -> str:
    with session_scope() as session:
        state = session.scalar(select(Workflow.state).where(Workflow.id == workflow_id))
        assert state is not None
        return state


def act(workflow_id: int, action: str, *args: Any) -> Any:
    """An operator action in its own transaction (what a dashboard request does)."""
    with session_scope() as session:
        workflow = session.get(Workflow, workflow_id)
        assert workflow is not None
        result = getattr(workflow, action)(*args)
        return result.id if isinstance(result, StepExecution) else result


def drain(max_rounds: int = 200, *, swallow: bool = True) -> int:
    """Run every scheduled execution of a runnable workflow, ignoring waits, until none is left.

    Returns how many executions were run. Step exceptions are swallowed (their outcome is
    committed by the executor before it re-raises).
    """
    ran = 0
    for _ in range(max_rounds):
        with session_scope() as session:
            ids = list(
                session.scalars(
                    select(StepExecution.id)
                    .join(Workflow, Workflow.id == StepExecution.workflow_id)
                    .where(
                        StepExecution.state == StepState.SCHEDULED,
                        Workflow.state.in_(sorted(RUNNABLE_WORKFLOW_STATES)),
                    )
                    .order_by(StepExecution.id)
                )
            )
        if not ids:
            return ran
        for execution_id in ids:
            try:
                executor.execute(execution_id, interruptible=False)
            except Exception:
                if not swallow:
                    raise
            ran += 1
    raise AssertionError(f"drain did not settle after {max_rounds} rounds")
