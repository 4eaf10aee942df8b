"""The HTTP API through real HTTP: a server on 127.0.0.1 serving the standalone app, called
the way a runbook script or a payment provider's webhook calls it (docs/MANUAL.md,
"Automating operations"). Each endpoint, each scope refusal, each error code, idempotent
signals and the audit rows behind them."""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from openapi_spec_validator import validate
from sqlalchemy import select
from werkzeug.serving import make_server

from geneva_drive import Workflow, step
from geneva_drive.errors import ConfigurationError
from geneva_drive.models import OperatorAction, Signal
from tests.app.conftest import CSRF, DashPayment, app_config, login
from tests.engine.helpers import make_order

TOKENS = {
    "reader": ("reader-token-0123456789abcdef", "read"),
    "ops": ("ops-token-0123456789abcdef", "read,operate"),
    "hook": ("hook-token-0123456789abcdef", "signal"),
    "all": ("all-token-0123456789abcdef", "read,operate,signal"),
}


def token_setting(tokens: dict[str, tuple[str, str]] = TOKENS) -> str:
    return ";".join(
        f"{name}:{hashlib.sha256(secret.encode()).hexdigest()}:{scopes}"
        for name, (secret, scopes) in tokens.items()
    )


@dataclass
class Answer:
    status: int
    body: Any
    headers: Any


class Api:
    """A client of the API on a live server: ``api.get("workflows", token="ops")``."""

    def __init__(self, base: str, app: Any = None) -> None:
        self.base = base
        self.app = app

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = "all",
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        sent = dict(headers or {})
        if data is not None:
            sent.setdefault("Content-Type", "application/json")
        if token is not None:
            sent["Authorization"] = f"Bearer {TOKENS[token][0] if token in TOKENS else token}"
        request = urllib.request.Request(
            f"{self.base}/api/v1/{path}", data=data, method=method, headers=sent
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return Answer(response.status, json.loads(response.read()), response.headers)
        except urllib.error.HTTPError as error:
            return Answer(error.code, json.loads(error.read()), error.headers)

    def get(self, path: str, **options: Any) -> Answer:
        return self.call("GET", path, **options)

    def post(self, path: str, body: Any = None, **options: Any) -> Answer:
        return self.call("POST", path, body, **options)


class Served:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=10)


@pytest.fixture
def serve(app_factory):  # type: ignore[no-untyped-def]
    """``serve(**config)``: the app with the API's tokens, on a port of its own."""
    running: list[Served] = []

    def start(**extra: Any) -> Api:
        extra.setdefault("API_TOKENS", token_setting())
        served = Served(app_factory(**extra))
        running.append(served)
        return Api(served.url, served.app)

    yield start
    for served in running:
        served.stop()


@pytest.fixture
def api(serve) -> Api:  # type: ignore[no-untyped-def]
    return serve()


def audit(session: Any, actor: str) -> list[tuple[str, str, int | None]]:
    session.expire_all()
    return [
        (row.action, row.result, row.workflow_id)
        for row in session.scalars(
            select(OperatorAction).where(OperatorAction.actor == actor).order_by(OperatorAction.id)
        )
    ]


class ApiOrder(Workflow):
    @step(wait_for="payment_confirmed")
    def wait_for_payment(self) -> None:
        pass

    @step
    def ship(self) -> None:
        pass


# --- the document and authentication ----------------------------------------------------------


def test_the_document_needs_no_token_and_is_valid_openapi_3_1(api):
    answer = api.get("openapi.json", token=None)
    assert answer.status == 200
    document = answer.body
    assert document["openapi"] == "3.1.0"
    validate(document)  # raises on any violation of the OpenAPI 3.1 schema
    assert document["servers"] == [{"url": f"{api.base}/api/v1"}]
    paths = document["paths"]
    assert paths["/workflows/{workflow_id}/actions/resume_at"]["post"]["requestBody"]["required"]
    assert paths["/signals"]["post"]["security"] == [{"bearer": []}]
    assert "openapi" not in json.dumps(paths.get("/openapi.json", {}))


def test_no_token_or_a_wrong_one_is_401_in_json(api):
    for token in (None, "not-a-configured-token"):
        answer = api.get("workflows", token=token)
        assert answer.status == 401
        assert answer.body["error"]["code"] == "unauthorized"
        assert "GENEVA_API_TOKENS" in answer.body["error"]["message"]
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")


