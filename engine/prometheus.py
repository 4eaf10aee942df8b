"""Prometheus metrics: executor counters and histograms, and the database gauges collector.

Two kinds of numbers, from two places:

* **Events** (counters, histograms) are counted where they happen: the executor, signal
  delivery, operator actions and housekeeping send blinker events
  (:mod:`geneva_drive.instrumentation`) and :func:`install` connects receivers that count them.
  Celery's prefork pool runs steps in child processes, so these only add up correctly in
  prometheus-client's *multiprocess mode*: set ``PROMETHEUS_MULTIPROC_DIR`` to an empty,
  writable directory **before the process starts** (prometheus-client decides at import) and
  every process writes its samples there; :func:`exposition_registry` sums them.
* **Backlog** (gauges) is read from the database at scrape time by :class:`DatabaseCollector`
  through :mod:`geneva_drive.metrics`: grouped queries, cached for a few seconds, so the numbers are
  the same whichever process answers and never outlive a deleted class or step.

Exposing the event metrics of workers: either run the dashboard and the workers on one host
with the same ``PROMETHEUS_MULTIPROC_DIR`` (the dashboard's ``/metrics`` then sums them), or set
``GENEVA_WORKER_METRICS_PORT`` and each worker serves its own ``/metrics`` on
``GENEVA_WORKER_METRICS_ADDR`` (default 127.0.0.1; see :func:`start_worker_server`). Use one or
the other for a given directory, not both, or Prometheus counts every step twice.

Labels never carry ids: ``workflow`` is the stored workflow type, ``step`` a step name,
``outcome``/``result``/``action``/``kind`` come from fixed vocabularies.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    values,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import REGISTRY, Collector

from geneva_drive import db, instrumentation, limits
from geneva_drive.config import process_variable
from geneva_drive.errors import ConfigurationError
from geneva_drive.metrics import MetricsSnapshot, cache_max_age, get_snapshot
from geneva_drive.registry import registered_workflows

log = logging.getLogger("geneva_drive.prometheus")

#: Step bodies: from a few milliseconds (a no-op) to an hour (a long resumable slice).
STEP_DURATION_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)  # fmt: skip
#: started_at - scheduled_for: queue and dispatch lag, which blows past runtime-shaped buckets
#: under a backlog (celery-exporter's queue-wait buckets, extended to 2 h).
START_DELAY_BUCKETS = (
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
    7200.0,
)  # fmt: skip

#: Housekeeping report keys (the gem's result keys) → the counter and label they feed.
HOUSEKEEPING_CLEANED_UP = {
    "workflows_cleaned_up": "workflows",
    "step_executions_cleaned_up": "step_executions",
    "signals_cleaned_up": "signals",
}
HOUSEKEEPING_RECOVERED = {
    "stuck_in_progress_recovered": "stuck_in_progress",
    "stuck_scheduled_recovered": "stuck_scheduled",
    "stranded_waiting_released": "stranded_waiting",
}

_ACTION_LABEL = re.compile(r"[a-z][a-z0-9_]{0,39}")


def is_multiprocess() -> bool:
    """True when prometheus-client writes samples to ``PROMETHEUS_MULTIPROC_DIR``.

    prometheus-client decides once, when it is imported; ask it rather than the environment.
    """
    return values.ValueClass is not values.MutexValue


# --- event metrics ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EventMetrics:
    """The counters and histograms fed by the engine's instrumentation events."""

    step_executions: Counter
    step_duration: Histogram
    step_start_delay: Histogram
    signals: Counter
    operator_actions: Counter
    housekeeping_runs: Counter
    housekeeping_cleaned_up: Counter
    housekeeping_recovered: Counter
    housekeeping_last_run: Gauge
    wait_timeouts: Counter
    children_started: Counter
    children_joined: Counter
    limit_deferrals: Counter
    worker_recoveries: Counter
    schedule_ticks: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry | None) -> EventMetrics:
        return cls(
            step_executions=Counter(
                "geneva_drive_step_executions",
                "Step executions that ended, by outcome: the step body's outcome (completed, "
                "interrupted, exception, or the flow-control action), step_not_defined when "
                "the class no longer defines the step (the workflow is paused, stranded), or "
                "precondition_skipped / precondition_canceled / precondition_exception when "
                "skip_if, cancel_if or their evaluation ended it before the body ran.",
                ["workflow", "step", "outcome"],
                registry=registry,
            ),
            step_duration=Histogram(
                "geneva_drive_step_duration_seconds",
                "Time spent in step bodies.",
                ["workflow", "step"],
                buckets=STEP_DURATION_BUCKETS,
                registry=registry,
            ),
            step_start_delay=Histogram(
                "geneva_drive_step_start_delay_seconds",
                "started_at - scheduled_for of executions whose body ran (queue and dispatch lag;"
                " deliberate waits are not included).",
                ["workflow"],
                buckets=START_DELAY_BUCKETS,
                registry=registry,
            ),
            signals=Counter(
                "geneva_drive_signals",
                "Signals delivered with workflow.signal(), by result (delivered or duplicate).",
                ["workflow", "result"],
                registry=registry,
            ),
            operator_actions=Counter(
                "geneva_drive_operator_actions",
                "Operator actions taken from the dashboard or the CLI.",
                ["action"],
                registry=registry,
            ),
            housekeeping_runs=Counter(
                "geneva_drive_housekeeping_runs",
                "Housekeeping passes completed.",
                registry=registry,
            ),
            housekeeping_cleaned_up=Counter(
                "geneva_drive_housekeeping_cleaned_up",
                "Rows deleted by housekeeping's cleanup of old finished and canceled workflows.",
                ["kind"],
                registry=registry,
            ),
            housekeeping_recovered=Counter(
                "geneva_drive_housekeeping_recovered",
                "Stuck step executions recovered by housekeeping.",
                ["kind"],
                registry=registry,
            ),
            housekeeping_last_run=Gauge(
                "geneva_drive_housekeeping_last_run_timestamp_seconds",
                "Unix time at which the last housekeeping pass completed.",
                registry=registry,
                multiprocess_mode="mostrecent",
            ),
            wait_timeouts=Counter(
                "geneva_drive_wait_timeouts",
                "Waits for a signal that timed out, by the step's on_timeout action "
                "(run, skip, cancel, pause).",
                ["workflow", "step", "action"],
                registry=registry,
            ),
            children_started=Counter(
                "geneva_drive_children_started",
                "Child workflows started by a step of their parent, by the parent's "
                "workflow class.",
                ["workflow"],
                registry=registry,
            ),
            children_joined=Counter(
                "geneva_drive_children_joined",
                "Child workflows whose end reached their parent (once per child), by "
                "the parent's workflow class and the child's end (finished, canceled).",
                ["workflow", "state"],
                registry=registry,
            ),
            limit_deferrals=Counter(
                "geneva_drive_limit_deferrals",
                "Executions deferred at their start by a concurrency or rate limit: "
                "no slot or token of their key was free. Labelled by the limit's name only "
                "(keys are unbounded).",
                ["limit"],
                registry=registry,
            ),
            worker_recoveries=Counter(
                "geneva_drive_worker_recoveries",
                "In-progress step executions recovered because their worker's lease expired "
                "(no heartbeat within worker_lease: the process died or stalled), by workflow "
                "class; each was reattempted or canceled as stuck_recovery_action says.",
                ["workflow"],
                registry=registry,
            ),
            schedule_ticks=Counter(
                "geneva_drive_schedule_ticks",
                "Ticks of each schedule by what became of them: created (a workflow), "
                "skipped_overlap (its previous run still went on, or the creation was refused), "
                "missed (no dispatcher ran; catch_up decided), failed (creating it raised).",
                ["schedule", "result"],
                registry=registry,
            ),
        )

    def collectors(self) -> list[Any]:
        return [getattr(self, name) for name in self.__dataclass_fields__]


