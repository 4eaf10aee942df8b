"""Traces: one trace per workflow, a span per step attempt (docs/MANUAL.md, "Tracing").

With ``opentelemetry-api`` importable (``geneva-drive[otel]``) and a tracer provider set by the
application, the engine writes OpenTelemetry spans; the SDK, its sampler and its exporter stay
the application's choice. Without the API, or with the default proxy or the no-op provider,
:func:`tracer` answers None and every caller skips its tracing: one function call and an
``isinstance`` per step attempt, nothing else.

The database carries the trace, not the broker: ``Workflow.create()`` stores the caller's W3C
context (``traceparent``, ``tracestate``) in the workflow row's ``metadata`` under
:data:`METADATA_KEY`, and each step attempt's span is that context's child, whichever process
runs it and however its message got there. A workflow created outside any span gets the
context of its first step's span, stored with that step's start, so later steps join it.

What sits under ``metadata["trace"]``::

    {"traceparent": "00-<trace id>-<span id>-<flags>", "tracestate": "...",   # the parent
     "signals": {"<signal id>": {"traceparent": ..., "tracestate": ...}}}     # their senders

This module imports nothing of the engine: the executor, ``Workflow.create()``, signals, the
Celery transport, the dispatcher, housekeeping and the log adapter call it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    AVAILABLE = True
except ImportError:  # the optional extra is not installed: tracing is off for good
    AVAILABLE = False

if TYPE_CHECKING:
    # Re-exported for the executor's annotations (only type checkers import them).
    from opentelemetry.trace import Span as Span
    from opentelemetry.trace import Tracer as Tracer

#: The key of the workflow row's ``metadata`` that holds its trace context.
METADATA_KEY = "trace"
#: Under it: the contexts of the signals' senders, by signal id (the newest few only).
SIGNALS_KEY = "signals"
#: How many signal senders a workflow remembers: a link is for the execution a signal wakes,
#: which runs soon after; a workflow signaled thousands of times keeps a small row.
MAX_SIGNAL_CONTEXTS = 16
#: The instrumentation scope of every span the engine writes.
SCOPE = "geneva_drive"

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")

# The provider last seen and the tracer it gave (None: a proxy or no-op provider, tracing off).
# A provider set with set_tracer_provider() cannot be replaced, so the answer for a real one
# holds; the identity check keeps the answer right when the proxy is replaced by a real one.
_provider: object = None
_tracer: Tracer | None = None


def tracer() -> Tracer | None:
    """The engine's tracer when the application configured a real tracer provider, else None.

    Called once per step attempt: with the default proxy provider it costs one function call
    of the API (about a microsecond) and an identity check.
    """
    if not AVAILABLE:
        return None
    provider = otel_trace.get_tracer_provider()
    if provider is _provider:
        return _tracer
    return _resolve(provider)


def _resolve(provider: object) -> Tracer | None:
    global _provider, _tracer
    found: Tracer | None = None
    if not isinstance(provider, otel_trace.ProxyTracerProvider | otel_trace.NoOpTracerProvider):
        assert isinstance(provider, otel_trace.TracerProvider)
        candidate = provider.get_tracer(SCOPE, _version())
        # An SDK provider switched off (OTEL_SDK_DISABLED) hands out no-op tracers.
        if not isinstance(candidate, otel_trace.NoOpTracer | otel_trace.ProxyTracer):
            found = candidate
    _provider, _tracer = provider, found
    return found


def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("geneva-drive")
    except PackageNotFoundError:
        return None


# --- contexts as stored ------------------------------------------------------------------------


def _carrier(span_context: Any) -> dict[str, str]:
    """A span context as W3C Trace Context fields."""
    carrier = {
        "traceparent": f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-"
        f"{int(span_context.trace_flags):02x}"
    }
    state = span_context.trace_state.to_header() if span_context.trace_state else ""
    if state:
        carrier["tracestate"] = state
    return carrier


def current_carrier() -> dict[str, str] | None:
    """The current span's context as W3C fields, when tracing is on and a span is current."""
    if tracer() is None:
        return None
    span_context = otel_trace.get_current_span().get_span_context()
    return _carrier(span_context) if span_context.is_valid else None