def test_a_signed_in_dashboard_session_is_not_a_login_to_the_api(app_factory, make_workflow):
    """The dashboard's cookie is never read: a browser signed in as an operator, tricked into
    posting to the API, gets a 401 and changes nothing."""
    app = app_factory(API_TOKENS=token_setting())
    client = login(app.test_client(), "olga")
    workflow = make_workflow()
    assert client.get("/workflows").status_code == 200  # the cookie works on the dashboard
    refused = client.post(
        f"/api/v1/workflows/{workflow.id}/actions/pause",
        headers={"X-CSRF-Token": CSRF},
        json={},
    )
    assert refused.status_code == 401
    assert refused.json["error"]["code"] == "unauthorized"


def test_each_scope_is_needed_and_none_implies_another(api, make_workflow, geneva_session):
    workflow = make_workflow()
    assert api.get(f"workflows/{workflow.id}", token="hook").status == 403
    refused = api.post(f"workflows/{workflow.id}/actions/pause", token="reader")
    assert refused.status == 403
    assert refused.body["error"]["code"] == "forbidden"
    assert "'operate' scope" in refused.body["error"]["message"]
    signal = api.post(f"workflows/{workflow.id}/signals", {"name": "go"}, token="ops")
    assert signal.status == 403
    # Refused actions and signals are in the audit, under the token's name.
    assert audit(geneva_session, "api:reader") == [("pause", "refused", workflow.id)]
    assert audit(geneva_session, "api:ops") == [("signal", "refused", workflow.id)]
    geneva_session.refresh(workflow)
    assert workflow.state == "ready"


def test_a_malformed_token_setting_refuses_to_start_naming_it(app_factory):
    for bad in (
        "ops:not-hex:read",
        "ops:" + "a" * 64 + ":write",
        "ops",
        "a b:" + "a" * 64 + ":read",
    ):
        with pytest.raises(ConfigurationError, match="GENEVA_API_TOKENS"):
            app_factory(API_TOKENS=bad)


def test_a_token_past_its_budget_waits(serve):
    api = serve(API_REQUESTS_PER_MINUTE=3)
    assert [api.get("limits").status for _ in range(3)] == [200, 200, 200]
    throttled = api.get("limits")
    assert throttled.status == 429
    assert throttled.body["error"]["code"] == "too_many_requests"
    assert int(throttled.headers["Retry-After"]) >= 1
    assert api.get("limits", token="reader").status == 200  # another token has its own


# --- reading -----------------------------------------------------------------------------------


def test_the_list_filters_and_pages_with_a_cursor(api, make_workflow):
    made = [make_workflow() for _ in range(5)]
    paused = make_workflow(run=True)
    first = api.get("workflows?limit=2&class=DashPayment")
    assert first.status == 200
    assert [w["id"] for w in first.body["items"]] == [paused.id, made[-1].id]
    item = first.body["items"][0]
    assert item["class"] == "DashPayment" and item["state"] == "paused"
    assert "RuntimeError" in item["why"] or item["error_message"]
    second = api.get(f"workflows?limit=2&class=DashPayment&after={first.body['next']}")
    assert [w["id"] for w in second.body["items"]] == [made[-2].id, made[-3].id]
    everything = api.get("workflows?limit=100000&state=ready")
    assert {w["id"] for w in everything.body["items"]} == {w.id for w in made}
    assert everything.body["next"] is None


def test_bad_query_parameters_are_400_naming_them(api):
    wrong = api.get("workflows?state=sleeping")
    assert wrong.status == 400
    assert wrong.body["error"]["field"] == "state"
    unknown = api.get("workflows?colour=blue")
    assert (unknown.status, unknown.body["error"]["field"]) == (400, "colour")
    assert api.get("workflows?limit=0").body["error"]["field"] == "limit"


def test_a_workflow_with_its_executions_and_signals(api, make_workflow):
    workflow = make_workflow(run=True)
    answer = api.get(f"workflows/{workflow.id}")
    assert answer.status == 200
    body = answer.body
    assert (body["id"], body["state"], body["hero_type"]) == (workflow.id, "paused", "Order")
    steps = [(e["step_name"], e["state"]) for e in body["executions"]]
    assert steps[0] == ("authorize", "completed") and steps[-1] == ("charge", "failed")
    assert body["executions"][-1]["error_class_name"] == "RuntimeError"
    assert body["signals"] == []
    missing = api.get("workflows/999999")
    assert (missing.status, missing.body["error"]["code"]) == (404, "not_found")


