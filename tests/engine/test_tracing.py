"""Tracing (docs/MANUAL.md, "Tracing"): one trace per workflow, a span per step attempt, links
from signals, child workflows in their parent step's trace, the dispatcher's and
housekeeping's spans of their own, trace ids on log lines, and nothing at all with tracing off.

The SDK is configured as an application would (``otel_spans``: an in-memory exporter); the
steps run through the real executor, in a session of their own as a worker runs them.
"""

from __future__ import annotations

import itertools
import logging
import os
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery
from celery.signals import before_task_publish
from opentelemetry import trace as otel_trace
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy import select

from geneva_drive import ExceptionPolicy, Workflow, executor, housekeeping, inline, step, tracing
from geneva_drive.celery_client import CeleryTransport
from geneva_drive.config import settings
from geneva_drive.dispatch import dispatch_due
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.testing import perform_next_step, speedrun_children, speedrun_workflow
from tests.engine.helpers import executions, make_order

ROOT = Path(__file__).resolve().parents[2]


class Shipment(Workflow):
    @step
    def pack(self):
        pass

    @step
    def ship(self):
        pass

    @step
    def notify(self):
        pass


class Flaky(Workflow):
    """Fails twice (reattempted by its policy), then succeeds."""

    calls = 0

    @step(on_exception=ExceptionPolicy("reattempt", matching=RuntimeError, max_reattempts=3))
    def call_api(self):
        Flaky.calls += 1
        if Flaky.calls <= 2:
            raise RuntimeError(f"the API answered 503 (call {Flaky.calls})")

    @step
    def done(self):
        pass


class Broken(Workflow):
    @step
    def explode(self):
        raise ValueError("the address is missing")


class AwaitsPayment(Workflow):
    @step(wait_for="paid")
    def wait_for_payment(self):
        pass

    @step
    def after(self):
        pass


class PackLine(Workflow):
    @step
    def pack(self):
        pass


class Fulfilment(Workflow):
    @step
    def fan_out(self):
        self.start_child(PackLine, hero=self.hero)

    @step(wait_for_children=True)
    def join(self):
        pass


@pytest.fixture(autouse=True)
def _reset_flaky():
    Flaky.calls = 0


def step_spans(exporter):
    return [s for s in exporter.get_finished_spans() if s.name.startswith("geneva_drive.step ")]


def hex_trace(span_context) -> str:
    return f"{span_context.trace_id:032x}"


def traceparent(span_context) -> str:
    return (
        f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-"
        f"{int(span_context.trace_flags):02x}"
    )


def resend_sweep() -> int:
    """A dispatcher sweep once the sent messages count as lost (``dispatch_resend_after``)."""
    return dispatch_due(utcnow() + settings.dispatch_resend_after + timedelta(seconds=1))


def tracer():
    return otel_trace.get_tracer("the application")


def test_create_inside_a_span_stores_its_context_and_every_step_is_its_child(
    geneva_session, otel_spans
):
    with tracer().start_as_current_span("POST /orders") as request:
        workflow = Shipment.create(hero=make_order(geneva_session))
        geneva_session.commit()
    creator = request.get_span_context()
    stored = workflow.metadata_["trace"]
    assert stored["traceparent"] == traceparent(creator)
    speedrun_workflow(workflow)
    assert workflow.state == "finished"

    spans = step_spans(otel_spans)
    assert [s.name for s in spans] == [
        "geneva_drive.step Shipment.pack",
        "geneva_drive.step Shipment.ship",
        "geneva_drive.step Shipment.notify",
    ]
    ran = executions(geneva_session, workflow)
    for span, execution in zip(spans, ran, strict=True):
        assert span.kind == SpanKind.INTERNAL
        assert span.context.trace_id == creator.trace_id
        assert span.parent is not None and span.parent.span_id == creator.span_id
        assert span.status.status_code == StatusCode.UNSET
        assert dict(span.attributes) == {
            "geneva_drive.workflow.id": workflow.id,
            "geneva_drive.workflow.class": "Shipment",
            "geneva_drive.step": execution.step_name,
            "geneva_drive.execution.id": execution.id,
            "geneva_drive.attempt": 1,
            "geneva_drive.outcome": "success",
            "geneva_drive.hero.type": "Order",
            "geneva_drive.hero.id": str(workflow.hero_id),
        }
        # The span covers the attempt: it starts before the step's start and ends after its
        # finish was recorded.
        assert span.start_time <= execution.started_at.timestamp() * 1e9 + 1e6
        assert span.end_time >= execution.finished_at.timestamp() * 1e9 - 1e6


