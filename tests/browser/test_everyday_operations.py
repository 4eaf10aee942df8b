"""The everyday operations: the overdue grace, the signal inbox, the confirm dialog by keyboard,
refreshes that keep what the operator opened, bulk previews, failure groups, the phone layout
and the trend charts, each performed the way an on-call operator does it, in Chromium on the
demo data, asserting on what the operator sees and on the rows the action changed."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, tuple_

from geneva_drive import children, db, executor
from geneva_drive.config import settings
from geneva_drive.models import Signal, StepExecution, utcnow
from geneva_drive.workflow import Workflow
from tests.browser.conftest import login, open_first, screenshot

pytestmark = pytest.mark.browser


def _one(stmt: Any) -> Any:
    with db.new_session() as session:
        return session.scalar(stmt)


def _workflow(workflow_id: int) -> Workflow:
    with db.new_session() as session:
        workflow = session.get(Workflow, workflow_id)
        assert workflow is not None
        session.expunge(workflow)
        return workflow


def _first_id(page: Any) -> int:
    link = page.locator("#results tbody a").first
    return int((link.text_content() or "#0").lstrip("#"))


def _waiting_ids(state: str) -> list[int]:
    with db.new_session() as session:
        return list(
            session.scalars(
                select(StepExecution.workflow_id)
                .join(Workflow, Workflow.id == StepExecution.workflow_id)
                .where(StepExecution.state == "waiting", Workflow.state == state)
                .order_by(StepExecution.workflow_id)
            )
        )


# --- 3: overdue means late beyond a grace, and says by how much ---------------------------------


def test_overdue_has_a_grace_and_says_how_late(live_server, page, frozen_clock, demo_started_at):
    """The dashboard reads a held clock (``frozen_clock``), set to the seed's start: with the
    real one, the demo's rows due during the seed turn overdue once a loaded machine has spent
    the grace on the seed and the browser (93 overdue rows, a list of 50), or between the
    overview's count and the list behind it; so might the feed resumed here."""
    from playwright.sync_api import expect

    frozen_clock.set(demo_started_at)
    base = live_server.url
    login(page, base, "olga")
    # A paused feed resumed now is due now: not red, not counted as overdue.
    page.goto(f"{base}/workflows?class=FeedImportWorkflow&state=paused")
    open_first(page)
    workflow_id = int(re.search(r"/workflows/(\d+)", page.url).group(1))  # type: ignore[union-attr]
    page.get_by_role("button", name="Resume", exact=True).click()
    expect(page.locator("#wf-state")).to_have_text("ready")
    # Later than the dispatch interval, within the grace: still due now, not overdue.
    frozen_clock.advance(settings.overdue_after - timedelta(seconds=1))
    page.reload()
    expect(page.locator("#why-line")).to_have_text("parse due now")
    expect(page.locator("#wf-title")).not_to_contain_text("overdue")
    assert _workflow(workflow_id).state == "ready"

    # The overview's count and the list behind its card agree, and each row says how late.
    page.goto(f"{base}/")
    card = page.locator("#stat-overdue")
    count = int((card.locator(".n").text_content() or "0").replace(",", ""))
    expect(card).to_contain_text(f"due more than {int(settings.overdue_after.total_seconds())} s")
    expect(card).to_contain_text("the latest is late by")
    card.click()
    rows = page.locator("#results tbody tr")
    expect(rows).to_have_count(count)
    for i in range(count):
        expect(rows.nth(i)).to_contain_text(re.compile(r"overdue, late by \d+ (s|min|h)"))
    assert all(
        f"#{workflow_id}" != (rows.nth(i).locator("a").first.text_content() or "")
        for i in range(count)
    )
    screenshot(page, "workflows-overdue", full_page=False)


# --- 4: the signal inbox keeps paused waiters apart ------------------------------------------


