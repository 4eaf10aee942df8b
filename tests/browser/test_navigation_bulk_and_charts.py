"""Navigation at phone width, the overview's cards against their lists, refreshes that pause,
bulk actions over many workflows, the charts' time axis, the list by keyboard, the colour
scheme switch, audit batches and refused signals: each performed in Chromium on the demo the
way an on-call operator meets it, asserting on what they see and on the rows behind it."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, tuple_

from geneva_drive import children, db
from geneva_drive.examples.models import DemoCustomer
from geneva_drive.examples.onboarding import OnboardingWorkflow
from geneva_drive.models import OperatorAction, StepExecution
from geneva_drive.workflow import Workflow
from tests.browser.conftest import login

pytestmark = pytest.mark.browser

BASE_HTML = Path(__file__).resolve().parents[2] / "templates" / "base.html"


def _nav_in_base_html() -> list[str]:
    """The main menu's labels as base.html lists them (its ``('endpoint', 'Label')`` pairs)."""
    text = BASE_HTML.read_text()
    menu = text[text.index('<nav class="main"') : text.index("</nav>")]
    return re.findall(r"\('[\w.]+', '([^']+)'\)", menu)


def _number(text: str | None) -> int:
    found = re.search(r"[\d,]+", text or "")
    assert found, text
    return int(found.group(0).replace(",", ""))


def _seconds(text: str) -> float:
    """ "late by 3 min" → 180 (the dashboard's duration format)."""
    found = re.search(r"late by ([\d.]+) (ms|s|min|h|d)", text)
    assert found, text
    factor = {"ms": 0.001, "s": 1, "min": 60, "h": 3600, "d": 86400}[found.group(2)]
    return float(found.group(1)) * factor


# --- 3: the menu at 390 px ----------------------------------------------------------------------


def _reachable(control: Any, where: str) -> None:
    """``control`` is on the 390 x 844 screen, unscrolled, and not covered: a tap at its centre
    lands on it."""
    box = control.bounding_box()
    assert box is not None, (where, "hidden")
    assert box["x"] >= 0 and box["x"] + box["width"] <= 390, (where, box)
    assert box["y"] >= 0 and box["y"] + box["height"] <= 844, (where, box)
    on_top = control.evaluate(
        """(e, [x, y]) => { const hit = document.elementFromPoint(x, y);
                           return hit === e || e.contains(hit); }""",
        [box["x"] + box["width"] / 2, box["y"] + box["height"] / 2],
    )
    assert on_top, (where, "covered")


def test_every_navigation_link_is_reachable_at_390_px(live_server, phone_page):
    """Every page of the main menu, opened from the menu itself; on each, every link of the
    menu and Log out on the first screen. The menu is read from the page (and must be the one
    base.html lists), so a link added later is checked too."""
    page = phone_page
    base = live_server.url
    login(page, base, "olga")
    menu = page.get_by_role("navigation", name="Main").get_by_role("link")
    labels = [text.strip() for text in menu.all_inner_texts()]
    assert labels == _nav_in_base_html(), labels
    assert "Limits" in labels and len(labels) >= 8, labels
    hrefs = [str(link.get_attribute("href")) for link in menu.all()]
    assert len(set(hrefs)) == len(hrefs), hrefs
    header = page.locator("header.top")
    for label, href in zip(labels, hrefs, strict=True):
        # Open the page from the menu: the link works, and it is the page to check next.
        header.get_by_role("link", name=label, exact=True).click()
        page.wait_for_url(base + href)
        page.wait_for_load_state("load")
        width = page.evaluate("() => document.documentElement.scrollWidth")
        assert width <= 390, (href, width)
        assert page.get_by_role("navigation", name="Main").get_by_role("link").count() == len(
            labels
        ), href
        for other in labels:
            link = header.get_by_role("link", name=other, exact=True)
            _reachable(link, f"{href}: {other}")
        _reachable(header.get_by_role("button", name="Log out", exact=True), href)
        current = header.locator("[aria-current=page]")
        assert current.inner_text().strip() == label, href


# --- 2: the overview's cards equal their lists --------------------------------------------------