def test_the_caller_s_tracestate_is_stored_and_carried_by_the_steps(geneva_session, otel_spans):
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    incoming = TraceContextTextMapPropagator().extract(
        {
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "tracestate": "shop=blue,vendor=7",
        }
    )
    with tracer().start_as_current_span("POST /orders", context=incoming):
        workflow = Shipment.create(hero=make_order(geneva_session))
        geneva_session.commit()
    assert workflow.metadata_["trace"]["tracestate"] == "shop=blue,vendor=7"
    speedrun_workflow(workflow)
    for span in step_spans(otel_spans):
        assert span.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
        assert span.context.trace_state.to_header() == "shop=blue,vendor=7"


def test_a_workflow_created_outside_any_span_gets_its_first_step_s_trace(
    geneva_session, otel_spans
):
    workflow = Shipment.create(hero=make_order(geneva_session))
    geneva_session.commit()
    assert workflow.metadata_ is None  # nothing to store: no span was current
    perform_next_step(workflow)
    first = step_spans(otel_spans)[0]
    assert first.parent is None  # the root of the workflow's trace
    geneva_session.expire_all()
    assert tracing.trace_id_of(workflow.metadata_) == hex_trace(first.context)
    speedrun_workflow(workflow)
    pack, ship, notify = step_spans(otel_spans)
    assert pack is first
    for later in (ship, notify):
        assert later.context.trace_id == first.context.trace_id
        assert later.parent.span_id == first.context.span_id


def test_reattempts_count_and_a_raising_body_marks_its_span_error(geneva_session, otel_spans):
    workflow = Flaky.create(hero=make_order(geneva_session))
    geneva_session.commit()
    for _ in range(2):
        with pytest.raises(RuntimeError):
            perform_next_step(workflow)
    speedrun_workflow(workflow)
    assert workflow.state == "finished"
    spans = step_spans(otel_spans)
    assert [
        (s.attributes["geneva_drive.step"], s.attributes["geneva_drive.attempt"]) for s in spans
    ] == [("call_api", 1), ("call_api", 2), ("call_api", 3), ("done", 1)]
    assert [s.attributes["geneva_drive.outcome"] for s in spans] == [
        "reattempted",
        "reattempted",
        "success",
        "success",
    ]
    for failed, call in zip(spans[:2], (1, 2), strict=True):
        assert failed.status.status_code == StatusCode.ERROR
        (event,) = failed.events
        assert event.name == "exception"
        assert event.attributes["exception.type"] == "RuntimeError"
        assert event.attributes["exception.message"] == f"the API answered 503 (call {call})"
    assert spans[2].status.status_code == StatusCode.UNSET
    assert spans[2].events == ()


def test_a_failed_step_resumed_by_an_operator_runs_as_its_next_attempt(geneva_session, otel_spans):
    workflow = Broken.create(hero=make_order(geneva_session))
    geneva_session.commit()
    with pytest.raises(ValueError):
        perform_next_step(workflow)
    (failed,) = step_spans(otel_spans)
    assert failed.attributes["geneva_drive.outcome"] == "failed"
    assert failed.status.status_code == StatusCode.ERROR
    assert "the address is missing" in failed.status.description
    geneva_session.expire_all()
    assert workflow.state == "paused"
    workflow.resume()
    geneva_session.commit()
    with pytest.raises(ValueError):
        perform_next_step(workflow)
    assert [s.attributes["geneva_drive.attempt"] for s in step_spans(otel_spans)] == [1, 2]


def _link_kinds(span):
    return {link.attributes["geneva_drive.link"]: link for link in span.links}


