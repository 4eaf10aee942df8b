"""Sessions, secrets and hosts: each finding of a security review reproduced the way it was found.

Every test here failed on the code before the fix: a password change that left old sessions
alive, a host app's weak secret key accepted, idle sockets that silenced ``/healthz``, the demo's
loopback access through proxy headers it did not know, and the lesser findings (throttle races,
lockout by rotating addresses, unbounded hashing, the built-in login under a host login, forged
audit actors, unaudited refusals, a host role in capitals, a public ``/metrics``, Host
allow-list, log lines with newlines, hero ids with ``/``, the 431 page).
"""

from __future__ import annotations

import contextlib
import logging
import select as io_select
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import select
from werkzeug.security import generate_password_hash

from geneva_drive.dashboard import GenevaDrive
from geneva_drive.errors import ConfigurationError
from geneva_drive.models import OperatorAction
from tests.app.conftest import CSRF
from tests.reliability.conftest import SECRET_KEY

FAST = "pbkdf2:sha256:1000"
LOOPBACK = {"REMOTE_ADDR": "127.0.0.1"}


def _login(client, name: str, password: str, addr: str = "203.0.113.5"):
    with client.session_transaction() as session:
        session["geneva_drive.csrf"] = CSRF
    return client.post(
        "/login",
        data={"username": name, "password": password, "csrf_token": CSRF},
        environ_base={"REMOTE_ADDR": addr},
    )


def _users(password: str, role: str = "operator") -> dict[str, Any]:
    return {"olga": {"password_hash": generate_password_hash(password, method=FAST), "role": role}}


# --- 1. a new password ends the sessions of the old one -----------------------------------------


def test_a_changed_password_ends_existing_sessions(build):
    before = build(USERS=_users("old-password"))
    client = before.test_client()
    assert _login(client, "olga", "old-password").status_code == 302
    assert client.get("/workflows").status_code == 200
    cookie = client.get_cookie("session")
    assert cookie is not None

    # The operator puts a new hash in GENEVA_USERS and restarts: the old cookie is nobody.
    after = build(USERS=_users("new-password"))
    stolen = after.test_client()
    stolen.set_cookie("session", cookie.value)
    page = stolen.get("/workflows")
    assert page.status_code == 302 and "/login" in page.headers["Location"]

    # A restart that keeps the password keeps the session.
    same = build(USERS=before.config["USERS"])
    kept = same.test_client()
    kept.set_cookie("session", cookie.value)
    assert kept.get("/workflows").status_code == 200


def test_the_session_cookie_holds_no_password_hash_material(build):
    """The cookie is signed, not encrypted: the fingerprint in it is keyed with the secret key,
    so it says nothing about the hash to whoever reads the cookie."""
    import base64
    import zlib

    flask_app = build(USERS=_users("old-password"))
    client = flask_app.test_client()
    assert _login(client, "olga", "old-password").status_code == 302
    cookie = client.get_cookie("session")
    assert cookie is not None
    body = cookie.value.lstrip(".").split(".")[0]
    raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    text = (zlib.decompress(raw) if cookie.value.startswith(".") else raw).decode()
    hashed = flask_app.config["USERS"]["olga"]["password_hash"]
    assert hashed not in text and hashed.rsplit("$", 1)[-1] not in text


# --- 2. extension mode checks the host's secret key ---------------------------------------------


def _host(geneva_database, **config: Any) -> tuple[Flask, SQLAlchemy]:
    app = Flask("host")
    app.config.update(**geneva_database.flask_config(), **config)
    db = SQLAlchemy()
    db.init_app(app)
    return app, db


@pytest.mark.parametrize(
    "key", [None, "", "change-me", "shop-dev-secret", "dev-only-change-me", "short"]
)
def test_init_app_refuses_a_weak_or_public_host_key(geneva_database, key):
    extra = {} if key is None else {"SECRET_KEY": key}
    app, db = _host(geneva_database, **extra)
    try:
        with pytest.raises(ConfigurationError) as refused:
            GenevaDrive(app, db=db)
        message = str(refused.value)
        assert "SECRET_KEY" in message and "token_urlsafe" in message, message
    finally:
        with app.app_context():
            db.engine.dispose()