def test_overview_cards_equal_their_lists(live_server, page, frozen_clock, demo_started_at):
    """Read at one held instant, the seed's start (``frozen_clock``): with the real clock the
    demo's rows due during the seed turn overdue once a loaded machine has spent the grace
    on the seed and the browser, more of them than a list page holds, or between a card and
    its list."""
    from playwright.sync_api import expect

    frozen_clock.set(demo_started_at)
    # The demo has no workflow stuck in progress and none unexplained: a card of 0 beside an
    # empty list proves little, so one of each is made (as a crashed worker and a lost row
    # would leave them).
    stuck_id, unexplained_id = _one_stuck_and_one_unexplained(demo_started_at)
    base = live_server.url
    login(page, base, "olga")
    page.goto(f"{base}/")
    paused = _number(page.locator("#stat-paused .n").text_content())
    stuck = _number(page.locator("#stat-stuck .n").text_content())
    unexplained = _number(page.locator("#stat-unexplained .n").text_content())
    links = {
        name: page.locator(f"#stat-{name}").get_attribute("href")
        for name in ("paused", "stuck", "unexplained")
    }
    card = page.locator("#stat-overdue")
    overdue = _number(card.locator(".n").text_content())
    assert overdue > 0
    latest = _seconds(card.inner_text())
    stuck_text = re.search(r"([\d,]+) late by more than", card.inner_text())
    assert stuck_text
    stuck_scheduled = int(stuck_text.group(1).replace(",", ""))
    stranded = _number(page.locator("#stat-stranded .n").text_content())
    waiting = _number(page.locator("#stat-waiting .n").text_content())

    # The overdue card's list: as many rows, the most late first, the first as late as the
    # card says, and as many of them past the stuck threshold as the card counts.
    card.click()
    page.wait_for_url(re.compile(r"due=overdue"))
    rows = page.locator("#results tbody tr")
    expect(rows).to_have_count(overdue)
    lateness = [_seconds(rows.nth(i).inner_text()) for i in range(overdue)]
    assert lateness == sorted(lateness, reverse=True), lateness
    # A few seconds pass between the two reads; the minute-scale figures stay put.
    assert abs(lateness[0] - latest) <= 90, (lateness[0], latest)
    from geneva_drive.config import settings

    threshold = settings.stuck_scheduled_threshold.total_seconds()
    assert sum(1 for s in lateness if s > threshold + 90) <= stuck_scheduled
    assert stuck_scheduled <= sum(1 for s in lateness if s > threshold - 90)

    # The stranded card and the stranded page; the waiting card and the inbox.
    page.goto(f"{base}/stranded")
    groups = page.locator("#stranded section.card h2")
    assert sum(_number(re.sub(r"^.*· ", "", t)) for t in groups.all_inner_texts()) == stranded
    page.goto(f"{base}/signals")
    headings = page.locator("#signals-inbox section.card h3").all_inner_texts()
    assert sum(_number(h.split("·")[1]) for h in headings) == waiting

    # The paused, stuck and unexplained cards and the lists they link to (every page of them).
    paused_ids = _listed_ids(page, base + str(links["paused"]))
    assert paused > 0 and len(paused_ids) == paused, (paused, paused_ids)
    with db.new_session() as session:
        states = set(session.scalars(select(Workflow.state).where(Workflow.id.in_(paused_ids))))
    assert states == {"paused"}, states
    assert _listed_ids(page, base + str(links["stuck"])) == [stuck_id]
    assert stuck == 1
    page.goto(base + str(links["unexplained"]))
    page.wait_for_url(f"{base}/unexplained")
    found = {
        int(_number(text.split("#")[1]))
        for text in page.locator("#unexplained tbody tr td:first-child").all_inner_texts()
    }
    assert found == {unexplained_id}, found
    assert unexplained == len(found)


def _one_stuck_and_one_unexplained(now: datetime) -> tuple[int, int]:
    """A performing workflow whose step started two hours before ``now`` (stuck in progress),
    and a ready one, settled an hour ago, whose scheduled execution is gone (unexplained)."""
    with db.transaction() as session:
        running = session.scalars(
            select(StepExecution)
            .where(StepExecution.state == "in_progress")
            .order_by(StepExecution.id)
        ).first()
        assert running is not None
        running.started_at = now - timedelta(hours=2)
        lost = session.scalars(
            select(StepExecution)
            .join(Workflow, Workflow.id == StepExecution.workflow_id)
            .where(
                Workflow.type == "OnboardingWorkflow",
                Workflow.state == "ready",
                StepExecution.state == "scheduled",
            )
            .order_by(StepExecution.id)
        ).first()
        assert lost is not None
        lost.state = "canceled"
        lost.canceled_at = now - timedelta(hours=1)
        workflow = session.get(Workflow, lost.workflow_id)
        assert workflow is not None
        workflow.transitioned_at = now - timedelta(hours=1)
        return running.workflow_id, lost.workflow_id