_install_lock = threading.Lock()
_metrics: EventMetrics | None = None
_registry: CollectorRegistry | None = None


def install(
    registry: CollectorRegistry | None = REGISTRY, *, disable_created: bool = True
) -> EventMetrics:
    """Create the event metrics (in ``registry``) and connect them to the engine's events.

    Idempotent: later calls return the metrics of the first. Called by the dashboard factory
    and by the Celery worker hooks; call it yourself in any other process that runs steps.
    In multiprocess mode the metrics write to ``PROMETHEUS_MULTIPROC_DIR`` whatever
    ``registry`` is. ``disable_created`` turns off prometheus-client's ``*_created`` series
    (process-wide): they double the series count and no alert here needs them.
    """
    global _metrics, _registry
    with _install_lock:
        if _metrics is not None:
            return _metrics
        if disable_created:
            disable_created_metrics()  # type: ignore[no-untyped-call]
        metrics = EventMetrics.create(registry)
        instrumentation.precondition_evaluated.connect(_on_precondition, weak=False)
        instrumentation.step_performed.connect(_on_step, weak=False)
        instrumentation.signal_delivered.connect(_on_signal, weak=False)
        instrumentation.operator_action.connect(_on_operator_action, weak=False)
        instrumentation.housekeeping_performed.connect(_on_housekeeping, weak=False)
        instrumentation.wait_timed_out.connect(_on_wait_timed_out, weak=False)
        instrumentation.child_started.connect(_on_child_started, weak=False)
        instrumentation.child_joined.connect(_on_child_joined, weak=False)
        instrumentation.limit_deferred.connect(_on_limit_deferred, weak=False)
        instrumentation.worker_recovered.connect(_on_worker_recovered, weak=False)
        instrumentation.schedule_ticked.connect(_on_schedule_ticked, weak=False)
        _metrics, _registry = metrics, registry
        return metrics


