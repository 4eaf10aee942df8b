"""Every page as a full page and as its HTMX partial; filters, keyset pagination, escaping,
polling (286 once terminal) and the security headers."""

from __future__ import annotations

import contextlib

import pytest
from sqlalchemy import event, update

from geneva_drive import IterableStep, resumable_step
from geneva_drive.dashboard.extensions import db
from geneva_drive.models import StepExecution, utcnow
from geneva_drive.testing import perform_next_step, speedrun_workflow
from geneva_drive.workflow import Workflow
from tests.app.conftest import DashPayment, post, run_to_finish
from tests.engine.helpers import make_order

HTMX = {"HX-Request": "true"}


def _pages(wf_id: int, hero_id: str) -> list[tuple[str, str]]:
    """(url, id of the partial's root element)."""
    return [
        ("/", 'id="overview"'),
        ("/workflows", 'id="results"'),
        ("/workflows?state=paused&class=DashPayment", 'id="results"'),
        (f"/workflows/{wf_id}", 'id="wf-live"'),
        (f"/heroes/Order/{hero_id}", 'id="hero-workflows"'),
        ("/signals", 'id="signals-inbox"'),
        ("/definitions", 'id="definitions"'),
        ("/definitions/DashPayment", 'id="definitions"'),
        ("/stranded", 'id="stranded"'),
        ("/failures", 'id="failures"'),
        ("/failures?window=7d", 'id="failures"'),
        ("/audit", 'id="audit"'),
        (f"/workflows/bulk?action=pause&ids={wf_id}", 'id="bulk-confirm"'),
    ]


def test_every_page_renders_in_full_and_as_partial(operator_client, make_workflow):
    wf = make_workflow(run=True)
    for url, marker in _pages(wf.id, wf.hero_id):
        full = operator_client.get(url)
        assert full.status_code == 200, url
        html = full.get_data(as_text=True)
        assert "<html" in html and marker in html, url
        assert "HX-Request" in full.headers.get("Vary", ""), url

        partial = operator_client.get(url, headers=HTMX)
        assert partial.status_code == 200, url
        fragment = partial.get_data(as_text=True)
        assert "<html" not in fragment and marker in fragment, url
        assert "HX-Request" in partial.headers.get("Vary", ""), url


def test_history_restore_gets_the_full_page(operator_client, make_workflow):
    wf = make_workflow()
    response = operator_client.get(
        f"/workflows/{wf.id}", headers={**HTMX, "HX-History-Restore-Request": "true"}
    )
    assert "<html" in response.get_data(as_text=True)


def test_unknown_workflow_and_class_are_404(operator_client):
    assert operator_client.get("/workflows/999999").status_code == 404
    assert operator_client.get("/definitions/NoSuchWorkflow").status_code == 404


def test_detail_shows_error_backtrace_plan_and_why_line(operator_client, make_workflow):
    wf = make_workflow(run=True)
    html = operator_client.get(f"/workflows/{wf.id}").get_data(as_text=True)
    assert "paused after <code>RuntimeError</code> in <code>charge</code>" in html
    assert "<details><summary>Backtrace</summary>" in html
    assert "RuntimeError" in html
    # The gravestone is in the plan, struck through by its class, and not offered to resume_at.
    assert 'class="status-removed"' in html and "legacy_capture" in html
    select = html.split('name="step"', 1)[1].split("</select>", 1)[0]
    assert "legacy_capture" not in select
    assert 'value="ship"' in select


class DashCopy(Workflow):
    """One resumable step over five items, two per execution: a chain of three executions."""

    @resumable_step(max_iterations=2)
    def copy(self, it: IterableStep) -> None:
        it.iterate_over(range(5), lambda item: None)


