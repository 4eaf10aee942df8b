"""Prometheus multiprocess mode under a real Celery prefork worker (two children, Redis):
the steps its children run add up on the worker's metrics port (GENEVA_WORKER_METRICS_PORT,
served by the main process from PROMETHEUS_MULTIPROC_DIR)."""

from __future__ import annotations

import json
import socket
import urllib.request
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from geneva_drive.celery import CeleryTransport, make_celery
from tests.integration.conftest import (
    BIN,
    REDIS_URL,
    Process,
    create_workflow,
    process_env,
    require_service,
    wait_for_state,
)
from tests.metrics.mp_worker import MetricsMpWorkflow

pytestmark = pytest.mark.integration

STEPS = 20


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_prefork_children_add_up_on_the_worker_metrics_port(
    shared_database, processes, use_transport, tmp_path: Path
) -> None:
    require_service("Redis", REDIS_URL)
    directory = tmp_path / "prometheus"
    directory.mkdir()
    port, queue = _free_port(), f"gd-metrics-{uuid.uuid4().hex[:8]}"
    env = process_env(
        shared_database,
        tmp_path / "steps.log",
        GENEVA_BROKER_URL=REDIS_URL,
        GENEVA_DEFAULT_QUEUE=queue,
        GENEVA_WORKFLOW_MODULES="tests.metrics.mp_worker",
        PROMETHEUS_MULTIPROC_DIR=str(directory),
        GENEVA_WORKER_METRICS_PORT=str(port),
    )
    worker = Process(
        [str(BIN / "celery"), "-A", "geneva_drive.celery", "worker", "--pool=prefork", "-c", "2",
         "--loglevel=INFO", "-Q", queue, "-n", f"{queue}@%h",
         "--without-gossip", "--without-mingle", "--without-heartbeat"],
        env,
        tmp_path / "worker.log",
    )  # fmt: skip
    processes.append(worker)
    worker.wait_for_output(" ready.", timeout=60)
    celery = make_celery(REDIS_URL)
    celery.conf.task_default_queue = queue
    use_transport(CeleryTransport(celery))
    try:
        ids = [create_workflow(MetricsMpWorkflow) for _ in range(STEPS)]
        for workflow_id in ids:
            wait_for_state(workflow_id, "finished", timeout=60)
    finally:
        celery.close()

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    labels = (("outcome", "completed"), ("step", "work"), ("workflow", "metrics_mp_flow"))
    assert values[("geneva_drive_step_executions_total", labels)] == STEPS
    assert values[
        ("geneva_drive_step_duration_seconds_count", (("step", "work"), ("workflow", "metrics_mp_flow")))
    ] == STEPS  # fmt: skip
    # The steps ran in the pool's children (one file each), not in the main process that
    # serves the port; the port shows their sum.
    per_process = {
        path.stem.removeprefix("counter_"): _completed(path)
        for path in directory.glob("counter_*.db")
    }
    assert per_process.get(str(worker.pid), 0) == 0
    children = {pid: n for pid, n in per_process.items() if pid != str(worker.pid) and n}
    assert children and sum(children.values()) == STEPS, per_process


def _completed(path: Path) -> float:
    from prometheus_client.mmap_dict import MmapedDict

    total = 0.0
    for key, value, _timestamp, _pos in MmapedDict.read_all_values_from_file(str(path)):
        _metric, name, labels, _help = json.loads(key)
        if name == "geneva_drive_step_executions_total" and labels.get("outcome") == "completed":
            total += value
    return total
