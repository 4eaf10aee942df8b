"""The worker metrics server (GENEVA_WORKER_METRICS_PORT) in this process."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from geneva_drive import instrumentation, prometheus

# Does not use the suite's database (an HTTP server in this process, no database): the SQLite pass runs it once.
pytestmark = pytest.mark.sqlite_pass


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_disabled_without_a_port(monkeypatch):
    monkeypatch.delenv("GENEVA_WORKER_METRICS_PORT", raising=False)
    assert prometheus.start_worker_server() is False


def test_a_bad_port_names_the_variable(monkeypatch):
    monkeypatch.setenv("GENEVA_WORKER_METRICS_PORT", "nine")
    with pytest.raises(ValueError, match="GENEVA_WORKER_METRICS_PORT"):
        prometheus.start_worker_server()


def test_a_taken_port_is_logged_not_raised(caplog):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert prometheus.start_worker_server(taken.getsockname()[1]) is False
    assert "cannot serve worker metrics" in caplog.text


def test_serves_this_process_event_metrics_on_loopback(monkeypatch):
    prometheus.install()
    port = _free_port()
    monkeypatch.setenv("GENEVA_WORKER_METRICS_PORT", str(port))
    monkeypatch.delenv("GENEVA_WORKER_METRICS_ADDR", raising=False)
    assert prometheus.start_worker_server() is True
    instrumentation.operator_action.send("test", action="resume_at")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    actions = {
        s.labels["action"]: s.value for s in families["geneva_drive_operator_actions"].samples
    }
    assert actions["resume_at"] >= 1
    assert "geneva_drive_workflows" not in families  # database gauges live on the dashboard


def test_celery_worker_init_installs_the_metrics(monkeypatch, geneva_database):
    # geneva_database: worker_init refuses to start without a configured database (and this
    # file runs in the SQLite pass only, where that is the suite's SQLite file).
    from geneva_drive import celery as engine_celery

    monkeypatch.delenv("GENEVA_WORKER_METRICS_PORT", raising=False)
    monkeypatch.delenv("GENEVA_WORKFLOW_MODULES", raising=False)
    # A worker refuses to start without a broker (no silent broker); this one is given one.
    monkeypatch.setenv("GENEVA_BROKER_URL", "memory://")
    prometheus.uninstall()
    # worker_init records the queues this process consumes: put them back after the test,
    # or later tests' perform_step would take this process for a worker.
    monkeypatch.setattr(engine_celery, "_consumed_queues", engine_celery._consumed_queues)
    monkeypatch.setattr(engine_celery, "_worker_default_queue", engine_celery._worker_default_queue)
    engine_celery._on_worker_init()
    assert prometheus.installed() is not None