def test_signal_inbox_keeps_paused_waiters_apart_and_sends_in_place(live_server, page):
    from playwright.sync_api import expect

    paused = _waiting_ids("paused")
    ready = _waiting_ids("ready")
    assert paused and ready
    base = live_server.url
    login(page, base, "olga")
    page.goto(f"{base}/signals")
    held = page.locator("section.paused-group")
    expect(page.locator("#paused-waiters")).to_have_text("Waiters of paused workflows")
    expect(page.locator("#signals-inbox")).to_contain_text("A signal sent now is stored (pending)")
    for workflow_id in paused:
        expect(held.locator(f"#waiter-{workflow_id}")).to_contain_text("paused")
    first_active = page.locator("section.card:not(.paused-group)").first
    for workflow_id in ready[:3]:
        expect(first_active.locator(f"#waiter-{workflow_id}")).to_be_visible()

    # Send from the inbox: the inbox updates in place (no reload) and the waiter leaves it.
    page.evaluate("() => { window.__no_reload = true; }")
    target = ready[0]
    row = page.locator(f"#waiter-{target}")
    row.locator("summary", has_text="Send signal").click()
    expect(row.get_by_label("Name")).to_have_value("payment_confirmed")
    row.get_by_label("Payload (JSON)").fill('{"amount_cents": 4200}')
    row.get_by_role("button", name="Send signal").click()
    expect(page.locator("#inbox-message")).to_contain_text(f"#{target}: Signal payment_confirmed")
    expect(page.locator(f"#waiter-{target}")).to_have_count(0)
    assert page.evaluate("() => window.__no_reload") is True
    signal = _one(select(Signal).where(Signal.workflow_id == target))
    assert signal is not None and signal.payload_json == {"amount_cents": 4200}
    assert target not in _waiting_ids("ready")


# --- 5: the cancel dialog, by keyboard ----------------------------------------------------------


def test_cancel_dialog_by_keyboard_names_the_action_and_focuses_back(live_server, page):
    from playwright.sync_api import expect

    base = live_server.url
    login(page, base, "olga")
    page.goto(f"{base}/workflows?class=PaymentWorkflow&state=ready")
    open_first(page)
    workflow_id = int(re.search(r"/workflows/(\d+)", page.url).group(1))  # type: ignore[union-attr]
    cancel = page.get_by_role("button", name="Cancel", exact=True)
    expect(cancel).to_have_class(re.compile("danger"))
    cancel.focus()
    page.keyboard.press("Enter")
    dialog = page.locator("#confirm-dialog")
    expect(dialog).to_be_visible()
    confirm = dialog.get_by_role("button", name=f"Cancel workflow #{workflow_id}")
    expect(confirm).to_have_class(re.compile("danger"))
    expect(dialog.get_by_role("button", name="Back")).to_be_focused()
    screenshot(page, "cancel-dialog", full_page=False)
    # Enter-Enter: the second Enter lands on Back, so nothing is canceled.
    page.keyboard.press("Enter")
    expect(dialog).to_be_hidden()
    page.wait_for_timeout(500)
    assert _workflow(workflow_id).state == "ready"
    expect(page.locator("#wf-state")).to_have_text("ready")

    # Tab to the named confirm button, then Enter: canceled, shown in place.
    cancel.focus()
    page.keyboard.press("Enter")
    expect(dialog.get_by_role("button", name="Back")).to_be_focused()
    page.keyboard.press("Tab")
    expect(confirm).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#wf-state")).to_have_text("canceled")
    assert _workflow(workflow_id).state == "canceled"


# --- 6: a refresh keeps what the operator is doing ------------------------------------------


def _wait_for_polls(page: Any, path: str, n: int = 2) -> None:
    for _ in range(n):
        with page.expect_response(
            lambda r: (
                r.request.method == "GET"
                and r.url.split("?")[0].endswith(path)
                and r.request.headers.get("hx-request") == "true"
            )
        ):
            pass


def test_refresh_keeps_open_backtrace_focus_scroll_and_does_not_push_rows(live_server, page):
    from playwright.sync_api import expect

    base = live_server.url
    login(page, base, "olga")
    page.set_viewport_size({"width": 1280, "height": 500})
    page.goto(f"{base}/workflows?class=FeedImportWorkflow&state=paused")
    open_first(page)
    path = re.search(r"(/workflows/\d+)", page.url).group(1)  # type: ignore[union-attr]
    error = page.locator(".error-block").first
    error.locator("summary", has_text="Backtrace").click()
    expect(error.locator("pre")).to_be_visible()
    resume = page.get_by_role("button", name="Resume", exact=True)
    resume.focus()
    page.mouse.wheel(0, 200)
    page.wait_for_timeout(300)
    scrolled = page.evaluate("() => window.scrollY")
    assert scrolled > 0
    _wait_for_polls(page, path)
    expect(error.locator("details")).to_have_attribute("open", "")
    expect(error.locator("pre")).to_be_visible()
    expect(resume).to_be_focused()
    assert page.evaluate("() => window.scrollY") == scrolled

    # The list: a new workflow does not push the rows being read; it is announced instead.
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"{base}/workflows?class=OnboardingWorkflow")
    top = _first_id(page)
    from geneva_drive.examples import seed
    from geneva_drive.examples.models import DemoCustomer
    from geneva_drive.examples.onboarding import OnboardingWorkflow

    newest = seed._create(OnboardingWorkflow, DemoCustomer(email="late@example.com"))
    expect(page.locator("#show-newer")).to_have_text("1 newer workflow: show them")
    assert _first_id(page) == top
    page.locator("#show-newer").click()
    expect(page.locator("#results tbody a").first).to_have_text(f"#{newest}")