def _listed_ids(page: Any, url: str) -> list[int]:
    """The workflow ids of a list, following its pager to the last page."""
    ids: list[int] = []
    page.goto(url)
    while True:
        boxes = page.locator("#results tbody input[name=ids]")
        ids += [int(box.get_attribute("value") or 0) for box in boxes.all()]
        older = page.locator("nav.pager a", has_text="Older")
        if not older.count():
            return ids
        page.goto(page.url.split("/workflows")[0] + str(older.get_attribute("href")))


# --- 4: a paused refresh says so and can be resumed ---------------------------------------------


def test_a_paused_refresh_says_why_and_resumes(live_server, scheme_page):
    from playwright.sync_api import expect

    page = scheme_page
    base = live_server.url
    login(page, base, "olga")
    page.goto(f"{base}/workflows?class=OnboardingWorkflow")
    status = page.locator("#refresh-text")
    toggle = page.locator("#refresh-toggle")
    expect(status).to_contain_text("Live · updated")
    expect(toggle).to_have_text("Pause")

    page.locator("input[name=ids]").first.check()
    expect(status).to_have_text("Live updates paused: 1 row selected")
    expect(toggle).to_have_text("Resume")

    # A new workflow arrives while paused: the list does not announce it.
    with db.transaction() as session:
        hero = DemoCustomer(email="late-arrival@example.com")
        session.add(hero)
        session.flush()
        OnboardingWorkflow.create(hero=hero, session=session)
    page.wait_for_timeout(2500)  # two poll periods (POLL_SECONDS=1 in the browser tests)
    expect(page.locator("#show-newer")).to_have_count(0)

    # Resume: the refresh runs again (the selection stays ticked) and the new row is announced.
    toggle.click()
    expect(status).to_contain_text("Live · updated")
    expect(page.locator("#show-newer")).to_contain_text("1 newer workflow")
    expect(page.locator("input[name=ids]").first).to_be_checked()

    # Pausing by hand says so too, and resumes the same way.
    toggle.click()
    expect(status).to_have_text("Live updates paused by you")
    toggle.click()
    expect(status).to_contain_text("Live · updated")

    # A finished workflow's page does not pretend to be live.
    with db.new_session() as session:
        finished = session.scalar(select(Workflow.id).where(Workflow.state == "finished"))
    page.goto(f"{base}/workflows/{finished}")
    expect(status).to_contain_text("Not live")
    expect(toggle).to_be_hidden()
    # Nor does it say "finished" twice (badge and why line).
    expect(page.locator("#why-line")).to_have_text("nothing left to run")


# --- 6: above 100 the confirm asks for the count -----------------------------------------------


def test_a_bulk_action_over_100_asks_for_the_count(live_server, scheme_page):
    from playwright.sync_api import expect

    page = scheme_page
    base = live_server.url
    login(page, base, "olga")
    page.goto(f"{base}/workflows?state=ready")  # every class: well over 100 to pause
    page.get_by_label("All matching the filter").check()
    page.get_by_role("button", name="Pause selected").click()
    count = _number(page.locator("#bulk-count").text_content())
    assert count > 100
    dialog = page.locator("#bulk-dialog")
    typed = dialog.get_by_label(f"Type {count} to confirm")
    confirm = dialog.get_by_role("button", name=f"Pause {count:,} workflows")
    # Focus is on the field, not on the button; the button does nothing until the count is in.
    expect(typed).to_be_focused()
    expect(confirm).to_be_disabled()
    page.keyboard.press("Enter")
    expect(dialog).to_be_visible()
    with db.new_session() as session:
        assert session.scalar(select(Workflow.id).where(Workflow.state == "paused")) is not None
        paused_before = len(
            list(session.scalars(select(Workflow.id).where(Workflow.state == "paused")))
        )
    typed.fill(str(count - 1))
    expect(confirm).to_be_disabled()
    typed.fill(f"{count:,}")
    expect(confirm).to_be_enabled()
    confirm.click()
    expect(page.locator("#bulk-done")).to_contain_text("Pause selected:")
    with db.new_session() as session:
        paused_after = len(
            list(session.scalars(select(Workflow.id).where(Workflow.state == "paused")))
        )
    assert paused_after > paused_before

    # Under 100 nothing is asked: one row, focus on the confirm button as before.
    page.goto(f"{base}/workflows?class=PaymentWorkflow&state=paused")
    page.locator("input[name=ids]").nth(0).check()
    page.get_by_role("button", name="Resume selected", exact=True).click()
    expect(page.locator("#typed-count")).to_have_count(0)
    expect(dialog.get_by_role("button", name="Resume 1 workflow")).to_be_focused()


