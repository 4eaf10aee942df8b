"""The Celery side: the app, the tasks, the worker hooks and the Celery transport.

Celery only carries "run execution N now"; the database row is the schedule.
``geneva_drive.perform_step`` is thin and idempotent: running a message twice is harmless
because the executor only starts an execution that is still ``scheduled``, under the workflow
lock. That is also why ``acks_late`` is safe here: a message whose worker died mid-step is
redelivered, and the redelivery finds the row ``in_progress`` and does nothing: the dead
process's worker row stops renewing its lease, and the next dispatcher sweep recovers the
execution (engine/liveness.py).

Processes::

    celery -A geneva_drive.celery worker            # runs steps (GENEVA_BROKER_URL, GENEVA_DATABASE_URL)
    celery -A geneva_drive.celery beat              # the dispatcher: sweeps and housekeeping in-process

Each worker process imports ``GENEVA_WORKFLOW_MODULES`` and configures its own database
engine after the fork. On a warm shutdown (the first Ctrl-C / SIGTERM) running resumable
steps stop at their next checkpoint and hand over to a successor execution.

The dashboard process sends messages through the same app; ``celery_init_app(flask_app)``
wires it into a Flask app factory without this module importing Flask.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from celery import Celery, Task
from celery.signals import (
    beat_init,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)

from geneva_drive import current_worker, db, executor, inline, liveness, prometheus
from geneva_drive.bootstrap import import_workflow_modules
from geneva_drive.celery_client import (
    BROKER_SETTING,
    DISPATCH_DUE_TASK,
    HOUSEKEEPING_TASK,
    MADE_HERE,
    PERFORM_STEP_TASK,
    CeleryTransport,
    broker_url,
    default_app,
    default_queue,
    new_app,
    require_broker,
    use_app,
)
from geneva_drive.config import settings
from geneva_drive.dispatch import dispatch_due, start_dispatcher_thread
from geneva_drive.errors import ConfigurationError
from geneva_drive.executor import request_shutdown
from geneva_drive.housekeeping import run as run_housekeeping

log = logging.getLogger(__name__)


def make_celery(url: str | None = None) -> Celery:
    """A configured Celery app with the GenevaDrive tasks registered (its beat is the
    dispatcher: the sweeps run in the beat process, see ``_on_beat_init``)."""
    return register_tasks(new_app(url))


def register(celery: Celery) -> Celery:
    """Run GenevaDrive on the host application's own Celery app.

    Registers the step task on ``celery`` and sends every step message through it, so
    ``celery -A myshop.celery worker`` runs steps and ``celery -A myshop.celery beat`` is the
    dispatcher: its process runs the sweeps and housekeeping itself, in threads (no beat entry,
    no task message: a backlog of step messages cannot hold them up). Only GenevaDrive's own
    tasks get its options (late acks, redelivery when a worker dies, no results); the host's
    configuration is left as it is. Set ``worker_prefetch_multiplier=1`` on the host app when long steps share a queue
    with short ones.
    """
    global app
    register_tasks(celery)
    use_app(celery)
    app = celery
    return celery


def register_tasks(celery: Celery) -> Celery:
    """Register the GenevaDrive tasks on ``celery`` (configured by ``celery_client.new_app``)."""
    step_options: dict[str, Any] = {
        "acks_late": True,
        "reject_on_worker_lost": True,
        "ignore_result": True,
    }
    celery.task(name=PERFORM_STEP_TASK, **step_options)(perform_step)
    celery.task(name=DISPATCH_DUE_TASK, ignore_result=True)(dispatch_due_task)
    celery.task(name=HOUSEKEEPING_TASK, ignore_result=True)(housekeeping_task)
    return celery


def perform_step(step_execution_id: int) -> None:
    """Run one step execution; re-raises what the executor re-raises (the step's own error).

    The executor's own lock query is the existence check: a missing row (replication lag
    between the sender's commit and this read, as the gem rides out) is retried 5 times,
    0.1 s apart, without a separate lookup session per message.
    """
    budget = (
        inline.budget(consumes_queue, others_waiting=_messages_waiting)
        if _consumed_queues is not None
        else None
    )
    if _consumed_queues is not None and current_worker.get() is None:
        # A worker process whose registration failed at start (Celery logs a failing
        # worker_process_init and carries on; the database may have been down for a moment)
        # registers now: a step it started unregistered would carry no worker, and if the
        # process died, nothing would recover the step before the hour-long threshold. If the
        # database is still down this raises, and the dispatcher sends the message again.
        _start_liveness()
    for attempt in range(5):
        if executor.execute(step_execution_id, missing_ok=True, budget=budget):
            return
        if attempt < 4:
            time.sleep(0.1)
    log.warning("step execution %s not found; nothing to run", step_execution_id)


#: The queues this worker process consumes (``-Q``), recorded at worker start; None outside a
#: worker (perform_step called directly), where successors are always sent.
_consumed_queues: frozenset[str] | None = None
#: Where this worker's own sends of a step without a ``queue`` option go.
_worker_default_queue: str | None = None


def consumes_queue(queue: str | None) -> bool:
    """Whether a step routed to ``queue`` (None: the default queue) would reach this worker."""
    if _consumed_queues is None:
        return False
    return (queue or _worker_default_queue or default_queue()) in _consumed_queues


def _ask_broker() -> bool:
    """Whether a message waits in one of this worker's queues (one broker round trip each).

    ``queue_declare(passive=True)`` reports the ready messages on AMQP and, through kombu's
    virtual transport, the list lengths on Redis (every priority level counted).
    """
    with app.pool.acquire(block=True) as connection:
        channel = connection.default_channel
        for name in sorted(_consumed_queues or ()):
            if channel.queue_declare(queue=name, passive=True).message_count:
                return True
    return False


#: How long one answer of the broker stands for this process's chains: a step takes
#: a few milliseconds, so without it a worker under a backlog asked every third step.
WAITING_ANSWER_SECONDS = 0.05


def _remembered_broker_answer(clock: Callable[[], float] = time.monotonic) -> Callable[[], bool]:
    return inline.remembered(lambda: _ask_broker(), WAITING_ANSWER_SECONDS, clock)


#: The "others waiting?" question of this process's budgets (each prefork child its own; the
#: threads of a threads pool share it, and two of them racing only ask the broker twice).
_messages_waiting = _remembered_broker_answer()


def dispatch_due_task() -> int:
    """Beat task: one dispatcher sweep (:func:`geneva_drive.dispatch.dispatch_due`)."""
    return dispatch_due()


def housekeeping_task() -> dict[str, int]:
    """Beat task: one housekeeping run; returns the gem's result keys."""
    return run_housekeeping().as_dict()


# --- worker process hooks ---------------------------------------------------------------------


def _on_worker_init(sender: Any = None, **_: Any) -> None:
    # The main worker process: the solo and threads pools run steps here, and prefork children
    # inherit the imported workflow classes.
    global _consumed_queues, _worker_default_queue
    # Sent after the worker selected its queues (-Q) and before the pool forks: the children
    # inherit the set. Only a successor routed to one of these may run in this worker.
    worker_app = getattr(sender, "app", None)
    if worker_app is not None:
        _consumed_queues = frozenset(str(name) for name in worker_app.amqp.queues.consume_from)
        _worker_default_queue = str(worker_app.conf.task_default_queue)
    global _node_name
    _node_name = getattr(sender, "hostname", None)
    try:
        # A worker publishes (successors, recovered steps): never to a broker it was not given.
        require_broker("celery worker", worker_app)
        import_workflow_modules()
        if db._engine is None:
            db.configure()  # refuses an unset GENEVA_DATABASE_URL
    except (ConfigurationError, ImportError) as error:
        # A worker that started anyway would take messages and pause every workflow it loads
        # ("step not defined") or fail on a missing table. Celery's signal dispatch logs and
        # swallows an Exception from a handler; SystemExit ends the worker, non-zero.
        # Once: Celery's log goes to stderr when it has set up logging; else print it there.
        if logging.getLogger().handlers:
            log.critical("GenevaDrive worker cannot start: %s", error)
        else:
            print(f"GenevaDrive worker cannot start: {error}", file=sys.stderr, flush=True)
        raise SystemExit(2) from error
    # Event metrics (inherited by prefork children) and GENEVA_WORKER_METRICS_PORT's server.
    prometheus.install()
    prometheus.start_worker_server()


def _on_beat_init(sender: Any = None, **_: Any) -> None:
    # Beat is the dispatcher: it runs the sweeps (sends, time-outs, the recovery of expired
    # workers) and housekeeping itself, in threads of its own process, instead of sending them
    # as tasks. A task would wait in the step queue behind every step message (a backlog held
    # time-outs minutes late), and housekeeping tasks would pile up and overlap.
    beat_app = getattr(sender, "app", None)
    if beat_app is not None and not _runs_geneva_drive(beat_app):
        return  # the beat of an app GenevaDrive was not registered on
    try:
        # It sends step messages: never to a broker it was not given.
        require_broker("celery beat", beat_app)
        import_workflow_modules()
        if db._engine is None:
            db.configure()  # refuses an unset GENEVA_DATABASE_URL
    except (ConfigurationError, ImportError) as error:
        if logging.getLogger().handlers:
            log.critical("GenevaDrive beat cannot start: %s", error)
        else:
            print(f"GenevaDrive beat cannot start: {error}", file=sys.stderr, flush=True)
        raise SystemExit(2) from error
    try:
        # Its sends go where the workers read (a host's workers consume their own app's queue).
        liveness.require_fed_queue("celery beat")
    except ConfigurationError as error:
        log.critical("GenevaDrive beat cannot start: %s", error)
        raise SystemExit(2) from error
    start_dispatcher_thread()
    log.info(
        "GenevaDrive dispatcher running in beat: a sweep every %s s, housekeeping every %s s",
        settings.dispatch_interval.total_seconds(),
        settings.housekeeping_interval.total_seconds(),
    )


def _runs_geneva_drive(celery: Celery) -> bool:
    """Is ``celery`` an app made here or given to :func:`register` (task names alone do not
    tell: Celery shares tasks across apps)?"""
    return bool(getattr(celery, MADE_HERE, False)) or celery is default_app()


def _on_worker_process_init(**_: Any) -> None:
    # A prefork child: never reuse the parent's pooled connections across fork; open its own.
    import_workflow_modules()
    if db._engine is not None:
        # The engine configured before the fork (the host's Flask-SQLAlchemy engine, or the
        # URL's) stays; only its pool is dropped, without closing the parent's connections.
        db._engine.dispose(close=False)
    else:
        db.configure()
    # Each pool process is a worker of its own: a SIGKILL of one child expires its lease only.
    _start_liveness()


#: This process's registered worker (a prefork child, or a solo/threads worker's main process).
_heartbeat: liveness.Heartbeat | None = None
#: The Celery node name (``celery@host``), recorded by worker_init and inherited by the children.
_node_name: str | None = None


def _start_liveness() -> None:
    global _heartbeat
    if _heartbeat is not None and current_worker.get() == _heartbeat.worker_id:
        return
    name = f"{_node_name or 'celery@' + socket.gethostname()}/{os.getpid()}"
    _heartbeat = liveness.start_worker("celery", sorted(_consumed_queues or ()), name=name)


def _stop_liveness(**_: Any) -> None:
    # A clean stop: the steps of this process have finished (Celery's warm shutdown waits for
    # them; resumable ones stopped at a checkpoint), so the row is marked stopped.
    global _heartbeat
    if _heartbeat is not None and current_worker.get() == _heartbeat.worker_id:
        _heartbeat.stop(clean=True)
    _heartbeat = None


def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    # The solo and threads pools run steps in the main process: it is the worker. (Prefork
    # children register themselves in worker_process_init; the parent runs no step.)
    controller = getattr(sender, "controller", None)
    pool_cls = getattr(controller, "pool_cls", None)
    if "prefork" in str(getattr(pool_cls, "__module__", pool_cls)):
        return
    _start_liveness()


def _on_task_prerun(**_: Any) -> None:
    # Celery makes pool children ignore SIGINT, and billiard sets SIG_IGN again *after*
    # worker_process_init, so the handler is installed here, in the child, before each task.
    # SIGINT is the only shutdown news a child gets: a Ctrl-C in a terminal reaches the whole
    # group, and the main process forwards it on a warm shutdown (below). The handler stops a
    # running resumable step at its next checkpoint.
    if _current_process_name() == "MainProcess":
        return  # solo/threads pools: the main process hears worker_shutting_down itself
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, _on_child_sigint)


