"""Hostile input through the dashboard: every form field and query parameter, every id.

Each request gets a clear answer below 500 (400/404/409, or 200 for a filter that matches
nothing), engine rows stay as they were when the request is refused, and engine data is
escaped wherever it is rendered.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from sqlalchemy import select

from geneva_drive.config import settings
from geneva_drive.models import OperatorAction, Signal, StepExecution
from geneva_drive.testing import speedrun_workflow
from geneva_drive.workflow import Workflow
from tests.app.conftest import CSRF, DashPayment, app_config, login
from tests.engine.helpers import make_order

HYPO = hsettings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

XSS = "<script>alert('gd')</script>"
XSS_IMG = '<img src=x onerror="alert(1)">'

# Requests carry bytes: a lone surrogate cannot arrive (invalid UTF-8 is decoded to U+FFFD),
# so the text here is any encodable text; raw invalid bytes are sent in test_raw_bytes_*.
hostile_text = st.one_of(
    st.text(alphabet=st.characters(codec="utf-8"), max_size=60),
    st.sampled_from(
        [
            "-1",
            "0",
            str(10**30),
            "99999999999999999999",
            "#" + str(2**63),
            "²",
            "٣",
            "①",
            "abc",
            "../",
            "../../etc/passwd",
            "%00",
            "\x00",
            "\ufffd",
            "%ED%A0%80",
            XSS,
            XSS_IMG,
            "' OR 1=1 --",
            "Order:1",
            "Order/" + "9" * 40,
            ":",
            "/",
            "a" * 5000,
            "1e9",
            "NaN",
            " 5 ",
            "24h",
            "7d",
            "999999d",
            "-5h",
            "all",
            "selected",
        ]
    ),
)

QUERY_KEYS = [
    "class",
    "state",
    "hero_type",
    "hero_id",
    "step",
    "error",
    "q",
    "due",
    "stranded",
    "after",
    "before",
    "window",
    "actor",
    "action",
    "workflow",
    "scope",
    "ids",
    "target_step",
    "partial",
]
GET_PAGES = [
    "/",
    "/workflows",
    "/signals",
    "/definitions",
    "/stranded",
    "/failures",
    "/audit",
    "/workflows/bulk",
]


@pytest.fixture
def dash(geneva_database, geneva_session):
    from geneva_drive.dashboard import create_app

    DashPayment.fail_charge = True
    app = create_app(app_config(geneva_database))
    yield app
    with app.app_context():
        from geneva_drive.dashboard.extensions import db

        db.session.remove()
        db.engine.dispose()


@pytest.fixture
def client(dash):
    return login(dash.test_client(), "olga")


@pytest.fixture
def workflows(geneva_session) -> dict[str, int]:
    """A paused one (charge failed), a parked one (at the confirm gate), a fresh ready one."""
    made = {}
    for kind in ("paused", "parked", "ready"):
        order = make_order(geneva_session)
        wf = DashPayment.create(hero=order, session=geneva_session)
        geneva_session.commit()
        if kind != "ready":
            DashPayment.fail_charge = kind == "paused"
            with contextlib.suppress(RuntimeError):
                speedrun_workflow(wf)
        made[kind] = wf.id
    DashPayment.fail_charge = True
    return made


def engine_rows(session) -> tuple:
    session.expire_all()
    return (
        sorted((w.id, w.state, w.next_step_name) for w in session.scalars(select(Workflow))),
        sorted((e.id, e.state) for e in session.scalars(select(StepExecution))),
        sorted((s.id, s.state, s.claimed) for s in session.scalars(select(Signal))),
    )


def post(client, url: str, data: dict[str, Any] | None = None, htmx: bool = False):
    headers = {"X-CSRF-Token": CSRF}
    if htmx:
        headers["HX-Request"] = "true"
    return client.post(url, data=data or {}, headers=headers)


def assert_clear(response, *allowed: int) -> None:
    assert response.status_code < 500, (response.status_code, response.get_data(as_text=True)[:500])
    if allowed:
        assert response.status_code in allowed, response.status_code


# --- ids in paths --------------------------------------------------------------------------

BAD_IDS = ["0", "-1", str(2**63), str(10**30), "abc", "..%2F", "1.5", "%20", "0x10", "²"]
ACTIONS = ["pause", "resume", "skip", "cancel", "reattempt", "resume_at", "signals"]


@pytest.mark.parametrize("raw", BAD_IDS)
def test_bad_workflow_ids_in_paths_are_404(client, geneva_session, workflows, raw):
    before = engine_rows(geneva_session)
    assert_clear(client.get(f"/workflows/{raw}"), 404)
    assert_clear(client.get(f"/workflows/{raw}", headers={"HX-Request": "true"}), 404)
    for action in ACTIONS:
        assert_clear(
            post(client, f"/workflows/{raw}/{action}", {"name": "x", "step": "ship"}), 404, 405
        )
    assert engine_rows(geneva_session) == before


@pytest.mark.parametrize("raw", BAD_IDS)
def test_bad_ids_in_every_int_route_are_404(dash, client, geneva_session, workflows, raw):
    """Every route with an ``<int:…>`` argument, found in the url_map (new ones included)."""
    import re

    rules = [r for r in dash.url_map.iter_rules() if "<int:" in r.rule]
    assert len(rules) >= 8
    before = engine_rows(geneva_session)
    for rule in rules:
        url = re.sub(r"<int:[a-z_]+>", raw, rule.rule)
        for method in sorted(rule.methods & {"GET", "POST"}):
            response = client.get(url) if method == "GET" else post(client, url, {"name": "x"})
            assert_clear(response, 404, 405)
    assert engine_rows(geneva_session) == before


@HYPO
@given(hero_type=hostile_text, hero_id=hostile_text, name=hostile_text)
def test_path_segments_never_500(client, workflows, hero_type, hero_id, name):
    from urllib.parse import quote

    for url in (
        f"/heroes/{quote(hero_type, safe='')}/{quote(hero_id, safe='')}",
        f"/definitions/{quote(name, safe='')}",
    ):
        response = client.get(url)
        assert_clear(response)


# --- query parameters -------------------------------------------------------------------------


@HYPO
@given(
    page=st.sampled_from(GET_PAGES),
    params=st.dictionaries(st.sampled_from(QUERY_KEYS), hostile_text, max_size=5),
    htmx=st.booleans(),
)
def test_query_parameters_never_500_and_never_write(
    client, geneva_session, workflows, page, params, htmx
):
    before = engine_rows(geneva_session)
    headers = {"HX-Request": "true"} if htmx else {}
    response = client.get(page, query_string=params, headers=headers)
    assert_clear(response)
    body = response.get_data(as_text=True)
    assert XSS not in body and XSS_IMG not in body
    assert engine_rows(geneva_session) == before


@pytest.mark.parametrize("page", GET_PAGES)
def test_raw_bytes_in_query_strings_never_500(client, workflows, page):
    for raw in (b"q=%FF%FE", b"class=%ED%A0%80", b"after=%00&before=%C0%AF", b"state=\xff&q=\xc0"):
        # WSGI carries the raw bytes as latin-1 text.
        response = client.get(page, environ_overrides={"QUERY_STRING": raw.decode("latin-1")})
        assert_clear(response)


# --- the signal form ------------------------------------------------------------------------


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


hostile_payload_text = st.one_of(
    st.text(alphabet=st.characters(codec="utf-8"), max_size=80),
    st.sampled_from(
        [
            "{",
            "null",
            "NaN",
            '{"a": NaN}',
            '{"a": Infinity}',
            "[1, -Infinity]",
            '"\\u0000"',
            '{"\\u0000": 1}',
            '"\\ud800"',
            '{"a": 1, "a": 2}',
            '{"_gd": "uuid", "v": "nope"}',
            json.dumps({"x": XSS}),
            _nested(50),
            _nested(5000),
            _nested(200000),
            json.dumps({"blob": "x" * 200_000}),
            "1" * 5000,
            "true",
            "[]",
            "\ufeff{}",
        ]
    ),
)


@HYPO
@given(
    name=hostile_text,
    payload=hostile_payload_text,
    key=st.none() | hostile_text,
    htmx=st.booleans(),
)
def test_signal_form_never_500_and_refusals_write_no_engine_rows(
    client, geneva_session, workflows, name, payload, key, htmx
):
    before = engine_rows(geneva_session)
    data = {"name": name, "payload": payload}
    if key is not None:
        data["idempotency_key"] = key
    response = post(client, f"/workflows/{workflows['parked']}/signals", data, htmx=htmx)
    assert_clear(response, 200, 302, 400, 409, 413)
    if response.status_code >= 400:
        assert engine_rows(geneva_session) == before
    # Whatever was refused, the audit log does not become a store for oversized input.
    geneva_session.expire_all()
    for row in geneva_session.scalars(select(OperatorAction)):
        stored = json.dumps(row.params or {}, ensure_ascii=False)
        limit = settings.max_signal_payload_size or 0
        assert len(stored.encode()) <= limit + 4096, (row.result, len(stored))


def test_oversize_request_body_is_refused(client, geneva_session, workflows):
    before = engine_rows(geneva_session)
    response = post(
        client,
        f"/workflows/{workflows['parked']}/signals",
        {"name": "payment_confirmed", "payload": json.dumps({"x": "y" * 5_000_000})},
    )
    assert_clear(response, 413)
    assert engine_rows(geneva_session) == before


# --- step names and bulk forms --------------------------------------------------------------


@HYPO
@given(
    step=hostile_text.filter(lambda s: s.strip() not in ("authorize", "charge", "confirm", "ship"))
)
def test_resume_at_unknown_step_is_refused_and_changes_nothing(
    client, geneva_session, workflows, step
):
    before = engine_rows(geneva_session)
    response = post(client, f"/workflows/{workflows['paused']}/resume_at", {"step": step})
    assert_clear(response, 400, 409)
    assert engine_rows(geneva_session) == before


@HYPO
@given(
    form=st.fixed_dictionaries(
        {"action": st.sampled_from(["pause", "cancel", "resume_at", "explode", ""]) | hostile_text},
        optional={
            "scope": hostile_text,
            "ids": st.lists(hostile_text, max_size=4),
            "target_step": hostile_text,
            "class": hostile_text,
            "state": hostile_text,
            "q": hostile_text,
            "due": hostile_text,
        },
    ),
    method=st.sampled_from(["GET", "POST"]),
)
def test_bulk_forms_never_500(client, geneva_session, workflows, form, method):
    response = (
        client.get("/workflows/bulk", query_string=form)
        if method == "GET"
        else post(client, "/workflows/bulk", form)
    )
    assert_clear(response)


# --- escaping ---------------------------------------------------------------------------------


def test_engine_data_renders_inert(client, geneva_session, workflows):
    """Error messages (the failing step raises with a <script> in it), signal names, payloads,
    idempotency keys and filters holding markup come back escaped on every page."""
    parked = geneva_session.get(Workflow, workflows["parked"])
    parked.signal(XSS_IMG, {"note": XSS}, idempotency_key=XSS)
    geneva_session.commit()
    pages = [
        f"/workflows/{workflows['paused']}",
        f"/workflows/{workflows['parked']}",
        "/workflows",
        "/workflows?state=paused",
        f"/workflows?q={XSS}",
        f"/workflows?class={XSS}&step={XSS_IMG}",
        "/signals",
        "/failures",
        "/failures?window=7d",
        "/stranded",
        "/audit",
        "/",
        f"/heroes/Order/{XSS}",
    ]
    raw_error = "card declined <script>alert(1)</script>"
    for page in pages:
        for headers in ({}, {"HX-Request": "true"}):
            response = client.get(page, headers=headers)
            assert_clear(response)
            body = response.get_data(as_text=True)
            for needle in (XSS, XSS_IMG, raw_error, "<script>alert"):
                assert needle not in body, (page, needle)
    detail = client.get(f"/workflows/{workflows['paused']}").get_data(as_text=True)
    assert "card declined &lt;script&gt;" in detail  # shown, escaped


def test_refusal_messages_render_inert(client, geneva_session, workflows):
    response = post(client, f"/workflows/{workflows['paused']}/resume_at", {"step": XSS})
    assert_clear(response, 400, 409)
    body = response.get_data(as_text=True)
    assert XSS not in body
    response = post(client, f"/workflows/{workflows['paused']}/resume_at", {"step": XSS}, htmx=True)
    assert XSS not in response.get_data(as_text=True) or response.mimetype == "text/plain"
