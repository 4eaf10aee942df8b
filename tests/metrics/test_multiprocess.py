"""Multiprocess mode: two real worker processes run steps with PROMETHEUS_MULTIPROC_DIR set;
their samples add up in MultiProcessCollector, in the dashboard's /metrics and on the worker
metrics port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from geneva_drive.models import StepExecution
from tests.metrics.mp_worker import MetricsMpWorkflow

ROOT = Path(__file__).resolve().parents[2]
PER_WORKER = 5
LABELS = {"workflow": "metrics_mp_flow", "step": "work"}


def _env(database, directory: Path, **extra: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if k.lower() != "prometheus_multiproc_dir"}
    env.update(
        PROMETHEUS_MULTIPROC_DIR=str(directory),
        GENEVA_DATABASE_URL=database.url,
        PYTHONPATH=str(ROOT),
        **extra,
    )
    if database.schema is not None:
        env["GENEVA_TEST_SCHEMA"] = database.schema
    return env


def _worker(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.metrics.mp_worker", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen[str]) -> str:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    return out


def _families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _sample(families, name: str, sample_name: str, **labels: str) -> float:  # type: ignore[no-untyped-def]
    for sample in families[name].samples:
        if sample.name == sample_name and sample.labels == labels:
            return float(sample.value)
    raise AssertionError(f"no {sample_name}{labels}")


@pytest.fixture
def ran_in_two_workers(geneva_database, geneva_session, tmp_path):  # type: ignore[no-untyped-def]
    directory = tmp_path / "prom"
    directory.mkdir()
    for _ in range(2 * PER_WORKER):
        MetricsMpWorkflow.create(allow_multiple=True)
    geneva_session.commit()
    ids = [str(i) for i in geneva_session.scalars(select(StepExecution.id).order_by("id"))]
    env = _env(geneva_database, directory)
    workers = [_worker(env, "run", *ids[:PER_WORKER]), _worker(env, "run", *ids[PER_WORKER:])]
    pids = {_finish(w).strip() for w in workers}
    assert len(pids) == 2
    return directory, pids, env


def test_counters_of_two_workers_add_up(ran_in_two_workers):
    directory, pids, _ = ran_in_two_workers
    # One file per process and metric type: both workers wrote their own samples.
    written = {p.name for p in directory.iterdir()}
    assert {f"counter_{pid}.db" for pid in pids} <= written
    assert {f"histogram_{pid}.db" for pid in pids} <= written

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    assert (
        registry.get_sample_value(
            "geneva_drive_step_executions_total", {**LABELS, "outcome": "completed"}
        )
        == 2 * PER_WORKER
    )
    assert (
        registry.get_sample_value("geneva_drive_step_duration_seconds_count", LABELS)
        == 2 * PER_WORKER
    )
    assert (
        registry.get_sample_value(
            "geneva_drive_step_start_delay_seconds_count", {"workflow": "metrics_mp_flow"}
        )
        == 2 * PER_WORKER
    )
    assert registry.get_sample_value("geneva_drive_housekeeping_runs_total") == 2
    # A timestamp gauge in "mostrecent" mode: one value, the latest of the two processes.
    [last_run] = [
        s
        for family in registry.collect()
        for s in family.samples
        if s.name == "geneva_drive_housekeeping_last_run_timestamp_seconds"
    ]
    assert abs(last_run.value - time.time()) < 300


def test_dashboard_metrics_aggregate_the_directory(ran_in_two_workers):
    _, _, env = ran_in_two_workers
    families = _families(_finish(_worker(env, "scrape")))
    assert (
        _sample(
            families,
            "geneva_drive_step_executions",
            "geneva_drive_step_executions_total",
            **LABELS,
            outcome="completed",
        )
        == 2 * PER_WORKER
    )
    assert families["geneva_drive_step_executions"].type == "counter"
    assert families["geneva_drive_step_duration_seconds"].type == "histogram"
    # The database gauges are there too, from the same database the workers wrote.
    assert (
        _sample(
            families,
            "geneva_drive_workflows",
            "geneva_drive_workflows",
            workflow="metrics_mp_flow",
            state="finished",
        )
        == 2 * PER_WORKER
    )


def test_worker_metrics_port_serves_the_sum(ran_in_two_workers):
    _, _, env = ran_in_two_workers
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    families = _families(
        _finish(_worker({**env, "GENEVA_WORKER_METRICS_PORT": str(port)}, "serve"))
    )
    assert (
        _sample(
            families,
            "geneva_drive_step_executions",
            "geneva_drive_step_executions_total",
            **LABELS,
            outcome="completed",
        )
        == 2 * PER_WORKER
    )
    assert "geneva_drive_workflows" not in families  # workers expose events, not DB gauges