def test_init_app_accepts_a_real_host_key(geneva_database, monkeypatch):
    # A broker is given (no silent broker: init_app without celery= needs one), so only the key
    # decides.
    monkeypatch.setenv("GENEVA_BROKER_URL", "memory://")
    app, db = _host(geneva_database, SECRET_KEY=SECRET_KEY)
    try:
        GenevaDrive(app, db=db, user_loader=lambda request: None)
    finally:
        with app.app_context():
            db.engine.dispose()


def test_the_example_host_app_and_the_manual_take_the_key_from_the_environment():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    source = (root / "examples" / "host_app" / "app" / "__init__.py").read_text()
    assert "shop-dev-secret" not in source and 'os.environ.get("SHOP_SECRET_KEY")' in source
    manual = (root / "docs" / "MANUAL.md").read_text()
    assert 'SECRET_KEY="change-me"' not in manual


# --- 4. the demo refuses every proxy-typical header ---------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        "X-Client-IP",
        "True-Client-IP",
        "CF-Connecting-IP",
        "X-Cluster-Client-IP",
        "Fastly-Client-IP",
        "Client-IP",
        "X-Original-Forwarded-For",
        "X-ProxyUser-Ip",
        "X-Envoy-External-Address",
        "X-Original-Host",
        "X-Host",
        "CF-Ray",
        "X-Amzn-Trace-Id",
    ],
)
def test_demo_refuses_every_proxy_typical_header(build, header):
    app = build(DEMO=True)
    client = app.test_client()
    ok = client.get("/workflows", headers={"Host": "127.0.0.1:8000"}, environ_base=LOOPBACK)
    assert ok.status_code == 200  # a newcomer on loopback: no login, no token
    response = client.get(
        "/workflows",
        headers={"Host": "127.0.0.1:8000", header: "203.0.113.7"},
        environ_base=LOOPBACK,
    )
    assert response.status_code == 302 and "/login" in response.headers["Location"], header


def test_the_demo_banner_and_readme_say_never_behind_a_proxy():
    from pathlib import Path

    from geneva_drive.dashboard import auth

    assert "must never sit behind a proxy" in auth.DEMO_BANNER
    cli = Path(auth.__file__).with_name("cli.py").read_text()
    assert "print(DEMO_BANNER" in cli
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "must never sit behind a proxy" in readme


# --- 5. the lesser findings ---------------------------------------------------------------------


def test_parallel_guesses_do_not_beat_the_limit(build, monkeypatch):
    """Check-then-record let 30 parallel guesses be checked against a limit of 5: the attempt
    is recorded before the password is checked, so only 5 are checked at all."""
    from geneva_drive.dashboard import auth

    app = build(LOGIN_MAX_FAILURES=5, LOGIN_MAX_FAILURES_PER_USER=1000)
    checked = []
    gate = threading.Barrier(30, timeout=30)
    real = auth.check_password_hash

    def slow_check(hashed: str, password: str) -> bool:
        checked.append(password)
        return bool(real(hashed, password))

    monkeypatch.setattr(auth, "check_password_hash", slow_check)
    statuses: list[int] = []

    def guess(i: int) -> None:
        client = app.test_client()
        gate.wait()
        statuses.append(_login(client, "olga", f"guess-{i}").status_code)

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(30)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(set(statuses)) == [401, 429], statuses
    assert statuses.count(401) <= 5 and len(checked) <= 5, (statuses, len(checked))


def test_rotating_addresses_do_not_lock_a_user_out_of_their_own_address(build):
    app = build(LOGIN_MAX_FAILURES_PER_USER=50)
    client = app.test_client()
    assert _login(client, "olga", "olga-pw", addr="192.0.2.10").status_code == 302
    statuses = [  # 55 guesses from 11 addresses: past the per-user limit of 50
        _login(client, "olga", "guess", addr=f"198.51.100.{i + 1}").status_code
        for i in range(11)
        for _ in range(5)
    ]
    assert statuses.count(401) == 50 and statuses[-1] == 429, statuses
    assert _login(client, "olga", "guess", addr="198.51.100.99").status_code == 429
    # Olga, from the address she logged in from before, is not locked out.
    assert _login(app.test_client(), "olga", "olga-pw", addr="192.0.2.10").status_code == 302