# --- 7: the bulk preview appears where the operator is looking -------------------------------


def test_bulk_preview_is_on_screen_from_the_bottom_of_a_long_page(live_server, page):
    from playwright.sync_api import expect

    base = live_server.url
    login(page, base, "olga")
    page.goto(f"{base}/workflows?class=OnboardingWorkflow&state=ready")
    boxes = page.locator("input[name=ids]")
    expect(boxes).to_have_count(50)
    chosen = [int(boxes.nth(i).get_attribute("value") or 0) for i in (48, 49)]
    boxes.nth(48).check()
    boxes.nth(49).check()
    assert page.evaluate("() => window.scrollY") > 1000
    page.get_by_role("button", name="Pause selected").click()
    count = page.locator("#bulk-count")
    expect(count).to_have_text("2 workflows will be paused.")
    box = count.bounding_box()
    assert box is not None and 0 <= box["y"] <= 900 - box["height"], box
    page.locator("#bulk-dialog").get_by_role("button", name="Pause 2 workflows").click()
    expect(page.locator("#bulk-done")).to_contain_text("Pause selected: 2 done.")
    assert {_workflow(i).state for i in chosen} == {"paused"}


# --- 8: the overview's totals, the failure window, reattempt a group -----------------------


def test_overview_totals_and_reattempting_a_failure_group(live_server, page):
    from playwright.sync_api import expect

    base = live_server.url
    login(page, base, "olga")
    paused = _one(select(func.count()).select_from(Workflow).where(Workflow.state == "paused"))
    # Steps waiting for a signal: the demo's fulfilment parents wait in `waiting` too, for their
    # children, and are neither in the inbox nor in its card.
    waiting = _one(
        select(func.count())
        .select_from(StepExecution)
        .join(Workflow, Workflow.id == StepExecution.workflow_id)
        .where(
            StepExecution.state == "waiting",
            ~tuple_(Workflow.type, StepExecution.step_name).in_(children.join_steps()),
        )
    )
    expect(page.locator("#stat-paused .n")).to_have_text(str(paused))
    expect(page.locator("#stat-waiting .n")).to_have_text(str(waiting))
    expect(page.locator("#failures-title")).to_have_text(
        "Failures in the last 1h by step and error class"
    )
    expect(page.locator("#overview-failures")).to_contain_text("ValueError")
    page.get_by_role("navigation", name="Failure window").get_by_role(
        "link", name="last 24h"
    ).click()
    expect(page.locator("#failures-title")).to_contain_text("last 24h")

    page.get_by_role("link", name="Failure triage").click()
    # A click waits only for the navigation to start (open_first): clicked before the page's
    # deferred htmx has run, "Reattempt this group" is a plain link to the bulk page, which
    # has no dialog (seen on a loaded machine). wait_for_url waits for the load event.
    page.wait_for_url(re.compile(r"/failures"))
    group = page.locator("#failures tbody tr", has_text="ValueError")
    broken = _one(
        select(func.count())
        .select_from(Workflow)
        .where(Workflow.type == "FeedImportWorkflow", Workflow.state == "paused")
    )
    group.get_by_role("button", name="Reattempt this group").click()
    expect(page.locator("#bulk-count")).to_have_text(f"{broken} workflows will be reattempted.")
    page.locator("#bulk-dialog").get_by_role("button", name=f"Reattempt {broken} workflows").click()
    expect(page.locator("#bulk-done")).to_contain_text(f"Reattempt selected: {broken} done.")
    assert (
        _one(
            select(func.count())
            .select_from(Workflow)
            .where(Workflow.type == "FeedImportWorkflow", Workflow.state == "paused")
        )
        == 0
    )


# --- 9: wording ---------------------------------------------------------------------------------


