"""A worker process for the multiprocess test: ``python -m tests.metrics.mp_worker MODE …``.

The parent sets ``PROMETHEUS_MULTIPROC_DIR`` (before this process imports prometheus-client,
as a Celery worker's environment would) and ``GENEVA_DATABASE_URL`` (plus
``GENEVA_TEST_SCHEMA`` on PostgreSQL). Modes:

* ``run ID…`` — install the event metrics and run those step executions through the real
  executor, like a prefork child running ``geneva_drive.perform_step``; then one
  housekeeping pass.
* ``scrape`` — build the dashboard and print its ``/metrics`` (the aggregated directory plus
  the database gauges).
* ``serve`` — start the worker metrics server on ``GENEVA_WORKER_METRICS_PORT`` and print
  what it serves.
"""

from __future__ import annotations

import os
import sys
import time
import urllib.request
from typing import Any

from geneva_drive import Workflow, step


class MetricsMpWorkflow(Workflow):
    workflow_name = "metrics_mp_flow"
    may_proceed_without_hero = True

    @step
    def work(self) -> None:
        pass


def _configure() -> None:
    from geneva_drive import db, transport

    url = os.environ["GENEVA_DATABASE_URL"]
    schema = os.environ.get("GENEVA_TEST_SCHEMA")
    kwargs: dict[str, Any] = {}
    if schema:
        kwargs["connect_args"] = {"options": f"-csearch_path={schema}"}
    db.configure(url, **kwargs)
    transport.set_transport(transport.RecordingTransport())


def main(argv: list[str]) -> int:
    mode, args = argv[0], argv[1:]
    from geneva_drive import prometheus

    assert prometheus.is_multiprocess(), "PROMETHEUS_MULTIPROC_DIR must be set before start"
    if mode == "run":
        _configure()
        from geneva_drive import executor

        prometheus.install()
        for execution_id in args:
            executor.execute(int(execution_id))
        from geneva_drive import housekeeping

        # Every worker process runs one pass; two passes never overlap (the housekeeping lease),
        # so a process that finds the other's pass running waits for its turn.
        while housekeeping.run().skipped_overlapping:
            time.sleep(0.05)
        print(os.getpid())
        return 0
    if mode == "scrape":
        from geneva_drive.dashboard import create_app

        options: dict[str, Any] = {}
        if os.environ.get("GENEVA_TEST_SCHEMA"):
            options = {
                "connect_args": {"options": f"-csearch_path={os.environ['GENEVA_TEST_SCHEMA']}"}
            }
        flask_app = create_app(
            {"TESTING": True, "SQLALCHEMY_DATABASE_URI": os.environ["GENEVA_DATABASE_URL"],
             "SQLALCHEMY_ENGINE_OPTIONS": options, "METRICS_PUBLIC": True}
        )  # fmt: skip
        response = flask_app.test_client().get("/metrics")
        assert response.status_code == 200, response.status_code
        sys.stdout.write(response.get_data(as_text=True))
        return 0
    if mode == "serve":
        assert prometheus.start_worker_server()
        port = os.environ["GENEVA_WORKER_METRICS_PORT"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            sys.stdout.write(response.read().decode())
        return 0
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