def test_resumable_chain_is_grouped_with_cursor_progress(operator_client, geneva_session):
    wf = DashCopy.create(session=geneva_session, hero=make_order(geneva_session))
    geneva_session.commit()
    for _ in range(3):
        perform_next_step(wf)
    assert wf.state == "finished"
    html = operator_client.get(f"/workflows/{wf.id}").get_data(as_text=True)
    assert "Resumable <code>copy</code></strong>: 3 executions" in html
    chain = html.split("Resumable <code>copy</code>", 1)[1].split("</table>", 1)[0]
    assert chain.count("<tr") == 4  # header + one row per hop
    assert ">+2<" in chain and ">+1<" in chain
    assert "<code>5</code>" in chain


def test_engine_data_is_escaped(operator_client, make_workflow):
    wf = make_workflow(run=True)
    html = operator_client.get(f"/workflows/{wf.id}").get_data(as_text=True)
    assert "<script>alert(1)</script>" not in html
    assert "card declined &lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_live_region_polls_while_ongoing_and_stops_with_286_once_terminal(
    operator_client, make_workflow
):
    wf = make_workflow()
    ongoing = operator_client.get(f"/workflows/{wf.id}", headers=HTMX)
    assert ongoing.status_code == 200
    assert 'hx-trigger="every 5s"' in ongoing.get_data(as_text=True)

    run_to_finish(wf)

    done = operator_client.get(f"/workflows/{wf.id}", headers=HTMX)
    assert done.status_code == 286
    assert "hx-trigger" not in done.get_data(as_text=True).split('id="wf-live"', 1)[1][:400]
    # A full page load of a terminal workflow is an ordinary 200.
    assert operator_client.get(f"/workflows/{wf.id}").status_code == 200


def test_list_filters_by_state_class_hero_step_error_and_id(operator_client, make_workflow):
    paused = make_workflow(run=True)
    ready = make_workflow()

    def ids(query: str) -> set[int]:
        html = operator_client.get(f"/workflows?{query}").get_data(as_text=True)
        return {i for i in (paused.id, ready.id) if f'id="wf-{i}"' in html}

    assert ids("") == {paused.id, ready.id}
    assert ids("state=paused") == {paused.id}
    assert ids("state=ready&class=DashPayment") == {ready.id}
    assert ids("class=NoSuchClass") == set()
    assert ids(f"hero_type=Order&hero_id={ready.hero_id}") == {ready.id}
    assert ids("step=charge") == {paused.id}
    assert ids("error=RuntimeError") == {paused.id}
    assert ids("error=KeyError") == set()
    assert ids(f"q={ready.id}") == {ready.id}
    assert ids(f"q=%23{paused.id}") == {paused.id}
    assert ids(f"q=Order:{paused.hero_id}") == {paused.id}
    assert ids("q=free+text") == set()


def test_due_filter_finds_overdue_executions(operator_client, make_workflow, geneva_session):
    late = make_workflow()
    make_workflow()  # due in the future
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == late.id)
        .values(scheduled_for=utcnow().replace(year=2020))
    )
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id != late.id)
        .values(scheduled_for=utcnow().replace(year=2100))
    )
    geneva_session.commit()
    html = operator_client.get("/workflows?due=overdue").get_data(as_text=True)
    assert f'id="wf-{late.id}"' in html
    assert html.count('id="wf-') == 1
    assert "overdue" in html


def test_keyset_pagination_walks_older_and_newer_without_overlap(app_factory, make_workflow):
    from tests.app.conftest import login

    client = login(app_factory(PAGE_SIZE=2).test_client(), "olga")
    made = sorted((make_workflow().id for _ in range(5)), reverse=True)

    def page_ids(query: str) -> list[int]:
        html = client.get(f"/workflows?{query}").get_data(as_text=True)
        return [i for i in made if f'id="wf-{i}"' in html]

    assert page_ids("") == made[:2]
    assert page_ids(f"after={made[1]}") == made[2:4]
    assert page_ids(f"after={made[3]}") == made[4:]
    assert page_ids(f"before={made[2]}") == made[:2]
    first = client.get("/workflows").get_data(as_text=True)
    assert f"after={made[1]}" in first  # the Older link carries the keyset cursor
    assert "Newer" not in first
    assert page_ids("after=not-a-number") == made[:2]


