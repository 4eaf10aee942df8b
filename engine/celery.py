"""The Celery side: the app, the ``geneva_drive.perform_step`` task and the Celery transport.

Celery only carries "run execution N now"; the database row is the schedule (SPEC §1.2).
The task is thin and idempotent: running a message twice is harmless because the executor
only starts an execution that is still ``scheduled``, under the workflow lock.

Start a worker with ``celery -A engine.celery worker``; configure with ``GENEVA_BROKER_URL``.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from celery import Celery

from engine.transport import Message

log = logging.getLogger("engine.celery")

DEFAULT_BROKER_URL = "redis://127.0.0.1:6379/0"
PERFORM_STEP_TASK = "geneva_drive.perform_step"


def make_celery(broker_url: str | None = None) -> Celery:
    celery = Celery("geneva_drive", broker=broker_url or os.environ.get("GENEVA_BROKER_URL") or DEFAULT_BROKER_URL)
    celery.conf.update(
        task_ignore_result=True,
        task_acks_late=True,
        # A message whose worker died is redelivered; the executor makes the rerun harmless.
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue="default",
        broker_connection_retry_on_startup=True,
    )
    celery.task(name=PERFORM_STEP_TASK, bind=False, acks_late=True, ignore_result=True)(perform_step)
    return celery


def perform_step(step_execution_id: int) -> None:
    """Run one step execution; re-raises what the executor re-raises."""
    from sqlalchemy import select

    from engine import db, executor
    from engine.models import StepExecution

    # Ride out replication lag between the sender's commit and this read (as the gem does).
    for attempt in range(5):
        with db.new_session() as session:
            found = session.scalar(select(StepExecution.id).where(StepExecution.id == step_execution_id))
        if found is not None:
            break
        if attempt < 4:
            time.sleep(0.1)
    else:
        log.warning("step execution %s not found; nothing to run", step_execution_id)
        return
    executor.execute(step_execution_id)


class CeleryTransport:
    """Sends ``geneva_drive.perform_step(id)`` with the step's queue, priority and countdown."""

    def __init__(self, celery: Celery | None = None) -> None:
        self._celery = celery

    @property
    def celery(self) -> Celery:
        if self._celery is None:
            self._celery = app
        return self._celery

    def send(self, message: Message) -> None:
        options: dict[str, Any] = {"task_id": message.job_id}
        if message.queue:
            options["queue"] = message.queue
        if message.priority is not None:
            options["priority"] = message.priority
        if message.countdown:
            options["countdown"] = message.countdown
        self.celery.send_task(PERFORM_STEP_TASK, args=[message.execution_id], **options)


app = make_celery()