def test_a_signal_sent_inside_a_span_links_the_execution_it_wakes(geneva_session, otel_spans):
    workflow = AwaitsPayment.create(hero=make_order(geneva_session))
    geneva_session.commit()
    perform_next_step(workflow)  # parks: no span, the body did not run
    assert step_spans(otel_spans) == []
    with tracer().start_as_current_span("POST /webhooks/payment") as webhook:
        signal = workflow.signal("paid", {"amount": 12})
        geneva_session.commit()
    perform_next_step(workflow)
    (woken,) = step_spans(otel_spans)
    link = _link_kinds(woken)["signal"]
    assert link.context.trace_id == webhook.get_span_context().trace_id
    assert link.context.span_id == webhook.get_span_context().span_id
    assert link.attributes["geneva_drive.signal.id"] == signal.id
    # The webhook's own trace is not the workflow's: the step stays in the workflow's trace.
    assert woken.parent is None or woken.parent.span_id != webhook.get_span_context().span_id


def test_a_signal_buffered_before_the_step_parks_is_linked_when_the_gate_attaches_it(
    geneva_session, otel_spans
):
    workflow = AwaitsPayment.create(hero=make_order(geneva_session))
    geneva_session.commit()
    with tracer().start_as_current_span("POST /webhooks/payment") as webhook:
        workflow.signal("paid")
        geneva_session.commit()
    perform_next_step(workflow)
    (ran,) = step_spans(otel_spans)
    assert _link_kinds(ran)["signal"].context.span_id == webhook.get_span_context().span_id


def test_a_signal_sent_outside_any_span_adds_no_link_and_stores_nothing(geneva_session, otel_spans):
    workflow = AwaitsPayment.create(hero=make_order(geneva_session))
    geneva_session.commit()
    perform_next_step(workflow)
    workflow.signal("paid")
    geneva_session.commit()
    perform_next_step(workflow)
    (woken,) = step_spans(otel_spans)
    assert "signal" not in _link_kinds(woken)
    geneva_session.expire_all()
    assert "signals" not in workflow.metadata_["trace"]


def test_a_child_workflow_s_trace_is_its_parent_step_s_span(geneva_session, otel_spans):
    with tracer().start_as_current_span("POST /orders"):
        parent = Fulfilment.create(hero=make_order(geneva_session))
        geneva_session.commit()
    perform_next_step(parent)
    (fan_out,) = step_spans(otel_spans)
    (child,) = speedrun_children(parent)
    (child_step,) = [s for s in step_spans(otel_spans) if "PackLine" in s.name]
    assert tracing.trace_id_of(child.metadata_) == hex_trace(fan_out.context)
    assert child_step.parent.span_id == fan_out.context.span_id
    assert child_step.context.trace_id == fan_out.context.trace_id


def _run_chain(session, budget_setting: bool) -> tuple[Workflow, list[int]]:
    settings.inline_successor_start_with_outcome = budget_setting
    with tracer().start_as_current_span("POST /orders"):
        workflow = Shipment.create(hero=make_order(session))
        session.commit()
    first = workflow.current_execution.id
    assert executor.execute(first, budget=inline.Budget())
    return workflow, [e.id for e in executions(session, workflow)]


@pytest.mark.usefixtures("generous_inline_time_budget")
@pytest.mark.parametrize("start_with_outcome", [False, True], ids=["own-start", "with-outcome"])
def test_inline_successors_get_the_same_spans_as_delivered_ones(
    geneva_session, geneva_transport, otel_spans, start_with_outcome
):
    workflow, ran = _run_chain(geneva_session, start_with_outcome)
    # Only the first step's message (sent by create): all three ran in this "worker".
    assert geneva_transport.execution_ids == ran[:1]
    spans = step_spans(otel_spans)
    assert [s.attributes["geneva_drive.execution.id"] for s in spans] == ran
    creator = tracing.stored(workflow.metadata_)
    assert creator is not None
    for span in spans:
        assert hex_trace(span.context) == tracing.trace_id_of(workflow.metadata_)
        assert f"{span.parent.span_id:016x}" in creator["traceparent"]
        assert span.attributes["geneva_drive.outcome"] == "success"
        assert span.attributes["geneva_drive.attempt"] == 1
    # Each span ended before the next one began: siblings, not nested in one another.
    for earlier, later in itertools.pairwise(spans):
        assert earlier.end_time <= later.start_time


