"""GET /metrics on the dashboard: parsed with prometheus-client's own parser and checked
against seeded rows; the bearer token; the scrape cache."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from geneva_drive import metrics
from geneva_drive.config import settings
from geneva_drive.prometheus import DatabaseCollector
from tests.metrics.seed import EXPECTED, EXPECTED_STATES, OLDEST_OVERDUE

DB_GAUGES = {
    "geneva_drive_workflows": {"workflow", "state"},
    "geneva_drive_paused_ratio": {"workflow"},
    "geneva_drive_waiting_step_executions": {"workflow"},
    "geneva_drive_waiting_overdue": {"workflow"},
    "geneva_drive_overdue_step_executions": {"workflow"},
    "geneva_drive_stuck_in_progress": {"workflow"},
    "geneva_drive_unexplained_workflows": {"workflow"},
    "geneva_drive_oldest_overdue_seconds": set(),
    "geneva_drive_workers": {"state"},
    "geneva_drive_expired_worker_steps": set(),
    "geneva_drive_schedule_late_seconds": {"schedule"},
}
#: Every label any geneva_drive_* series may carry: names and fixed vocabularies, never ids.
ALLOWED_LABELS = {
    "workflow",
    "state",
    "step",
    "outcome",
    "result",
    "action",
    "kind",
    "le",
    "limit",  # a limit's name, never its key
    "schedule",  # a schedule's name (at most SCHEDULE_SERIES_LIMIT series of the gauge)
}


@pytest.fixture
def app(geneva_database, geneva_session) -> Iterator[object]:
    from geneva_drive.dashboard import create_app
    from geneva_drive.dashboard.extensions import db

    options: dict[str, object] = {}
    if geneva_database.schema is not None:
        options = {"connect_args": {"options": f"-csearch_path={geneva_database.schema}"}}
    flask_app = create_app(
        {
            "TESTING": True,
            "SQLALCHEMY_DATABASE_URI": geneva_database.url,
            "SQLALCHEMY_ENGINE_OPTIONS": options,
            "METRICS_TOKEN": None,
            "METRICS_PUBLIC": True,  # what is scraped is checked here; the token in test_security
        }
    )
    yield flask_app
    with flask_app.app_context():
        db.engine.dispose()


def scrape(client, **headers) -> dict[str, object]:  # type: ignore[no-untyped-def]
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.content_type.startswith("text/plain; version=0.0.4")
    return {f.name: f for f in text_string_to_metric_families(response.get_data(as_text=True))}


def samples(family) -> dict[tuple[tuple[str, str], ...], float]:  # type: ignore[no-untyped-def]
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples}


def test_database_gauges_match_the_seeded_rows(app, seeded):
    families = scrape(app.test_client())

    for name, labels in DB_GAUGES.items():
        family = families[name]
        assert family.type == "gauge", name
        assert family.documentation, name
        for sample in family.samples:
            assert set(sample.labels) == labels, (name, sample.labels)

    workflows = samples(families["geneva_drive_workflows"])
    expected_workflows = {
        (("state", state), ("workflow", workflow)): float(count)
        for workflow, states in EXPECTED_STATES.items()
        for state, count in states.items()
    }
    assert workflows == expected_workflows  # every state of every class, zeros included

    per_class = {
        "geneva_drive_paused_ratio": 0,
        "geneva_drive_waiting_step_executions": 1,
        "geneva_drive_waiting_overdue": 2,
        "geneva_drive_overdue_step_executions": 3,
        "geneva_drive_stuck_in_progress": 4,
    }
    for name, index in per_class.items():
        got = {dict(k)["workflow"]: v for k, v in samples(families[name]).items()}
        assert got == pytest.approx({w: e[index] for w, e in EXPECTED.items()}), name

    [oldest] = families["geneva_drive_oldest_overdue_seconds"].samples
    # Seeded 10 minutes overdue at `seeded`; the scrape happens a moment later.
    assert OLDEST_OVERDUE.total_seconds() <= oldest.value < OLDEST_OVERDUE.total_seconds() + 60
    assert samples(families["geneva_drive_database_up"]) == {(): 1.0}


def test_labels_never_carry_ids(app, seeded, geneva_session):
    from sqlalchemy import select

    from geneva_drive.models import StepExecution
    from geneva_drive.workflow import Workflow

    ids = {str(i) for i in geneva_session.scalars(select(Workflow.id))}
    ids |= {str(i) for i in geneva_session.scalars(select(StepExecution.id))}
    families = scrape(app.test_client())
    for family in families.values():
        if not family.name.startswith("geneva_drive_"):
            continue
        for sample in family.samples:
            assert set(sample.labels) <= ALLOWED_LABELS, (family.name, sample.labels)
            for key, value in sample.labels.items():
                if key != "le":
                    assert value not in ids, (family.name, sample.labels)


def test_waiting_overdue_is_absent_when_the_threshold_is_disabled(app, seeded):
    settings.waiting_visibility_threshold = None
    families = scrape(app.test_client())
    assert "geneva_drive_waiting_overdue" not in families
    assert "geneva_drive_waiting_step_executions" in families


def test_bearer_token_is_required_when_configured(app, seeded):
    app.config["METRICS_TOKEN"] = "s3cret-token"
    client = app.test_client()

    missing = client.get("/metrics")
    assert missing.status_code == 401
    assert missing.headers["WWW-Authenticate"].startswith("Bearer")
    assert "geneva_drive" not in missing.get_data(as_text=True)
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert (
        client.get("/metrics", headers={"Authorization": "Basic s3cret-token"}).status_code == 401
    )

    families = scrape(client, Authorization="Bearer s3cret-token")
    assert "geneva_drive_workflows" in families


def test_token_from_the_environment(geneva_database, geneva_session, monkeypatch):
    from geneva_drive.dashboard import create_app
    from geneva_drive.dashboard.extensions import db

    monkeypatch.setenv("GENEVA_METRICS_TOKEN", "1234567890123456")  # JSON-parsed to an int
    options: dict[str, object] = {}
    if geneva_database.schema is not None:
        options = {"connect_args": {"options": f"-csearch_path={geneva_database.schema}"}}
    flask_app = create_app(
        {
            "TESTING": True,
            "SQLALCHEMY_DATABASE_URI": geneva_database.url,
            "SQLALCHEMY_ENGINE_OPTIONS": options,
        }
    )
    try:
        client = flask_app.test_client()
        assert client.get("/metrics").status_code == 401
        assert (
            client.get("/metrics", headers={"Authorization": "Bearer 1234567890123456"}).status_code
            == 200
        )
    finally:
        with flask_app.app_context():
            db.engine.dispose()


def snapshot_selects(counter) -> list[str]:
    """The snapshot's statements among a scrape's: the limit gauges' grouped reads (over the
    slot columns) come on top whenever any imported test module declares a limit, and have
    their own tests in test_limit_metrics."""
    return [
        s
        for s in counter.selects()
        if "limit_slot" not in s
        # The deferrals by slot; not the overdue query, whose "deferred_on IS NULL" keeps
        # the executions a limit holds back out of it.
        and not s.lstrip().startswith("SELECT geneva_drive_step_executions.deferred_on")
    ]


def test_second_scrape_within_the_ttl_runs_no_query(app, seeded, count_statements):
    from geneva_drive.dashboard.extensions import db

    client = app.test_client()
    with app.app_context():
        engine = db.engine
    with count_statements(engine) as counter:
        first = scrape(client)
        after_first = counter.count
        second = scrape(client)
    assert len(snapshot_selects(counter)) == 7, counter.statements
    assert counter.count == after_first, "the second scrape within 5 s must not query"
    assert samples(first["geneva_drive_workflows"]) == samples(second["geneva_drive_workflows"])


def test_a_scrape_after_the_ttl_queries_again(app, seeded, count_statements, monkeypatch):
    from geneva_drive.dashboard.extensions import db

    client = app.test_client()
    with app.app_context():
        engine = db.engine
    scrape(client)
    monkeypatch.setattr(metrics._cache, "max_age", 0.0)
    with count_statements(engine) as counter:
        scrape(client)
    assert len(snapshot_selects(counter)) == 7


def test_database_errors_become_database_up_zero():
    def broken() -> metrics.MetricsSnapshot:
        raise RuntimeError("database is down")

    families = list(DatabaseCollector(broken).collect())
    assert [f.name for f in families] == ["geneva_drive_database_up"]
    assert families[0].samples[0].value == 0


def test_overview_and_metrics_show_the_same_numbers(app, seeded):
    """The dashboard's overview calls geneva_drive.metrics.get_snapshot(): same cache, same numbers."""
    families = scrape(app.test_client())
    snapshot = metrics.get_snapshot()
    overdue = samples(families["geneva_drive_overdue_step_executions"])
    assert sum(overdue.values()) == snapshot.overdue == 2
    assert families["geneva_drive_oldest_overdue_seconds"].samples[0].value == pytest.approx(
        snapshot.oldest_overdue_seconds
    )


