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

from tests.integration.conftest import BIN, Process, wait_until

pytestmark = pytest.mark.integration


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