def test_the_step_span_is_current_in_the_body_and_log_lines_carry_its_ids(
    geneva_session, otel_spans, caplog
):
    seen: dict[str, object] = {}

    class Logs(Workflow):
        @step
        def look(self):
            seen["span"] = otel_trace.get_current_span().get_span_context()
            raise RuntimeError("boom")

    workflow = Logs.create(hero=make_order(geneva_session))
    geneva_session.commit()
    with caplog.at_level(logging.INFO, logger="geneva_drive"), pytest.raises(RuntimeError):
        perform_next_step(workflow)
    (span,) = step_spans(otel_spans)
    assert seen["span"] == span.context
    ids = {"trace_id": f"{span.context.trace_id:032x}", "span_id": f"{span.context.span_id:016x}"}
    # The executor's line about the policy, and the error report, written inside the span.
    policy = next(r for r in caplog.records if "policy" in r.getMessage())
    assert {k: policy.geneva_drive[k] for k in ids} == ids
    assert f"trace_id={ids['trace_id']} span_id={ids['span_id']}" in policy.getMessage()
    report = next(r for r in caplog.records if r.getMessage().startswith("Step raised"))
    assert {k: report.geneva_drive[k] for k in ids} == ids


def test_without_a_provider_log_lines_carry_no_trace_ids(geneva_session, caplog):
    class QuietLogs(Workflow):
        @step
        def look(self):
            raise RuntimeError("boom")

    workflow = QuietLogs.create(hero=make_order(geneva_session))
    geneva_session.commit()
    with caplog.at_level(logging.INFO, logger="geneva_drive"), pytest.raises(RuntimeError):
        perform_next_step(workflow)
    policy = next(r for r in caplog.records if "policy" in r.getMessage())
    assert "trace_id" not in policy.geneva_drive
    assert "trace_id" not in policy.getMessage()


def test_the_dispatcher_sweep_and_housekeeping_have_spans_of_their_own(geneva_session, otel_spans):
    Shipment.create(hero=make_order(geneva_session))
    geneva_session.commit()
    assert resend_sweep() == 1  # its message counts as lost: the sweep sends it again
    housekeeping.run()
    finished = {s.name: s for s in otel_spans.get_finished_spans()}
    sweep = finished["geneva_drive.dispatch"]
    assert sweep.parent is None and sweep.attributes["geneva_drive.dispatched"] == 1
    keeper = finished["geneva_drive.housekeeping"]
    assert keeper.parent is None and keeper.context.trace_id != sweep.context.trace_id
    assert keeper.attributes["geneva_drive.housekeeping.skipped_overlapping"] == 0
    assert "geneva_drive.housekeeping.workflows_cleaned_up" in keeper.attributes


@pytest.fixture
def published() -> list[dict]:
    """The headers of every Celery message published while the test runs (a real Celery app
    on its in-memory broker)."""
    seen: list[dict] = []

    def record(sender=None, headers=None, **_):
        seen.append(dict(headers or {}))

    before_task_publish.connect(record, weak=False)
    yield seen
    before_task_publish.disconnect(record)


def _celery() -> Celery:
    return Celery("tracing-test", broker="memory://", set_as_current=False)


def test_the_celery_transport_publishes_inside_the_workflow_s_trace(
    geneva_session, otel_spans, published, use_transport
):
    app = _celery()
    use_transport(CeleryTransport(app))
    with tracer().start_as_current_span("POST /orders") as request:
        Shipment.create(hero=make_order(geneva_session))
        geneva_session.commit()
    creator = request.get_span_context()
    (first,) = published
    assert first["traceparent"] == traceparent(creator)
    # The dispatcher's sweep, inside a span of another trace, publishes in the workflow's.
    published.clear()
    assert resend_sweep() == 1
    (resent,) = published
    assert resent["traceparent"] == first["traceparent"]
    app.close()


def test_without_a_provider_the_celery_transport_adds_no_headers(
    geneva_session, published, use_transport
):
    app = _celery()
    use_transport(CeleryTransport(app))
    with tracer().start_as_current_span("POST /orders"):
        Shipment.create(hero=make_order(geneva_session))
        geneva_session.commit()
    (first,) = published
    assert "traceparent" not in first
    app.close()


@pytest.fixture
def use_transport():
    from geneva_drive import transport

    previous = transport._transport

    def use(chosen):
        transport.set_transport(chosen)

    yield use
    transport.set_transport(previous)


