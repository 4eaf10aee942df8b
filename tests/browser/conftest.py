"""Browser fixtures: the dashboard served on 127.0.0.1 in a thread, the demo data, Chromium.

Playwright drives Debian's ``/usr/bin/chromium`` (no downloaded browser). Without it the
tests are skipped, unless ``GENEVA_REQUIRE_SERVICES=1`` (CI), where a missing browser fails.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import DateTime, and_, bindparam, inspect, select, update
from sqlalchemy.engine.url import make_url
from werkzeug.serving import make_server

from geneva_drive import db, transport
from geneva_drive.config import settings
from geneva_drive.dashboard import create_app
from geneva_drive.models import Base, UTCDateTime, utcnow
from geneva_drive.testing.pytest_plugin import create_test_database
from tests.app.conftest import USERS, app_config

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
DOCS_SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def screenshots_dir() -> Path:
    """Where :func:`screenshot` writes: the README's ``docs/screenshots/`` only when asked.

    Every run used to rewrite the committed images (their bytes differ from run to run), so a
    ``git commit -a`` after the suite took two dozen changed PNGs along. The screenshots are
    still taken on every run, into the temporary directory, so a page that cannot be captured
    fails the test either way.
    """
    if os.environ.get("GENEVA_SCREENSHOTS_RECORD") == "1":
        return DOCS_SCREENSHOTS
    return Path(tempfile.gettempdir()) / "geneva-drive-screenshots"


PASSWORDS = {"olga": "olga-pw", "vic": "vic-pw"}

assert set(PASSWORDS) == set(USERS)


def _require_browser() -> None:
    if Path(CHROMIUM).exists():
        return
    if os.environ.get("GENEVA_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{CHROMIUM} is missing and GENEVA_REQUIRE_SERVICES=1")
    pytest.skip(f"{CHROMIUM} is not installed")


@dataclass(frozen=True)
class DemoTemplate:
    """The demo seeded once per pytest process, into a SQLite file the tests copy."""

    path: Path
    count: int
    #: Right before the seed started, and right after it ended (the real clock).
    started: datetime
    finished: datetime


@pytest.fixture(scope="session")
def demo_template(tmp_path_factory: pytest.TempPathFactory) -> DemoTemplate:
    """``geneva_drive.examples.seed`` run once per pytest process: seeding costs 5-6 s of CPU
    (hundreds of workflows through the engine), which every browser test paid, on a loaded
    machine a minute or more of wall time each. Each test now gets a copy (``demo_data``)."""
    from geneva_drive.examples import DEMO_TABLES
    from geneva_drive.examples import seed as demo_seed

    directory = tmp_path_factory.mktemp("demo-template")
    database = create_test_database(directory)
    previous_engine, previous_transport = db._engine, transport._transport
    db.configure(engine=database.engine)
    transport.set_transport(transport.RecordingTransport())
    snapshot = {k: v for k, v in vars(settings).items() if not k.startswith("_")}
    try:
        Base.metadata.create_all(database.engine, tables=DEMO_TABLES)
        started = utcnow()
        count = demo_seed.seed()
        finished = utcnow()
    finally:
        for key, value in snapshot.items():
            setattr(settings, key, value)
        transport.set_transport(previous_transport)
        if previous_engine is not None:
            db.configure(engine=previous_engine)
        # The last connection to close checkpoints the WAL: the file alone is the database.
        database.engine.dispose()
    return DemoTemplate(Path(str(make_url(database.url).database)), count, started, finished)


def _shift_every_timestamp(engine: Any, delta: timedelta) -> None:
    """Move every date-time of every table ``delta`` later, as if the rows had been written
    ``delta`` later: the copied demo is then as fresh as one seeded now."""
    with engine.begin() as connection:
        for table in Base.metadata.sorted_tables:
            if not inspect(connection).has_table(table.name):
                continue
            stamps = [c for c in table.columns if isinstance(c.type, DateTime | UTCDateTime)]
            keys = list(table.primary_key.columns)
            if not stamps or not keys:
                continue
            rows = connection.execute(select(*keys, *stamps)).mappings().all()
            if not rows:
                continue
            where = and_(*(key == bindparam(f"k_{key.name}") for key in keys))
            statement = (
                update(table)
                .where(where)
                .values({c.name: bindparam(f"v_{c.name}") for c in stamps})
            )
            connection.execute(
                statement,
                [
                    {
                        **{f"k_{key.name}": row[key.name] for key in keys},
                        **{
                            f"v_{c.name}": None if row[c.name] is None else row[c.name] + delta
                            for c in stamps
                        },
                    }
                    for row in rows
                ],
            )


@dataclass(frozen=True)
class Demo:
    count: int
    #: When the copied demo's seed "started", moved like its rows.
    started: datetime


@pytest.fixture
def demo(geneva_database, geneva_transport, demo_template: DemoTemplate) -> Demo:  # type: ignore[no-untyped-def]
    """This test's database holds a copy of the demo, every timestamp moved by the time since
    the template was seeded: the rows stand where a seed finishing now would put them."""
    path = Path(str(make_url(geneva_database.url).database))
    geneva_database.engine.dispose()
    for leftover in (path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        leftover.unlink(missing_ok=True)
    shutil.copyfile(demo_template.path, path)
    delta = utcnow() - demo_template.finished
    _shift_every_timestamp(geneva_database.engine, delta)
    return Demo(demo_template.count, demo_template.started + delta)


@pytest.fixture
def demo_data(demo: Demo) -> int:
    """The demo workflows of ``geneva_drive.examples.seed`` (a few hundred, in every state)."""
    return demo.count


@pytest.fixture
def demo_started_at(demo: Demo) -> datetime:
    """The instant right before the demo's seed started (moved like its rows): every due time
    the seed writes is this or later, except the ones it puts in the past on purpose (its
    overdue rows, minutes back). A test that holds the clock here (``frozen_clock``) sees the
    same demo however long seeding, copying and the browser took."""
    return demo.started


class LiveServer:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.thread.join(timeout=10)


@pytest.fixture
def live_server(geneva_database, demo_data) -> Iterator[LiveServer]:  # type: ignore[no-untyped-def]
    # Poll every second so a test watching a timeline does not wait 5 s per refresh.
    app = create_app(app_config(geneva_database, POLL_SECONDS=1))
    with LiveServer(app) as server:
        yield server
    with app.app_context():
        from geneva_drive.dashboard.extensions import db

        db.session.remove()
        db.engine.dispose()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium per test file (each test opens its own context, so cookies and storage
    stay per test): a launch costs about a second of CPU, which every test paid."""
    _require_browser()
    from playwright.sync_api import expect, sync_playwright

    # CI machines run the whole suite in parallel with other jobs; 5 s is tight for a poll
    # round-trip on a loaded 2-core box, and a slow pass is not a failure. A wait ends as soon
    # as its condition holds: the bound costs nothing when the page is right.
    expect.set_options(timeout=30_000)

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def watch(page: Any) -> list[str]:
    """Collect what fails a browser test: console errors, script errors and 5xx answers."""
    errors: list[str] = []

    def on_console(message: Any) -> None:
        # Chromium logs every 4xx answer to an XHR; a 409 refusal or a 400 for bad input
        # (swapped in next to the control) is an expected answer.
        expected = ("status of 409", "status of 400")
        if message.type == "error" and not any(e in message.text for e in expected):
            errors.append(message.text)

    def on_response(response: Any) -> None:
        if response.status >= 500:
            errors.append(f"{response.status} from {response.request.method} {response.url}")

    # A CSP violation, a script error or a server error is a bug: fail the test at the end.
    page.on("console", on_console)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("response", on_response)
    return errors


