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
from sqlalchemy import func, select
from sqlalchemy.engine.url import make_url
from sqlalchemy.orm import Session

from geneva_drive import db, executor
from geneva_drive.models import StepExecution
from geneva_drive.states import RUNNABLE_WORKFLOW_STATES, StepState
from geneva_drive.workflow import Workflow
from tests.engine.helpers import make_order
from tests.reliability.ledger import WRITES as WRITES  # re-exported for the tests
from tests.reliability.ledger import WRITES_METADATA as WRITES_METADATA
from tests.reliability.ledger import write_ledger_row as write_ledger_row


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


def committed_writes(workflow_id: int | None = None) -> int:
    """Ledger rows committed (of one workflow, or all)."""
    with session_scope() as session:
        query = select(func.count()).select_from(WRITES)
        if workflow_id is not None:
            query = query.where(WRITES.c.workflow_id == workflow_id)
        return int(session.scalar(query) or 0)


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


def new_order_id() -> int:
    """A new order (a hero), committed; its id."""
    with session_scope() as session:
        return make_order(session).id


def new_workflow(cls: type[Workflow], **kwargs: Any) -> int:
    with session_scope() as session:
        order = make_order(session)
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


class BodyGate:
    """Holds a step body (or a worker's hand-off) at the point it calls :meth:`hold` while the
    test, in its own transactions, acts as an operator; then lets it go on.

    The interleaving is exact: the worker thread is inside the body (no lock held, no
    transaction open) while the operator's transaction runs. A body holds only until the test
    has released it once, so a rerun of the same body goes straight through.
    """

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.released = threading.Event()

    def reset(self) -> None:
        self.entered.clear()
        self.released.clear()

    def hold(self) -> None:
        """Called by the body: hold here until the test releases (once released, a no-op)."""
        if self.released.is_set():
            return
        self.entered.set()
        assert self.released.wait(20), "test never released the step body"

    def run_held(
        self,
        workflow_id: int,
        *operator_actions: tuple[Any, ...],
        budget: Any = None,
        while_held: Callable[[], None] | None = None,
        keep_errors: bool = False,
        worker_errors: list[BaseException] | None = None,
    ) -> list[Any]:
        """Run the workflow's current execution in a worker thread, apply the operator actions
        (``("pause",)``, ``("resume_at", "c")``, …) while it is held, then release it and wait
        for the worker's finalize. Returns what each action returned; with ``keep_errors`` an
        action that raises gives its exception in that place instead of failing the test.
        ``budget`` runs the worker with inline successors (engine/inline.py);
        ``while_held`` checks the rows before the operator acts (or cuts the body's database
        connection); ``worker_errors`` collects what the worker raised (a step's own error,
        re-raised once its outcome is committed) instead of failing the test."""
        execution_id = current_execution_id(workflow_id)
        assert execution_id is not None, f"workflow {workflow_id} has no execution to run"
        errors: list[BaseException] = []

        def worker() -> None:
            try:
                executor.execute(execution_id, budget=budget)
            except BaseException as error:
                errors.append(error)

        thread = threading.Thread(target=worker, daemon=True)
        thread.start()
        try:
            assert self.entered.wait(20), "the worker never reached the held point"
            if while_held is not None:
                while_held()
            outcomes: list[Any] = []
            for action in operator_actions:
                try:
                    outcomes.append(act(workflow_id, *action))
                except Exception as error:
                    if not keep_errors:
                        raise
                    outcomes.append(error)
        finally:
            self.released.set()
            thread.join(20)
        assert not thread.is_alive(), "the worker did not finish after the release"
        if worker_errors is not None:
            worker_errors.extend(errors)
        else:
            assert errors == [], errors
        return outcomes


def step_history(workflow_id: int) -> list[tuple[str, str, str | None]]:
    """``(step name, state, outcome)`` of every execution of the workflow, oldest first."""
    with session_scope() as session:
        rows = session.execute(
            select(StepExecution.step_name, StepExecution.state, StepExecution.outcome)
            .where(StepExecution.workflow_id == workflow_id)
            .order_by(StepExecution.id)
        )
        return [(name, state, outcome) for name, state, outcome in rows]


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