def test_concurrent_password_hashing_is_bounded(build, monkeypatch):
    from geneva_drive.dashboard import auth

    app = build(
        LOGIN_MAX_FAILURES=1000, LOGIN_MAX_FAILURES_PER_USER=1000,
        LOGIN_MAX_FAILURES_PER_ADDRESS=1000,
    )  # fmt: skip
    running = [0]
    most = [0]
    lock = threading.Lock()
    release = threading.Event()
    real = auth.check_password_hash

    def counting(hashed: str, password: str) -> bool:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        release.wait(0.5)
        try:
            return bool(real(hashed, password))
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(auth, "check_password_hash", counting)

    def guess(i: int) -> None:
        _login(app.test_client(), f"user-{i}", "guess", addr=f"198.51.100.{i + 1}")

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert 1 <= most[0] <= auth.MAX_CONCURRENT_HASHES < 12, most[0]


# --- host apps: the built-in login, roles, actors -----------------------------------------------


class _HostUser:
    def __init__(self, user_id: int, name: str, role: str | None) -> None:
        self.id = user_id
        self.name = name
        self.geneva_drive_role = role
        self.is_authenticated = True
        self.is_active = True
        self.is_anonymous = False

    def get_id(self) -> str:
        return str(self.id)


@pytest.fixture
def flask_login_host(geneva_database, geneva_session):
    """``make(users, **init_app)``: a host with Flask-Login and the dashboard at /admin."""
    from flask_login import LoginManager, login_user

    made: list[tuple[Flask, SQLAlchemy]] = []

    def make(users: dict[int, _HostUser], **options: Any) -> Flask:
        app, db = _host(geneva_database, SECRET_KEY=SECRET_KEY, GENEVA_URL_PREFIX="/admin")
        manager = LoginManager()
        manager.init_app(app)
        manager.user_loader(lambda user_id: users.get(int(user_id)))

        @app.post("/host-login/<int:user_id>")
        def host_login(user_id: int) -> tuple[str, int]:
            login_user(users[user_id])
            return "", 204

        GenevaDrive(app, db=db, **options)
        made.append((app, db))
        return app

    yield make
    for app, db in made:
        with app.app_context():
            db.engine.dispose()


def test_no_built_in_login_under_a_host_login(flask_login_host, monkeypatch):
    from geneva_drive.dashboard import auth

    app = flask_login_host({1: _HostUser(1, "ann", "operator")})
    hashed = []
    monkeypatch.setattr(auth, "check_password_hash", lambda *a: hashed.append(a) or False)
    client = app.test_client()
    with client.session_transaction() as session:
        session["geneva_drive.csrf"] = CSRF
    response = client.post(
        "/admin/login", data={"username": "x", "password": "y", "csrf_token": CSRF}
    )
    assert response.status_code == 404, response.status_code
    assert not hashed


@pytest.mark.parametrize("role", ["Operator", "OPERATOR", " operator "])
def test_a_host_role_in_capitals_is_understood(flask_login_host, role):
    app = flask_login_host({1: _HostUser(1, "ann", role)})
    client = app.test_client()
    client.post("/host-login/1")
    assert client.get("/admin/workflows").status_code == 200


def test_an_unknown_host_role_is_a_clear_403(flask_login_host):
    app = flask_login_host({1: _HostUser(1, "ann", "admin")})
    client = app.test_client()
    client.post("/host-login/1")
    response = client.get("/admin/workflows")
    assert response.status_code == 403
    text = response.get_data(as_text=True)
    assert "admin" in text and "operator" in text and "viewer" in text


def test_a_host_user_named_like_the_cli_cannot_pose_as_it(flask_login_host, geneva_session):
    from tests.app.conftest import DashPayment
    from tests.engine.helpers import make_order

    wf = DashPayment.create(hero=make_order(geneva_session), session=geneva_session)
    geneva_session.commit()
    app = flask_login_host({7: _HostUser(7, "cli:root", "operator")})
    client = app.test_client()
    client.post("/host-login/7")
    with client.session_transaction() as session:
        session["geneva_drive.csrf"] = CSRF
    response = client.post(f"/admin/workflows/{wf.id}/pause", headers={"X-CSRF-Token": CSRF})
    assert response.status_code in (200, 302), response.status_code
    geneva_session.expire_all()
    actors = geneva_session.scalars(select(OperatorAction.actor)).all()
    assert actors and all(not actor.startswith("cli:") for actor in actors), actors
    assert any("7" in actor for actor in actors), actors