def uninstall() -> None:
    """Disconnect the receivers and unregister the metrics (tests; re-``install()`` after)."""
    global _metrics, _registry
    with _install_lock:
        if _metrics is None:
            return
        instrumentation.precondition_evaluated.disconnect(_on_precondition)
        instrumentation.step_performed.disconnect(_on_step)
        instrumentation.signal_delivered.disconnect(_on_signal)
        instrumentation.operator_action.disconnect(_on_operator_action)
        instrumentation.housekeeping_performed.disconnect(_on_housekeeping)
        instrumentation.wait_timed_out.disconnect(_on_wait_timed_out)
        instrumentation.child_started.disconnect(_on_child_started)
        instrumentation.child_joined.disconnect(_on_child_joined)
        instrumentation.limit_deferred.disconnect(_on_limit_deferred)
        instrumentation.worker_recovered.disconnect(_on_worker_recovered)
        instrumentation.schedule_ticked.disconnect(_on_schedule_ticked)
        if _registry is not None:
            for collector in _metrics.collectors():
                _registry.unregister(collector)
        _metrics, _registry = None, None


def installed() -> EventMetrics | None:
    return _metrics


def workflow_label(payload: Mapping[str, Any]) -> str:
    """The stored workflow type for an event (the same label the database gauges use)."""
    stored = payload.get("workflow_type")
    if stored:
        return str(stored)
    class_name = str(payload.get("workflow_class") or "Workflow")
    for name, cls in registered_workflows().items():
        if cls.__name__ == class_name:
            return name
    return class_name


def _on_precondition(sender: Any, **payload: Any) -> None:
    metrics = _metrics
    outcome = payload.get("outcome")
    if metrics is None or outcome in (None, "passed"):
        return
    metrics.step_executions.labels(
        workflow_label(payload), str(payload.get("step_name")), f"precondition_{outcome}"
    ).inc()


def _on_step(sender: Any, **payload: Any) -> None:
    metrics = _metrics
    if metrics is None:
        return
    workflow, step = workflow_label(payload), str(payload.get("step_name"))
    metrics.step_executions.labels(workflow, step, str(payload.get("outcome", "unknown"))).inc()
    duration = payload.get("duration")
    if duration is not None:
        metrics.step_duration.labels(workflow, step).observe(duration)
    delay = payload.get("start_delay")
    if delay is not None:
        metrics.step_start_delay.labels(workflow).observe(max(0.0, float(delay)))