def test_cache_period_from_the_app_config(geneva_database, geneva_session, count_statements):
    from geneva_drive.dashboard import create_app
    from geneva_drive.dashboard.extensions import db

    options: dict[str, object] = {}
    if geneva_database.schema is not None:
        options = {"connect_args": {"options": f"-csearch_path={geneva_database.schema}"}}
    previous = metrics._cache.max_age
    flask_app = create_app(
        {
            "TESTING": True,
            "SQLALCHEMY_DATABASE_URI": geneva_database.url,
            "SQLALCHEMY_ENGINE_OPTIONS": options,
            "METRICS_CACHE_SECONDS": 0,
            "METRICS_PUBLIC": True,
        }
    )
    try:
        client = flask_app.test_client()
        with flask_app.app_context():
            engine = db.engine
        with count_statements(engine) as counter:
            scrape(client)
            scrape(client)
        # An empty database: three snapshot queries per scrape (counts, workers, schedules),
        # no cache.
        assert len(snapshot_selects(counter)) == 6
    finally:
        metrics.configure_cache(max_age=previous)
        with flask_app.app_context():
            db.engine.dispose()


def test_the_overview_page_counts_agree_with_metrics(app, seeded):
    """The dashboard's overview and /metrics must never tell an operator two stories."""
    from geneva_drive.dashboard import queries
    from geneva_drive.dashboard.extensions import db

    families = scrape(app.test_client())

    def total(name: str) -> float:
        return sum(samples(families[name]).values())

    with app.test_request_context():
        overview = queries.overview(db.session)
    scraped = {
        (dict(k)["workflow"], dict(k)["state"]): v
        for k, v in samples(families["geneva_drive_workflows"]).items()
        if v
    }
    shown = {
        (workflow, state): float(count)
        for workflow, states in overview.counts.items()
        for state, count in states.items()
        if count
    }
    assert shown == scraped
    assert overview.overdue == total("geneva_drive_overdue_step_executions") == 2
    assert overview.waiting_overdue == total("geneva_drive_waiting_overdue") == 1
    assert overview.stuck_in_progress == total("geneva_drive_stuck_in_progress") == 1


def test_openmetrics_when_prometheus_asks_for_it(app, seeded):
    from prometheus_client.openmetrics.parser import (
        text_string_to_metric_families as openmetrics_families,
    )

    # What Prometheus 2.x sends by default.
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    response = app.test_client().get("/metrics", headers={"Accept": accept})
    assert response.status_code == 200
    assert response.content_type.startswith("application/openmetrics-text")
    families = {f.name: f for f in openmetrics_families(response.get_data(as_text=True))}
    assert families["geneva_drive_workflows"].type == "gauge"
    assert families["geneva_drive_step_executions"].type == "counter"
    overdue = {
        s.labels["workflow"]: s.value
        for s in families["geneva_drive_overdue_step_executions"].samples
    }
    assert overdue == {"MetricsAlpha": 2, "MetricsBeta": 0, "MetricsGamma": 0}