def test_the_actor_name_comes_from_the_hosts_hook(flask_login_host, geneva_session):
    from tests.app.conftest import DashPayment
    from tests.engine.helpers import make_order

    wf = DashPayment.create(hero=make_order(geneva_session), session=geneva_session)
    geneva_session.commit()
    app = flask_login_host(
        {7: _HostUser(7, "cli:root", "operator")},
        actor_name=lambda user: f"Ann Example <ann@shop.test>#{user.get_id()}",
    )
    client = app.test_client()
    client.post("/host-login/7")
    with client.session_transaction() as session:
        session["geneva_drive.csrf"] = CSRF
    client.post(f"/admin/workflows/{wf.id}/pause", headers={"X-CSRF-Token": CSRF})
    geneva_session.expire_all()
    actors = geneva_session.scalars(select(OperatorAction.actor)).all()
    assert actors == ["host:7 Ann Example <ann@shop.test>#7"], actors


# --- refusals are audited, within bounds ---------------------------------------------------------


def _audit(geneva_session) -> list[tuple[str, str, str]]:
    geneva_session.expire_all()
    rows = geneva_session.scalars(select(OperatorAction).order_by(OperatorAction.id)).all()
    return [(row.actor, row.action, row.result) for row in rows]


def test_refusals_are_audited(build, geneva_session):
    from tests.app.conftest import login

    app = build()
    viewer = login(app.test_client(), "vic")
    assert viewer.post("/workflows/1/pause", headers={"X-CSRF-Token": CSRF}).status_code == 403
    operator = login(app.test_client(), "olga")
    assert operator.post("/workflows/1/pause", headers={"X-CSRF-Token": "wrong"}).status_code == 403
    missing = operator.post("/workflows/999999/pause", headers={"X-CSRF-Token": CSRF})
    assert missing.status_code == 404
    rows = _audit(geneva_session)
    assert ("vic", "refused_request", "forbidden") in rows, rows
    assert ("olga", "refused_request", "csrf") in rows, rows
    assert any(r[0] == "olga" and r[2] in ("not_found", "refused") for r in rows), rows
    # The audit page shows them, and can filter on them.
    page = operator.get("/audit?action=refused_request")
    assert page.status_code == 200 and "vic" in page.get_data(as_text=True)


def test_refusals_cannot_flood_the_audit_table(build, geneva_session):
    from tests.app.conftest import login

    app = build()
    viewer = login(app.test_client(), "vic")
    for _ in range(500):
        viewer.post("/workflows/1/pause", headers={"X-CSRF-Token": CSRF})
    rows = [r for r in _audit(geneva_session) if r[1] == "refused_request"]
    assert 1 <= len(rows) <= 60, len(rows)


# --- /metrics needs a token unless opened -------------------------------------------------------


def test_metrics_needs_a_token_unless_opened(build):
    closed = build()
    response = closed.test_client().get("/metrics")
    assert response.status_code in (401, 403)
    assert "GENEVA_METRICS_TOKEN" in response.get_data(as_text=True)
    opened = build(METRICS_PUBLIC=True)
    assert opened.test_client().get("/metrics").status_code == 200


def test_metrics_needs_a_token_in_demo_mode(build):
    app = build(DEMO=True)
    response = app.test_client().get(
        "/metrics", headers={"Host": "127.0.0.1:8000"}, environ_base=LOOPBACK
    )
    assert response.status_code in (401, 403)


def test_metrics_needs_a_token_under_a_hosts_prefix(flask_login_host):
    app = flask_login_host({})
    assert app.test_client().get("/admin/metrics").status_code in (401, 403)


@pytest.mark.parametrize("value", ["maybe", "2"])
def test_a_misconfigured_metrics_setting_refuses_to_start(build, value):
    with pytest.raises(ConfigurationError, match="GENEVA_METRICS_PUBLIC"):
        build(METRICS_PUBLIC=value)


def test_metrics_public_and_a_token_together_refuse_to_start(build):
    with pytest.raises(ConfigurationError, match="GENEVA_METRICS_PUBLIC"):
        build(METRICS_PUBLIC=True, METRICS_TOKEN="a-token-long-enough-1234")


# --- Host allow-list, log lines, hero ids, the 431 page -----------------------------------------