def test_text_is_text_and_stranded_and_skipped_steps_are_named(live_server, page):
    from playwright.sync_api import expect

    base = live_server.url
    login(page, base, "olga")
    for path in ("/workflows?state=paused", "/workflows?class=OnboardingWorkflow", "/signals"):
        page.goto(base + path)
        text = page.locator("main").inner_text()
        assert "`" not in text, path
        assert "scheduled for in" not in text and "scheduled in 0 s" not in text, path

    # A stranded workflow: the why line says so, the plan marks the missing step.
    page.goto(f"{base}/workflows?class=OnboardingWorkflow&stranded=send_sms")
    open_first(page)
    expect(page.locator("#why-line")).to_have_text("stranded: step send_sms is no longer defined")
    expect(page.locator("#why-line code")).to_have_text("send_sms")
    plan = page.locator("ol.plan")
    expect(plan.locator("li", has_text="send_sms")).to_contain_text("stranded here")
    expect(plan.locator("li[aria-current=step]")).to_have_count(0)

    # Skip a failed step: the plan shows it skipped, not failed; the toast has no backticks.
    page.goto(f"{base}/workflows?class=FeedImportWorkflow&state=paused")
    open_first(page)
    workflow_id = int(re.search(r"/workflows/(\d+)", page.url).group(1))  # type: ignore[union-attr]
    page.get_by_role("button", name="Skip", exact=True).click()
    page.locator("#confirm-dialog").get_by_role(
        "button", name=f"Skip the step of workflow #{workflow_id}"
    ).click()
    expect(page.locator("#toasts")).to_contain_text("Skipped parse.")
    expect(plan.locator("li", has_text="parse")).to_contain_text("skipped")
    expect(page.locator("#timeline")).to_contain_text("due ")
    assert _workflow(workflow_id).next_step_name == "publish"


# --- 10: consistency: every page refreshes, the Name is filled, phone width ------------------


def test_every_page_refreshes_and_the_signal_name_starts_filled(live_server, page):
    from playwright.sync_api import expect

    base = live_server.url
    login(page, base, "olga")
    for path in ("/stranded", "/failures", "/audit", "/definitions"):
        page.goto(base + path)
        _wait_for_polls(page, path, n=1)

    page.goto(f"{base}/workflows/{_waiting_ids('ready')[0]}")
    page.get_by_text("Send signal").first.click()
    expect(page.locator("#wf-live").get_by_label("Name")).to_have_value("payment_confirmed")


def test_phone_width_shows_the_list_on_the_first_screen(live_server, phone_page):
    from playwright.sync_api import expect

    page = phone_page
    base = live_server.url
    login(page, base, "olga")
    page.goto(f"{base}/workflows?state=paused")
    header = page.locator("header.top").bounding_box()
    assert header is not None and header["height"] < 844 * 0.12, header
    first_row = page.locator("#results tbody tr").first
    expect(first_row).to_be_in_viewport()
    # The folded filters open from their summary.
    page.get_by_text("Filters").click()
    expect(page.get_by_label("State", exact=True)).to_be_visible()
    screenshot(page, "mobile-filters", full_page=False)


# --- 11: the demo keeps live waiters for an operator ---------------------------------------


def test_demo_keeps_parked_payments_for_the_operator(live_server, page):
    import random

    from playwright.sync_api import expect

    from geneva_drive.examples import seed

    rng = random.Random(1)
    for _ in range(80):  # far more ticks than there are parked payments
        seed._confirm_a_parked_payment(rng)
    ready = _waiting_ids("ready")
    assert len(ready) >= seed.KEEP_FOR_OPERATOR, ready

    base = live_server.url
    login(page, base, "olga")
    page.goto(f"{base}/signals")
    row = page.locator(f"#waiter-{ready[0]}")
    row.locator("summary", has_text="Send signal").click()
    row.get_by_role("button", name="Send signal").click()
    expect(page.locator("#inbox-message")).to_contain_text("delivered")
    assert ready[0] not in _waiting_ids("ready")


# --- 12: trend charts and durations -------------------------------------------------------------


def test_trend_charts_follow_new_executions(live_server, page):
    from playwright.sync_api import expect

    base = live_server.url
    login(page, base, "olga")
    overall = page.locator("section.trend").first.locator("figure").first
    expect(overall.locator("svg")).to_have_attribute("aria-label", re.compile(r"completed"))
    caption = overall.locator("figcaption")
    before = int(re.search(r"([\d,]+) completed", caption.inner_text()).group(1).replace(",", ""))  # type: ignore[union-attr]

    # A worker finishes three welcome mails; the chart's next refresh counts them.
    with db.new_session() as session:
        due = list(
            session.scalars(
                select(StepExecution.id)
                .where(
                    StepExecution.state == "scheduled",
                    StepExecution.step_name == "send_welcome",
                    StepExecution.scheduled_for <= utcnow(),
                )
                .limit(3)
            )
        )
    assert len(due) == 3
    for execution_id in due:
        executor.execute(execution_id)
    expect(caption).to_contain_text(f"{before + 3:,} completed")

    page.goto(f"{base}/definitions/OnboardingWorkflow")
    expect(page.locator("#durations-title")).to_be_visible()
    expect(page.locator(".dist").first).to_contain_text("median")
