"""Security of the dashboard: CSRF on every state-changing route, roles, login throttling,
session cookies, security headers, the /metrics token and secrets kept out of logs."""

from __future__ import annotations

import contextlib
import logging
import re

import pytest
from werkzeug.security import generate_password_hash

from geneva_drive.testing import speedrun_workflow
from tests.app.conftest import CSRF, USERS, DashPayment, login
from tests.engine.helpers import make_order
from tests.reliability.conftest import SECRET_KEY
from tests.reliability.test_hostile_dashboard import engine_rows

METRICS_TOKEN = "metrics-token-8f1d3c"


@pytest.fixture
def app(build):
    return build()


@pytest.fixture
def wf_ids(geneva_session) -> dict[str, int]:
    made = {}
    for kind in ("paused", "parked"):
        order = make_order(geneva_session)
        wf = DashPayment.create(hero=order, session=geneva_session)
        geneva_session.commit()
        DashPayment.fail_charge = kind == "paused"
        with contextlib.suppress(RuntimeError):
            speedrun_workflow(wf)
        made[kind] = wf.id
    DashPayment.fail_charge = True
    return made


#: The HTTP API's Blueprint: it never reads the session cookie (bearer tokens only), so the
#: cookie-and-CSRF walks below are the dashboard's; the API gets a walk of its own.
API = "geneva_drive_api."


def post_rules(app) -> list:
    """The dashboard's state-changing routes (the cookie-authenticated ones)."""
    rules = [
        r
        for r in app.url_map.iter_rules()
        if "POST" in r.methods and not r.endpoint.startswith(API)
    ]
    assert len(rules) >= 9, [r.rule for r in rules]  # the enumeration itself must not be empty
    return rules


def api_post_rules(app) -> list:
    rules = [
        r
        for r in app.url_map.iter_rules()
        if "POST" in r.methods and r.endpoint.startswith(API) and r.endpoint != API + "unmatched"
    ]
    assert len(rules) >= 11, [r.rule for r in rules]
    return rules


def url_for_rule(rule, workflow_id: int) -> str:
    return (
        rule.rule.replace("<int:workflow_id>", str(workflow_id))
        .replace("<workflow_id>", str(workflow_id))
        .replace("<any_text:name>", "nightly")
    )


FORM = {"name": "payment_confirmed", "step": "ship", "action": "cancel", "scope": "all"}


# --- CSRF -------------------------------------------------------------------------------------


def test_every_post_route_requires_a_csrf_token(app, geneva_session, wf_ids):
    client = login(app.test_client(), "olga")
    before = engine_rows(geneva_session)
    for rule in post_rules(app):
        url = url_for_rule(rule, wf_ids["paused"])
        missing = client.post(url, data=FORM)
        assert missing.status_code == 400, (rule.rule, missing.status_code)
        wrong = client.post(url, data=FORM, headers={"X-CSRF-Token": "forged"})
        assert wrong.status_code == 403, (rule.rule, wrong.status_code)
        wrong_field = client.post(url, data={**FORM, "csrf_token": "forged"})
        assert wrong_field.status_code == 403, (rule.rule, wrong_field.status_code)
        cross_site = client.post(
            url, data=FORM, headers={"X-CSRF-Token": CSRF, "Sec-Fetch-Site": "cross-site"}
        )
        assert cross_site.status_code == 403, (rule.rule, cross_site.status_code)
    assert engine_rows(geneva_session) == before
    # The same client with the right token does act: the refusals above were about the token.
    ok = client.post(f"/workflows/{wf_ids['paused']}/cancel", headers={"X-CSRF-Token": CSRF})
    assert ok.status_code in (200, 302)
    assert engine_rows(geneva_session) != before


def test_csrf_token_of_another_session_is_refused(app, wf_ids):
    mallory = login(app.test_client(), "olga")
    with mallory.session_transaction() as session:
        session["geneva_drive.csrf"] = "mallorys-own-token"
    victim = login(app.test_client(), "olga")
    response = victim.post(
        f"/workflows/{wf_ids['paused']}/cancel", headers={"X-CSRF-Token": "mallorys-own-token"}
    )
    assert response.status_code == 403


def test_get_routes_change_nothing(app, geneva_session, wf_ids):
    """State never changes on GET (so no GET needs a token): every GET route, with the action
    parameters a forged link would carry, leaves the engine rows alone."""
    client = login(app.test_client(), "olga")
    before = engine_rows(geneva_session)
    for rule in app.url_map.iter_rules():
        if "GET" not in rule.methods or rule.arguments - {"workflow_id"}:
            continue
        url = url_for_rule(rule, wf_ids["paused"])
        assert client.get(url, query_string=FORM).status_code < 500, url
    assert engine_rows(geneva_session) == before