def test_limits_schedules_and_health_answer_their_shapes(api):
    for path, key in (("limits", "items"), ("schedules", "items"), ("health", "unexplained")):
        answer = api.get(path, token="reader")
        assert answer.status == 200 and isinstance(answer.body[key], list), (path, answer.body)


# --- operator actions -------------------------------------------------------------------------


def test_pause_then_resume_answers_the_workflow_and_audits_it(api, make_workflow, geneva_session):
    workflow = make_workflow()
    paused = api.post(f"workflows/{workflow.id}/actions/pause", token="ops")
    assert paused.status == 200
    assert paused.body["workflow"]["state"] == "paused"
    assert paused.body["message"] == "Paused."
    again = api.post(f"workflows/{workflow.id}/actions/pause", {}, token="ops")
    assert again.status == 409
    assert again.body["error"]["code"] == "conflict"
    resumed = api.post(f"workflows/{workflow.id}/actions/resume", token="ops")
    assert (resumed.status, resumed.body["workflow"]["state"]) == (200, "ready")
    assert audit(geneva_session, "api:ops") == [
        ("pause", "ok", workflow.id),
        ("pause", "refused", workflow.id),
        ("resume", "ok", workflow.id),
    ]


def test_resume_at_checks_its_step(api, make_workflow, geneva_session):
    workflow = make_workflow(run=True)
    missing = api.post(f"workflows/{workflow.id}/actions/resume_at", {}, token="ops")
    assert (missing.status, missing.body["error"]["field"]) == (400, "step")
    unknown = api.post(f"workflows/{workflow.id}/actions/resume_at", {"step": "nope"}, token="ops")
    assert unknown.status == 409 and "nope" in unknown.body["error"]["message"]
    done = api.post(f"workflows/{workflow.id}/actions/resume_at", {"step": "confirm"}, token="ops")
    assert done.status == 200
    assert done.body["workflow"]["next_step"] == "confirm"
    assert [a for a, r, _ in audit(geneva_session, "api:ops")] == ["resume_at"] * 3


def test_actions_on_a_workflow_that_does_not_exist_are_404(api):
    answer = api.post("workflows/424242/actions/cancel", token="ops")
    assert (answer.status, answer.body["error"]["code"]) == (404, "not_found")


# --- signals -----------------------------------------------------------------------------------


def test_a_signal_with_an_idempotency_key_is_delivered_once(api, geneva_session):
    order = make_order(geneva_session)
    workflow = ApiOrder.create(hero=order, session=geneva_session)
    geneva_session.commit()
    body = {"name": "payment_confirmed", "payload": {"amount": 12}, "idempotency_key": "evt-1"}
    first = api.post(f"workflows/{workflow.id}/signals", body, token="hook")
    assert first.status == 200, first.body
    assert first.body["duplicate_delivery"] is False
    assert first.body["workflow_id"] == workflow.id
    second = api.post(f"workflows/{workflow.id}/signals", body, token="hook")
    assert second.status == 200
    assert second.body["duplicate_delivery"] is True
    assert second.body["signal_id"] == first.body["signal_id"]
    geneva_session.expire_all()
    rows = geneva_session.scalars(select(Signal).where(Signal.workflow_id == workflow.id)).all()
    assert [(s.name, s.payload_json) for s in rows] == [("payment_confirmed", {"amount": 12})]


def test_a_webhook_signals_the_heros_ongoing_workflow(api, geneva_session):
    order = make_order(geneva_session)
    workflow = ApiOrder.create(hero=order, session=geneva_session)
    geneva_session.commit()
    hook = {
        "workflow": "ApiOrder",
        "hero_type": "Order",
        "hero_id": str(order.id),
        "name": "payment_confirmed",
        "idempotency_key": "psp-evt-9",
    }
    delivered = api.post("signals", hook, token="hook")
    assert delivered.status == 200, delivered.body
    assert delivered.body["workflow_id"] == workflow.id
    assert api.post("signals", hook, token="hook").body["duplicate_delivery"] is True
    nobody = api.post("signals", {**hook, "hero_id": "999999"}, token="hook")
    assert (nobody.status, nobody.body["error"]["code"]) == (404, "not_found")
    assert "No ongoing ApiOrder for Order 999999" in nobody.body["error"]["message"]
    unknown = api.post("signals", {**hook, "workflow": "Nope"}, token="hook")
    assert unknown.status == 400
    results = [(a, r) for a, r, _ in audit(geneva_session, "api:hook")]
    assert results == [
        ("signal", "ok"),
        ("signal", "ok"),
        ("signal", "refused"),
        ("signal", "refused"),
    ]


