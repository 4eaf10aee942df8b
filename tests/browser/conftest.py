"""Browser fixtures: the dashboard served on 127.0.0.1 in a thread, the demo data, Chromium.

Playwright drives Debian's ``/usr/bin/chromium`` (no downloaded browser). Without it the
tests are skipped, unless ``GENEVA_REQUIRE_SERVICES=1`` (CI), where a missing browser fails.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from werkzeug.serving import make_server

from geneva_drive.dashboard import create_app
from geneva_drive.models import Base
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
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
PASSWORDS = {"olga": "olga-pw", "vic": "vic-pw"}

assert set(PASSWORDS) == set(USERS)


def _require_browser() -> None:
    if Path(CHROMIUM).exists():
        return
    if os.environ.get("GENEVA_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{CHROMIUM} is missing and GENEVA_REQUIRE_SERVICES=1")
    pytest.skip(f"{CHROMIUM} is not installed")


@pytest.fixture
def demo_data(geneva_database, geneva_transport) -> int:  # type: ignore[no-untyped-def]
    """The demo workflows of ``geneva_drive.examples.seed`` (a few hundred, in every state)."""
    from geneva_drive.examples import DEMO_TABLES
    from geneva_drive.examples import seed as demo_seed

    Base.metadata.create_all(geneva_database.engine, tables=DEMO_TABLES)
    return demo_seed.seed()


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


@pytest.fixture
def browser() -> Iterator[Any]:
    _require_browser()
    from playwright.sync_api import expect, sync_playwright

    # CI machines run the whole suite in parallel with other jobs; 5 s is tight for a poll
    # round-trip on a loaded 2-core box, and a slow pass is not a failure.
    expect.set_options(timeout=15_000)

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
        # Chromium logs every 4xx answer to an XHR; a 409 refusal is an expected answer.
        if message.type == "error" and "status of 409" not in message.text:
            errors.append(message.text)

    def on_response(response: Any) -> None:
        if response.status >= 500:
            errors.append(f"{response.status} from {response.request.method} {response.url}")

    # A CSP violation, a script error or a server error is a bug: fail the test at the end.
    page.on("console", on_console)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("response", on_response)
    return errors


def open_page(browser: Any, width: int = 1280, height: int = 900) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    errors = watch(page)
    yield page
    context.close()
    assert not errors, f"browser console errors or 5xx answers: {errors}"


@pytest.fixture
def page(browser) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    yield from open_page(browser)


@pytest.fixture
def phone_page(browser) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    """A 390 px wide phone screen (the size the issue was reported at)."""
    yield from open_page(browser, 390, 844)


def login(page: Any, base_url: str, user: str) -> None:
    page.goto(f"{base_url}/login")
    page.get_by_label("Username").fill(user)
    page.get_by_label("Password").fill(PASSWORDS[user])
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base_url}/")


def screenshot(page: Any, name: str, full_page: bool = True) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=full_page)
