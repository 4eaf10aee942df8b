"""The sending side of Celery: the app's configuration and the transport that sends steps.

Below the engine's scheduling layer, which hands it messages (engine/transport.py's default
transport); it knows task *names* only, never the task functions, so it imports nothing of
the engine's upper layers. :mod:`geneva_drive.celery` - the worker side - registers the tasks
on the same app (``celery -A geneva_drive.celery``), so a process that sends and runs steps
uses one app and one broker connection pool.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery import Celery

from geneva_drive import tracing
from geneva_drive.config import process_variable
from geneva_drive.errors import ConfigurationError

if TYPE_CHECKING:
    from geneva_drive.transport import Message

#: The setting that names the broker. There is no default: a process that publishes step
#: messages must be given a broker (or the host's Celery app), docs/MANUAL.md, "Adding GenevaDrive to an existing Flask app"
BROKER_SETTING = "GENEVA_BROKER_URL"
#: Marks the apps new_app() made (the host's own apps are not checked for a broker).
MADE_HERE = "_geneva_drive_made_here"
#: Task names are stable strings: queued messages outlive refactors of module paths.
PERFORM_STEP_TASK = "geneva_drive.perform_step"
DISPATCH_DUE_TASK = "geneva_drive.dispatch_due"
HOUSEKEEPING_TASK = "geneva_drive.housekeeping"


def broker_url() -> str | None:
    """``GENEVA_BROKER_URL``, or None: no broker was given (and none is guessed)."""
    return process_variable(BROKER_SETTING) or None


def broker_missing(role: str) -> ConfigurationError:
    """The refusal of a role that would publish step messages without a broker."""
    return ConfigurationError(
        f"{role} publishes step messages, but no broker was given: set {BROKER_SETTING} to "
        "your Celery broker (e.g. redis://HOST:6379/0 or amqp://USER:PASSWORD@HOST:5672/VHOST), "
        "or give the Flask extension your Celery app (GenevaDrive(app, db=db, celery=celery)). "
        "Only the embedded `geneva-drive up` and `geneva-drive worker` run without a broker "
        "(they poll the database)."
    )


def has_broker(celery: Celery | None = None) -> bool:
    """Was this process given a broker: the host's Celery app (:func:`use_app`), an app with a
    broker configured, or ``GENEVA_BROKER_URL``?"""
    if celery is None:
        if _host_given:
            return True
        celery = default_app()
    if not getattr(celery, MADE_HERE, False):
        return True  # a host's own app: configured by the host
    return bool(celery.conf.broker_url or broker_url())


def require_broker(role: str, celery: Celery | None = None) -> None:
    """Refuse to start ``role`` (raise ConfigurationError naming the setting) without a broker."""
    if not has_broker(celery):
        raise broker_missing(role)


def default_queue() -> str:
    """``GENEVA_DEFAULT_QUEUE``: the queue for steps without a ``queue`` job option."""
    return process_variable("GENEVA_DEFAULT_QUEUE") or "default"


def new_app(url: str | None = None) -> Celery:
    """A configured Celery app (broker, queue, acks, beat schedule), without the tasks."""
    # Not the process's "current" Celery app: a host's shared_task must not bind to this one.
    # Without a URL the app has no broker (Celery would fall back to amqp://localhost at the
    # first send): every role that publishes refuses to start then (require_broker).
    celery = Celery("geneva_drive", broker=url or broker_url(), set_as_current=False)
    setattr(celery, MADE_HERE, True)
    queue = default_queue()
    celery.conf.update(
        task_ignore_result=True,
        task_acks_late=True,
        # A message whose worker process died is redelivered; the executor makes it harmless.
        task_reject_on_worker_lost=True,
        # One message per process at a time: a long step must not sit on prefetched messages.
        worker_prefetch_multiplier=1,
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
    )
    return celery


_default: Celery | None = None
#: The host gave its own Celery app (use_app): its broker is the host's business.
_host_given = False


def default_app() -> Celery:
    """The process's Celery app, made on first use (``geneva_drive.celery.app`` is this one),
    or the host's own once :func:`geneva_drive.celery.register` was given it."""
    global _default
    if _default is None:
        _default = new_app()
    return _default


def use_app(celery: Celery) -> None:
    """Send step messages through ``celery`` (a host's own app) from now on."""
    global _default, _host_given
    _default = celery
    _host_given = True


class CeleryTransport:
    """Sends ``geneva_drive.perform_step(id)`` with the step's queue, priority and countdown."""

    def __init__(self, celery: Celery | None = None) -> None:
        self._celery = celery

    @property
    def celery(self) -> Celery:
        # Not cached: register() may point the process at the host's app after this was made.
        return self._celery if self._celery is not None else default_app()

    def send(self, message: Message) -> None:
        celery = self.celery
        if self._celery is None and not has_broker():
            # Never to a broker this process was not given (the roles refuse at start; this is
            # the backstop): the row stays unsent-or-sent in the database either way.
            raise broker_missing("this process")
        options: dict[str, Any] = {"task_id": message.job_id}
        if message.queue:
            options["queue"] = message.queue
        if message.priority is not None:
            options["priority"] = message.priority
        if message.countdown:
            options["countdown"] = message.countdown
        if message.eta is not None:
            options["eta"] = message.eta
        if message.trace is None:
            celery.send_task(PERFORM_STEP_TASK, args=[message.execution_id], **options)
            return
        # Published inside the workflow's trace, which the headers carry to the worker: Celery's
        # own instrumentation starts its task spans there (docs/MANUAL.md, "Tracing").
        with tracing.publishing(message.trace) as headers:
            if headers:
                options["headers"] = headers
            celery.send_task(PERFORM_STEP_TASK, args=[message.execution_id], **options)