@pytest.mark.parametrize(
    "value", ['["dash.example.com", "localhost"]', "dash.example.com, localhost"]
)
def test_trusted_hosts_refuse_another_host(build, monkeypatch, value):
    """GENEVA_TRUSTED_HOSTS, as JSON or as the comma-separated list one writes in a shell."""
    monkeypatch.setenv("GENEVA_TRUSTED_HOSTS", value)
    app = build()
    client = app.test_client()
    for host in ("dash.example.com", "localhost:8000"):
        assert client.get("/healthz", headers={"Host": host}).status_code == 200, host
    assert client.get("/healthz", headers={"Host": "rebind.attacker.test"}).status_code == 400


@pytest.mark.parametrize("value", ["{}", "[1, 2]", " , "])
def test_a_malformed_trusted_hosts_refuses_to_start(build, monkeypatch, value):
    monkeypatch.setenv("GENEVA_TRUSTED_HOSTS", value)
    with pytest.raises(ConfigurationError, match="GENEVA_TRUSTED_HOSTS"):
        build()


def test_a_step_error_with_newlines_is_one_log_line(caplog):
    from geneva_drive import instrumentation

    name = instrumentation.log.name  # geneva_drive.instrumentation
    logging.getLogger(name).disabled = False  # Alembic's fileConfig may have disabled it
    error = RuntimeError("boom\nINFO Login: user admin from 127.0.0.1\r\nok")
    with caplog.at_level(logging.ERROR, logger=name):
        instrumentation._log_reporter(error, {})
    (record,) = [r for r in caplog.records if r.name == name]
    message = record.getMessage()
    assert "\n" not in message and "\r" not in message, message
    assert "boom\\x0aINFO Login" in message, message


def test_a_hero_id_with_a_slash_has_its_page(build, geneva_session):
    from tests.app.conftest import DashPayment, login
    from tests.engine.helpers import make_order

    order = make_order(geneva_session)
    wf = DashPayment.create(hero=order, session=geneva_session)
    wf.hero_id = "eu/2026/0042"
    geneva_session.commit()
    client = login(build().test_client(), "olga")
    page = client.get(f"/heroes/{wf.hero_type}/eu/2026/0042")
    assert page.status_code == 200 and f"/workflows/{wf.id}" in page.get_data(as_text=True)


