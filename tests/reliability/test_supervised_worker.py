"""A supervised Celery worker recovers.

Celery's prefork worker does not survive every fault on its own: a pool child SIGKILLed while
the pool starts makes it exit with "Unrecoverable error: WorkerLostError", and a SIGKILL of
its main process ends it. Production runs workers under a supervisor that starts them again
(README, "Supervising workers": systemd ``Restart=always``, supervisord ``autorestart``). This
test is that supervisor in miniature - a loop that starts the worker again whenever it exits -
and checks that the fleet recovers: every workflow finishes, no execution runs its body twice,
and the invariants hold.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from geneva_drive import dispatch, housekeeping
from geneva_drive.config import settings
from tests.integration.conftest import (
    BIN,
    SharedDatabase,
    create_workflow,
    process_env,
    wait_until,
    workflow_state,
)
from tests.reliability.crash_flows import CrashManyWorkflow, Ledger
from tests.reliability.invariants import assert_invariants
from tests.reliability.test_crash import (  # noqa: F401 (fixtures)
    MODULES,
    CeleryWorker,
    _assert_no_execution_ran_twice,
    celery_worker,
    private_redis,
)

pytestmark = pytest.mark.integration


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (the prefork pool's children)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces, so split after its ')'.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


class Supervisor:
    """Starts the worker, and starts it again whenever it exits (systemd Restart=always)."""

    def __init__(self, args: list[str], env: dict[str, str], directory: Path) -> None:
        self.args = args
        self.env = env
        self.directory = directory
        self.starts = 0
        self.exits: list[int] = []
        self.current: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.starts += 1
            with open(self.directory / f"supervised-{self.starts}.log", "wb") as log:
                process = subprocess.Popen(
                    self.args,
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                self.current = process
                code = process.wait()
            self.exits.append(code)
            # The pool's children of a killed main process: a supervisor's stop-the-group.
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except OSError:
                pass
            time.sleep(0.5)  # RestartSec

    def stop(self) -> None:
        self._stop.set()
        process = self.current
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        self._thread.join(60)

    def output(self) -> str:
        return "\n".join(
            path.read_text(errors="replace")
            for path in sorted(self.directory.glob("supervised-*.log"))
        )


def test_a_supervised_prefork_worker_recovers_and_the_workflows_finish(
    celery_worker: CeleryWorker,  # noqa: F811 (the fixture imported above)
    shared_database: SharedDatabase,
    tmp_path: Path,
) -> None:
    env = process_env(
        shared_database,
        celery_worker.log,
        GENEVA_BROKER_URL=celery_worker.redis.url,
        GENEVA_DEFAULT_QUEUE=celery_worker.queue,
        GENEVA_WORKFLOW_MODULES=MODULES,
    )
    args = [
        str(BIN / "celery"), "-A", "geneva_drive.celery", "worker", "--pool=prefork", "-c", "2",
        "--loglevel=INFO", "-Q", celery_worker.queue, "-n", f"{celery_worker.queue}@%h",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
    supervisor = Supervisor(args, env, tmp_path)
    supervisor.start()
    try:
        # Fault 1: SIGKILL a pool child as soon as the pool forks it (the pool is starting).
        def kill_a_pool_child() -> bool:
            # The child listed may be gone by the time it is signalled (the pool replaces
            # children as it starts; the supervisor may have restarted the worker): try the
            # current worker's children again until one is killed.
            main = supervisor.current
            for child in _children(main.pid) if main is not None else []:
                try:
                    os.kill(child, signal.SIGKILL)
                    return True
                except ProcessLookupError:
                    continue
            return False

        wait_until(lambda: supervisor.current, 30, "the worker to start")
        wait_until(kill_a_pool_child, 60, "a pool child to kill")
        workflow_ids = [create_workflow(CrashManyWorkflow) for _ in range(4)]
        wait_until(lambda: " ready." in supervisor.output(), 90, "a worker to be ready")
        # Fault 2: SIGKILL the worker's main process once a step ran (messages in flight).
        wait_until(lambda: celery_worker.ledger().lines, 60, "a step to run")
        current = supervisor.current
        assert current is not None
        os.kill(current.pid, signal.SIGKILL)
        # The supervisor starts it again; the dispatcher and housekeeping recover what the
        # killed worker held (small thresholds, as the dispatcher process would run them).
        settings.stuck_in_progress_threshold = 3
        settings.stuck_scheduled_threshold = 2
        settings.dispatch_resend_after = 1

        def all_finished() -> bool:
            housekeeping.run()
            dispatch.dispatch_due()
            return all(workflow_state(w) == "finished" for w in workflow_ids)

        wait_until(all_finished, 120, "every workflow to finish under the supervisor")
    finally:
        supervisor.stop()
    assert supervisor.starts >= 2, supervisor.exits
    ledger: Ledger = celery_worker.ledger()
    for workflow_id in workflow_ids:
        for name in ("a", "b", "c"):
            assert ledger.count(workflow_id, name, "start") >= 1, (workflow_id, name)
    _assert_no_execution_ran_twice(ledger)
    assert_invariants(shared_database.engine, quiescent=True)