# --- malformed requests ------------------------------------------------------------------------


def test_bodies_are_checked_before_anything_changes(api, make_workflow, geneva_session):
    workflow = make_workflow()
    path = f"workflows/{workflow.id}/signals"
    too_large = api.post(path, {"name": "go", "payload": {"blob": "x" * (70 * 1024)}}, token="hook")
    assert (too_large.status, too_large.body["error"]["code"]) == (413, "too_large")
    not_json = api.post(path, raw=b"name=go", token="hook", headers={"Content-Type": "text/plain"})
    assert (not_json.status, not_json.body["error"]["code"]) == (415, "unsupported_media_type")
    broken = api.post(path, raw=b'{"name": "go"', token="hook")
    assert (broken.status, broken.body["error"]["code"]) == (400, "bad_request")
    typo = api.post(path, {"name": "go", "idempotencykey": "k"}, token="hook")
    assert (typo.status, typo.body["error"]["field"]) == (400, "idempotencykey")
    empty_name = api.post(path, {"name": ""}, token="hook")
    assert (empty_name.status, empty_name.body["error"]["field"]) == (400, "name")
    geneva_session.expire_all()
    assert (
        geneva_session.scalars(select(Signal).where(Signal.workflow_id == workflow.id)).all() == []
    )
    assert all(r == "refused" for _, r, _ in audit(geneva_session, "api:hook"))


def test_unknown_routes_and_methods_answer_in_json(api, make_workflow):
    workflow = make_workflow()
    unknown = api.get("nothing/here", token=None)
    assert (unknown.status, unknown.body["error"]["code"]) == (404, "not_found")
    wrong = api.call("DELETE", f"workflows/{workflow.id}")
    assert (wrong.status, wrong.body["error"]["code"]) == (405, "method_not_allowed")
    assert wrong.headers["Allow"] == "GET"
    verb = api.post(f"workflows/{workflow.id}/actions/explode", token="ops")
    assert verb.status == 404


# --- in a host app --------------------------------------------------------------------------


def test_a_host_app_serves_it_under_its_prefix_with_its_own_check(geneva_database, make_workflow):
    from flask import Flask
    from flask_sqlalchemy import SQLAlchemy

    from geneva_drive.dashboard import GenevaDrive
    from geneva_drive.dashboard.api.tokens import ApiClient
    from geneva_drive.models import Base

    host = Flask("host")
    config = app_config(geneva_database)
    host.config.update(
        SECRET_KEY="a-host-secret-key-of-decent-length-0123456789",
        SQLALCHEMY_DATABASE_URI=config["SQLALCHEMY_DATABASE_URI"],
        SQLALCHEMY_ENGINE_OPTIONS=config.get("SQLALCHEMY_ENGINE_OPTIONS", {}),
        GENEVA_BROKER_URL="memory://",
    )
    host_db = SQLAlchemy(metadata=Base.metadata)
    host_db.init_app(host)

    def api_auth(request: Any) -> ApiClient | None:
        if request.headers.get("X-Internal-Key") == "k-1":
            return ApiClient("deployer", frozenset({"read"}))
        return None

    GenevaDrive(host, db=host_db, url_prefix="/admin/wf", api_auth=api_auth)
    workflow = make_workflow()
    client = host.test_client()
    ok = client.get(f"/admin/wf/api/v1/workflows/{workflow.id}", headers={"X-Internal-Key": "k-1"})
    assert ok.status_code == 200 and ok.json["id"] == workflow.id
    assert client.get("/admin/wf/api/v1/workflows").status_code == 401
    denied = client.post(
        f"/admin/wf/api/v1/workflows/{workflow.id}/actions/pause",
        headers={"X-Internal-Key": "k-1"},
    )
    assert denied.status_code == 403
    assert (
        client.get("/admin/wf/api/v1/openapi.json")
        .json["servers"][0]["url"]
        .endswith("/admin/wf/api/v1")
    )
    with host.app_context():
        host_db.engine.dispose()