# --- roles ------------------------------------------------------------------------------------


def test_viewers_cannot_act_on_any_route(app, geneva_session, wf_ids):
    viewer = login(app.test_client(), "vic")
    before = engine_rows(geneva_session)
    for rule in post_rules(app):
        if rule.endpoint.removeprefix("geneva_drive.") in ("auth.login", "auth.logout"):
            continue
        for workflow_id in wf_ids.values():
            response = viewer.post(
                url_for_rule(rule, workflow_id), data=FORM, headers={"X-CSRF-Token": CSRF}
            )
            assert response.status_code == 403, (rule.rule, response.status_code)
    assert engine_rows(geneva_session) == before
    page = viewer.get(f"/workflows/{wf_ids['paused']}").get_data(as_text=True)
    assert f"/workflows/{wf_ids['paused']}/cancel" not in page


def test_anonymous_cannot_act_or_read(app, geneva_session, wf_ids):
    client = app.test_client()
    with client.session_transaction() as session:
        session["geneva_drive.csrf"] = CSRF
    before = engine_rows(geneva_session)
    for rule in post_rules(app):
        if rule.endpoint.removeprefix("geneva_drive.") in ("auth.login", "auth.logout"):
            continue
        response = client.post(
            url_for_rule(rule, wf_ids["paused"]), data=FORM, headers={"X-CSRF-Token": CSRF}
        )
        assert response.status_code in (302, 401), (rule.rule, response.status_code)
    assert client.get(f"/workflows/{wf_ids['paused']}").status_code == 302
    assert engine_rows(geneva_session) == before


def test_no_api_route_acts_for_a_cookie_or_without_a_token(build, geneva_session, wf_ids):
    """Every state-changing route of the HTTP API: anonymous, or with an operator's dashboard
    session and its CSRF token, is a 401 and changes nothing; a token without the route's
    scope is a 403."""
    import hashlib

    reader = "reader-token-for-the-security-walk"
    app = build(API_TOKENS=f"reader:{hashlib.sha256(reader.encode()).hexdigest()}:read")
    anonymous = app.test_client()
    operator = login(app.test_client(), "olga")
    before = engine_rows(geneva_session)
    for rule in api_post_rules(app):
        url = url_for_rule(rule, wf_ids["paused"])
        body = {"name": "payment_confirmed", "step": "ship"}
        assert anonymous.post(url, json=body).status_code == 401, rule.rule
        cookie = operator.post(url, json=body, headers={"X-CSRF-Token": CSRF})
        assert cookie.status_code == 401, (rule.rule, cookie.status_code)
        scoped = anonymous.post(url, json=body, headers={"Authorization": f"Bearer {reader}"})
        assert scoped.status_code == 403, (rule.rule, scoped.status_code)
    assert engine_rows(geneva_session) == before


def test_forged_session_cookie_is_ignored(build, wf_ids):
    """A session signed with another key (say, the public dev key) logs nobody in."""
    attacker_app = build(SECRET_KEY="dev-only-change-me")
    attacker = login(attacker_app.test_client(), "olga")
    cookie = attacker.get_cookie("session")
    assert cookie is not None
    target = build().test_client()
    target.set_cookie("session", cookie.value)
    assert target.get("/workflows").status_code == 302


# --- login throttling -------------------------------------------------------------------------


def _login(client, name: str, password: str, addr: str = "203.0.113.5"):
    with client.session_transaction() as session:
        session["geneva_drive.csrf"] = CSRF
    return client.post(
        "/login",
        data={"username": name, "password": password, "csrf_token": CSRF},
        environ_base={"REMOTE_ADDR": addr},
    )


