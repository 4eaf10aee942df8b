"""An operator in Chromium on the demo, asking why a wait ended or goes on, in light and dark,
at 1280 and 390 px, with axe-core finding no serious violation on what they looked at:

* a warehouse wave whose lines paused after an error says so first ("4 children paused after
  errors"), each count links to those children, its page has the children by state, and the
  children list shows each child's error message and its parent;
* an abandoned checkout says it timed out waiting for `payment_confirmed` (then cancel), in the
  list and in ``/signals``'s "Recently timed out";
* the day chart's last tick reads "now", not an hour still to come;
* ``/`` searches from any page, the focus ring stands out, the fixed live control at 390 px
  leaves the last row readable, and a failed refresh dims the numbers and says they are stale;
* a burst of executions in one minute is drawn clipped on the hour chart, so the minutes
  around it keep their height;
* a signal sent to a wave waiting for its children is stored pending, and the operator reads
  that nothing waits for it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select

from geneva_drive import db
from geneva_drive.examples.checkout import CheckoutWorkflow
from geneva_drive.examples.fulfilment import WarehouseWaveWorkflow
from geneva_drive.models import Signal, StepExecution, utcnow
from geneva_drive.workflow import Workflow
from tests.browser.conftest import login
from tests.browser.test_accessibility import AXE, _serious, watch

pytestmark = pytest.mark.browser

SCREENS = [("light", 1280), ("dark", 1280), ("light", 390), ("dark", 390)]


@pytest.fixture(params=SCREENS, ids=[f"{s}-{w}" for s, w in SCREENS])
def screen(request, browser) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    scheme, width = request.param
    context = browser.new_context(
        viewport={"width": width, "height": 844 if width < 600 else 900}, color_scheme=scheme
    )
    context.add_init_script(path=str(AXE))
    page = context.new_page()
    errors = watch(page)
    yield page
    context.close()
    # The test's own outage (a refresh refused on purpose) is the only error it expects.
    outage = ("htmx:afterRequest", "htmx:sendError", "net::ERR_FAILED")
    errors = [e for e in errors if not any(o in e for o in outage)]
    assert not errors, f"browser console errors or 5xx answers: {errors}"


def _no_axe_violations(page: Any) -> None:
    found = _serious(page)
    assert not found, found


def _wave() -> tuple[int, dict[int, str]]:
    with db.new_session() as session:
        wave = session.scalar(
            select(Workflow.id).where(Workflow.type == WarehouseWaveWorkflow.workflow_name)
        )
        assert wave is not None
        kids = session.execute(
            select(Workflow.id, Workflow.state).where(Workflow.parent_id == wave)
        )
        return int(wave), {int(i): str(s) for i, s in kids}


def _abandoned_checkout() -> int:
    with db.new_session() as session:
        found = session.scalar(
            select(Workflow.id)
            .where(Workflow.type == CheckoutWorkflow.workflow_name, Workflow.state == "canceled")
            .order_by(Workflow.id)
        )
    assert found is not None
    return int(found)


def test_a_wave_says_its_failed_children_first_and_links_to_them(live_server, screen):
    from playwright.sync_api import expect

    page = screen
    wave, kids = _wave()
    paused = sorted(i for i, s in kids.items() if s == "paused")
    assert len(paused) == 4, kids
    base = live_server.url
    login(page, base, "olga")
    page.goto(f"{base}/workflows?class={WarehouseWaveWorkflow.workflow_name}")
    why = page.locator(f"#wf-{wave} td.why")
    expect(why).to_contain_text("4 children paused after errors: waiting for them since")
    _no_axe_violations(page)

    why.get_by_role("link", name="4 children paused after errors").click()
    expect(page).to_have_url(re.compile(rf"parent={wave}&state=paused&due=failed$"))
    expect(page.locator("#results tbody tr")).to_have_count(4)
    first = page.locator(f"#wf-{paused[0]}")
    expect(first).to_contain_text("paused after LabelPrinterOffline in print_label")
    expect(first).to_contain_text(f"label printer lp-2 did not answer for line #{paused[0]}")
    expect(first).to_contain_text(f"child of #{wave}")
    _no_axe_violations(page)

    first.get_by_role("link", name=f"#{wave}").click()
    expect(page).to_have_url(f"{base}/workflows/{wave}")
    panel = page.locator("#wf-relationships")
    expect(panel.locator("li")).to_have_text(["4 paused after an error", "8 finished"])
    expect(page.locator("#why-line a")).to_have_text("4 children paused after errors")
    _no_axe_violations(page)
    panel.get_by_role("link", name="8 finished").click()
    expect(page).to_have_url(re.compile(rf"parent={wave}&state=finished$"))
    expect(page.locator("#results tbody tr")).to_have_count(8)


def test_a_timed_out_checkout_says_so_in_the_list_and_the_inbox(live_server, screen):
    from playwright.sync_api import expect

    page = screen
    checkout = _abandoned_checkout()
    base = live_server.url
    login(page, base, "olga")
    page.goto(f"{base}/workflows?class={CheckoutWorkflow.workflow_name}&state=canceled")
    row = page.locator(f"#wf-{checkout}")
    expect(row.locator("td.why")).to_have_text(
        "timed out waiting for payment_confirmed after 1 min 15 s (then cancel)"
    )
    expect(row.locator("td.why code")).to_have_text("payment_confirmed")
    _no_axe_violations(page)

    page.get_by_role("link", name="Signals", exact=True).click()
    recent = page.locator(f"#timed-out-{checkout}")
    expect(recent).to_contain_text("payment_confirmed in capture")
    expect(recent).to_contain_text("1 min 15 s")
    expect(recent.locator("td[data-label=Then]")).to_have_text("cancel")
    expect(recent).to_contain_text("canceled")
    _no_axe_violations(page)
    recent.get_by_role("link", name=f"#{checkout}").click()
    expect(page.locator("#why-line")).to_have_text(
        "timed out waiting for payment_confirmed after 1 min 15 s (then cancel)"
    )


def test_the_charts_end_at_now_and_the_shortcuts_and_live_bar_work(live_server, screen):
    from playwright.sync_api import expect

    page = screen
    base = live_server.url
    login(page, base, "olga")
    # The time axis of every chart ends at "now", never at the end of the current hour.
    for axis in page.locator(".chart .time-axis").all():
        expect(axis.locator("span").last).to_have_text("now")
    _no_axe_violations(page)

    # "/" on a page without a search field opens the list with its search focused.
    page.goto(f"{base}/signals")
    page.keyboard.press("/")
    expect(page).to_have_url(f"{base}/workflows#search")
    expect(page.locator("#f-q")).to_be_focused()
    page.keyboard.type("Type:1")
    expect(page.locator("#f-q")).to_have_value("Type:1")

    # The focus ring: at least 3:1 against the page behind it.
    page.locator("#f-q").press("Tab")
    ring = page.evaluate("() => getComputedStyle(document.activeElement).outlineColor")
    assert _contrast(ring, page.evaluate("() => getComputedStyle(document.body).backgroundColor"))
    assert _contrast(
        ring, page.evaluate("() => getComputedStyle(document.documentElement).backgroundColor")
    )

    # The last row scrolls clear of the live control fixed at the bottom of a phone.
    page.goto(f"{base}/workflows")
    page.evaluate("() => window.scrollTo(0, document.body.scrollHeight)")
    last = page.locator("#results tbody tr").last.bounding_box()
    control = page.locator("#refresh").bounding_box()
    assert last is not None and control is not None
    if page.viewport_size["width"] < 600:
        assert last["y"] + last["height"] <= control["y"], (last, control)

    # A refresh that fails dims the numbers and says they are stale; the next success undims.
    page.route("**/workflows?*", lambda route: route.abort())
    page.route("**/workflows", lambda route: route.abort())
    expect(page.locator("#refresh-text")).to_contain_text("stale", timeout=30_000)
    expect(page.locator("[data-poll][data-stale]").first).to_be_attached()
    page.unroute("**/workflows?*")
    page.unroute("**/workflows")
    expect(page.locator("#refresh-text")).to_contain_text("Live", timeout=30_000)
    expect(page.locator("[data-poll][data-stale]")).to_have_count(0)


def _luminance(css: str) -> float:
    parts = [float(x) for x in re.findall(r"[\d.]+", css)[:3]]
    channels = [c / 255 for c in parts]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def _contrast(a: str, b: str) -> bool:
    if b.startswith("rgba(0, 0, 0, 0)"):  # transparent: nothing behind to compare with
        return True
    x, y = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (x + 0.05) / (y + 0.05) >= 3.0


def test_a_burst_is_clipped_and_the_other_minutes_keep_their_height(live_server, screen):
    from playwright.sync_api import expect

    page = screen
    base = live_server.url
    login(page, base, "olga")
    hour = page.locator("section.trend").first.locator("figure").first
    expect(hour.locator("g.bar").first).to_be_attached()
    tallest = max(_bar_totals(hour))
    # A seeding burst: ten times the busiest minute so far finishes in this minute.
    burst = max(200, tallest * 10)
    _finish_executions(burst)

    clipped = hour.locator("g.bar.clipped")
    expect(clipped).to_have_count(1, timeout=30_000)
    expect(clipped.locator("rect.clip-mark")).to_have_count(1)
    expect(clipped.locator("title")).to_contain_text("off the scale")
    expect(hour.locator("figcaption .clip-note")).to_have_text(
        "1 bar off the scale, marked at the top"
    )
    # The scale follows the minutes around the burst, not the burst: it tops out at one and a
    # half times the busiest of them, which stands over half the chart's height (unclipped,
    # it would be a sliver of 80 / 10 px).
    scale = int(
        re.search(r"scale 0.([\d,]+) executions", hour.locator("figcaption").inner_text())  # type: ignore[union-attr]
        .group(1)
        .replace(",", "")
    )
    others = [t for t in _bar_totals(hour) if t < burst]
    assert scale <= math.ceil(1.5 * max(others)) < burst, (scale, others, burst)
    if max(others):
        assert max(_bar_heights(hour, clipped=False)) >= 40, _bar_heights(hour, clipped=False)
    _no_axe_violations(page)


def _bar_totals(figure: Any) -> list[int]:
    """Each bar's executions, read from its tooltip ("12:03 UTC: 40 completed, 1 failed, …")."""
    totals = []
    for title in figure.locator("g.bar title").all_text_contents():
        counts = re.findall(r"([\d,]+) (?:completed|failed|reattempted)", title)
        totals.append(sum(int(n.replace(",", "")) for n in counts))
    return totals