def test_with_the_default_provider_nothing_is_stored_or_traced(geneva_session):
    assert tracing.tracer() is None
    with tracer().start_as_current_span("POST /orders"):
        workflow = Shipment.create(hero=make_order(geneva_session))
        geneva_session.commit()
    speedrun_workflow(workflow)
    geneva_session.expire_all()
    assert workflow.metadata_ is None
    rows = geneva_session.scalars(
        select(StepExecution.metadata_).where(StepExecution.workflow_id == workflow.id)
    )
    assert list(rows) == [None, None, None]


def _run_in_subprocess(before: str, after: str, tmp_path: Path) -> str:
    script = "\n".join(textwrap.dedent(part) for part in (before, _WORKFLOW, after))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(ROOT)
    env["GENEVA_DATABASE_URL"] = f"sqlite:///{tmp_path / 'trace.sqlite3'}"
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


# Both scripts run a workflow through the real executor on a database of their own (it never
# touches the suite's, so this runs once, in the SQLite pass).
_WORKFLOW = """
    from geneva_drive import Workflow, db, step, tracing
    from geneva_drive.models import Base, StepExecution
    from geneva_drive.testing import speedrun_workflow

    class Plain(Workflow):
        may_proceed_without_hero = True

        @step
        def one(self):
            pass

        @step
        def two(self):
            pass

    Base.metadata.create_all(db.get_engine())
    with db.transaction() as session, request():
        workflow = Plain.create(session=session)
    session = db.new_session()
    workflow = session.get(Workflow, workflow.id)
    speedrun_workflow(workflow)
    assert workflow.state == "finished", workflow.state
    assert workflow.metadata_ is None, workflow.metadata_
    assert all(e.metadata_ is None for e in session.query(StepExecution)), "execution metadata"
    assert tracing.tracer() is None
"""


@pytest.mark.sqlite_pass
def test_without_opentelemetry_installed_the_engine_runs_unchanged(tmp_path):
    out = _run_in_subprocess(
        """
        import sys
        # As if geneva-drive[otel] was not installed: every opentelemetry import fails.
        for name in [n for n in sys.modules if n.startswith("opentelemetry")]:
            del sys.modules[name]
        sys.modules["opentelemetry"] = None
        from contextlib import nullcontext as request
        """,
        """
        assert tracing.AVAILABLE is False
        print("ran without opentelemetry")
        """,
        tmp_path,
    )
    assert "ran without opentelemetry" in out


@pytest.mark.sqlite_pass
def test_with_the_no_op_provider_nothing_is_traced(tmp_path):
    out = _run_in_subprocess(
        """
        from opentelemetry import trace
        trace.set_tracer_provider(trace.NoOpTracerProvider())

        def request():  # the caller's span, as the no-op provider makes it
            return trace.get_tracer("app").start_as_current_span("POST /orders")
        """,
        """
        assert tracing.AVAILABLE is True
        print("ran with the no-op provider")
        """,
        tmp_path,
    )
    assert "ran with the no-op provider" in out


def test_a_trace_the_sampler_drops_costs_no_attempt_count_and_stays_dropped(
    geneva_session, otel_global
):
    """``ParentBased(ALWAYS_OFF)``: the workflow's first step decides for its trace; nothing is
    exported, the stored context says "not sampled", and the attempt is not counted."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
    from sqlalchemy import event

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(ALWAYS_OFF))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel_trace.set_tracer_provider(provider)
    counted: list[str] = []

    def record(_c, _cursor, statement, *_rest):
        text = statement.lower()
        if "count(" in text and "started_at is not null" in text:  # the attempt count
            counted.append(statement)

    workflow = Shipment.create(hero=make_order(geneva_session))
    geneva_session.commit()
    engine = geneva_session.get_bind()
    event.listen(engine, "before_cursor_execute", record)
    try:
        speedrun_workflow(workflow)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert workflow.state == "finished"
    assert exporter.get_finished_spans() == ()
    assert counted == []
    flags = workflow.metadata_["trace"]["traceparent"].rsplit("-", 1)[1]
    assert int(flags, 16) & 0x01 == 0  # stored as "not sampled": later steps follow it
    provider.shutdown()