def test_login_is_rate_limited_per_user_and_address(build):
    """Per (user, address) first; then looser caps per user (from any address) and per
    address (for any user). These replaced the strict per-address and per-user limits,
    which let five wrong passwords from anywhere lock the real user out."""
    app = build(
        LOGIN_MAX_FAILURES=3,
        LOGIN_WINDOW_SECONDS=60,
        LOGIN_MAX_FAILURES_PER_USER=6,
        LOGIN_MAX_FAILURES_PER_ADDRESS=6,
    )
    client = app.test_client()
    for _ in range(3):
        assert _login(client, "olga", "guess").status_code == 401
    blocked = _login(client, "olga", "guess")
    assert blocked.status_code == 429
    assert 0 < int(blocked.headers["Retry-After"]) <= 60
    # Even the right password is refused while blocked: guessing gains nothing.
    assert _login(client, "olga", "olga-pw").status_code == 429
    # Other names from the same address, and the same name from another address, go on...
    assert _login(client, "vic", "vic-pw").status_code == 302
    assert _login(client, "olga", "guess", addr="198.51.100.7").status_code == 401
    # ...until the looser caps: 6 failures for olga from any address, 6 from one address.
    for addr in ("198.51.100.8", "198.51.100.9"):
        assert _login(client, "olga", "guess", addr=addr).status_code == 401
    assert _login(client, "olga", "olga-pw", addr="198.51.100.10").status_code == 429
    for name in ("ghost1", "ghost2", "ghost3"):
        assert _login(client, name, "guess", addr="192.0.2.50").status_code == 401
    for name in ("ghost4", "ghost5", "ghost6"):
        assert _login(client, name, "guess", addr="192.0.2.50").status_code == 401
    assert _login(client, "vic", "vic-pw", addr="192.0.2.50").status_code == 429
    # An unrelated user on an unrelated address logs in.
    assert _login(client, "vic", "vic-pw", addr="198.51.100.8").status_code == 302


def test_login_limit_window_expires_and_success_resets(build, monkeypatch):
    app = build(LOGIN_MAX_FAILURES=2, LOGIN_WINDOW_SECONDS=60)
    limiter = app.extensions["geneva_drive"].login_limiter
    now = [1000.0]
    monkeypatch.setattr(limiter, "_clock", lambda: now[0])
    client = app.test_client()
    assert _login(client, "olga", "x").status_code == 401
    assert _login(client, "olga", "olga-pw").status_code == 302  # success clears the count
    assert _login(client, "olga", "x").status_code == 401
    assert _login(client, "olga", "x").status_code == 401
    assert _login(client, "olga", "olga-pw").status_code == 429
    now[0] += 61
    assert _login(client, "olga", "olga-pw").status_code == 302


def test_login_requires_csrf(app):
    client = app.test_client()
    response = client.post("/login", data={"username": "olga", "password": "olga-pw"})
    assert response.status_code == 400
    assert client.get("/workflows").status_code == 302


# --- cookies and headers ----------------------------------------------------------------------


def _session_cookie_header(response) -> str:
    cookies = [h for h in response.headers.getlist("Set-Cookie") if h.startswith("session=")]
    assert cookies, response.headers
    return cookies[-1]


def test_session_cookie_flags(build):
    app = build()
    plain = _session_cookie_header(_login(app.test_client(), "olga", "olga-pw"))
    assert "HttpOnly" in plain
    assert re.search(r"SameSite=(Lax|Strict)", plain)
    # Served over HTTPS, the cookie is Secure even without configuration.
    client = app.test_client()
    with client.session_transaction(base_url="https://localhost") as session:
        session["geneva_drive.csrf"] = CSRF
    over_tls = client.post(
        "/login",
        data={"username": "olga", "password": "olga-pw", "csrf_token": CSRF},
        base_url="https://localhost",
    )
    assert over_tls.status_code == 302
    assert "Secure" in _session_cookie_header(over_tls)
    # SESSION_COOKIE_SECURE forces it everywhere.
    forced = build(SESSION_COOKIE_SECURE=True)
    assert "Secure" in _session_cookie_header(_login(forced.test_client(), "olga", "olga-pw"))


def test_security_headers_on_every_kind_of_response(app, wf_ids):
    client = login(app.test_client(), "olga")
    responses = {
        "page": client.get("/workflows"),
        "detail": client.get(f"/workflows/{wf_ids['paused']}"),
        "partial": client.get("/workflows", headers={"HX-Request": "true"}),
        "404": client.get("/workflows/999999"),
        "400": client.post("/workflows/1/cancel"),
        "login": app.test_client().get("/login"),
        "healthz": app.test_client().get("/healthz"),
        "metrics": app.test_client().get("/metrics"),
        "static": client.get("/static/js/app.js"),
    }
    for response in responses.values():
        response.close()  # a static file's response holds the file open until closed
    for name, response in responses.items():
        csp = response.headers.get("Content-Security-Policy", "")
        directives = dict(
            [*part.strip().split(" ", 1), ""][:2] for part in csp.split(";") if part.strip()
        )
        assert "script-src" in directives or "default-src" in directives, (name, csp)
        script_src = directives.get("script-src", directives.get("default-src", ""))
        assert "'unsafe-inline'" not in script_src and "'unsafe-eval'" not in script_src, name
        assert "*" not in script_src.split(), name
        assert directives.get("frame-ancestors") in ("'none'", "'self'"), (name, csp)
        assert directives.get("object-src") == "'none'", (name, csp)
        assert response.headers.get("X-Content-Type-Options") == "nosniff", name
        assert response.headers.get("X-Frame-Options") in ("DENY", "SAMEORIGIN"), name


