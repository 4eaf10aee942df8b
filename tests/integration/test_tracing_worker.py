"""Tracing through a real Celery worker on Redis (docs/MANUAL.md, "Tracing"), with Celery's own
instrumentation in the worker (tests/integration/tracing_flows.py): the steps' spans join the
trace of the request that created the workflow, and Celery's task spans land in that same
trace instead of starting traces of their own.

The test process is the application's web process (the SDK, no Celery instrumentation): it
creates the workflow inside a request span and runs the dispatcher's sweep that sends the
delayed step. The worker runs every step from a message (inline successors off).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace as otel_trace

from geneva_drive.dispatch import dispatch_due
from tests.integration.conftest import (
    REDIS_URL,
    Broker,
    SharedDatabase,
    Worker,
    create_workflow,
    executions,
    require_service,
    wait_for_state,
    wait_until,
)
from tests.integration.tracing_flows import TracedTrip

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def traced_worker(
    shared_database: SharedDatabase,
    short_horizon: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Worker]:
    require_service("Redis", REDIS_URL)
    directory = tmp_path_factory.mktemp("traced")
    started = Worker(
        shared_database,
        Broker("redis", REDIS_URL),
        directory,
        "prefork",
        1,
        GENEVA_WORKFLOW_MODULES="tests.integration.tracing_flows",
        GENEVA_TEST_SPANS=str(directory),
        GENEVA_INLINE_SUCCESSORS="false",
    )
    try:
        yield started
    finally:
        started.close()


def worker_spans(directory: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted(directory.glob("spans-*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def hex_id(value: int, width: int) -> str:
    return f"0x{value:0{width}x}"


def test_step_spans_join_the_creator_s_trace_and_celery_s_spans_stay_in_it(
    traced_worker: Worker, use_transport, otel_spans
) -> None:
    use_transport(traced_worker.transport)
    tracer = otel_trace.get_tracer("shop.web")
    with tracer.start_as_current_span("POST /trips") as request:
        workflow_id = create_workflow(TracedTrip)
    creator = request.get_span_context()
    trace_id, creator_id = hex_id(creator.trace_id, 32), hex_id(creator.span_id, 16)

    def charge_waits_unsent() -> bool:
        found = [e for e in executions(workflow_id) if e.step_name == "charge"]
        return bool(found) and found[0].sent_at is None

    wait_until(charge_waits_unsent, what="the worker to run reserve and schedule charge")
    # The dispatcher, here in the web process: its sweep sends charge once it is due.
    wait_until(lambda: dispatch_due() == 1, timeout=30, what="the sweep to send charge")
    wait_for_state(workflow_id, "finished")
    directory = traced_worker.directory
    wait_until(
        lambda: (
            sum(s["name"].startswith("geneva_drive.step") for s in worker_spans(directory)) == 3
            and sum(s["name"].startswith("run/") for s in worker_spans(directory)) == 3
        ),
        what="the worker to export three step spans and three task spans",
    )
    spans = worker_spans(directory)
    by_id = {s["context"]["span_id"]: s for s in spans}

    # One trace: the request's. Celery's instrumentation started none of its own.
    assert {s["context"]["trace_id"] for s in spans} == {trace_id}, [
        (s["name"], s["context"]["trace_id"]) for s in spans
    ]

    steps = [s for s in spans if s["name"].startswith("geneva_drive.step")]
    ran = {e.id: e.step_name for e in executions(workflow_id)}
    assert sorted(s["name"] for s in steps) == sorted(
        f"geneva_drive.step TracedTrip.{name}" for name in ("reserve", "charge", "ship")
    )
    for span in steps:
        attributes = span["attributes"]
        assert span["kind"] == "SpanKind.INTERNAL"
        assert span["parent_id"] == creator_id  # the request's span, across processes
        assert attributes["geneva_drive.workflow.id"] == workflow_id
        assert attributes["geneva_drive.workflow.class"] == "TracedTrip"
        assert ran[attributes["geneva_drive.execution.id"]] == attributes["geneva_drive.step"]
        assert attributes["geneva_drive.attempt"] == 1
        assert attributes["geneva_drive.outcome"] == "success"
        # Linked to the Celery task span that delivered its message (the step's own parent
        # stays the workflow's context).
        (delivery,) = [
            link for link in span["links"] if link["attributes"]["geneva_drive.link"] == "delivery"
        ]
        task = by_id[delivery["context"]["span_id"]]
        assert task["name"] == "run/geneva_drive.perform_step"

    def task_of(step_name: str) -> dict[str, Any]:
        (span,) = [s for s in steps if s["attributes"]["geneva_drive.step"] == step_name]
        (delivery,) = [
            link for link in span["links"] if link["attributes"]["geneva_drive.link"] == "delivery"
        ]
        return by_id[delivery["context"]["span_id"]]

    # reserve: published by the web process without Celery's instrumentation; the engine's
    # headers carried the workflow's context, so the task span is the request's child.
    assert task_of("reserve")["parent_id"] == creator_id
    # charge: sent by the dispatcher's sweep, published inside the workflow's trace.
    assert task_of("charge")["parent_id"] == creator_id
    # ship: sent by the worker after charge's commit, inside charge's span: Celery's publish
    # span nests under it and the task span under the publish span.
    (charge_span,) = [s for s in steps if s["attributes"]["geneva_drive.step"] == "charge"]
    publish = by_id[task_of("ship")["parent_id"]]
    assert publish["name"] == "apply_async/geneva_drive.perform_step"
    assert publish["parent_id"] == charge_span["context"]["span_id"]

    # The web process: the request and the sweep's own span, in a trace of its own.
    local = {s.name: s for s in otel_spans.get_finished_spans()}
    sweep = local["geneva_drive.dispatch"]
    assert sweep.context.trace_id != creator.trace_id and sweep.parent is None
