"""``geneva-drive up --demo`` on the embedded default (SQLite under ./var/, no broker): it
migrates into ./var/, serves the dashboard on a free port (``/healthz`` answers) while it seeds
the demo workflows, and stops cleanly on Ctrl-C. (What the seed creates is checked in
tests/examples; the embedded worker in test_embedded.py.)"""

from __future__ import annotations

import json
import os
import re
import signal
import urllib.request
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select, text

from geneva_drive.dialects import dialect_for_url
from geneva_drive.testing.pytest_plugin import create_mysql_database, drop_mysql_database
from tests.integration.conftest import BIN, Process, wait_until

pytestmark = pytest.mark.integration


@pytest.mark.sqlite_pass  # its own SQLite file in tmp_path, whatever the suite's database
def test_up_demo_serves_the_dashboard_and_stops_on_ctrl_c(
    tmp_path: Path, processes: list[Process]
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENEVA_")}
    env.update(GENEVA_TEST_CWD=str(tmp_path), PYTHONUNBUFFERED="1")
    up = Process(
        [str(BIN / "geneva-drive"), "up", "--demo", "--port", "0", "--concurrency", "1"],
        env,
        tmp_path / "up.log",
    )
    processes.append(up)
    out = up.wait_for_output("GenevaDrive dashboard: http://", timeout=60)
    url = re.search(r"GenevaDrive dashboard: (http://127\.0\.0\.1:\d+)", out).group(1)
    with urllib.request.urlopen(f"{url}/healthz", timeout=10) as response:
        assert response.status == 200
        assert json.loads(response.read())["status"] == "ok"

    # Seeding runs (the dashboard already answers meanwhile); Ctrl-C may land during it.
    database = tmp_path / "var" / "geneva_drive.sqlite3"
    engine = create_engine(f"sqlite:///{database}")
    try:

        def seeded() -> int:
            with engine.connect() as connection:
                return connection.scalar(
                    select(func.count()).select_from(text("geneva_drive_workflows"))
                )

        wait_until(seeded, 60, "the demo seed to create workflows")
    finally:
        engine.dispose()

    os.killpg(up.pid, signal.SIGINT)  # Ctrl-C
    up.popen.wait(60)
    assert up.popen.returncode == 0, up.output()[-3000:]
    assert "GenevaDrive stopped." in up.output()


@pytest.mark.skipif(
    dialect_for_url(os.environ.get("GENEVA_TEST_DATABASE_URL") or "sqlite://").name != "mysql",
    reason="needs GENEVA_TEST_DATABASE_URL=mysql+pymysql://… (the demo on MariaDB)",
)
def test_up_demo_on_mariadb_runs_workflows_to_the_end_and_every_page_answers(
    tmp_path: Path, processes: list[Process]
) -> None:
    """MariaDB end to end: `geneva-drive up --demo` with GENEVA_DATABASE_URL on MariaDB
    migrates an empty database, its worker runs workflows to the end, every page answers."""
    admin_url = os.environ["GENEVA_TEST_DATABASE_URL"]
    name, url = create_mysql_database(admin_url, prefix="gd_up")
    engine = create_engine(url)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GENEVA_")}
        env.update(GENEVA_TEST_CWD=str(tmp_path), PYTHONUNBUFFERED="1", GENEVA_DATABASE_URL=url)
        env.update(GENEVA_METRICS_PUBLIC="1")  # /metrics is among the pages fetched below
        up = Process(
            [str(BIN / "geneva-drive"), "up", "--demo", "--port", "0", "--concurrency", "2"],
            env,
            tmp_path / "up.log",
        )
        processes.append(up)
        out = up.wait_for_output("GenevaDrive dashboard: http://", timeout=90)
        base = re.search(r"GenevaDrive dashboard: (http://127\.0\.0\.1:\d+)", out).group(1)
        with engine.connect() as connection:
            started = connection.scalar(text("SELECT UTC_TIMESTAMP(6)"))

        def finished_by_the_worker() -> int | None:
            # A finished workflow whose steps all completed (or were skipped), at least one of
            # them run by this process's worker: a workflow run to the end, not a seeded row.
            with engine.connect() as connection:
                return connection.scalar(
                    text(
                        "SELECT w.id FROM geneva_drive_workflows w WHERE w.state = 'finished' "
                        "AND EXISTS (SELECT 1 FROM geneva_drive_step_executions e "
                        "  WHERE e.workflow_id = w.id AND e.started_at > :started "
                        "  AND e.outcome = 'success') "
                        "AND NOT EXISTS (SELECT 1 FROM geneva_drive_step_executions e "
                        "  WHERE e.workflow_id = w.id "
                        "  AND e.state NOT IN ('completed', 'skipped', 'canceled')) "
                        "ORDER BY w.id LIMIT 1"
                    ),
                    {"started": started},
                )

        finished = wait_until(finished_by_the_worker, 120, "a workflow run to the end")
        with engine.connect() as connection:
            hero_type, hero_id, workflow_type = connection.execute(
                text(
                    "SELECT hero_type, hero_id, type FROM geneva_drive_workflows "
                    "WHERE hero_type IS NOT NULL ORDER BY id LIMIT 1"
                )
            ).one()
            last = connection.scalar(text("SELECT MAX(id) FROM geneva_drive_workflows"))
        pages = [
            "/",
            "/signals",
            "/definitions",
            f"/definitions/{workflow_type}",
            "/stranded",
            "/failures",
            "/audit",
            "/workflows",
            f"/workflows?after={last}",
            "/workflows?state=paused",
            f"/workflows/{finished}",
            f"/heroes/{hero_type}/{hero_id}",
            "/metrics",
            "/healthz",
        ]
        for page in pages:
            with urllib.request.urlopen(f"{base}{page}", timeout=30) as response:
                assert response.status == 200, page
        os.killpg(up.pid, signal.SIGINT)
        up.popen.wait(60)
        assert up.popen.returncode == 0, up.output()[-3000:]
    finally:
        engine.dispose()
        drop_mysql_database(admin_url, name)
