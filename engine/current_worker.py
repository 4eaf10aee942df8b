"""Which registered worker this thread runs steps for (engine/liveness.py registers it).

A leaf, so the executor can record ``worker_id`` in the statement that starts an execution
without importing the liveness machinery. A Celery pool process sets the process's worker; an
embedded worker's threads set their own (one process may host more than one embedded worker,
and a test process runs steps outside any). The process's value is tied to its pid: a child
forked from a registered process does not inherit its parent's worker.
"""

from __future__ import annotations

import os
import threading

_process: tuple[int, int] | None = None
_thread = threading.local()
#: Executions this process started and then could not finish (their finalize failed, a hook
#: raised): still in progress under this process's live worker, so the lease never expires for
#: them. The heartbeat hands each to recovery (engine/liveness.py) and forgets it.
_abandoned: dict[int, int] = {}
_abandoned_lock = threading.Lock()
#: The names of the workers registered in this process (for log lines).
_names: dict[int, str] = {}


def set_process(worker_id: int | None, name: str = "") -> None:
    """This process's worker (None: none)."""
    global _process
    _process = None if worker_id is None else (os.getpid(), worker_id)
    if worker_id is not None:
        _names[worker_id] = name


def set_thread(worker_id: int | None, name: str = "") -> None:
    """This thread's worker, over the process's (None: the process's again)."""
    _thread.worker_id = worker_id
    if worker_id is not None:
        _names[worker_id] = name


def name_of(worker_id: int | None) -> str:
    """The name a worker of this process registered with ("" if unknown here)."""
    return "" if worker_id is None else _names.get(worker_id, "")


def get() -> int | None:
    """The worker the current thread runs steps for, or None."""
    own: int | None = getattr(_thread, "worker_id", None)
    if own is not None:
        return own
    if _process is not None and _process[0] == os.getpid():
        return _process[1]
    return None


def abandon(execution_id: int) -> None:
    """An attempt this thread's worker started and can no longer finish: recover it soon
    (the heartbeat does), as if its worker had died. Nothing outside a registered worker."""
    worker_id = get()
    if worker_id is None:
        return
    with _abandoned_lock:
        _abandoned[execution_id] = worker_id


def abandoned(worker_id: int) -> list[int]:
    """The executions ``worker_id`` abandoned and recovery has not settled yet."""
    with _abandoned_lock:
        return [e for e, w in _abandoned.items() if w == worker_id]


def settled(execution_id: int) -> None:
    """Recovery took care of it (or the row moved on): forget it."""
    with _abandoned_lock:
        _abandoned.pop(execution_id, None)