def test_pages_hold_no_inline_script_or_handlers(app, wf_ids):
    """What the CSP forbids the pages must not need: no inline <script>, no on*= handlers,
    no javascript: URLs."""
    client = login(app.test_client(), "olga")
    for url in (
        "/",
        "/workflows",
        f"/workflows/{wf_ids['paused']}",
        f"/workflows/{wf_ids['parked']}",
        "/signals",
        "/failures",
        "/stranded",
        "/definitions",
        "/audit",
        "/login",
    ):
        body = client.get(url).get_data(as_text=True)
        for tag, content in re.findall(r"(<script\b[^>]*>)(.*?)</script>", body, flags=re.I | re.S):
            assert "src=" in tag and not content.strip(), (url, tag, content[:80])
        assert not re.search(r"\son[a-z]+\s*=", body, flags=re.I), url
        assert "javascript:" not in body.lower(), url


# --- /metrics ---------------------------------------------------------------------------------


def test_metrics_token_is_honoured(build):
    app = build(METRICS_TOKEN=METRICS_TOKEN)
    client = app.test_client()
    assert client.get("/metrics").status_code == 401
    for header in (
        "Bearer wrong",
        f"Basic {METRICS_TOKEN}",
        f"Bearer {METRICS_TOKEN}x",
        f"Bearer {METRICS_TOKEN[:-1]}",
        "Bearer ",
        METRICS_TOKEN,
    ):
        response = client.get("/metrics", headers={"Authorization": header})
        assert response.status_code == 401, header
        assert METRICS_TOKEN not in response.get_data(as_text=True)
    good = client.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert good.status_code == 200
    assert METRICS_TOKEN not in good.get_data(as_text=True)
    # A logged-in dashboard session is not a metrics credential.
    assert login(app.test_client(), "olga").get("/metrics").status_code == 401
    # Without a token configured the endpoint is open, like /healthz.
    # Without a token it is closed, unless opened explicitly.
    assert build().test_client().get("/metrics").status_code == 401
    assert build(METRICS_PUBLIC=True).test_client().get("/metrics").status_code == 200


# --- secrets in logs ----------------------------------------------------------------------------


def test_no_secrets_in_logs(build, wf_ids, caplog):
    password = "correct horse battery staple"
    users = {
        **USERS,
        "pat": {
            "password_hash": generate_password_hash(password, "pbkdf2:sha256:1000"),
            "role": "operator",
        },
    }
    app = build(USERS=users, METRICS_TOKEN=METRICS_TOKEN, LOGIN_MAX_FAILURES=2)
    caplog.set_level(logging.DEBUG)
    client = app.test_client()
    _login(client, "pat", password + "-typo")
    _login(client, "pat", password, addr="192.0.2.1")
    _login(client, "pat", password + "-typo")
    _login(client, "pat", password + "-typo")  # throttled now
    client = app.test_client()
    _login(client, "pat", password, addr="192.0.2.99")
    with client.session_transaction() as session:
        csrf_token = session["geneva_drive.csrf"]
    client.post(f"/workflows/{wf_ids['paused']}/cancel", headers={"X-CSRF-Token": "forged"})
    client.post(
        f"/workflows/{wf_ids['parked']}/signals",
        data={"name": "payment_confirmed", "payload": '{"card": "4111"}'},
        headers={"X-CSRF-Token": csrf_token},
    )
    client.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    client.get("/metrics", headers={"Authorization": "Bearer wrong-token-guess"})
    logged = "\n".join(
        f"{r.name} {r.getMessage()} {r.args!r} {getattr(r, 'exc_text', '') or ''}"
        for r in caplog.records
    )
    assert caplog.records, "expected some log output to inspect"
    for secret in (
        password,
        users["pat"]["password_hash"],
        csrf_token,
        SECRET_KEY,
        METRICS_TOKEN,
        "wrong-token-guess",
    ):
        assert secret not in logged, secret