def open_page(
    browser: Any, width: int = 1280, height: int = 900, color_scheme: str | None = None
) -> Iterator[Any]:
    context = browser.new_context(
        viewport={"width": width, "height": height}, color_scheme=color_scheme
    )
    page = context.new_page()
    errors = watch(page)
    yield page
    context.close()
    assert not errors, f"browser console errors or 5xx answers: {errors}"


@pytest.fixture
def page(browser) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    yield from open_page(browser)


@pytest.fixture(params=["light", "dark"])
def scheme_page(request, browser) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    """The ``page`` in the light and in the dark scheme (the system preference, which the
    dashboard follows until the scheme switch overrides it): a test taking it runs twice."""
    yield from open_page(browser, color_scheme=request.param)


@pytest.fixture
def phone_page(browser) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    """A 390 px wide phone screen (the size the layout problems were reported at)."""
    yield from open_page(browser, 390, 844)


def open_first(page: Any) -> None:
    """Open the first workflow of the list on screen, and wait until its page has loaded.

    A click waits only for the navigation to start: the page's deferred scripts (htmx, the
    confirmation dialogs) may not have run yet, and on a loaded machine a test's next click
    then met a button without its behaviour (no dialog opened)."""
    page.locator("#results tbody a").first.click()
    page.wait_for_load_state("load")


def login(page: Any, base_url: str, user: str) -> None:
    page.goto(f"{base_url}/login")
    page.get_by_label("Username").fill(user)
    page.get_by_label("Password").fill(PASSWORDS[user])
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base_url}/")


def screenshot(page: Any, name: str, full_page: bool = True) -> None:
    target = screenshots_dir()
    target.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(target / f"{name}.png"), full_page=full_page)
