"""A stranger's install: the built wheel in a fresh venv outside the checkout, then the example
host application (examples/host_app, whose package is named ``app``) on PostgreSQL + Redis.

What a new user does, in order:

1. ``pip wheel`` the project; the wheel holds templates, static files and migrations, and no
   top-level package but ``geneva_drive``.
2. From a directory with no checkout, a venv holding only the wheel (and gunicorn) runs
   ``geneva-drive migrate``, ``geneva-drive up --demo``, ``gunicorn
   geneva_drive.dashboard.wsgi:app`` and ``celery -A geneva_drive.celery worker``.
3. The host app is installed beside it. Its ``flask db upgrade`` runs both migration
   histories; a Celery worker and beat start from the host's own Celery app; gunicorn serves
   the host. An order created through the host's route reserves its lines, parks for its
   payment, is woken by the webhook, waits, and finishes. The dashboard mounted at
   ``/admin/workflows`` shows it to the host's operator and refuses a host user without the
   operator role, who is still signed in to the shop afterwards.

Slow (two pip installs); run once, in the SQLite pass of scripts/test (it brings its own
PostgreSQL database).
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from tests.integration.conftest import REDIS_URL, ROOT, Process, require_service

# Runs once, in the SQLite pass: it brings its own PostgreSQL database. Building the wheel and
# its virtualenv takes minutes on a loaded machine: a larger time limit than the default.
pytestmark = [pytest.mark.integration, pytest.mark.sqlite_pass, pytest.mark.timeout(1200)]

PG_ADMIN_URL = os.environ.get(
    "GENEVA_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _attempt(
    args: list[str], cwd: Path, env: dict[str, str], timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> str:
    done = _attempt(args, cwd, env, timeout)
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        cwd=out,
        env=env,
    )
    (found,) = out.glob("geneva_drive-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv outside the checkout holding the wheel, its dependencies and gunicorn."""
    where = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    _run([str(where / "bin" / "pip"), "install", "-q", str(wheel), "gunicorn"], cwd=where, env=env)
    return where


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A working directory with no checkout in it or above it."""
    here = tmp_path / "elsewhere"
    here.mkdir()
    assert not (here / "engine").exists() and ROOT not in here.parents
    return here


@pytest.fixture
def pg_database() -> Iterator[str]:
    require_service("PostgreSQL", PG_ADMIN_URL)
    name = f"gd_host_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        yield url
    finally:
        with admin.connect() as c:
            c.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"),
                {"n": name},
            )
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()


@pytest.fixture
def started() -> Iterator[list[Process]]:
    running: list[Process] = []
    yield running
    for process in running:
        process.stop(timeout=15)


def _clean_env(venv: Path, cwd: Path, **extra: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "TMPDIR", "PATH")}
    env = {
        **keep,
        "PATH": f"{venv / 'bin'}:{keep.get('PATH', '/usr/bin:/bin')}",
        "VIRTUAL_ENV": str(venv),
        "GENEVA_TEST_CWD": str(cwd),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.update(extra)
    return env


def test_the_wheel_holds_one_namespace_and_its_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert top == {"geneva_drive"}, top
    for needed in (
        "geneva_drive/dashboard/templates/base.html",
        "geneva_drive/dashboard/templates/error.html",
        "geneva_drive/dashboard/static/css/app.css",
        "geneva_drive/migrations/env.py",
        "geneva_drive/migrations/versions/0001_create_geneva_drive_tables.py",
        "geneva_drive/dashboard/wsgi.py",
        "geneva_drive/py.typed",
        # The README's links do not resolve from the wheel: it points readers at this copy.
        "geneva_drive/docs/MANUAL.md",
        "geneva_drive/docs/__init__.py",
    ):
        assert needed in names, needed
    assert any(n.startswith("geneva_drive/dashboard/static/vendor/htmx-") for n in names)
    assert not any(n.startswith("geneva_drive/examples/host_app") for n in names)


def test_the_wheel_alone_runs_every_role(venv: Path, outside: Path, started: list[Process]) -> None:
    bin_ = venv / "bin"
    env = _clean_env(venv, outside)
    migrated = _run([str(bin_ / "geneva-drive"), "migrate"], cwd=outside, env=env)
    assert "setup plugin" not in migrated and "SECRET_KEY" not in migrated
    assert (outside / "var" / "geneva_drive.sqlite3").exists()

    port = _free_port()
    up = Process(
        [str(bin_ / "geneva-drive"), "up", "--demo", "--port", str(port)],
        env,
        outside / "up.log",
    )
    started.append(up)
    up.wait_for_output("GenevaDrive is running", timeout=120)
    assert _get(f"http://127.0.0.1:{port}/")[0] == 200
    assert up.stop() == 0

    database = f"sqlite:///{outside / 'var' / 'geneva_drive.sqlite3'}"
    require_service("Redis", REDIS_URL)
    web_port = _free_port()
    # The standalone dashboard's operator actions publish step messages: like every publishing
    # role it refuses to start without GENEVA_BROKER_URL (no silent broker).
    gunicorn = Process(
        [str(bin_ / "gunicorn"), "-b", f"127.0.0.1:{web_port}", "geneva_drive.dashboard.wsgi:app"],
        {
            **env,
            "GENEVA_DATABASE_URL": database,
            "GENEVA_SECRET_KEY": uuid.uuid4().hex,
            "GENEVA_BROKER_URL": REDIS_URL,
        },
        outside / "gunicorn.log",
    )
    started.append(gunicorn)
    gunicorn.wait_for_output("Booting worker", timeout=60)
    _wait_http(f"http://127.0.0.1:{web_port}/healthz")

    worker = Process(
        [str(bin_ / "celery"), "-A", "geneva_drive.celery", "worker", "-P", "solo", "-l", "INFO"],
        {**env, "GENEVA_DATABASE_URL": database, "GENEVA_BROKER_URL": REDIS_URL},
        outside / "worker.log",
    )
    started.append(worker)
    worker.wait_for_output("ready.", timeout=60)


def test_a_worker_with_a_broken_setting_refuses_to_start(venv: Path, outside: Path) -> None:
    bin_ = venv / "bin"
    env = _clean_env(venv, outside, GENEVA_BROKER_URL=REDIS_URL)
    worker = [
        str(bin_ / "celery"),
        "-A",
        "geneva_drive.celery",
        "worker",
        "-P",
        "solo",
        "-l",
        "INFO",
    ]
    no_db = _attempt(worker, outside, env, timeout=60)
    assert no_db.returncode != 0
    assert "GENEVA_DATABASE_URL is not set" in no_db.stderr
    assert not (outside / "var").exists()  # no silent SQLite file

    env["GENEVA_DATABASE_URL"] = f"sqlite:///{outside / 'x.sqlite3'}"
    env["GENEVA_WORKFLOW_MODULES"] = "myshop.nonexistent"
    bad_module = _attempt(worker, outside, env, timeout=60)
    assert bad_module.returncode != 0
    assert "myshop.nonexistent" in bad_module.stderr and "ready." not in bad_module.stderr


def test_the_host_app_runs_an_order_through_its_own_celery_and_dashboard(
    venv: Path, tmp_path: Path, pg_database: str, started: list[Process]
) -> None:
    require_service("Redis", REDIS_URL)
    shop = tmp_path / "myshop"
    shutil.copytree(
        ROOT / "examples" / "host_app", shop, ignore=shutil.ignore_patterns("__pycache__")
    )
    bin_ = venv / "bin"
    env = _clean_env(
        venv,
        shop,
        SHOP_DATABASE_URL=pg_database,
        SHOP_BROKER_URL=REDIS_URL,
        SHOP_SECRET_KEY=uuid.uuid4().hex,
        GENEVA_DISPATCH_INTERVAL="1",
    )
    _run([str(bin_ / "pip"), "install", "-q", "flask-login", "pytest"], cwd=shop, env=env)
    # The shop's own tests, on GenevaDrive's pytest plugin as installed from the wheel (a fresh
    # schema per test in the PostgreSQL database, the shop's tables beside the engine's).
    tested = _run(
        [str(bin_ / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=shop,
        env={**env, "GENEVA_TEST_DATABASE_URL": pg_database},
    )
    assert "4 passed" in tested, tested

    # Both migration histories, in the host's one `flask db upgrade`.
    _run([str(bin_ / "flask"), "--app", "app", "db", "upgrade"], cwd=shop, env=env)
    engine = create_engine(pg_database)
    with engine.connect() as c:
        assert c.execute(text("SELECT version_num FROM alembic_version")).scalar() == "shop_0002"
        assert c.execute(text("SELECT version_num FROM geneva_drive_alembic_version")).scalar()
    # The host's autogenerate leaves the engine's tables alone.
    checked = _run([str(bin_ / "flask"), "--app", "app", "db", "check"], cwd=shop, env=env)
    assert "No new upgrade operations detected" in checked
    _run(
        [
            str(bin_ / "python"),
            "-c",
            (
                "from app import create_app, db\n"
                "from app.models import User\n"
                "app = create_app()\n"
                "with app.app_context():\n"
                "    for name, role in (('alice', 'operator'), ('bob', None)):\n"
                "        u = User(name=name, geneva_drive_role=role); u.set_password(name + '-pw')\n"
                "        db.session.add(u)\n"
                "    db.session.commit()\n"
            ),
        ],
        cwd=shop,
        env=env,
    )

    worker = Process(
        [
            str(bin_ / "celery"),
            "-A",
            "app.celery_app",
            "worker",
            "-P",
            "prefork",
            "-c",
            "2",
            "-l",
            "INFO",
        ],
        env,
        shop / "worker.log",
    )
    started.append(worker)
    beat = Process(
        [
            str(bin_ / "celery"),
            "-A",
            "app.celery_app",
            "beat",
            "-s",
            str(shop / "beat-schedule"),
            "-l",
            "INFO",
        ],
        env,
        shop / "beat.log",
    )
    started.append(beat)
    port = _free_port()
    web = Process(
        [str(bin_ / "gunicorn"), "-b", f"127.0.0.1:{port}", "-w", "2", "app.wsgi:app"],
        env,
        shop / "web.log",
    )
    started.append(web)
    worker.wait_for_output("ready.", timeout=90)
    beat.wait_for_output("beat: Starting", timeout=60)
    base = f"http://127.0.0.1:{port}"
    _wait_http(f"{base}/login")

    alice = _Browser(base)
    assert alice.post("/login", {"name": "alice", "password": "alice-pw"})[0] == 200
    status, body = alice.post("/orders", {"sku": ["a-1", "b-2"]})
    assert status == 201, body
    order = json.loads(body)

    def current() -> dict[str, Any]:
        return json.loads(alice.get(f"/orders/{order['id']}")[1])

    parked = _eventually(
        lambda: (
            (o := current())["next_step"] == "capture_payment" and all(o["lines_reserved"]) and o
        ),
        "the order to reserve its lines and wait for its payment",
    )
    assert parked["workflow_state"] == "ready"

    event = {"order_id": order["id"], "amount_cents": 990, "event_id": "evt-1"}
    assert alice.post_json("/webhooks/payments", event)[0] == 202
    done = _eventually(
        lambda: (o := current())["workflow_state"] == "finished" and o,
        "the order to finish",
        timeout=60,
    )
    assert (done["status"], done["paid_cents"]) == ("shipped", 990)

    status, page = alice.get(f"/admin/workflows/workflows/{order['workflow_id']}")
    assert status == 200 and "OrderWorkflow" in page and "finished" in page
    assert alice.get("/account")[0] == 200  # the dashboard left the host's session alone

    bob = _Browser(base)
    assert bob.post("/login", {"name": "bob", "password": "bob-pw"})[0] == 200
    assert bob.get("/admin/workflows/")[0] == 403
    assert bob.get("/account")[0] == 200

    # The dashboard leaves signing out to the shop (its own Log out is for its own login).
    assert "Log out" not in alice.get("/admin/workflows/")[1]

    # Beat's sweeps reach the shop's worker on the shop's own queue, not a queue nobody reads.
    _eventually(
        lambda: (
            "geneva_drive.dispatch_due" in worker.output()
            and "succeeded" in worker.output().split("geneva_drive.dispatch_due", 1)[1]
        ),
        "a dispatch_due sweep to run on the shop's worker",
        timeout=30,
    )

    stranger = _Browser(base, follow=False)
    status, _ = stranger.get("/admin/workflows/")
    assert status == 302 and stranger.last_location.startswith("/login?next=")
    engine.dispose()
    for process in (worker, beat, web):
        assert "Traceback" not in process.output(), process.output()[-3000:]


# --- a tiny browser over urllib ---------------------------------------------------------------


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class _Browser:
    def __init__(self, base: str, follow: bool = True) -> None:
        self.base = base
        self.last_location = ""
        handlers: list[Any] = [urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())]
        if not follow:
            handlers.append(_NoRedirect())
        self.opener = urllib.request.build_opener(*handlers)

    def _open(self, request: urllib.request.Request) -> tuple[int, str]:
        try:
            with self.opener.open(request, timeout=15) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            self.last_location = error.headers.get("Location", "")
            return error.code, error.read().decode(errors="replace")

    def get(self, path: str) -> tuple[int, str]:
        return self._open(urllib.request.Request(self.base + path))

    def post(self, path: str, form: dict[str, Any]) -> tuple[int, str]:
        data = urllib.parse.urlencode(form, doseq=True).encode()
        return self._open(urllib.request.Request(self.base + path, data=data, method="POST"))

    def post_json(self, path: str, body: Any) -> tuple[int, str]:
        request = urllib.request.Request(
            self.base + path,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        return self._open(request)


def _get(url: str) -> tuple[int, str]:
    return _Browser("").get(url)


def _wait_http(url: str, timeout: float = 30.0) -> None:
    _eventually(lambda: _get(url)[0] < 500, f"{url} to answer", timeout=timeout)


def _eventually(check: Any, what: str, timeout: float = 45.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (urllib.error.URLError, ConnectionError, OSError, json.JSONDecodeError):
            last = None
        if last:
            return last
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")