@pytest.fixture(autouse=True)
def _payment_never_fails_at_random() -> Iterator[None]:
    yield
    DashPayment.fail_charge = True


# --- the remaining actions, schedules, throttles ------------------------------------------------


def test_skip_cancel_and_reattempt(api, make_workflow, geneva_session):
    ready = make_workflow()
    skipped = api.post(f"workflows/{ready.id}/actions/skip", token="ops")
    assert skipped.status == 200, skipped.body
    assert skipped.body["message"] == "Skipped `authorize`."
    failed = make_workflow(run=True)
    DashPayment.fail_charge = False
    again = api.post(f"workflows/{failed.id}/actions/reattempt", token="ops")
    assert (again.status, again.body["workflow"]["state"]) == (200, "ready")
    assert again.body["workflow"]["next_step"] == "charge"
    canceled = api.post(f"workflows/{failed.id}/actions/cancel", token="ops")
    assert (canceled.status, canceled.body["workflow"]["state"]) == (200, "canceled")
    refused = api.post(f"workflows/{failed.id}/actions/reattempt", token="ops")
    assert refused.status == 409
    assert audit(geneva_session, "api:ops") == [
        ("skip", "ok", ready.id),
        ("reattempt", "ok", failed.id),
        ("cancel", "ok", failed.id),
        ("reattempt", "refused", failed.id),
    ]


def test_schedules_are_listed_and_acted_on_by_name(api, geneva_session):
    from geneva_drive import Schedule, schedules

    try:
        Schedule.create(geneva_session, "reports/nightly", ApiReport, cron="0 3 * * *")
        geneva_session.commit()
        listed = api.get("schedules", token="reader")
        assert [s["name"] for s in listed.body["items"]] == ["reports/nightly"]
        paused = api.post("schedules/reports/nightly/actions/pause", token="ops")
        assert paused.status == 200, paused.body
        assert "Paused schedule `reports/nightly`" in paused.body["message"]
        twice = api.post("schedules/reports/nightly/actions/pause", token="ops")
        assert (twice.status, twice.body["error"]["code"]) == (409, "conflict")
        ran = api.post("schedules/reports/nightly/actions/run_now", token="ops")
        assert ran.status == 200 and ran.body["workflow_id"] is not None
        assert api.get(f"workflows/{ran.body['workflow_id']}").body["class"] == "ApiReport"
        missing = api.post("schedules/nope/actions/resume", token="ops")
        assert missing.status == 404
        assert [a for a, _, _ in audit(geneva_session, "api:ops")] == [
            "schedule_pause",
            "schedule_pause",
            "schedule_run_now",
        ]
    finally:
        schedules._reconciled.clear()


def test_wrong_tokens_from_one_address_wait(api):
    statuses = [api.get("limits", token=f"guess-{n}").status for n in range(11)]
    assert statuses[:10] == [401] * 10
    assert statuses[10] == 429
    # The right token from that address is not compared either while it waits.
    waited = api.get("limits", token="reader")
    assert waited.status == 429 and int(waited.headers["Retry-After"]) >= 1


def test_the_dashboard_cookie_over_http_opens_nothing(serve, make_workflow, geneva_session):
    """A browser signed in to the dashboard sends its cookie to the API too: refused."""
    api = serve()
    workflow = make_workflow()
    signed_in = login(api.app.test_client(), "olga")
    cookie = signed_in.get_cookie(api.app.config.get("SESSION_COOKIE_NAME", "session"))
    assert cookie is not None
    headers = {"Cookie": f"{cookie.key}={cookie.value}", "X-CSRF-Token": CSRF}
    # The cookie is a real login: over HTTP it opens the dashboard's pages.
    page = urllib.request.Request(f"{api.base}/workflows", headers=headers)
    with urllib.request.urlopen(page, timeout=30) as opened:
        assert opened.status == 200 and "/login" not in opened.url
    answer = api.post(f"workflows/{workflow.id}/actions/pause", {}, token=None, headers=headers)
    assert (answer.status, answer.body["error"]["code"]) == (401, "unauthorized")
    geneva_session.refresh(workflow)
    assert workflow.state == "ready"


class ApiReport(Workflow):
    may_proceed_without_hero = True

    @step
    def compile(self) -> None:
        pass
