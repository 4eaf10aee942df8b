"""Warm shutdown reaching resumable steps in prefork pool children (geneva_drive.celery hooks).

billiard sets SIGINT to SIG_IGN in a child *after* worker_process_init, so the child installs
its SIGINT handler before each task; the main process forwards a warm shutdown to its pool
children as SIGINT. The real-worker version is tests/integration/test_resumable_worker.py.
"""

from __future__ import annotations

import os
import signal
import time
from types import SimpleNamespace

import pytest

from geneva_drive import celery as engine_celery
from geneva_drive import executor

# Does not use the suite's database (signal handling of the worker hooks, no database): the SQLite pass runs it once.
pytestmark = pytest.mark.sqlite_pass


@pytest.fixture
def sigint_restored():
    previous = signal.getsignal(signal.SIGINT)
    executor.clear_shutdown()
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        executor.clear_shutdown()


def test_task_prerun_leaves_the_main_process_alone(sigint_restored):
    before = signal.getsignal(signal.SIGINT)
    engine_celery._on_task_prerun()
    assert signal.getsignal(signal.SIGINT) is before


def test_task_prerun_in_a_pool_child_installs_the_handler(sigint_restored, monkeypatch):
    monkeypatch.setattr(engine_celery, "_current_process_name", lambda: "ForkPoolWorker-1")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what billiard leaves behind
    engine_celery._on_task_prerun()
    assert signal.getsignal(signal.SIGINT) is engine_celery._on_child_sigint
    os.kill(os.getpid(), signal.SIGINT)
    deadline = time.monotonic() + 5
    while not executor.shutdown_requested() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert executor.shutdown_requested()


def test_warm_shutdown_is_forwarded_to_pool_children(sigint_restored, monkeypatch):
    import billiard.process

    children = [SimpleNamespace(pid=None), SimpleNamespace(pid=4242), SimpleNamespace(pid=4343)]
    monkeypatch.setattr(billiard.process, "active_children", lambda: children)
    sent = []

    def fake_kill(pid, signum):
        sent.append((pid, signum))
        if pid == 4242:
            raise ProcessLookupError(pid)  # a child that already exited

    monkeypatch.setattr(os, "kill", fake_kill)
    engine_celery._on_worker_shutting_down(sig="SIGTERM", how="warm", exitcode=0)
    assert executor.shutdown_requested()
    assert sent == [(4242, signal.SIGINT), (4343, signal.SIGINT)]