def test_a_bulk_preview_over_a_mixed_selection_counts_only_the_eligible(live_server, scheme_page):
    """Resume over two paused, two ready and one canceled row: the preview counts the two it
    will resume and says why the other three will not be done; confirmed, exactly the two
    change, on the page and in the database."""
    from playwright.sync_api import expect

    page = scheme_page
    base = live_server.url
    login(page, base, "olga")
    page.goto(f"{base}/workflows?class=PaymentWorkflow")
    page.wait_for_load_state("load")
    on_screen = [
        int(box.get_attribute("value") or 0)
        for box in page.locator("#results tbody input[name=ids]").all()
    ]
    with db.new_session() as session:
        state_of = dict(
            session.execute(
                select(Workflow.id, Workflow.state).where(Workflow.id.in_(on_screen))
            ).all()
        )
    by_state = {
        state: [i for i in on_screen if state_of[i] == state]
        for state in ("paused", "ready", "canceled")
    }
    assert all(len(by_state[s]) >= 2 for s in ("paused", "ready")), by_state
    paused, ready, canceled = (
        by_state["paused"][:2],
        by_state["ready"][:2],
        by_state["canceled"][:1],
    )
    assert canceled, by_state
    picked = [*paused, *ready, *canceled]
    for workflow_id in picked:
        page.locator(f"#results input[name=ids][value='{workflow_id}']").check()
    page.get_by_role("button", name="Resume selected", exact=True).click()

    dialog = page.locator("#bulk-dialog")
    expect(dialog.locator("#bulk-count")).to_have_text("2 workflows will be resumed.")
    refused = dialog.locator("#bulk-refused")
    expect(refused).to_contain_text("3 will not be done:")
    expect(refused).to_contain_text("2 ready (only a paused workflow can be resumed)")
    expect(refused).to_contain_text("1 canceled")
    # The sample is of what will be done, not of the whole selection.
    sample = dialog.locator("p.small", has_text="Sample:").get_by_role("link")
    expect(sample).to_have_count(2)
    assert sorted(_number(t) for t in sample.all_inner_texts()) == sorted(paused)
    confirm = dialog.get_by_role("button", name="Resume 2 workflows", exact=True)
    expect(confirm).to_be_focused()
    with db.new_session() as session:
        before = dict(
            session.execute(
                select(Workflow.id, Workflow.transitioned_at).where(Workflow.id.in_(picked))
            ).all()
        )
    confirm.click()

    done = page.locator("#bulk-done")
    expect(done).to_contain_text("Resume selected: 2 done, 3 refused")
    # The list behind the dialog is brought up to date: the two resumed rows are not paused.
    for workflow_id in paused:
        expect(page.locator(f"#wf-{workflow_id} td[data-label=State]")).not_to_contain_text(
            "paused"
        )
    with db.new_session() as session:
        after = {
            row.id: (row.state, row.transitioned_at)
            for row in session.scalars(select(Workflow).where(Workflow.id.in_(picked)))
        }
        batch = session.scalars(
            select(OperatorAction)
            .where(OperatorAction.action == "bulk_resume")
            .order_by(OperatorAction.id.desc())
        ).first()
        assert batch is not None
        assert sorted(batch.params["done_ids"]) == sorted(paused)
        assert sorted(batch.params["refused_ids"]) == sorted([*ready, *canceled])
    assert all(after[i][0] == "ready" for i in paused), after
    assert all(after[i] == ("ready", before[i]) for i in ready), (after, before)
    assert after[canceled[0]] == ("canceled", before[canceled[0]])


# --- 5: a stranded workflow's detail ------------------------------------------------------------


