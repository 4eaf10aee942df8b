"""``db.run_beside``: reads on a connection of their own, in a pool made per process, and
``db.serves_threads``: which binds can give a second thread a connection."""

from __future__ import annotations

import os
import threading

import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import StaticPool

from geneva_drive import db


def test_work_runs_in_a_thread_of_its_own():
    name = db.run_beside(lambda: threading.current_thread().name).result(timeout=10)
    assert name.startswith("geneva-drive-beside")
    assert name != threading.current_thread().name


def test_a_forked_child_runs_work_beside_though_its_parent_had_started_the_pool():
    """A pool inherited through fork has threads only in the parent: the child gets its own
    instead of queueing work nobody runs."""
    assert db.run_beside(os.getpid).result(timeout=10) == os.getpid()  # the parent's threads
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through its exit status
        try:
            ran = db.run_beside(os.getpid).result(timeout=10)
            os._exit(0 if ran == os.getpid() else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize(
    ("make", "serves"),
    [
        (lambda path: create_engine(f"sqlite:///{path / 'file.sqlite3'}"), True),
        (lambda path: create_engine("sqlite://", poolclass=StaticPool), False),
        (lambda path: create_engine("sqlite://"), False),  # SingletonThreadPool for :memory:
        (lambda path: create_engine(f"sqlite:///{path / 'c.sqlite3'}").connect(), False),
    ],
    ids=["pooled engine", "StaticPool", "in-memory SQLite", "a bare Connection"],
)
def test_serves_threads_only_where_a_second_connection_exists(tmp_path, make, serves):
    bind = make(tmp_path)
    try:
        assert db.serves_threads(bind) is serves
    finally:
        (bind.close if hasattr(bind, "close") else bind.dispose)()
