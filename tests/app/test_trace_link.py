"""The detail page links a workflow's trace when ``GENEVA_TRACE_URL_TEMPLATE`` is set
(docs/MANUAL.md, "Tracing"); a template that could not make the link refuses to start, naming
the setting."""

from __future__ import annotations

import html
import re

import pytest
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from opentelemetry import trace as otel_trace

from geneva_drive import Workflow, step
from geneva_drive.dashboard import GenevaDrive
from geneva_drive.errors import ConfigurationError
from geneva_drive.testing import speedrun_workflow
from tests.app.conftest import login
from tests.engine.helpers import make_order

JAEGER = "http://jaeger:16686/trace/{trace_id}"


class TracedInvoice(Workflow):
    @step
    def send(self) -> None:
        pass


def _traced(geneva_session) -> tuple[TracedInvoice, str]:
    """A workflow created inside a request's span (stored on its row), and that trace's id."""
    with otel_trace.get_tracer("shop").start_as_current_span("POST /invoices") as request:
        workflow = TracedInvoice.create(hero=make_order(geneva_session))
        geneva_session.commit()
    speedrun_workflow(workflow)
    return workflow, f"{request.get_span_context().trace_id:032x}"


def _trace_link(page: str) -> str | None:
    found = re.search(r'<dd id="wf-trace"><a href="([^"]+)"', page)
    return html.unescape(found.group(1)) if found else None


def test_the_detail_page_links_the_workflow_s_trace(app_factory, geneva_session, otel_spans):
    workflow, trace_id = _traced(geneva_session)
    client = login(app_factory(TRACE_URL_TEMPLATE=JAEGER).test_client(), "vic")
    page = client.get(f"/workflows/{workflow.id}").get_data(as_text=True)
    assert _trace_link(page) == f"http://jaeger:16686/trace/{trace_id}"


def test_the_setting_is_read_from_the_environment(
    app_factory, geneva_session, otel_spans, monkeypatch
):
    workflow, trace_id = _traced(geneva_session)
    monkeypatch.setenv("GENEVA_TRACE_URL_TEMPLATE", "https://traces.example/t/{trace_id}?x=1&y=2")
    client = login(app_factory().test_client(), "vic")
    page = client.get(f"/workflows/{workflow.id}").get_data(as_text=True)
    assert _trace_link(page) == f"https://traces.example/t/{trace_id}?x=1&y=2"


def test_no_link_without_the_setting_or_without_a_stored_trace(
    app_factory, geneva_session, otel_spans
):
    traced, _trace_id = _traced(geneva_session)
    plain = TracedInvoice.create(hero=make_order(geneva_session))  # outside any span
    geneva_session.commit()
    without = login(app_factory().test_client(), "vic")
    assert _trace_link(without.get(f"/workflows/{traced.id}").get_data(as_text=True)) is None
    with_template = login(app_factory(TRACE_URL_TEMPLATE=JAEGER).test_client(), "vic")
    page = with_template.get(f"/workflows/{plain.id}").get_data(as_text=True)
    assert page.count("TracedInvoice") and _trace_link(page) is None


BAD_TEMPLATES = [
    ("http://jaeger:16686/search", "has no {trace_id}"),
    ("http://jaeger:16686/trace/{trace}", "names {trace}"),
    ("http://jaeger/{trace_id}/{span_id}", "names {span_id}"),
    ("http://jaeger/{trace_id", "is not a valid template"),
    ("javascript:alert('{trace_id}')", "neither an http(s) URL nor a path"),
]


@pytest.mark.parametrize(("template", "problem"), BAD_TEMPLATES)
def test_a_bad_template_refuses_to_start_naming_the_setting(
    app_factory, monkeypatch, template, problem
):
    monkeypatch.setenv("GENEVA_TRACE_URL_TEMPLATE", template)
    with pytest.raises(ConfigurationError) as refused:
        app_factory()
    message = str(refused.value)
    assert message.startswith(f"GENEVA_TRACE_URL_TEMPLATE={template!r}")
    assert problem in message
    assert "http://jaeger:16686/trace/{trace_id}" in message  # the way out


def test_a_host_app_refuses_a_bad_template_too(geneva_database, geneva_session, monkeypatch):
    monkeypatch.setenv("GENEVA_BROKER_URL", "memory://")
    app = Flask("host")
    app.config.update(
        SECRET_KEY="host-secret-key-long-enough-0c9e",
        GENEVA_TRACE_URL_TEMPLATE="http://jaeger:16686/search",
        **geneva_database.flask_config(),
    )
    db = SQLAlchemy()
    db.init_app(app)
    with pytest.raises(ConfigurationError, match=r"^GENEVA_TRACE_URL_TEMPLATE="):
        GenevaDrive(app, db=db)
    with app.app_context():
        db.engine.dispose()