def test_the_stranded_detail_offers_no_plain_resume(live_server, scheme_page):
    from playwright.sync_api import expect

    page = scheme_page
    base = live_server.url
    login(page, base, "olga")
    with db.new_session() as session:
        stranded = session.scalar(
            select(StepExecution.workflow_id)
            .where(StepExecution.step_name == "send_sms", StepExecution.state == "failed")
            .order_by(StepExecution.workflow_id)
        )
    page.goto(f"{base}/workflows/{stranded}")
    expect(page.locator("#wf-title")).to_contain_text("stranded")
    actions = page.locator(".actions")
    expect(actions.get_by_role("button", name="Resume", exact=True)).to_have_count(0)
    expect(actions.get_by_role("button", name="Resume at")).to_be_visible()
    # "Next step" does not contradict "stranded on": it names the missing step, no other.
    next_step = page.locator("#wf-next-step")
    expect(next_step).to_contain_text("stranded on send_sms")
    expect(next_step).not_to_contain_text("send_welcome")
    expect(next_step.get_by_role("link", name="the stranded drain")).to_be_visible()


# --- 7: charts ------------------------------------------------------------------------------------


def test_charts_have_a_time_axis_and_a_marked_partial_bucket(live_server, scheme_page):
    from playwright.sync_api import expect

    page = scheme_page
    base = live_server.url
    login(page, base, "olga")
    for trend in page.locator("section.trend").all():
        chart = trend.locator("figure").first
        labels = chart.locator(".time-axis span").all_inner_texts()
        assert len(labels) >= 5, labels
        # Clock times in UTC, and the right edge, the end of the window, is "now".
        assert all(re.fullmatch(r"\d\d:\d\d", label) for label in labels[:-1]), labels
        assert labels[-1] == "now", labels
        expect(chart.locator("line.tick")).to_have_count(len(labels))
        # Exactly one bar is the current bucket, marked as such, and the caption says it.
        expect(chart.locator("g.bar.partial")).to_have_count(1)
        expect(chart.locator("g.bar").last).to_have_class(re.compile(r"\bpartial\b"))
        expect(chart.locator("g.bar.partial title")).to_contain_text("so far")
        expect(chart.locator("figcaption")).to_contain_text("still filling")
    # The demo's day of history: the day chart has bars in many hours, failures among them.
    day = page.locator("section.trend").nth(1).locator("figure").first
    filled = day.locator("g.bar:has(rect[class^=k-])").count()
    assert filled >= 12, filled
    expect(day.locator("figcaption")).not_to_contain_text(" 0 failed")


# --- the list by keyboard -------------------------------------------------------------------------


def test_the_list_by_keyboard(live_server, page):
    from playwright.sync_api import expect

    base = live_server.url
    login(page, base, "olga")
    page.goto(f"{base}/workflows?class=PaymentWorkflow")
    # The skip links: the second one jumps past the filters and the bulk bar.
    presses = 0
    first_box = page.locator("input[name=ids]").first
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to the list")).to_be_focused()
    page.keyboard.press("Enter")
    while presses < 6 and not first_box.evaluate("e => e === document.activeElement"):
        page.keyboard.press("Tab")
        presses += 1
    expect(first_box).to_be_focused()
    assert presses <= 2, presses

    # j/k move, x selects, Enter opens; / searches; ? lists the shortcuts.
    page.locator("h1").click()
    page.keyboard.press("j")
    page.keyboard.press("j")
    rows = page.locator("#results tbody tr")
    expect(rows.nth(1)).to_have_class(re.compile("kb-current"))
    page.keyboard.press("k")
    expect(rows.nth(0)).to_have_class(re.compile("kb-current"))
    page.keyboard.press("x")
    expect(rows.nth(0).locator("input[name=ids]")).to_be_checked()
    page.keyboard.press("x")
    expect(rows.nth(0).locator("input[name=ids]")).not_to_be_checked()
    page.locator("h1").click()
    page.keyboard.press("/")
    expect(page.locator("#f-q")).to_be_focused()
    page.keyboard.press("Escape")
    page.locator("h1").click()
    page.keyboard.press("?")
    expect(page.locator("#kbd-help")).to_be_visible()
    expect(page.locator("#kbd-help")).to_contain_text("select or unselect")


# --- the scheme switch ----------------------------------------------------------------------------


def test_the_scheme_switch_overrides_the_system_and_is_remembered(live_server, browser):
    from playwright.sync_api import expect

    context = browser.new_context(color_scheme="dark")
    page = context.new_page()
    base = live_server.url
    login(page, base, "olga")
    switch = page.locator("#theme-switch")
    expect(switch).to_have_text("Theme: auto")

    def background() -> str:
        return str(
            page.evaluate("() => getComputedStyle(document.documentElement).backgroundColor")
        )

    dark = background()
    switch.click()
    expect(switch).to_have_text("Theme: light")
    assert background() != dark
    page.goto(f"{base}/workflows")  # remembered across pages (localStorage)
    expect(page.locator("#theme-switch")).to_have_text("Theme: light")
    assert page.evaluate("() => document.documentElement.dataset.theme") == "light"
    page.locator("#theme-switch").click()
    expect(page.locator("#theme-switch")).to_have_text("Theme: dark")
    page.locator("#theme-switch").click()
    expect(page.locator("#theme-switch")).to_have_text("Theme: auto")
    assert background() == dark
    context.close()


