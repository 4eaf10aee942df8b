"""A Flask-free CLI in a host deployment sends to the queue the workers consume, or refuses.

A host's Celery workers consume their own app's default queue (``celery`` unless it says
otherwise); ``geneva-drive`` outside Flask builds its own app, whose default queue is
``GENEVA_DEFAULT_QUEUE``. The live workers' rows say which queues they read, so a publishing
command that would send elsewhere stops at start, naming the setting, and writes nothing.
"""

from __future__ import annotations

from typing import Any

import redis
from sqlalchemy import select

from geneva_drive import db, liveness
from geneva_drive.models import OperatorAction, Signal
from tests.app.test_operator_cli import REDIS_URL, cli, demo  # noqa: F401 (fixtures)


def test_the_cli_refuses_a_queue_no_live_worker_consumes_and_delivers_to_one_that_does(
    demo: dict[str, list[int]],  # noqa: F811
    cli: Any,  # noqa: F811
) -> None:
    workflow_id = demo["payments"][0]
    queue = cli.env["GENEVA_DEFAULT_QUEUE"]
    host_worker = liveness.register("celery", ["celery"], name="celery@shop/101")

    refused = cli("signal", "payment_confirmed", str(workflow_id))
    assert refused.returncode == 2
    assert f"Celery queue {queue!r}" in refused.stderr
    assert "the live workers consume: celery" in refused.stderr
    assert "GENEVA_DEFAULT_QUEUE" in refused.stderr
    with db.new_session() as session:
        assert session.scalars(select(Signal).where(Signal.workflow_id == workflow_id)).all() == []
        assert session.scalars(select(OperatorAction)).all() == []  # nothing half-done

    # A worker that consumes the CLI's queue: the signal is delivered, and the woken step's
    # message lands in that queue.
    liveness.register("celery", ["celery", queue], name="celery@shop/102")
    delivered = cli("signal", "payment_confirmed", str(workflow_id))
    assert delivered.returncode == 0, delivered.stderr
    assert redis.Redis.from_url(REDIS_URL).llen(queue) >= 1
    host_worker.stop()


def test_the_standalone_dashboard_refuses_to_start_on_a_queue_no_worker_consumes(
    demo: dict[str, list[int]],  # noqa: F811
    cli: Any,  # noqa: F811
) -> None:
    import secrets
    import subprocess
    import sys

    liveness.register("celery", ["celery"], name="celery@shop/103")
    started = subprocess.run(
        [sys.executable, "-c", "import geneva_drive.dashboard.wsgi"],
        env={**cli.env, "GENEVA_SECRET_KEY": secrets.token_urlsafe(32)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode != 0
    assert "the standalone dashboard" in started.stderr
    assert "GENEVA_DEFAULT_QUEUE" in started.stderr