def _current_process_name() -> str:
    from billiard.process import current_process  # type: ignore[import-untyped,unused-ignore]

    return str(current_process().name)


def _on_child_sigint(_signum: int, _frame: Any) -> None:
    request_shutdown()


def _forward_shutdown_to_pool_children() -> None:
    from billiard.process import active_children  # type: ignore[import-untyped,unused-ignore]

    for child in active_children():
        if child.pid is None:
            continue
        try:
            os.kill(child.pid, signal.SIGINT)
        except OSError:
            pass


def _on_worker_shutting_down(**_: Any) -> None:
    # Warm shutdown: resumable steps running in this process stop at their next checkpoint
    # (outcome continued, successor scheduled) instead of holding the shutdown up. Ordinary
    # steps run to the end; the message is acknowledged only afterwards (acks_late).
    log.info("worker shutting down: asking resumable steps to stop at their next checkpoint")
    request_shutdown()
    # Prefork: the steps run in pool children, which this signal does not reach.
    _forward_shutdown_to_pool_children()


worker_init.connect(_on_worker_init, weak=False)
worker_ready.connect(_on_worker_ready, weak=False)
worker_process_shutdown.connect(_stop_liveness, weak=False)
worker_shutdown.connect(_stop_liveness, weak=False)
beat_init.connect(_on_beat_init, weak=False)
worker_process_init.connect(_on_worker_process_init, weak=False)
task_prerun.connect(_on_task_prerun, weak=False)
worker_shutting_down.connect(_on_worker_shutting_down, weak=False)


