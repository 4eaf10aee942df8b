"""The findings of the first security review, each reproduced the way it was found.

Every test here failed on the code before the fix: a missing secret key, the demo's loopback
bypass under DNS rebinding, username timing, login throttling, half-run bulk actions, logout,
CR/LF in ``next``, log forging, filters that scan the workflows table, and the lesser ones
(Cache-Control, the Server header, slow-header sockets, Origin, a 400,000-digit payload).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import statistics
import threading
import time
import urllib.request
from typing import Any

import pytest
from itsdangerous import URLSafeTimedSerializer
from sqlalchemy import select, text
from werkzeug.security import generate_password_hash

from geneva_drive.dashboard import config as dashboard_config
from geneva_drive.errors import ConfigurationError
from geneva_drive.models import OperatorAction
from geneva_drive.testing import speedrun_workflow
from geneva_drive.workflow import Workflow
from tests.app.conftest import CSRF, DashPayment, app_config, login
from tests.app.plans import full_scans, page_plans
from tests.engine.helpers import make_order


@pytest.fixture
def paused_id(geneva_session) -> int:
    """A DashPayment paused after its charge step failed."""
    order = make_order(geneva_session)
    wf = DashPayment.create(hero=order, session=geneva_session)
    geneva_session.commit()
    DashPayment.fail_charge = True
    with contextlib.suppress(RuntimeError):
        speedrun_workflow(wf)
    assert wf.state == "paused"
    return wf.id


@pytest.fixture
def logs(caplog):
    """caplog, with the geneva_drive loggers enabled again (Alembic's fileConfig, run by a
    migration test earlier in the session, disables the loggers that existed before it)."""
    for name, logger in logging.root.manager.loggerDict.items():
        if name.startswith("geneva_drive") and isinstance(logger, logging.Logger):
            logger.disabled = False
    return caplog


def _make_workflows(geneva_session, n: int) -> list[int]:
    ids = []
    for _ in range(n):
        order = make_order(geneva_session)
        ids.append(DashPayment.create(hero=order, session=geneva_session).id)
    geneva_session.commit()
    return ids


def _state(geneva_session, workflow_id: int) -> str | None:
    geneva_session.expire_all()
    wf = geneva_session.get(Workflow, workflow_id)
    return wf.state if wf is not None else None


# --- 1. an unset secret key fails open ----------------------------------------------------------


def _bare_config(geneva_database, **extra: Any) -> dict[str, Any]:
    """The test database, but no TESTING flag and no key: what a deployment starts with."""
    config = app_config(geneva_database, **extra)
    config.pop("TESTING")
    config.pop("SECRET_KEY")
    return config


@pytest.mark.parametrize("key", [None, "", dashboard_config.DEV_SECRET_KEY, "short"])
def test_the_dashboard_refuses_to_start_without_a_real_secret_key(geneva_database, key):
    from geneva_drive.dashboard import create_app

    config = _bare_config(geneva_database)
    if key is not None:
        config["SECRET_KEY"] = key
    with pytest.raises(ConfigurationError) as refused:
        create_app(config)
    message = str(refused.value)
    assert "GENEVA_SECRET_KEY" in message and "secrets.token_urlsafe" in message, message


def test_the_public_dev_key_forges_nothing_in_demo_mode(build, geneva_database, paused_id):
    """The reported exploit: a session signed with the public key, its own CSRF token, a
    resume. Demo mode signs with a random key per run, so the forged cookie is nobody."""
    from geneva_drive.dashboard import create_app

    first = create_app({**_bare_config(geneva_database), "DEMO": True})
    second = create_app({**_bare_config(geneva_database), "DEMO": True})
    keys = {first.config["SECRET_KEY"], second.config["SECRET_KEY"]}
    assert len(keys) == 2 and dashboard_config.DEV_SECRET_KEY not in keys
    forged = URLSafeTimedSerializer(
        dashboard_config.DEV_SECRET_KEY,
        salt="cookie-session",
        signer_kwargs={"key_derivation": "hmac", "digest_method": "sha1"},
        serializer=first.session_interface.serializer,
    ).dumps(
        {
            "geneva_drive.user": "olga",
            "geneva_drive.csrf": "t",
            "geneva_drive.iat": int(time.time()),
            "geneva_drive.gen": 0,
        }
    )
    client = first.test_client()
    client.set_cookie("session", forged)
    response = client.post(
        f"/workflows/{paused_id}/resume",
        data={"csrf_token": "t"},
        environ_base={"REMOTE_ADDR": "198.51.100.9"},  # not loopback: no demo bypass either
    )
    assert response.status_code in (302, 403) and "/login" in response.headers.get(
        "Location", "/login"
    )
    assert _state_after(first, paused_id) == "paused"
    for made in (first, second):  # their pools, closed here rather than by the collector
        with made.app_context():
            made.extensions["sqlalchemy"].engine.dispose()


def _state_after(flask_app, workflow_id: int) -> str | None:
    with flask_app.app_context():
        from geneva_drive.dashboard.extensions import db

        wf = db.session.get(Workflow, workflow_id)
        state = wf.state if wf is not None else None
        db.session.remove()
        return state


# --- 2. the demo's loopback bypass and DNS rebinding --------------------------------------------

LOOPBACK = {"REMOTE_ADDR": "127.0.0.1"}


def test_demo_bypass_refuses_a_foreign_host_from_loopback(build, paused_id, geneva_session):
    """DNS rebinding: the operator's browser, on this machine, runs a page of
    rebind.attacker.test resolved to 127.0.0.1. The TCP peer is loopback, the Host is not."""
    app = build(DEMO=True)
    client = app.test_client()
    with client.session_transaction() as session:
        session["geneva_drive.csrf"] = CSRF
    for host in ("localhost:8822", "127.0.0.1:8822", "[::1]:8822", "localhost"):
        ok = client.get("/workflows", headers={"Host": host}, environ_base=LOOPBACK)
        assert ok.status_code == 200, host
    rebound = {"Host": "rebind.attacker.test:8822"}
    page = client.get("/workflows", headers=rebound, environ_base=LOOPBACK)
    assert page.status_code == 302 and "/login" in page.headers["Location"]
    action = client.post(
        f"/workflows/{paused_id}/cancel",
        headers={**rebound, "X-CSRF-Token": CSRF},
        environ_base=LOOPBACK,
    )
    # Refused either way: as a stranger (login) or for want of the rebound origin's token.
    assert action.status_code in (302, 403), action.status_code
    assert _state(geneva_session, paused_id) == "paused"


@pytest.mark.parametrize(
    "header",
    [
        {"X-Forwarded-For": "203.0.113.7"},
        {"Forwarded": "for=203.0.113.7"},
        {"Via": "1.1 proxy"},
        {"X-Forwarded-Host": "dash.example.com"},
        {"X-Real-IP": "203.0.113.7"},
    ],
)
def test_demo_bypass_refuses_requests_through_a_proxy(build, header):
    """A reverse proxy on the same machine is a loopback peer for every outside client."""
    app = build(DEMO=True)
    response = app.test_client().get(
        "/workflows", headers={"Host": "127.0.0.1:8000", **header}, environ_base=LOOPBACK
    )
    assert response.status_code == 302 and "/login" in response.headers["Location"]


# --- 3. usernames enumerable by timing ----------------------------------------------------------


def test_unknown_and_known_users_cost_the_same(build):
    """The ratio of the medians of the two paths, measured here: an unknown name must cost what
    a known name with a wrong password costs (within a factor, not an absolute time).

    Measured in this thread's CPU time (the test client runs the request in it, hashing
    included): the work each path does is what tells names apart, and CPU time does not grow
    when other processes take the cores, as wall time does on a loaded machine."""
    costly = "pbkdf2:sha256:60000"  # ~30 ms: well above the request's own cost
    users = {
        "kim": {"password_hash": generate_password_hash("kim-pw", method=costly), "role": "viewer"}
    }
    app = build(USERS=users, LOGIN_MAX_FAILURES=10_000, LOGIN_MAX_FAILURES_PER_USER=10_000,
                LOGIN_MAX_FAILURES_PER_ADDRESS=10_000)  # fmt: skip
    client = app.test_client()
    with client.session_transaction() as session:
        session["geneva_drive.csrf"] = CSRF

    def attempt(name: str) -> float:
        started = time.thread_time()
        response = client.post(
            "/login", data={"username": name, "password": "wrong", "csrf_token": CSRF}
        )
        elapsed = time.thread_time() - started
        assert response.status_code == 401
        return elapsed

    attempt("kim"), attempt("nobody")  # warm both paths (the dummy hash is made once)
    known, unknown = [], []
    for i in range(9):  # interleaved, so load on the machine hits both alike
        known.append(attempt("kim"))
        unknown.append(attempt(f"nobody-{i}"))
    ratio = statistics.median(unknown) / statistics.median(known)
    assert 0.5 < ratio < 2.0, (ratio, known, unknown)


# --- 4. login throttling ------------------------------------------------------------------------


def _login(client, name: str, password: str, addr: str = "203.0.113.5"):
    with client.session_transaction() as session:
        session["geneva_drive.csrf"] = CSRF
    return client.post(
        "/login",
        data={"username": name, "password": password, "csrf_token": CSRF},
        environ_base={"REMOTE_ADDR": addr},
    )


def test_wrong_passwords_from_other_addresses_do_not_lock_the_user_out(build):
    app = build()
    client = app.test_client()
    for i in range(5):  # the attack: five wrong passwords from rotating addresses
        assert _login(client, "olga", "guess", addr=f"198.51.100.{i + 1}").status_code == 401
    assert _login(client, "olga", "olga-pw", addr="192.0.2.10").status_code == 302


def test_rotating_addresses_still_meet_the_per_user_cap(build):
    app = build(LOGIN_MAX_FAILURES_PER_USER=8)
    client = app.test_client()
    for i in range(8):
        assert _login(client, "olga", "guess", addr=f"198.51.100.{i + 1}").status_code == 401
    blocked = _login(client, "olga", "guess", addr="198.51.100.200")
    assert blocked.status_code == 429
    # A fresh name from a fresh address is not affected by olga's counter.
    assert _login(client, "vic", "vic-pw", addr="192.0.2.11").status_code == 302


def test_throttling_backs_off_instead_of_locking(build, monkeypatch):
    app = build(LOGIN_MAX_FAILURES=3, LOGIN_WINDOW_SECONDS=300, LOGIN_BACKOFF_SECONDS=2)
    limiter = app.extensions["geneva_drive"].login_limiter
    now = [1000.0]
    monkeypatch.setattr(limiter, "_clock", lambda: now[0])
    client = app.test_client()
    for _ in range(3):
        assert _login(client, "olga", "guess").status_code == 401
    first = _login(client, "olga", "olga-pw")
    assert first.status_code == 429 and int(first.headers["Retry-After"]) <= 2
    now[0] += 2.5
    assert _login(client, "olga", "guess").status_code == 401  # allowed again, and failed
    second = _login(client, "olga", "olga-pw")
    assert second.status_code == 429 and 2 < int(second.headers["Retry-After"]) <= 4
    now[0] += 4.5
    assert _login(client, "olga", "olga-pw").status_code == 302  # waited: in, not locked out


def test_a_spray_of_names_cannot_evict_a_block(build, monkeypatch):
    app = build(LOGIN_MAX_FAILURES=3, LOGIN_MAX_FAILURES_PER_USER=5)
    limiter = app.extensions["geneva_drive"].login_limiter
    monkeypatch.setattr(limiter, "_clock", lambda: 1000.0)  # the spray takes no time at all
    client = app.test_client()
    for _ in range(3):
        assert _login(client, "olga", "guess").status_code == 401
    assert _login(client, "olga", "guess").status_code == 429
    for i in range(100_001):  # fresh names, each one failure: the table overflows
        limiter.fail([f"user:spray-{i}"])
    assert _login(client, "olga", "guess").status_code == 429
    # The per-user count (3 of 5) survived too: two more failures from elsewhere block olga.
    for addr in ("198.51.100.1", "198.51.100.2"):
        assert _login(client, "olga", "guess", addr=addr).status_code == 401
    assert _login(client, "olga", "guess", addr="198.51.100.3").status_code == 429


def test_failed_logins_and_blocks_are_logged_without_the_password(build, logs):
    caplog = logs
    app = build(LOGIN_MAX_FAILURES=2)
    caplog.set_level(logging.INFO, logger="geneva_drive.dashboard.auth")
    client = app.test_client()
    password = "hunter2-is-my-password"
    for _ in range(3):
        _login(client, "olga", password)
    lines = [r.getMessage() for r in caplog.records if r.name == "geneva_drive.dashboard.auth"]
    failed = [line for line in lines if "Failed login" in line]
    throttled = [line for line in lines if "throttled" in line]
    assert len(failed) == 2 and len(throttled) == 1, lines
    assert all("olga" in line and "203.0.113.5" in line for line in failed + throttled)
    assert not any(password in line for line in lines)


# --- 5. a synchronous bulk action half-runs -----------------------------------------------------


def test_bulk_with_a_missing_id_runs_the_others_and_finishes_its_batch(
    build, geneva_session, paused_id
):
    client = login(build().test_client(), "olga")
    other = _make_workflows(geneva_session, 1)[0]
    response = client.post(
        "/workflows/bulk",
        data={"action": "cancel", "scope": "selected", "ids": [str(paused_id), str(other), "0"]},
        headers={"X-CSRF-Token": CSRF},
    )
    assert response.status_code == 302, response.get_data(as_text=True)[:500]
    assert _state(geneva_session, paused_id) == "canceled"
    assert _state(geneva_session, other) == "canceled"
    batch = geneva_session.scalars(
        select(OperatorAction).where(OperatorAction.action == "bulk_cancel")
    ).one()
    assert batch.result == "ok", (batch.result, batch.message)
    assert batch.params["done_ids"] == sorted([paused_id, other], reverse=True)
    assert batch.params["gone_ids"] == [0] and batch.params["refused_ids"] == []
    assert "no longer exist" in batch.message


def test_bulk_after_housekeeping_deleted_one_workflow(build, geneva_session):
    """Preview, then housekeeping deletes one of the workflows, then the confirm."""
    client = login(build().test_client(), "olga")
    first, second = _make_workflows(geneva_session, 2)
    preview = client.get(
        "/workflows/bulk", query_string={"action": "pause", "scope": "selected",
                                         "ids": [str(first), str(second)]}
    )  # fmt: skip
    assert preview.status_code == 200
    geneva_session.execute(text("DELETE FROM geneva_drive_workflows WHERE id = :id"), {"id": first})
    geneva_session.commit()
    response = client.post(
        "/workflows/bulk",
        data={"action": "pause", "scope": "selected", "ids": [str(first), str(second)]},
        headers={"X-CSRF-Token": CSRF, "HX-Request": "true"},
    )
    assert response.status_code == 200, response.get_data(as_text=True)[:500]
    assert "1 done" in response.get_data(as_text=True)
    assert _state(geneva_session, second) == "paused"
    batch = geneva_session.scalars(
        select(OperatorAction).where(OperatorAction.action == "bulk_pause")
    ).one()
    assert batch.result != "running"
    assert batch.params["gone_ids"] == [first] and batch.params["done_ids"] == [second]


# --- 6. logout does not invalidate the session --------------------------------------------------


def test_a_cookie_copied_before_logout_no_longer_acts(build, paused_id, geneva_session):
    app = build()
    client = app.test_client()
    assert _login(client, "olga", "olga-pw").status_code == 302
    copied = client.get_cookie("session").value
    with client.session_transaction() as session:
        token = session["geneva_drive.csrf"]
    assert client.post("/logout", headers={"X-CSRF-Token": token}).status_code == 302
    reader = app.test_client()
    reader.set_cookie("session", copied)
    assert reader.get("/workflows").status_code == 302
    actor = app.test_client()
    actor.set_cookie("session", copied)
    response = actor.post(f"/workflows/{paused_id}/cancel", headers={"X-CSRF-Token": token})
    assert response.status_code == 302 and "/login" in response.headers["Location"]
    assert _state(geneva_session, paused_id) == "paused"
    # Logging in again works, with a session of the new generation.
    assert _login(client, "olga", "olga-pw").status_code == 302
    assert client.get("/workflows").status_code == 200


def test_a_session_ends_after_its_lifetime(build):
    app = build(SESSION_LIFETIME_SECONDS=3600)
    client = app.test_client()
    assert _login(client, "olga", "olga-pw").status_code == 302
    assert client.get("/workflows").status_code == 200
    with client.session_transaction() as session:
        session["geneva_drive.iat"] = int(time.time()) - 3601  # logged in over an hour ago
    assert client.get("/workflows").status_code == 302
    # A session without a login time (made by anything but the login) does not act either.
    with client.session_transaction() as session:
        session["geneva_drive.user"] = "olga"
        session.pop("geneva_drive.iat", None)
    assert client.get("/workflows").status_code == 302


# --- 7. CR/LF in next ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target", ["/workflows\r\nSet-Cookie: x=1", "/a\nb", "/\\evil.example", "/x\x7fy"]
)
def test_control_characters_in_next_fall_back_to_the_overview(build, target):
    client = build().test_client()
    client.get("/login")
    with client.session_transaction() as session:
        token = session["geneva_drive.csrf"]
    response = client.post(
        "/login",
        query_string={"next": target},
        data={"username": "olga", "password": "olga-pw", "csrf_token": token},
    )
    assert response.status_code == 302
    assert response.headers["Location"] == "/"


# --- 8. log forging -----------------------------------------------------------------------------


def test_a_signal_name_cannot_forge_a_log_line(build, paused_id, logs):
    caplog = logs
    client = login(build().test_client(), "olga")
    caplog.set_level(logging.DEBUG)
    forged = "x\nINFO geneva_drive.dashboard.operator_actions: Operator alice: cancel on workflow 1"
    client.post(
        f"/workflows/{paused_id}/signals",
        data={"name": forged, "payload": "{}"},
        headers={"X-CSRF-Token": CSRF},
    )
    records = [r for r in caplog.records if r.name.startswith("geneva_drive")]
    assert any("Operator olga" in r.getMessage() for r in records), [
        r.getMessage() for r in records
    ]
    for record in records:
        message = record.getMessage()
        assert "\n" not in message and "\r" not in message, message


def test_engine_log_lines_escape_outside_text(logs):
    caplog = logs
    from geneva_drive.instrumentation import ContextAdapter

    adapter = ContextAdapter(logging.getLogger("geneva_drive.test"), {"hero_id": "a\nb"})
    caplog.set_level(logging.INFO, logger="geneva_drive.test")
    adapter.info("error: %s", RuntimeError("boom\nWARNING forged line"))
    (record,) = caplog.records
    assert "\n" not in record.getMessage()
    assert "hero_id=a\\x0ab" in record.getMessage()


# --- 9. filters that scan the workflows table ---------------------------------------------------

SCANNED = ("geneva_drive_workflows", "geneva_drive_step_executions")


_plans = page_plans


def _full_scans(plan: str) -> list[str]:
    return full_scans(plan, SCANNED)


@pytest.mark.parametrize(
    "query",
    [
        "step=charge",
        "error=builtins.RuntimeError",
        "due=overdue",
        "due=waiting",
        "due=stuck",
        "due=timed_out",
        # The filters that were index-served already, kept so by this test:
        "state=paused",
        "class=DashPayment",
        "class=DashPayment&state=paused",
        "hero_type=Order&hero_id=1",
        "q=Order:1",
        "q=1",
        "class=DashPayment&stranded=legacy_capture",
    ],
)
def test_every_filter_is_served_by_an_index(build, geneva_session, paused_id, query):
    app = build()
    plans = _plans(app, f"/workflows?{query}")
    assert plans
    scans = [(statement.split("FROM", 1)[-1][:200], _full_scans(plan)) for statement, plan in plans]
    assert not [s for s in scans if s[1]], scans


# --- 10. the lesser findings --------------------------------------------------------------------


def test_authenticated_responses_are_not_stored(build, paused_id):
    client = login(build().test_client(), "olga")
    for url in ("/", "/workflows", f"/workflows/{paused_id}", "/audit"):
        response = client.get(url)
        assert response.headers.get("Cache-Control") == "no-store", url
    partial = client.get("/workflows", headers={"HX-Request": "true"})
    assert partial.headers.get("Cache-Control") == "no-store"


def test_origin_is_checked_when_sec_fetch_site_is_absent(build, paused_id, geneva_session):
    client = login(build().test_client(), "olga")
    for origin in ("http://evil.example", "null", "http://localhost.evil.example"):
        response = client.post(
            f"/workflows/{paused_id}/cancel",
            headers={"X-CSRF-Token": CSRF, "Origin": origin},
        )
        assert response.status_code == 403, origin
    assert _state(geneva_session, paused_id) == "paused"
    same = client.post(
        f"/workflows/{paused_id}/cancel",
        headers={"X-CSRF-Token": CSRF, "Origin": "http://localhost"},
    )
    assert same.status_code == 302
    assert _state(geneva_session, paused_id) == "canceled"


def test_a_400000_digit_number_in_a_payload_is_a_clear_400(build, geneva_session):
    client = login(build().test_client(), "olga")
    order = make_order(geneva_session)
    wf = DashPayment.create(hero=order, session=geneva_session)
    geneva_session.commit()
    response = client.post(
        f"/workflows/{wf.id}/signals",
        data={"name": "payment_confirmed", "payload": '{"n": ' + "9" * 400_000 + "}"},
        headers={"X-CSRF-Token": CSRF, "HX-Request": "true"},
    )
    assert response.status_code == 400
    body = response.get_data(as_text=True)
    assert "digits" in body and "as a JSON string" in body, body[:300]
    assert "set_int_max_str_digits" not in body
    # A 400,000-digit id in a bulk selection is "no such id", not an error either.
    bulk = client.post(
        "/workflows/bulk",
        data={"action": "pause", "scope": "selected", "ids": ["9" * 400_000]},
        headers={"X-CSRF-Token": CSRF},
    )
    assert bulk.status_code == 400 and "Select workflows first" in bulk.get_data(as_text=True)


# --- geneva-drive up's server -------------------------------------------------------------------


@pytest.fixture
def served(build):
    """The dashboard on the server ``geneva-drive up`` uses, on a free loopback port, with
    short deadlines so that the test sees them act."""
    from geneva_drive.dashboard import server as dashboard_server

    srv = dashboard_server.make_server(
        build(), "127.0.0.1", 0, header_timeout=1.0, request_timeout=2.0, idle_timeout=5.0
    )
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    thread.join(10)
    assert not thread.is_alive()


def test_the_server_names_no_version(served):
    with urllib.request.urlopen(f"http://127.0.0.1:{served.server_port}/healthz", timeout=10) as r:
        assert r.status == 200
        server = r.headers.get("Server", "")
    assert server == "GenevaDrive", server
    assert "Werkzeug" not in server and "Python" not in server


def test_slow_header_connections_are_closed(served):
    """Slowloris: connections that drip their headers are closed after the header deadline,
    even though each one keeps sending (so an idle timeout alone would not close them)."""
    sockets = []
    for _ in range(20):
        sock = socket.create_connection(("127.0.0.1", served.server_port), timeout=10)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        sockets.append(sock)
    # The server closes them 1-2 s in (header_timeout, request_timeout); the loop stops as
    # soon as it has, and the bound is only how long a loaded machine may take to get there.
    deadline = time.monotonic() + 60
    open_ = list(sockets)
    while open_ and time.monotonic() < deadline:
        for sock in list(open_):
            try:
                sock.sendall(b"X-Drip: 1\r\n")
                sock.settimeout(0.05)
                if sock.recv(1) == b"":
                    open_.remove(sock)
            except TimeoutError:
                pass
            except OSError:
                open_.remove(sock)
        time.sleep(0.3)
    for sock in sockets:
        sock.close()
    assert not open_, f"{len(open_)} slow-header connections still open after 60 s"
    # The server still answers a normal request.
    with urllib.request.urlopen(f"http://127.0.0.1:{served.server_port}/healthz", timeout=10) as r:
        assert r.status == 200


# --- geneva-drive up refuses an unsafe start ----------------------------------------------------


def _run_up(tmp_path, *args: str, **env_extra: str):
    import os
    import subprocess

    from tests.integration.conftest import BIN

    env = {k: v for k, v in os.environ.items() if not k.startswith("GENEVA_")}
    env.update(GENEVA_DATABASE_URL=f"sqlite:///{tmp_path / 'up.sqlite3'}", **env_extra)
    return subprocess.run(
        [str(BIN / "geneva-drive"), "up", "--port", "0", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.integration
def test_up_refuses_to_start_without_a_secret_key(tmp_path):
    done = _run_up(tmp_path)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "GENEVA_SECRET_KEY" in done.stderr and "token_urlsafe" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.integration
def test_up_demo_refuses_a_non_loopback_host(tmp_path):
    # 192.0.2.1 (TEST-NET-1) is on no interface here: before the check existed this failed to
    # bind with a traceback; nothing ever listens beyond loopback.
    done = _run_up(tmp_path, "--demo", "--host", "192.0.2.1")
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "--demo serves only loopback" in done.stderr
