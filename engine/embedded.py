"""The embedded worker: runs steps in-process, with the step-execution table as the queue.

``geneva-drive up`` (and ``geneva-drive worker``) need no broker. The database already holds
the queue: due ``scheduled`` executions of ``ready`` workflows, on the ``(state,
scheduled_for)`` index. A poller thread reads it every ``poll_interval`` (25 ms by default)
and feeds a few worker threads that call :func:`geneva_drive.executor.execute`. Nothing is marked
or deleted to "consume" a message: the executor only starts an execution that is still
``scheduled``, under the workflow lock, so a row picked by two pollers (two ``worker``
processes on one database) still runs once, and the row itself records what happened.

Hops inside the process do not wait for the next poll: :class:`EmbeddedTransport` is the
transport of the process, and the after-commit send of a new execution only sets the poller's
wake-up event. A step's successor, a woken signal waiter or an operator's resume in the
dashboard of the same process starts within milliseconds; timed waits and writes from other
processes are seen at the next poll.

Why not kombu's SQLAlchemy transport: it polls once a second by default (~1 s per hop) and
never deletes consumed messages; a message table next to the execution table would only be a
second copy of the schedule.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from datetime import datetime

from sqlalchemy import select

from geneva_drive import current_worker, db, executor, inline, liveness
from geneva_drive.errors import ConfigurationError
from geneva_drive.instrumentation import report_error
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.states import StepState, WorkflowState
from geneva_drive.transport import Message
from geneva_drive.workflow import Workflow

log = logging.getLogger(__name__)

#: Seconds between polls of the table when nothing woke the poller.
DEFAULT_POLL_INTERVAL = 0.025
#: A row whose execution raised something other than the step's own error (the database was
#: locked, say) is retried after this many seconds, doubling up to ``MAX_RETRY_DELAY``.
RETRY_DELAY = 0.5
MAX_RETRY_DELAY = 30.0


class EmbeddedTransport:
    """The transport of an embedded process: a sent message only wakes the local poller."""

    def __init__(self, wake: threading.Event) -> None:
        self.wake = wake

    def send(self, message: Message) -> None:
        # The row is already committed; the poller reads it (and its due time) from the table.
        self.wake.set()


class EmbeddedWorker:
    """A poller thread and ``concurrency`` worker threads running due executions."""

    def __init__(
        self,
        concurrency: int = 2,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        batch_size: int = 50,
    ) -> None:
        if concurrency < 1:
            raise ConfigurationError("concurrency must be at least 1")
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.batch_size = batch_size
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._in_flight: set[int] = set()
        self._retry_at: dict[int, tuple[float, float]] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        #: This worker's row and heartbeat while it runs (engine/liveness.py).
        self._heartbeat: liveness.Heartbeat | None = None
        #: Executions run so far (for logs and tests).
        self.executed = 0

    @property
    def started(self) -> bool:
        return bool(self._threads)

    @property
    def transport(self) -> EmbeddedTransport:
        return EmbeddedTransport(self.wake)

    def start(self) -> None:
        self.stopping.clear()
        executor.clear_shutdown()
        # Its threads run steps as one registered worker, with a heartbeat of its own: if this
        # process dies, the next sweep (of any process) recovers its steps within the lease.
        self._heartbeat = liveness.start_worker("embedded", process=False)
        poller = threading.Thread(target=self._poll_loop, name="geneva-poller", daemon=True)
        self._threads = [poller]
        for index in range(self.concurrency):
            self._threads.append(
                threading.Thread(target=self._work_loop, name=f"geneva-worker-{index}", daemon=True)
            )
        for thread in self._threads:
            thread.start()
        log.info(
            "embedded worker started: %d thread(s), polling every %.0f ms",
            self.concurrency,
            self.poll_interval * 1000,
        )

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop polling, let running steps finish (resumable ones stop at a checkpoint).

        Returns False when a step was still running after ``timeout`` seconds; its execution
        stays in_progress, and once this worker's lease has expired (``worker_lease``) the next
        sweep recovers it. Otherwise the worker's row is marked stopped.
        """
        self.stopping.set()
        executor.request_shutdown()
        self.wake.set()
        # Drop work not started yet; it is still scheduled in the table for the next start.
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        for _ in range(self.concurrency):
            self._queue.put(None)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if self._heartbeat is not None:
            # Cleanly stopped only when no step is left running: otherwise the row just expires,
            # and the step still running is recovered once the lease has passed.
            self._heartbeat.stop(clean=not alive)
            self._heartbeat = None
        if alive:
            log.warning("embedded worker: %s still running a step at shutdown", ", ".join(alive))
            return False
        # The flag is process-wide: once our steps have stopped, executions run later in this
        # process (a test, a script) must not see a shutdown that is over.
        executor.clear_shutdown()
        log.info("embedded worker stopped after %d execution(s)", self.executed)
        return True

    # --- polling ---------------------------------------------------------------------------

    def due_execution_ids(self, now: datetime | None = None) -> list[int]:
        """Due scheduled executions of ready workflows, oldest first (one indexed query)."""
        moment = now or utcnow()
        query = (
            select(StepExecution.id)
            .join(Workflow, Workflow.id == StepExecution.workflow_id)
            .where(
                StepExecution.state == StepState.SCHEDULED,
                StepExecution.scheduled_for <= moment,
                Workflow.state == WorkflowState.READY,
            )
            .order_by(StepExecution.scheduled_for, StepExecution.id)
            .limit(self.batch_size)
        )
        with db.new_session() as session:
            return list(session.scalars(query))

    def poll_once(self) -> int:
        """Queue the due executions that are not queued or running already; return how many."""
        ids = self.due_execution_ids()
        now = time.monotonic()
        queued = 0
        with self._lock:
            for execution_id in ids:
                if execution_id in self._in_flight:
                    continue
                retry = self._retry_at.get(execution_id)
                if retry is not None and retry[0] > now:
                    continue
                self._in_flight.add(execution_id)
                self._queue.put(execution_id)
                queued += 1
        return queued

    def _poll_loop(self) -> None:
        while not self.stopping.is_set():
            # Clear before reading: a commit that lands during the read sets it again.
            self.wake.clear()
            try:
                self.poll_once()
            except Exception as error:
                log.exception("embedded poller: reading due executions failed")
                report_error(error, {"component": "embedded_poller"})
                self.stopping.wait(1.0)
            self.wake.wait(self.poll_interval)

    # --- working ---------------------------------------------------------------------------

    def _work_loop(self) -> None:
        heartbeat = self._heartbeat
        if heartbeat is not None:
            current_worker.set_thread(heartbeat.worker_id, heartbeat.name)
        while True:
            execution_id = self._queue.get()
            if execution_id is None or self.stopping.is_set():
                return
            try:
                self._run(execution_id)
            finally:
                with self._lock:
                    self._in_flight.discard(execution_id)
                # The step may have scheduled a successor that is due now.
                self.wake.set()

    def _run(self, execution_id: int) -> None:
        #: Successors this thread claimed to run next (engine/inline.py), in order.
        chained: list[int] = []

        def claimed(successor_id: int) -> None:
            # Before the commit that makes the successor due: the poller must not queue it for
            # another thread while this one runs it next.
            with self._lock:
                self._in_flight.add(successor_id)
            chained.append(successor_id)

        # Immediately-due successors run in this thread, within the budget; a stop
        # (request_shutdown) ends the chain at the next step boundary.
        try:
            executor.execute(
                execution_id,
                budget=inline.budget(on_claim=claimed, others_waiting=self._others_waiting),
            )
        except Exception as error:
            current = chained[-1] if chained else execution_id  # the execution that raised
            if self._still_scheduled(current):
                # Not the step's own error (that is recorded and reported by the executor):
                # the execution did not start. Back off so it cannot spin.
                self._back_off(current, error)
                return
            # The step raised; the executor has committed the outcome and reported it.
            log.debug("execution %s raised %s (recorded)", current, type(error).__name__)
        else:
            with self._lock:
                self._retry_at.pop(execution_id, None)
        finally:
            with self._lock:
                for successor_id in chained:
                    self._in_flight.discard(successor_id)
                self.executed += len(chained)
        with self._lock:
            self.executed += 1

    def _others_waiting(self) -> bool:
        # Due executions the poller queued for this process's threads.
        return not self._queue.empty()

    def _still_scheduled(self, execution_id: int) -> bool:
        try:
            with db.new_session() as session:
                state = session.scalar(
                    select(StepExecution.state).where(StepExecution.id == execution_id)
                )
        except Exception:
            return True
        return state == StepState.SCHEDULED

    def _back_off(self, execution_id: int, error: Exception) -> None:
        with self._lock:
            previous = self._retry_at.get(execution_id)
            delay = min(previous[1] * 2, MAX_RETRY_DELAY) if previous else RETRY_DELAY
            self._retry_at[execution_id] = (time.monotonic() + delay, delay)
        log.warning(
            "execution %s could not start (%s: %s); retrying in %.1f s",
            execution_id,
            type(error).__name__,
            error,
            delay,
        )