def _on_signal(sender: Any, **payload: Any) -> None:
    metrics = _metrics
    if metrics is None:
        return
    result = "duplicate" if payload.get("duplicate") else "delivered"
    metrics.signals.labels(workflow_label(payload), result).inc()


def _on_operator_action(sender: Any, **payload: Any) -> None:
    metrics = _metrics
    if metrics is None:
        return
    action = str(payload.get("action") or "unknown")
    # Action names come from code, but keep the label bounded whatever a caller sends.
    metrics.operator_actions.labels(action if _ACTION_LABEL.fullmatch(action) else "other").inc()


def _on_wait_timed_out(sender: Any, **payload: Any) -> None:
    metrics = _metrics
    if metrics is None:
        return
    metrics.wait_timeouts.labels(
        workflow_label(payload), str(payload.get("step_name")), str(payload.get("action"))
    ).inc()


def _on_child_started(sender: Any, **payload: Any) -> None:
    metrics = _metrics
    if metrics is None:
        return
    metrics.children_started.labels(workflow_label(payload)).inc()


def _on_child_joined(sender: Any, **payload: Any) -> None:
    metrics = _metrics
    if metrics is None:
        return
    metrics.children_joined.labels(workflow_label(payload), str(payload.get("state"))).inc()


def _on_limit_deferred(sender: Any, **payload: Any) -> None:
    metrics = _metrics
    if metrics is None:
        return
    metrics.limit_deferrals.labels(str(payload.get("limit"))).inc()


def _on_worker_recovered(sender: Any, **payload: Any) -> None:
    metrics = _metrics
    if metrics is None:
        return
    metrics.worker_recoveries.labels(workflow_label(payload)).inc()


def _on_schedule_ticked(sender: Any, **payload: Any) -> None:
    metrics = _metrics
    if metrics is None:
        return
    metrics.schedule_ticks.labels(str(payload.get("schedule")), str(payload.get("result"))).inc()


def _on_housekeeping(sender: Any, **payload: Any) -> None:
    metrics = _metrics
    if metrics is None:
        return
    report = payload.get("report", payload)
    values = report if isinstance(report, Mapping) else vars(report)
    for key, kind in HOUSEKEEPING_CLEANED_UP.items():
        if values.get(key):
            metrics.housekeeping_cleaned_up.labels(kind).inc(values[key])
    for key, kind in HOUSEKEEPING_RECOVERED.items():
        if values.get(key):
            metrics.housekeeping_recovered.labels(kind).inc(values[key])
    metrics.housekeeping_runs.inc()
    metrics.housekeeping_last_run.set(time.time())


# --- database gauges -------------------------------------------------------------------------


class DatabaseCollector(Collector):
    """The gauges of docs/MANUAL.md, "Metrics and alerting", from :func:`geneva_drive.metrics.get_snapshot` at scrape time.

    Each workflow class present in the database gets every series (zeros included), so
    "no series" always means "no such class", never "zero". ``geneva_drive_waiting_overdue``
    is left out when ``waiting_visibility_threshold`` is disabled. When the database cannot be
    read, only ``geneva_drive_database_up 0`` is exposed (the event metrics still are).
    """

    def __init__(self, snapshot: Callable[[], MetricsSnapshot] = get_snapshot) -> None:
        self._snapshot = snapshot

    def describe(self) -> list[Metric]:
        return []  # never query the database at registration time

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "geneva_drive_database_up", "1 when the database gauges could be read at this scrape."
        )
        try:
            snapshot = self._snapshot()
        except Exception:
            log.exception("could not read the database gauges")
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from snapshot_metrics(snapshot)


