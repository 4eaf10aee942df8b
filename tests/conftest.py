"""Shared fixtures: hero models mapped on the engine's Base, and the geneva_session fixture
(from the geneva_drive.testing pytest plugin, registered via the pytest11 entry point); which
tests the PostgreSQL and MariaDB passes leave to the SQLite pass (``sqlite_pass``); which test
files start first."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from geneva_drive.models import Base
from tests.backends import url_backend
from tests.clock import FrozenClock


class Order(Base):
    __tablename__ = "test_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str] = mapped_column(String(32), default="new")


class Account(Base):
    __tablename__ = "test_accounts"
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    email: Mapped[str] = mapped_column(String(255), default="a@example.com")


@pytest.fixture(autouse=True)
def _no_worker_outlives_its_test() -> Iterator[None]:
    """A test that plays a Celery worker process (``perform_step`` with its queues set)
    registers a worker for the whole process; left registered, every later test's steps would
    carry that worker, and housekeeping would recover them once its heartbeat stopped."""
    yield
    from geneva_drive import celery as celery_module
    from geneva_drive import current_worker

    if celery_module._heartbeat is not None:
        celery_module._heartbeat.stop()
        celery_module._heartbeat = None
    current_worker.set_process(None)
    current_worker.set_thread(None)


@pytest.fixture
def generous_inline_time_budget() -> Iterator[None]:
    """Inline successors get 60 s instead of 200 ms. Tests of the inline chain's path (not of
    its budget, whose own test passes ``max_seconds``) use it: on a loaded machine 200 ms can
    run out between two steps and hand the chain over to the dispatcher."""
    from geneva_drive.config import settings

    before = settings.inline_successor_max_time
    settings.inline_successor_max_time = timedelta(seconds=60)
    yield
    settings.inline_successor_max_time = before


@pytest.fixture
def otel_global() -> Iterator[None]:
    """OpenTelemetry's global tracer provider, reset before and after the test: the test (or a
    manual example) may set one as an application does, once, and every other test keeps the
    default, tracing off. The API sets its global once per process, so the reset writes its
    private module state, as OpenTelemetry's own test utilities do."""
    from opentelemetry import trace as otel_trace
    from opentelemetry.util._once import Once

    def reset() -> None:
        otel_trace._TRACER_PROVIDER_SET_ONCE = Once()
        otel_trace._TRACER_PROVIDER = None

    reset()
    try:
        yield
    finally:
        reset()


@pytest.fixture
def otel_spans(otel_global: None) -> Iterator[object]:
    """OpenTelemetry's SDK as the application would configure it, with an in-memory exporter
    (docs/MANUAL.md, "Tracing"); yields the exporter."""
    from opentelemetry import trace as otel_trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel_trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()


@pytest.fixture
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> FrozenClock:
    """The engine's and the dashboard's "now", held at the real now until the test moves it
    (tests/clock.py): for assertions that read the time twice, or at an exact lateness."""
    return FrozenClock(monkeypatch)


#: The files that take longest in a pass (per-file wall time, 2026-12-04, four workers on two
#: cores), longest first. They are collected first, and ``scripts/test`` passes
#: ``--no-loadscope-reorder`` so that pytest-xdist hands them out in that order: by default it
#: sorts files by their number of tests, which starts these one- and two-test files last and ended
#: each pass with one worker running them while the others idled (about a minute a pass).
START_FIRST = (
    "tests/app/test_operator_cli.py",
    "tests/integration/test_wheel_host_app.py",
    "tests/engine/test_children_scale.py",
    "tests/browser/test_navigation_bulk_and_charts.py",
    "tests/browser/test_accessibility.py",
    "tests/integration/test_resumable_worker.py",
    "tests/browser/test_everyday_operations.py",
    "tests/reliability/test_chaos.py",
    "tests/reliability/test_crash.py",
    "tests/integration/test_no_silent_broker.py",
    "tests/integration/test_install_modes.py",
    "tests/engine/test_public_api.py",
    "tests/integration/test_celery_workers.py",
    "tests/reliability/test_soak.py",
    "tests/engine/test_check_deploy.py",
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The ``START_FIRST`` files go to the front (a stable sort: the rest keep their order).

    ``sqlite_pass`` tests do not use the suite's database (GENEVA_TEST_DATABASE_URL): the
    PostgreSQL and MariaDB passes would repeat them unchanged, so they run in the SQLite pass
    only (CONTRIBUTING "Which tests run where")."""
    rank = {path: n for n, path in enumerate(START_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
    if url_backend() == "sqlite":
        return
    skip = pytest.mark.skip(
        reason="runs once, in the SQLite pass: does not use the suite's database"
    )
    for item in items:
        if item.get_closest_marker("sqlite_pass"):
            item.add_marker(skip)