# --- the audit's batch rows ---------------------------------------------------------------------


def test_an_audit_batch_row_links_to_its_workflows(live_server, page):
    from playwright.sync_api import expect

    base = live_server.url
    login(page, base, "olga")
    page.goto(f"{base}/workflows?class=PaymentWorkflow&state=ready")
    boxes = page.locator("input[name=ids]")
    ids = [int(boxes.nth(i).get_attribute("value") or 0) for i in range(2)]
    boxes.nth(0).check()
    boxes.nth(1).check()
    page.get_by_role("button", name="Pause selected").click()
    page.locator("#bulk-dialog").get_by_role("button", name="Pause 2 workflows").click()
    expect(page.locator("#bulk-done")).to_contain_text("2 done")
    page.goto(f"{base}/audit")
    batch = page.locator("#audit tbody tr", has_text="Pause selected").first
    link = batch.get_by_role("link", name=re.compile(r"batch"))
    link.click()
    expect(page.locator("#audit-batch")).to_contain_text("The workflows of batch")
    table = page.locator("#audit tbody")
    expect(table.locator("tr")).to_have_count(2)
    for workflow_id in ids:
        expect(table.get_by_role("link", name=f"#{workflow_id}", exact=True)).to_be_visible()


# --- 8: the signal inbox --------------------------------------------------------------------------


def test_a_refused_signal_keeps_what_was_typed_next_to_the_form(live_server, page):
    from playwright.sync_api import expect

    base = live_server.url
    login(page, base, "olga")
    page.goto(f"{base}/signals")
    row = page.locator("#signals-inbox section.card:not(.paused-group) tbody tr").first
    target = int((row.locator("a").first.text_content() or "#0").lstrip("#"))
    row.locator("summary", has_text="Send signal").click()
    row.get_by_label("Payload (JSON)").fill('{"amount_cents": 12')
    row.get_by_label("Idempotency key").fill("evt-typed-by-hand")
    row.get_by_role("button", name="Send signal").click()

    # The reason sits inside that waiter's form, which stays open with everything typed.
    row = page.locator(f"#waiter-{target}")
    error = row.locator(f"#signal-error-{target}")
    expect(error).to_contain_text("not valid JSON")
    expect(row.locator("details.signal-form")).to_have_attribute("open", "")
    expect(row.get_by_label("Payload (JSON)")).to_have_value('{"amount_cents": 12')
    expect(row.get_by_label("Idempotency key")).to_have_value("evt-typed-by-hand")
    with db.new_session() as session:
        assert session.scalar(
            select(StepExecution.state).where(
                StepExecution.workflow_id == target, StepExecution.state == "waiting"
            )
        )

    # Fixed in place, it goes through.
    row.get_by_label("Payload (JSON)").fill('{"amount_cents": 12}')
    row.get_by_role("button", name="Send signal").click()
    expect(page.locator("#inbox-message")).to_contain_text("delivered")

    # The detail page's form keeps it too (on a workflow waiting for a signal: the demo's
    # fulfilment parents wait in `waiting` too, for their children).
    with db.new_session() as session:
        other = session.scalar(
            select(StepExecution.workflow_id)
            .join(Workflow, Workflow.id == StepExecution.workflow_id)
            .where(
                StepExecution.state == "waiting",
                Workflow.state == "ready",
                ~tuple_(Workflow.type, StepExecution.step_name).in_(children.join_steps()),
            )
            .order_by(StepExecution.workflow_id.desc())
        )
    page.goto(f"{base}/workflows/{other}")
    page.locator("summary", has_text="Send signal").click()
    page.get_by_label("Payload (JSON)").fill("[1, 2,")
    page.locator("details.signal-form").get_by_role("button", name="Send signal").click()
    expect(page.locator(f"#signal-error-{other}")).to_contain_text("not valid JSON")
    expect(page.get_by_label("Payload (JSON)")).to_have_value("[1, 2,")