def snapshot_metrics(snapshot: MetricsSnapshot) -> Iterator[Metric]:
    workflows = GaugeMetricFamily(
        "geneva_drive_workflows", "Workflows by class and state.", labels=["workflow", "state"]
    )
    paused_ratio = GaugeMetricFamily(
        "geneva_drive_paused_ratio",
        "Paused workflows / all workflows of the class (finished and canceled included).",
        labels=["workflow"],
    )
    waiting = GaugeMetricFamily(
        "geneva_drive_waiting_step_executions",
        "Step executions parked waiting for a signal.",
        labels=["workflow"],
    )
    waiting_overdue = GaugeMetricFamily(
        "geneva_drive_waiting_overdue",
        "Parked step executions waiting longer than waiting_visibility_threshold.",
        labels=["workflow"],
    )
    overdue = GaugeMetricFamily(
        "geneva_drive_overdue_step_executions",
        "Scheduled step executions past their scheduled_for, of ready or performing workflows.",
        labels=["workflow"],
    )
    stuck = GaugeMetricFamily(
        "geneva_drive_stuck_in_progress",
        "Step executions in progress for longer than stuck_in_progress_threshold that no "
        "registered worker started (a worker's are judged by its lease).",
        labels=["workflow"],
    )
    unexplained = GaugeMetricFamily(
        "geneva_drive_unexplained_workflows",
        "Ongoing workflows with no explained next event (geneva-drive doctor lists them).",
        labels=["workflow"],
    )
    workers = GaugeMetricFamily(
        "geneva_drive_workers",
        "Registered worker processes that have not stopped: live (a heartbeat within "
        "worker_lease) or expired (none within it: killed or stalled; the row is kept a day).",
        labels=["state"],
    )
    for state, count in snapshot.workers.items():
        workers.add_metric([state], count)
    for cls in snapshot.classes:
        unexplained.add_metric([cls.workflow], cls.unexplained)
        for state, count in cls.states.items():
            workflows.add_metric([cls.workflow, state], count)
        paused_ratio.add_metric([cls.workflow], cls.paused_ratio)
        waiting.add_metric([cls.workflow], cls.waiting)
        if cls.waiting_overdue is not None:
            waiting_overdue.add_metric([cls.workflow], cls.waiting_overdue)
        overdue.add_metric([cls.workflow], cls.overdue)
        stuck.add_metric([cls.workflow], cls.stuck_in_progress)
    yield workflows
    yield paused_ratio
    yield waiting
    if snapshot.waiting_visibility_threshold is not None:
        yield waiting_overdue
    yield overdue
    yield stuck
    yield unexplained
    yield workers
    yield GaugeMetricFamily(
        "geneva_drive_expired_worker_steps",
        "Step executions in progress on a worker that is not live: the next dispatcher sweep "
        "recovers them (a value that stays above 0 means no sweep is running).",
        value=snapshot.expired_worker_steps,
    )
    late = GaugeMetricFamily(
        "geneva_drive_schedule_late_seconds",
        "How far each schedule's next tick is in the past (0 when it is not): a sweep fires a "
        "due tick within seconds, so a growing value means no dispatcher fires it. Paused and "
        "disabled schedules have no series.",
        labels=["schedule"],
    )
    for name, seconds in sorted(snapshot.schedules_late.items()):
        late.add_metric([name], seconds)
    yield late
    yield GaugeMetricFamily(
        "geneva_drive_oldest_overdue_seconds",
        "How late the most overdue scheduled step execution is (0 when none is).",
        value=snapshot.oldest_overdue_seconds,
    )
    yield GaugeMetricFamily(
        "geneva_drive_metrics_snapshot_timestamp_seconds",
        "When the database gauges above were read (they are cached for a few seconds).",
        value=snapshot.taken_at.timestamp(),
    )
    yield GaugeMetricFamily(
        "geneva_drive_metrics_query_duration_seconds",
        "Time the database gauges' queries took when the snapshot was last refreshed.",
        value=snapshot.query_seconds,
    )


# --- exposition ------------------------------------------------------------------------------


def exposition_registry(*, database: bool = False) -> CollectorRegistry:
    """A registry to expose in this process.

    In multiprocess mode: a fresh registry summing every process's samples from
    ``PROMETHEUS_MULTIPROC_DIR``; otherwise this process's default registry. With
    ``database=True`` the database gauges are added (the dashboard's ``/metrics``).
    """
    if is_multiprocess():
        registry = CollectorRegistry(auto_describe=False)
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Delegate(REGISTRY))
    if database:
        registry.register(DatabaseCollector())
        registry.register(LimitCollector())
    return registry