def test_list_query_uses_no_offset_and_no_count(app, operator_client, make_workflow):
    for _ in range(3):
        make_workflow()
    statements: list[str] = []
    offsets: list[object] = []
    with app.app_context():
        engine = db.engine

    def record(conn, cursor, statement, parameters, *args):  # type: ignore[no-untyped-def]
        statements.append(statement.upper())
        if "OFFSET" in statement.upper():
            # SQLite renders "LIMIT ? OFFSET ?" for a bare .limit(1) with offset 0; only a
            # non-zero offset would mean paging by OFFSET.
            offsets.append(parameters[-1] if isinstance(parameters, tuple | list) else parameters)

    event.listen(engine, "before_cursor_execute", record)
    try:
        assert operator_client.get("/workflows?state=ready&after=100000").status_code == 200
    finally:
        event.remove(engine, "before_cursor_execute", record)
    selects = [s for s in statements if "GENEVA_DRIVE_WORKFLOWS" in s]
    assert selects
    assert all(offset in (0, None) for offset in offsets), offsets
    assert not [s for s in statements if "COUNT(" in s]


def test_hero_page_lists_every_workflow_of_the_hero(operator_client, geneva_session):
    order = make_order(geneva_session)
    first = DashPayment.create(hero=order, session=geneva_session)
    first.cancel()
    second = DashPayment.create(hero=order, session=geneva_session)
    geneva_session.commit()
    html = operator_client.get(f"/heroes/Order/{order.id}").get_data(as_text=True)
    assert f"#{first.id}" in html and f"#{second.id}" in html
    assert "canceled" in html


def test_definitions_show_gravestones_with_executions_in_flight(
    operator_client, make_workflow, geneva_session
):
    wf = make_workflow()
    geneva_session.execute(
        update(StepExecution)
        .where(StepExecution.workflow_id == wf.id)
        .values(step_name="legacy_capture")
    )
    geneva_session.commit()
    html = operator_client.get("/definitions/DashPayment").get_data(as_text=True)
    row = html.split('class="gravestone">legacy_capture', 1)[1].split("</tr>", 1)[0]
    assert ">1</a>" in row  # one execution still in flight on the gravestone
    assert "1 on gravestones" in html


def test_stranded_page_groups_by_class_and_missing_step(
    operator_client, make_workflow, geneva_session
):
    wf = make_workflow(run=True)
    geneva_session.execute(
        update(Workflow).where(Workflow.id == wf.id).values(next_step_name="capture_payment")
    )
    geneva_session.commit()
    html = operator_client.get("/stranded").get_data(as_text=True)
    assert "DashPayment" in html and "capture_payment" in html
    assert "Resume selected at" in html and "Cancel selected" in html
    listed = operator_client.get("/workflows?class=DashPayment&stranded=capture_payment").get_data(
        as_text=True
    )
    assert f'id="wf-{wf.id}"' in listed
    # A step the class still runs is not a stranded group: the filter matches nothing.
    assert 'id="wf-' not in operator_client.get(
        "/workflows?class=DashPayment&stranded=ship"
    ).get_data(as_text=True)


def test_overview_and_failures_count_the_failure(operator_client, make_workflow):
    make_workflow(run=True)
    make_workflow(run=True)
    overview = operator_client.get("/").get_data(as_text=True)
    assert "DashPayment" in overview
    assert "paused ratio" in overview
    failures = operator_client.get("/failures").get_data(as_text=True)
    assert "RuntimeError" in failures and "charge" in failures
    assert ">2</a>" in failures


