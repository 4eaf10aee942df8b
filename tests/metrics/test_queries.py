"""geneva_drive.metrics: the grouped queries, the snapshot, the cache and the gem's gauges."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from geneva_drive import metrics
from geneva_drive.config import settings
from geneva_drive.db import get_engine
from tests.metrics.seed import EXPECTED, EXPECTED_STATES, OLDEST_OVERDUE


def test_snapshot_matches_the_seeded_rows(geneva_session, seeded):
    snapshot = metrics.collect(geneva_session, now=seeded)

    assert [c.workflow for c in snapshot.classes] == sorted(EXPECTED)
    for name, (ratio, waiting, waiting_overdue, overdue, stuck) in EXPECTED.items():
        cls = snapshot.for_class(name)
        assert dict(cls.states) == EXPECTED_STATES[name]
        assert cls.paused_ratio == pytest.approx(ratio)
        assert (cls.waiting, cls.waiting_overdue, cls.overdue, cls.stuck_in_progress) == (
            waiting,
            waiting_overdue,
            overdue,
            stuck,
        ), name
    assert snapshot.oldest_overdue_seconds == pytest.approx(OLDEST_OVERDUE.total_seconds())
    assert snapshot.state_totals == {
        "ready": 5,
        "performing": 2,
        "paused": 2,
        "finished": 2,
        "canceled": 1,
    }
    assert snapshot.total_workflows == 12
    assert (snapshot.waiting, snapshot.waiting_overdue) == (2, 1)
    assert (snapshot.overdue, snapshot.stuck_in_progress) == (2, 1)


def test_seven_queries_and_nothing_else(geneva_session, seeded, count_statements):
    with count_statements(get_engine()) as counter:
        snapshot = metrics.collect(geneva_session, now=seeded)
    selects = counter.selects()
    assert len(selects) == 7 == snapshot.query_count
    # Five grouped per class; one over the workers table (and the executions they hold); one
    # over the schedules that fire (their next tick, for the late gauge).
    grouped = [s for s in selects if "GROUP BY" in s.upper()]
    assert len(grouped) == 5
    workers, schedules = [s for s in selects if s not in grouped]
    assert "geneva_drive_workers" in workers
    assert "geneva_drive_schedules" in schedules
    # Nothing else but PostgreSQL's "SET LOCAL jit = off": no writes, no lazy loads.
    assert [s for s in counter.statements if s not in selects] in ([], ["SET LOCAL jit = off"])


def test_an_empty_database_costs_three_queries(geneva_session, count_statements):
    """The workflow counts, the workers and the schedules (both may exist before any
    workflow does)."""
    with count_statements(get_engine()) as counter:
        snapshot = metrics.collect(geneva_session)
    assert len(counter.selects()) == 3 == snapshot.query_count
    assert snapshot.workers == {"live": 0, "expired": 0}
    assert snapshot.classes == ()
    assert snapshot.oldest_overdue_seconds == 0.0
    assert snapshot.for_class("Nope").total == 0


def test_thresholds_come_from_the_settings(geneva_session, seeded):
    settings.waiting_visibility_threshold = timedelta(minutes=30)  # both waiters are overdue
    settings.stuck_in_progress_threshold = timedelta(minutes=1)  # both in_progress are stuck
    snapshot = metrics.collect(geneva_session, now=seeded)
    assert snapshot.for_class("MetricsBeta").waiting_overdue == 2
    assert snapshot.for_class("MetricsBeta").stuck_in_progress == 1
    assert snapshot.stuck_in_progress == 2


def test_disabled_visibility_threshold_has_no_waiting_overdue(geneva_session, seeded):
    settings.waiting_visibility_threshold = None
    snapshot = metrics.collect(geneva_session, now=seeded)
    assert snapshot.waiting_overdue is None
    assert all(c.waiting_overdue is None for c in snapshot.classes)
    assert snapshot.waiting == 2


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_cache_serves_a_second_read_without_queries(geneva_session, seeded, count_statements):
    clock = FakeClock()
    cache = metrics.SnapshotCache(max_age=5.0, stale_for=0.0, clock=clock)
    with count_statements(get_engine()) as counter:
        first = cache.get()
        after_first = len(counter.selects())
        clock.now += 4.9
        second = cache.get()
        after_second = len(counter.selects())
        clock.now += 0.2  # 5.1 s after the first read: expired
        third = cache.get()
    assert after_first == 7
    assert after_second == 7, "a read within the TTL must not touch the database"
    assert second is first
    assert len(counter.selects()) == 14
    assert third is not first


def test_an_expired_snapshot_is_served_while_one_thread_refreshes_it(
    geneva_session, seeded, count_statements, monkeypatch
):
    clock = FakeClock()
    cache = metrics.SnapshotCache(max_age=5.0, stale_for=60.0, clock=clock)
    first = cache.get()
    clock.now += 10  # expired, but within the stale window
    # Hold the background refresh until both callers have been answered: otherwise a fast
    # refresh may finish between the two calls and the second sees its result (no bug).
    release = threading.Event()
    real_collect = metrics.collect

    def held_collect(*args, **kwargs):  # type: ignore[no-untyped-def]
        release.wait(30)
        return real_collect(*args, **kwargs)

    monkeypatch.setattr(metrics, "collect", held_collect)
    with count_statements(get_engine()) as counter:
        assert cache.get() is first  # answered at once, from memory
        assert cache.get() is first  # a second caller does not start a second refresh
        release.set()
        cache.join(timeout=30)
    assert len(counter.selects()) == 7  # exactly one refresh, in the background
    refreshed = cache.get()
    assert refreshed is not first
    assert refreshed.taken_at > first.taken_at
    clock.now += 100  # beyond the stale window: the caller waits for fresh numbers
    with count_statements(get_engine()) as counter:
        latest = cache.get()
    assert latest is not refreshed
    assert len(counter.selects()) == 7


def test_a_failed_background_refresh_keeps_serving_the_last_snapshot(
    geneva_session, seeded, monkeypatch
):
    clock = FakeClock()
    cache = metrics.SnapshotCache(max_age=5.0, stale_for=60.0, clock=clock)
    first = cache.get()
    clock.now += 10

    def broken(session, now=None):  # type: ignore[no-untyped-def]
        raise RuntimeError("database went away")

    monkeypatch.setattr(metrics, "collect", broken)
    assert cache.get() is first
    cache.join(timeout=30)
    assert cache.get() is first  # still served; the next call tries again
    cache.join(timeout=30)


def test_cache_follows_threshold_changes(geneva_session, seeded):
    cache = metrics.SnapshotCache(max_age=60.0)
    assert cache.get().waiting_overdue == 1
    settings.waiting_visibility_threshold = None
    assert cache.get().waiting_overdue is None


def test_get_snapshot_max_age_zero_bypasses_the_cache(geneva_session, seeded, count_statements):
    metrics.get_snapshot()
    with count_statements(get_engine()) as counter:
        metrics.get_snapshot()
        assert counter.count == 0
        metrics.get_snapshot(max_age=0)
        assert len(counter.selects()) == 7


def test_concurrent_readers_share_one_refresh(geneva_session, seeded, count_statements):
    import threading

    cache = metrics.SnapshotCache(max_age=60.0)
    results = []
    barrier = threading.Barrier(8)

    def read() -> None:
        barrier.wait()
        results.append(cache.get())

    with count_statements(get_engine()) as counter:
        threads = [threading.Thread(target=read) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(results) == 8
    assert len({id(r) for r in results}) == 1
    assert len(counter.selects()) == 7


def test_report_gauges_emits_the_gems_gauges(geneva_session, seeded):
    sent: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def sink(name, value, tags):  # type: ignore[no-untyped-def]
        sent[(name, tuple(sorted(tags.items())))] = value

    metrics.report_gauges(metrics.collect(geneva_session, now=seeded), sink)

    def gauge(name: str, workflow: str | None = None) -> float | None:
        return sent.get((name, (("workflow", workflow),) if workflow else ()))

    assert gauge("geneva_drive.ready") == 5
    assert gauge("geneva_drive.canceled") == 1
    assert gauge("geneva_drive.ready", "MetricsAlpha") == 3
    # Only present (class, state) pairs, as the gem does.
    assert ("geneva_drive.canceled", (("workflow", "MetricsAlpha"),)) not in sent
    assert gauge("geneva_drive.paused_ratio", "MetricsGamma") == 1.0
    assert gauge("geneva_drive.paused_ratio", "MetricsBeta") == 0.0
    assert gauge("geneva_drive.waiting_step_executions") == 2
    assert gauge("geneva_drive.waiting_step_executions", "MetricsBeta") == 2
    assert gauge("geneva_drive.waiting_step_executions", "MetricsAlpha") is None
    assert gauge("geneva_drive.waiting_overdue") == 1
    assert gauge("geneva_drive.waiting_overdue", "MetricsBeta") == 1


def test_report_gauges_goes_through_the_facade(geneva_session, seeded):
    from geneva_drive import metrics_facade

    received = []

    def sink(name, value, tags):  # type: ignore[no-untyped-def]
        received.append((name, value, dict(tags)))

    metrics_facade.add_sink(sink)
    try:
        settings.waiting_visibility_threshold = None
        metrics.report_gauges(metrics.collect(geneva_session, now=seeded))
    finally:
        metrics_facade.remove_sink(sink)
    names = {name for name, _, _ in received}
    assert "geneva_drive.paused_ratio" in names
    assert "geneva_drive.waiting_overdue" not in names  # threshold disabled: no gauge at all
