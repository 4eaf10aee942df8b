"""How "run execution N" messages leave the process, and when.

The database row is the schedule; a transport only carries "run execution N now" (docs/MANUAL.md, "The row is the schedule; Celery is only the transport").
Messages are queued on the SQLAlchemy session and sent right after the transaction that
created them commits, never before, and never at all if it rolls back.

Executions due within ``settings.dispatch_horizon`` are sent at commit (with a countdown);
later ones stay unsent (``sent_at`` NULL) until the dispatcher finds them due, so no transport
ever holds a long ETA.

Transports: Celery (the default, :mod:`geneva_drive.celery_client`), the embedded in-process worker of
``geneva-drive up`` (which polls the table and needs no messages), and the recording transport
of the test fixture.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import event
from sqlalchemy.orm import Session

from geneva_drive.at_commit import AtCommit
from geneva_drive.celery_client import CeleryTransport
from geneva_drive.config import settings

log = logging.getLogger("geneva_drive.transport")


@dataclass
class Message:
    execution_id: int
    job_id: str
    queue: str | None = None
    priority: int | None = None
    countdown: float | None = None
    eta: datetime | None = None
    options: dict[str, Any] = field(default_factory=dict)
    #: The workflow's stored trace context (docs/MANUAL.md, "Tracing"): the Celery transport
    #: publishes inside it. None when the workflow has none.
    trace: dict[str, Any] | None = None


class Transport(Protocol):
    def send(self, message: Message) -> None: ...


class NullTransport:
    """Sends nothing: the embedded worker polls the step-execution table instead."""

    def send(self, message: Message) -> None:
        return None


class RecordingTransport:
    """Records messages instead of sending them (tests; docs/MANUAL.md, "Testing")."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    def send(self, message: Message) -> None:
        self.messages.append(message)

    @property
    def execution_ids(self) -> list[int]:
        return [m.execution_id for m in self.messages]

    def clear(self) -> None:
        self.messages.clear()


_transport: Transport | None = None


def set_transport(transport: Transport | None) -> None:
    global _transport
    _transport = transport


def get_transport() -> Transport:
    global _transport
    if _transport is None:
        _transport = CeleryTransport()
    return _transport


def require_publisher(role: str) -> None:
    """Refuse to start ``role`` if it would publish step messages to a broker it was not given
    (docs/MANUAL.md, "Adding GenevaDrive to an existing Flask app"): ConfigurationError naming ``GENEVA_BROKER_URL``. A process whose transport is
    not Celery's (the embedded worker's, a test's) publishes nothing and passes."""
    from geneva_drive import celery_client

    current = _transport
    if current is not None and not isinstance(current, CeleryTransport):
        return
    celery_client.require_broker(role, current._celery if current is not None else None)


def new_job_id() -> str:
    return uuid.uuid4().hex


_inline = threading.local()


@contextlib.contextmanager
def with_inline_enqueue() -> Iterator[None]:
    """Send messages at once instead of after commit, inside this block (nesting-safe)."""
    previous = getattr(_inline, "active", False)
    _inline.active = True
    try:
        yield
    finally:
        _inline.active = previous


def enqueues_deferred() -> bool:
    if getattr(_inline, "active", False):
        return False
    return settings.enqueue_after_commit


#: The messages a transaction sends once it has committed (a savepoint that rolls back takes
#: its own back with it).
_pending: AtCommit[Message] = AtCommit("geneva_pending_messages")


def queue_message(session: Session, message: Message) -> None:
    """Send ``message`` after ``session`` commits (or at once when enqueues are not deferred)."""
    if not enqueues_deferred():
        get_transport().send(message)
        return
    _pending.add(session, message)


def pending_count(session: Session) -> int:
    return len(_pending.items(session))


@event.listens_for(Session, "after_commit")
def _send_after_commit(session: Session) -> None:
    if session.get_nested_transaction() is not None:
        # SQLAlchemy fires after_commit for a released savepoint too; the enclosing
        # transaction may still roll back, so nothing is sent before the real commit.
        return
    pending = _pending.take(session)
    if not pending:
        return
    transport = get_transport()
    for message in pending:
        try:
            transport.send(message)
        except Exception:
            # The row is committed and marked sent; the dispatcher resends it once
            # settings.dispatch_resend_after has passed. Losing a message loses no work.
            log.exception(
                "Could not send step execution %s (job %s); the dispatcher will resend it",
                message.execution_id,
                message.job_id,
            )