def stored(metadata: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The trace entry of a workflow row's ``metadata`` (None: it has none)."""
    entry = metadata.get(METADATA_KEY) if metadata else None
    return entry if isinstance(entry, dict) else None


def with_creator(metadata: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``Workflow.create()``: the new row's metadata with the caller's trace context, or None
    when there is none to store (tracing off, no current span)."""
    carrier = current_carrier()
    if carrier is None:
        return None
    return {**(metadata or {}), METADATA_KEY: carrier}


def remember_signal(workflow: Any, signal_id: int) -> None:
    """A signal delivered from inside a span: its sender's context goes on the workflow row
    (under the workflow's lock, in the delivery's transaction), so the execution it wakes or
    that attaches it at the gate links to it. Nothing without tracing or a current span."""
    carrier = current_carrier()
    if carrier is None:
        return
    metadata = dict(workflow.metadata_ or {})
    entry = dict(stored(metadata) or {})
    senders = dict(entry.get(SIGNALS_KEY) or {})
    senders[str(signal_id)] = carrier
    if len(senders) > MAX_SIGNAL_CONTEXTS:
        newest = sorted(senders, key=lambda key: int(key))[-MAX_SIGNAL_CONTEXTS:]
        senders = {key: senders[key] for key in newest}
    entry[SIGNALS_KEY] = senders
    metadata[METADATA_KEY] = entry
    workflow.metadata_ = metadata


def trace_id_of(metadata: Mapping[str, Any] | None) -> str | None:
    """The workflow's trace id (32 hex digits) from its row's metadata, without OpenTelemetry
    (the dashboard's link to the trace)."""
    entry = stored(metadata)
    parent = entry.get("traceparent") if entry else None
    found = _TRACEPARENT.match(parent) if isinstance(parent, str) else None
    return found.group(1) if found is not None else None


def _context_of(carrier: Mapping[str, Any] | None) -> Any:
    """The OpenTelemetry context a stored carrier names (None: it names none)."""
    if not carrier or not isinstance(carrier.get("traceparent"), str):
        return None
    fields = {"traceparent": carrier["traceparent"]}
    if isinstance(carrier.get("tracestate"), str):
        fields["tracestate"] = carrier["tracestate"]
    context = TraceContextTextMapPropagator().extract(fields)
    valid = otel_trace.get_current_span(context).get_span_context().is_valid
    return context if valid else None


# --- the step span ----------------------------------------------------------------------------


def start_step(
    active: Tracer,
    workflow: Any,
    execution: Any,
    *,
    attempt: Callable[[], int],
    start_time: int,
) -> Span:
    """Start the span of one step attempt (not yet current: :func:`step_scope` makes it so).

    ``attempt`` counts the attempt (a database read): asked only when the span records, so a
    trace the sampler drops costs no query.

    Its parent is the workflow's stored context. A workflow without one gets this span's
    context stored on its row (written with the step's start), so every later step joins this
    trace. Links: the span current at the start (the Celery task span that delivered the
    message, with Celery's own instrumentation), and the sender of the signal the execution
    carries.
    """
    entry = stored(workflow.metadata_)
    parent = _context_of(entry)
    links = []
    current = otel_trace.get_current_span().get_span_context()
    if current.is_valid:
        links.append(otel_trace.Link(current, {"geneva_drive.link": "delivery"}))
    signal_id = execution.signal_id
    if signal_id is not None and entry:
        sender = _context_of((entry.get(SIGNALS_KEY) or {}).get(str(signal_id)))
        if sender is not None:
            links.append(
                otel_trace.Link(
                    otel_trace.get_current_span(sender).get_span_context(),
                    {"geneva_drive.link": "signal", "geneva_drive.signal.id": int(signal_id)},
                )
            )
    attributes: dict[str, Any] = {
        "geneva_drive.workflow.id": int(workflow.id),
        "geneva_drive.workflow.class": type(workflow).__name__,
        "geneva_drive.step": execution.step_name,
        "geneva_drive.execution.id": int(execution.id),
    }
    if workflow.hero_type is not None:
        attributes["geneva_drive.hero.type"] = str(workflow.hero_type)
    if workflow.hero_id is not None:
        attributes["geneva_drive.hero.id"] = str(workflow.hero_id)
    span = active.start_span(
        f"geneva_drive.step {type(workflow).__name__}.{execution.step_name}",
        # No stored context: a root, not a child of whatever delivered the message.
        context=parent if parent is not None else otel_context.Context(),
        kind=otel_trace.SpanKind.INTERNAL,
        attributes=attributes,
        links=links,
        start_time=start_time,
    )
    if span.is_recording():
        span.set_attribute("geneva_drive.attempt", attempt())
    if parent is None:
        span_context = span.get_span_context()
        if span_context.is_valid:
            metadata = dict(workflow.metadata_ or {})
            metadata[METADATA_KEY] = {**(entry or {}), **_carrier(span_context)}
            workflow.metadata_ = metadata
    return span


@contextmanager
def step_scope(span: Span, execution: Any) -> Iterator[None]:
    """The step's span is current for the body, finalize and its commit (a message sent after
    the commit is published inside it), then ends with the execution's outcome; an exception
    that leaves the attempt (the body's, raised once its outcome is committed) marks it ERROR."""
    token = otel_context.attach(otel_trace.set_span_in_context(span))
    try:
        yield
    except BaseException as error:
        span.record_exception(error)
        span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, _describe(error)))
        raise
    finally:
        otel_context.detach(token)
        # Read without loading: what finalize wrote, as it is in this session.
        row = vars(execution)
        outcome = row.get("outcome") or row.get("state")
        if outcome is not None:
            span.set_attribute("geneva_drive.outcome", str(outcome))
        span.end()


def abandon(span: Span, error: BaseException) -> None:
    """End the span of an attempt whose start did not commit."""
    span.record_exception(error)
    span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, _describe(error)))
    span.end()