def clear_limit_cache() -> None:
    """Forget the cached limit gauges (tests; the next scrape reads them again)."""
    with LimitCollector._lock:
        LimitCollector._cache = (-1e9, [])


class LimitCollector(Collector):
    """``geneva_drive_limit_in_use{limit}`` and ``geneva_drive_limit_waiting{limit}`` (docs/MANUAL.md,
    "Concurrency and rate limits"): grouped over the limited executions only (the partial slot indexes), cached like
    the other database gauges. Nothing is read, and nothing exposed, while no registered class
    declares a limit. The cache period is the snapshot's (``METRICS_CACHE_SECONDS``), so one
    setting says how fresh every database gauge is."""

    NAMES = ("geneva_drive_limit_in_use", "geneva_drive_limit_waiting")
    #: Shared by every instance (a registry may be built per scrape): (taken, rows).
    _cache: ClassVar[tuple[float, list[tuple[str, int, int]]]] = (-1e9, [])
    _lock = threading.Lock()

    @property
    def max_age(self) -> float:
        return cache_max_age()

    def describe(self) -> list[Metric]:
        return []

    def _read(self) -> list[tuple[str, int, int]]:
        with LimitCollector._lock:
            taken, rows = LimitCollector._cache
            if time.monotonic() - taken >= self.max_age:
                with db.new_session() as session:
                    rows = [(u.name, u.in_use, u.waiting) for u in limits.usage(session)]
                LimitCollector._cache = (time.monotonic(), rows)
            return rows

    def collect(self) -> Iterator[Metric]:
        if not limits.declared_limits():
            return
        try:
            rows = self._read()
        except Exception:
            log.exception("could not read the limit gauges")
            return
        in_use = GaugeMetricFamily(
            "geneva_drive_limit_in_use",
            "Executions in progress under each concurrency limit (all keys).",
            labels=["limit"],
        )
        waiting = GaugeMetricFamily(
            "geneva_drive_limit_waiting",
            "Executions deferred by each concurrency or rate limit, waiting for a slot or a "
            "token (all keys).",
            labels=["limit"],
        )
        for name, used, deferred in rows:
            in_use.add_metric([name], used)
            waiting.add_metric([name], deferred)
        yield in_use
        yield waiting


class _Delegate(Collector):
    def __init__(self, inner: CollectorRegistry) -> None:
        self._inner = inner

    def collect(self) -> Iterator[Metric]:
        yield from self._inner.collect()


def start_worker_server(port: int | None = None, addr: str | None = None) -> bool:
    """Serve this process's event metrics on ``addr:port`` (a thread); False when disabled.

    ``port`` defaults to ``GENEVA_WORKER_METRICS_PORT`` (unset or empty: disabled) and ``addr``
    to ``GENEVA_WORKER_METRICS_ADDR`` or 127.0.0.1 — put a scraper or a proxy on the host
    rather than opening the port to the network. Called once in the Celery main process
    (``worker_init``): with the prefork pool the children's samples reach it only through
    ``PROMETHEUS_MULTIPROC_DIR``.
    """
    from prometheus_client import start_http_server

    if port is None:
        raw = process_variable("GENEVA_WORKER_METRICS_PORT")
        if not raw:
            return False
        try:
            port = int(raw)
        except ValueError as exc:
            raise ConfigurationError(
                f"GENEVA_WORKER_METRICS_PORT={raw!r} is not a port number"
            ) from exc
    addr = addr or process_variable("GENEVA_WORKER_METRICS_ADDR") or "127.0.0.1"
    if not is_multiprocess():
        log.warning(
            "serving worker metrics without PROMETHEUS_MULTIPROC_DIR: steps run in prefork "
            "children will not be counted here"
        )
    try:
        start_http_server(port, addr=addr, registry=exposition_registry())
    except OSError as error:
        # A taken port must not stop the worker from running steps: metrics are best effort.
        log.error("cannot serve worker metrics on %s:%s: %s", addr, port, error)
        return False
    log.info("worker metrics on http://%s:%s/metrics", addr, port)
    return True