# --- Flask integration ------------------------------------------------------------------------


def celery_init_app(flask_app: Any, celery: Celery | None = None) -> Celery:
    """Attach the Celery app to a Flask app (the Flask "Celery app factory" pattern).

    Reads ``BROKER_URL`` (``GENEVA_BROKER_URL`` through ``from_prefixed_env("GENEVA")``) from the
    Flask config when present, runs tasks inside the Flask app context, and stores the app as
    ``flask_app.extensions["celery"]``. Duck-typed on purpose: the engine never imports Flask.
    """
    target = celery or app
    configured = flask_app.config.get("BROKER_URL")
    if configured:
        target.conf.broker_url = configured

    class FlaskTask(Task):  # type: ignore[misc]
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            with flask_app.app_context():
                return self.run(*args, **kwargs)

    target.Task = FlaskTask
    flask_app.extensions["celery"] = target
    return target


#: The app ``celery -A geneva_drive.celery`` finds.
app = register_tasks(default_app())

__all__ = [
    "BROKER_SETTING",
    "DISPATCH_DUE_TASK",
    "HOUSEKEEPING_TASK",
    "PERFORM_STEP_TASK",
    "CeleryTransport",
    "app",
    "broker_url",
    "celery_init_app",
    "default_queue",
    "make_celery",
    "perform_step",
    "register",
    "register_tasks",
]