def test_audit_page_lists_actions_newest_first(operator_client, make_workflow):
    wf = make_workflow()
    post(operator_client, f"/workflows/{wf.id}/pause")
    post(operator_client, f"/workflows/{wf.id}/resume")
    html = operator_client.get("/audit").get_data(as_text=True)
    assert html.index(">Resume<") < html.index(">Pause<")
    assert "olga" in html
    filtered = operator_client.get("/audit?action=pause").get_data(as_text=True)
    assert ">Pause<" in filtered and ">Resume<" not in filtered


def test_security_headers_and_cookie_flags(app, operator_client):
    response = operator_client.get("/")
    csp = response.headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in csp
    assert "script-src 'self'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert app.config["SESSION_COOKIE_HTTPONLY"] is True
    assert app.config["SESSION_COOKIE_SAMESITE"] == "Lax"


def test_pages_load_htmx_from_static_not_a_cdn(operator_client):
    html = operator_client.get("/").get_data(as_text=True)
    assert "/static/vendor/htmx-2.0.11.min.js" in html
    assert "unpkg" not in html and "cdn" not in html.lower()
    with operator_client.get("/static/vendor/htmx-2.0.11.min.js") as response:
        assert response.status_code == 200


@pytest.mark.parametrize("width_hint", ["375"])
def test_pages_declare_a_mobile_viewport(operator_client, width_hint):
    assert 'name="viewport" content="width=device-width' in operator_client.get("/").get_data(
        as_text=True
    )


def test_a_workflow_whose_class_is_gone_still_renders(
    operator_client, make_workflow, geneva_session
):
    wf = make_workflow(run=True)
    geneva_session.execute(update(Workflow).where(Workflow.id == wf.id).values(type="GoneWorkflow"))
    geneva_session.commit()
    detail = operator_client.get(f"/workflows/{wf.id}")
    assert detail.status_code == 200
    html = detail.get_data(as_text=True)
    assert "class missing" in html and "GoneWorkflow" in html
    listed = operator_client.get("/workflows?class=GoneWorkflow").get_data(as_text=True)
    assert f'id="wf-{wf.id}"' in listed and "(not registered)" in listed
    # Paused on a step no class defines: it is in the stranded drain view.
    assert "GoneWorkflow" in operator_client.get("/stranded").get_data(as_text=True)
    # Cancel still works on it (the engine allows it for any ongoing workflow).
    assert post(operator_client, f"/workflows/{wf.id}/cancel").status_code == 302


def test_due_filter_finds_parked_waiters_and_the_inbox_lists_them(operator_client, make_workflow):
    DashPayment.fail_charge = False
    parked = make_workflow()
    with contextlib.suppress(RuntimeError):
        speedrun_workflow(parked)  # stops at the confirm gate
    other = make_workflow()
    html = operator_client.get("/workflows?due=waiting").get_data(as_text=True)
    assert f'id="wf-{parked.id}"' in html and f'id="wf-{other.id}"' not in html
    assert "waiting for signal <code>payment_confirmed</code>" in html
    inbox = operator_client.get("/signals").get_data(as_text=True)
    assert "<code>payment_confirmed</code> · 1 waiting" in inbox
    assert f"#{parked.id}" in inbox


def test_logout_page_on_get_changes_nothing(operator_client):
    page = operator_client.get("/logout")
    assert page.status_code == 200 and ">Log out</button>" in page.get_data(as_text=True)
    assert operator_client.get("/").status_code == 200  # still logged in


def test_list_page_query_count_does_not_grow_with_rows(app, operator_client, make_workflow):
    with app.app_context():
        engine = db.engine
    statements: list[str] = []

    def record(conn, cursor, statement, *args):  # type: ignore[no-untyped-def]
        statements.append(statement)

    counts = []
    for batch in (2, 6):
        for _ in range(batch):
            make_workflow(run=True)  # paused after an error: the costliest why line
        statements.clear()
        event.listen(engine, "before_cursor_execute", record)
        try:
            assert operator_client.get("/workflows", headers=HTMX).status_code == 200
        finally:
            event.remove(engine, "before_cursor_execute", record)
        counts.append(len(statements))
    assert counts[0] == counts[1], counts