def _describe(error: BaseException) -> str:
    try:
        return f"{type(error).__name__}: {error}"
    except Exception:  # a broken __str__ must not hide the error itself
        return type(error).__name__


# --- the dispatcher's and housekeeping's spans ---------------------------------------------------


@contextmanager
def operation(name: str) -> Iterator[Span | None]:
    """A span of its own for one engine operation (a dispatcher sweep, a housekeeping run),
    current while it runs; yields None, doing nothing, when tracing is off."""
    active = tracer()
    if active is None:
        yield None
        return
    with active.start_as_current_span(name, kind=otel_trace.SpanKind.INTERNAL) as span:
        yield span


# --- publishing a step message -------------------------------------------------------------------


@contextmanager
def publishing(trace: Mapping[str, Any] | None) -> Iterator[dict[str, str] | None]:
    """Around the publish of a step message: its workflow's trace is current, and the headers
    it yields (W3C fields) carry it to the worker, so Celery's own instrumentation there starts
    its task span inside the workflow's trace even when this process publishes uninstrumented.

    A span of the same trace that is already current stays so (a step's span sending its
    successor: the publish nests under it); any other current span (a dispatcher sweep, a web
    request resuming the workflow) gives way to the workflow's context. Yields None, doing
    nothing, when tracing is off or the workflow has no trace.
    """
    if tracer() is None or not trace:
        yield None
        return
    context = _context_of(trace)
    if context is None:
        yield None
        return
    current = otel_trace.get_current_span().get_span_context()
    stored_context = otel_trace.get_current_span(context).get_span_context()
    if current.is_valid and current.trace_id == stored_context.trace_id:
        yield _carrier(current)
        return
    token = otel_context.attach(context)
    try:
        yield _carrier(stored_context)
    finally:
        otel_context.detach(token)


# --- logs ------------------------------------------------------------------------------------


def log_ids() -> dict[str, str] | None:
    """The current trace and span ids (hex), for a log record, when a span is current."""
    if tracer() is None:
        return None
    span_context = otel_trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return None
    return {"trace_id": f"{span_context.trace_id:032x}", "span_id": f"{span_context.span_id:016x}"}