def test_the_431_page_names_no_server(served_default):
    """The page reaches a client that is still sending its oversized head when the server
    refuses it: the server lingers (reads and drops the rest) instead of resetting the
    connection, which would make the client's kernel drop the page unread. The pause lets the
    server answer and close first, as it did under load in CI (2026-12-01)."""
    with socket.create_connection(("127.0.0.1", served_default.server_port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 70_000)
        time.sleep(0.5)
        sock.sendall(b"a" * 10_000 + b"\r\n\r\n")
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except OSError:
            pass
    assert answer.split(b" ", 2)[1] in (b"431", b"400"), answer[:80]
    assert b"waitress" not in answer.lower(), answer


# --- 3. idle sockets cannot silence /healthz ----------------------------------------------------


@contextlib.contextmanager
def _serving(app: Flask, **deadlines: float) -> Iterator[Any]:
    """``app`` on ``geneva-drive up``'s server (its defaults, or these deadlines), stopped after."""
    from geneva_drive.dashboard import server as dashboard_server

    srv = dashboard_server.make_server(app, "127.0.0.1", 0, **deadlines)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        thread.join(10)
    assert not thread.is_alive()


@pytest.fixture
def served_default(build):
    """The dashboard on ``geneva-drive up``'s server with its default deadlines and limits."""
    with _serving(build()) as srv:
        yield srv


def test_idle_sockets_cannot_starve_healthz(served_default):
    """210 connections that send nothing, more than the server's connection limit: a probe
    still gets its answer (the oldest silent connections make room for it)."""
    sockets = []
    try:
        for _ in range(210):
            sockets.append(socket.create_connection(("127.0.0.1", served_default.server_port)))
        url = f"http://127.0.0.1:{served_default.server_port}/healthz"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
        # Reopening them does not take the server down either.
        for sock in sockets:
            sock.close()
        sockets = [
            socket.create_connection(("127.0.0.1", served_default.server_port)) for _ in range(210)
        ]
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
    finally:
        for sock in sockets:
            sock.close()


def test_a_silent_connection_is_closed_at_the_header_deadline(build):
    """The header deadline runs from the accept: a socket that never sends a byte is closed
    after ``header_timeout`` (1 s here), not after the idle timeout (60 s here)."""
    deadlines = {"header_timeout": 1.0, "request_timeout": 2.0, "idle_timeout": 60.0}
    with _serving(build(), **deadlines) as srv:
        sock = socket.create_connection(("127.0.0.1", srv.server_port), timeout=20)
        with sock:
            assert sock.recv(1) == b""  # closed by the server (a timeout raises instead)


def test_one_address_holds_at_most_its_share_of_connections(build):
    """Past ``PER_ADDRESS_LIMIT`` (64) silent connections from one address, each new one closes
    that address's oldest, while the server is far from full; another address keeps all of
    its own. (The deadlines are long, so only the cap can close a socket here.)"""
    from geneva_drive.dashboard import server as dashboard_server

    limit = dashboard_server.PER_ADDRESS_LIMIT
    assert 60 + limit + 6 < dashboard_server.ROOM_FROM  # the server-wide room never applies
    deadlines = {"header_timeout": 120.0, "request_timeout": 240.0, "idle_timeout": 240.0}
    with _serving(build(), **deadlines) as srv:
        address = ("127.0.0.1", srv.server_port)
        other = [
            socket.create_connection(address, source_address=("127.0.0.2", 0)) for _ in range(60)
        ]
        mine = [socket.create_connection(address) for _ in range(limit + 6)]
        try:
            # Closed by the server = readable at end of file; wait until the six have gone.
            closed: set[socket.socket] = set()
            for _ in range(200):
                readable, _, _ = io_select.select(other + mine, [], [], 0.05)
                closed |= {s for s in readable if s.recv(1) == b""}
                if len(closed) >= 6:
                    break
            time.sleep(0.5)  # and no more follow
            readable, _, _ = io_select.select(other + mine, [], [], 0)
            closed |= {s for s in readable if s.recv(1) == b""}
            assert closed == set(mine[:6])
            with urllib.request.urlopen(f"http://127.0.0.1:{srv.server_port}/healthz") as page:
                assert page.status == 200
        finally:
            for sock in other + mine:
                sock.close()


# --- 6. an error page never depends on the thing that failed -------------------------------------


def test_pages_without_templates_still_answer_with_an_error_page(build, tmp_path, caplog):
    """The plain editable install found no templates: every page raised TemplateNotFound and
    the error page needed a template too, so the server closed the connection with no reply."""
    from jinja2 import FileSystemLoader

    from geneva_drive.dashboard import rendering
    from tests.app.conftest import login

    app = build()
    app.config["PROPAGATE_EXCEPTIONS"] = False  # as in production: no test-mode re-raise
    rendering.environment(app).loader = FileSystemLoader(str(tmp_path))  # an empty folder
    client = login(app.test_client(), "olga")
    with caplog.at_level(logging.ERROR):
        page = client.get("/workflows")
        missing = client.get("/no-such-page")
    assert page.status_code == 500 and b"Internal Server Error" in page.data
    assert missing.status_code == 404 and b"Not Found" in missing.data
    assert page.headers["Content-Security-Policy"]


# --- 5. indexes for the viewer-reachable filters ------------------------------------------------


@pytest.mark.parametrize(
    ("url", "table"),
    [
        ("/workflows?hero_id=1", "geneva_drive_workflows"),
        ("/workflows/bulk?action=pause&scope=all&hero_id=1", "geneva_drive_workflows"),
        ("/audit?actor=olga", "geneva_drive_operator_actions"),
        ("/audit?action=pause", "geneva_drive_operator_actions"),
        ("/audit?actor=olga&action=pause", "geneva_drive_operator_actions"),
    ],
)
def test_viewer_reachable_filters_are_served_by_an_index(build, geneva_session, url, table):
    """At 1M rows these filters took 212-319 ms each, a full scan per request a viewer can
    repeat at will. Plans as in test_security_hardening: SQLite's strict, and
    PostgreSQL's with sequential scans disabled."""
    from tests.app.conftest import DashPayment
    from tests.engine.helpers import make_order
    from tests.reliability.test_security_hardening import _plans

    DashPayment.create(hero=make_order(geneva_session), session=geneva_session)
    geneva_session.commit()
    plans = _plans(build(), url)
    assert plans
    scans = [
        line.strip()
        for _statement, plan in plans
        for line in plan.splitlines()
        if f"SCAN {table}" in line or f"Seq Scan on {table}" in line
    ]
    assert not scans, (scans, [statement[:300] for statement, _ in plans])
