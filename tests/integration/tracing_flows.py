"""The traced worker's workflows and its OpenTelemetry setup (tests/integration/
test_tracing_worker.py), as an application configures a Celery worker (docs/MANUAL.md,
"Tracing"): in each pool process (``worker_process_init``), the SDK's tracer provider and
Celery's own instrumentation.

The spans go to one JSON line each in ``$GENEVA_TEST_SPANS/spans-<pid>.jsonl`` (the SDK's
console exporter with the SDK's own JSON form, exported as each span ends), which the test
reads; a file per process, so lines never interleave.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from celery.signals import worker_process_init

from geneva_drive import Workflow, step


class TracedTrip(Workflow):
    """reserve → charge (two seconds later: beyond the test's one-second dispatch horizon, so
    the dispatcher sends it) → ship (sent by the worker that ran charge)."""

    may_proceed_without_hero = True

    @step
    def reserve(self) -> None:
        pass

    @step(wait=timedelta(seconds=2))
    def charge(self) -> None:
        pass

    @step
    def ship(self) -> None:
        pass


@worker_process_init.connect(weak=False)
def _trace_this_pool_process(**_: Any) -> None:
    directory = os.environ.get("GENEVA_TEST_SPANS")
    if not directory:
        return
    from opentelemetry import trace
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    out = (Path(directory) / f"spans-{os.getpid()}.jsonl").open("a", encoding="utf-8")
    provider = TracerProvider()
    provider.add_span_processor(
        SimpleSpanProcessor(
            ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")
        )
    )
    trace.set_tracer_provider(provider)
    CeleryInstrumentor().instrument()
