"""A real Prometheus server (Debian's ``prometheus``) scrapes the dashboard's ``/metrics`` and
loads docs/prometheus-rules.yml: the gauge ``geneva_drive_unexplained_workflows`` arrives
with its class label and value, and the alert on it is loaded (docs/MANUAL.md, "Unexplained
workflows: `geneva-drive doctor`").

The server runs on a port of its own with a data directory under the test's tmp_path and is
stopped by its own PID."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from sqlalchemy import update
from werkzeug.serving import make_server

from geneva_drive import Workflow, step
from geneva_drive.models import StepExecution, utcnow
from tests.engine.helpers import make_order

pytestmark = pytest.mark.integration

RULES = Path(__file__).resolve().parents[2] / "docs" / "prometheus-rules.yml"
#: /metrics answers 401 without a bearer token: the scrape presents it, as a
#: production Prometheus does (``authorization: {credentials: ...}``).
TOKEN = uuid4().hex


class ScrapedFlow(Workflow):
    @step
    def only(self) -> None:
        pass


def _prometheus() -> str:
    found = shutil.which("prometheus")
    if found is None:
        if os.environ.get("GENEVA_REQUIRE_SERVICES") == "1":
            pytest.fail("prometheus is required (apt-get install prometheus)")
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def dashboard(geneva_database, geneva_session) -> Iterator[str]:  # type: ignore[no-untyped-def]
    from geneva_drive.dashboard import create_app
    from geneva_drive.dashboard.extensions import db

    options: dict[str, object] = {}
    if geneva_database.schema is not None:
        options = {"connect_args": {"options": f"-csearch_path={geneva_database.schema}"}}
    app = create_app(
        {
            "TESTING": True,
            "SQLALCHEMY_DATABASE_URI": geneva_database.url,
            "SQLALCHEMY_ENGINE_OPTIONS": options,
            "METRICS_TOKEN": TOKEN,
        }
    )
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(5)
        with app.app_context():
            db.engine.dispose()


@pytest.fixture
def prometheus(dashboard: str, tmp_path: Path) -> Iterator[str]:
    binary = _prometheus()
    port = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files:\n  - {RULES}\n"
        "scrape_configs:\n"
        "  - job_name: geneva\n"
        f"    authorization:\n      credentials: {TOKEN}\n"
        f"    static_configs:\n      - targets: ['{dashboard}']\n"
    )
    with (tmp_path / "prometheus.log").open("w") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def _api(base: str, path: str, **params: str) -> Any:
    url = f"{base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())["data"]


def _eventually(fn: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except OSError:
            pass  # the server is still starting
        time.sleep(0.5)
    raise AssertionError(f"Prometheus never answered as expected (last: {last!r})")


def test_prometheus_scrapes_the_unexplained_gauge_and_loads_its_alert(
    prometheus: str, geneva_session
) -> None:
    wf = ScrapedFlow.create(hero=make_order(geneva_session))
    geneva_session.commit()
    long_ago = utcnow() - timedelta(hours=1)
    # Ready with its execution gone: unexplained.
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == wf.id)
        .values(state="canceled", outcome="canceled", finished_at=long_ago)
    )
    geneva_session.execute(
        update(Workflow).where(Workflow.id == wf.id).values(transitioned_at=long_ago)
    )
    geneva_session.commit()

    def scraped() -> list[Any]:
        result = _api(prometheus, "query", query="geneva_drive_unexplained_workflows")["result"]
        return [r for r in result if r["metric"].get("workflow") == "ScrapedFlow"]

    (series,) = _eventually(scraped)
    assert series["metric"]["job"] == "geneva"
    assert float(series["value"][1]) == 1.0

    def alert_loaded() -> list[Any]:
        groups = _api(prometheus, "rules")["groups"]
        return [
            rule
            for group in groups
            for rule in group["rules"]
            if rule["name"] == "GenevaDriveUnexplainedWorkflows"
        ]

    (rule,) = _eventually(alert_loaded)
    assert rule["query"] == "geneva_drive_unexplained_workflows > 0"
    assert rule["annotations"]["dashboard_url"] == "DASHBOARD_URL/unexplained"
    # Pending (its `for: 15m` has not passed), not firing: the rule sees the scraped series.
    _eventually(lambda: alert_loaded()[0]["state"] == "pending")