def _bar_heights(figure: Any, clipped: bool) -> list[float]:
    selector = "g.bar.clipped" if clipped else "g.bar:not(.clipped)"
    heights: list[float] = figure.locator(selector).evaluate_all(
        "bars => bars.map(b => [...b.querySelectorAll('rect[class^=k-]')]"
        ".reduce((sum, r) => sum + Number(r.getAttribute('height')), 0))"
    )
    return heights


def _finish_executions(count: int) -> None:
    """``count`` executions of a finished demo workflow that completed just now, as a burst of
    fast steps would leave them."""
    now = utcnow()
    with db.new_session() as session:
        owner = session.scalar(
            select(Workflow.id).where(Workflow.state == "finished").order_by(Workflow.id)
        )
        assert owner is not None
        session.add_all(
            StepExecution(
                workflow_id=owner,
                step_name="burst",
                state="completed",
                outcome="success",
                scheduled_for=now,
                started_at=now,
                completed_at=now,
                finished_at=now,
            )
            for _ in range(count)
        )
        session.commit()


def test_a_signal_to_a_wave_says_nothing_waits_for_it(live_server, screen):
    from playwright.sync_api import expect

    page = screen
    wave, _ = _wave()
    base = live_server.url
    login(page, base, "olga")
    page.goto(f"{base}/workflows/{wave}")
    page.locator("summary", has_text="Send signal").click()
    page.get_by_label("Name").fill("nudge")
    page.locator("details.signal-form").get_by_role("button", name="Send signal").click()

    notice = page.locator("#wf-live p.notice")
    expect(notice).to_contain_text("Signal nudge stored (pending), but nothing waits for it")
    expect(notice).to_contain_text("waiting for its child workflows (4 open), not for a signal")
    expect(notice).not_to_contain_text("delivered")
    _no_axe_violations(page)
    with db.new_session() as session:
        stored = session.execute(
            select(Signal.name, Signal.state).where(
                Signal.workflow_id == wave, Signal.name == "nudge"
            )
        ).all()
    assert [tuple(row) for row in stored] == [("nudge", "pending")]
