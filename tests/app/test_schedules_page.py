"""What operators see and do on /schedules: each schedule with its cadence in words, time zone,
next three fire times (local and UTC), last run linked with its state, skipped ticks with the
last reason and missed ticks; Pause, Resume and Run now change the row and write the audit;
the engine's refusals come back inline (409), never as a 500; a workflow a schedule created
names it on its detail page."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update

from geneva_drive import Schedule, Workflow, db, schedules, step
from geneva_drive.models import OperatorAction, ScheduleRow, utcnow
from geneva_drive.testing import fire_schedules
from tests.app.conftest import post


class PageReport(Workflow):
    """One step; hero-less. Never run in these tests, so a created run stays ``ready``."""

    may_proceed_without_hero = True

    @step
    def compile(self) -> None:
        pass


@pytest.fixture
def report_class() -> Iterator[type[Workflow]]:
    yield PageReport
    schedules._reconciled.clear()


@pytest.fixture
def nightly(geneva_session: Any, report_class: Any) -> ScheduleRow:
    row = Schedule.create(
        geneva_session,
        "reports/nightly",
        report_class,
        cron="0 3 * * *",
        timezone="Europe/Berlin",
    )
    geneva_session.commit()
    return row


@pytest.fixture
def pulse(geneva_session: Any, report_class: Any) -> ScheduleRow:
    row = Schedule.create(geneva_session, "pulse", report_class, every=30, overlap="allow")
    geneva_session.commit()
    return row


def _row_html(html: str, row_id: int) -> str:
    found = re.search(rf'<tr id="schedule-{row_id}"[^>]*>(.*?)</tr>', html, re.S)
    assert found, f"no row for schedule {row_id}"
    return found.group(0)


def _reload(name: str) -> ScheduleRow:
    with db.new_session() as session:
        row = session.scalars(select(ScheduleRow).where(ScheduleRow.name == name)).one()
        session.expunge(row)
        return row


def _audit(action: str) -> list[OperatorAction]:
    with db.new_session() as session:
        rows = list(
            session.scalars(
                select(OperatorAction)
                .where(OperatorAction.action == action)
                .order_by(OperatorAction.id)
            )
        )
        session.expunge_all()
        return rows


def _due(geneva_session: Any, name: str, ago: timedelta) -> None:
    at = utcnow() - ago
    geneva_session.execute(
        update(ScheduleRow).where(ScheduleRow.name == name).values(next_fire_at=at, anchor_at=at)
    )
    geneva_session.commit()


def test_page_lists_cadence_zone_next_times_last_run_and_ticks(
    operator_client: Any, geneva_session: Any, nightly: ScheduleRow, pulse: ScheduleRow
) -> None:
    # pulse: two ticks due (one missed under catch_up=latest), the latest fires.
    _due(geneva_session, "pulse", timedelta(seconds=45))
    # nightly: due with its previous run still ready (overlap=skip): the tick is skipped.
    _due(geneva_session, "reports/nightly", timedelta(seconds=5))
    fire_schedules()
    _due(geneva_session, "reports/nightly", timedelta(seconds=5))
    fire_schedules()

    response = operator_client.get("/schedules")
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    assert "<h1>Schedules</h1>" in html
    assert ">Schedules</a>" in html  # in the main navigation
    assert "2 active · 0 paused · 0 disabled" in html

    night = _reload("reports/nightly")
    row = _row_html(html, night.id)
    assert '<code class="schedule-name">reports/nightly</code>' in row
    assert "At 03:00" in row
    assert "Europe/Berlin" in row
    # The next three fire times, in Berlin time and in UTC.
    times = re.findall(r"<li>(\d{4}-\d\d-\d\d \d\d:\d\d) Europe/Berlin \(CES?T\)", row)
    assert len(times) == 3 and all(t.endswith("03:00") for t in times), row
    assert row.count(" UTC</time>") == 3
    assert (
        f'href="/workflows/{night.last_workflow_id}">PageReport #{night.last_workflow_id}</a>'
        in row
    )
    assert '<span class="badge tone-info">ready</span>' in row
    assert "1 created" in row
    assert "1 skipped" in row
    assert f"the previous run, workflow #{night.last_workflow_id}, is still ready" in row
    assert '<span class="badge tone-ok">active</span>' in row
    assert "source: runtime" in row
    # Run now is held back, with why: the previous run goes on and overlap is skip.
    assert "Run now</button>" in row and "disabled aria-describedby" in row
    assert f"its previous run, #{night.last_workflow_id}, is still ready (overlap=skip)" in row

    beat = _reload("pulse")
    row = _row_html(html, beat.id)
    assert "every 30 s" in row
    assert "1 missed" in row
    assert "1 created" in row
    assert ">Pause</button>" in row


def test_pause_resume_and_run_now_change_the_row_and_write_the_audit(
    operator_client: Any, nightly: ScheduleRow
) -> None:
    response = post(operator_client, "/schedules/reports/nightly/pause")
    assert response.status_code == 302
    assert response.headers["Location"].endswith("/schedules")
    assert _reload("reports/nightly").paused is True
    page = operator_client.get("/schedules").get_data(as_text=True)
    assert "Paused schedule <code>reports/nightly</code>" in page  # the flash
    row = _row_html(page, nightly.id)
    assert '<span class="badge tone-warn">paused</span>' in row
    assert ">Resume</button>" in row
    assert 'data-confirm-label="Resume schedule reports/nightly"' in row

    response = post(operator_client, "/schedules/reports/nightly/resume", htmx=True)
    assert response.status_code == 200
    assert "geneva:toast" in response.headers["HX-Trigger"]
    assert "Resumed schedule <code>reports/nightly</code>" in response.get_data(as_text=True)
    assert _reload("reports/nightly").paused is False

    before = _reload("reports/nightly").next_fire_at
    response = post(operator_client, "/schedules/reports/nightly/run-now", htmx=True)
    assert response.status_code == 200, response.get_data(as_text=True)
    after = _reload("reports/nightly")
    assert after.next_fire_at == before  # Run now leaves the next tick where it was
    assert after.last_workflow_id is not None
    html = response.get_data(as_text=True)
    assert (
        f'href="/workflows/{after.last_workflow_id}">PageReport #{after.last_workflow_id}</a>'
        in html
    )

    pause, resume, run = (
        _audit("schedule_pause"),
        _audit("schedule_resume"),
        _audit("schedule_run_now"),
    )
    assert [(a.actor, a.params, a.from_state, a.to_state, a.result) for a in pause] == [
        ("olga", {"schedule": "reports/nightly"}, "active", "paused", "ok")
    ]
    assert [(a.from_state, a.to_state, a.result) for a in resume] == [("paused", "active", "ok")]
    assert [(a.workflow_id, a.params, a.result) for a in run] == [
        (after.last_workflow_id, {"schedule": "reports/nightly"}, "ok")
    ]

    # The run names its schedule and the tick on its detail page, linked to /schedules.
    detail = operator_client.get(f"/workflows/{after.last_workflow_id}").get_data(as_text=True)
    assert (
        f'created by schedule <a href="/schedules#schedule-{nightly.id}"><code>reports/nightly</code></a>'
        in detail
    )
    assert re.search(r"for the tick of <time [^>]*>\d{4}-\d\d-\d\d \d\d:\d\d Europe/Berlin", detail)
    # ...and the audit page links the schedule actions to /schedules, the run to its workflow.
    audit = operator_client.get("/audit").get_data(as_text=True)
    assert '<a href="/schedules">schedules</a>' in audit


def test_refusals_come_back_inline_and_are_audited(
    operator_client: Any, nightly: ScheduleRow
) -> None:
    response = post(operator_client, "/schedules/reports/nightly/resume")
    assert response.status_code == 409
    row = _row_html(response.get_data(as_text=True), nightly.id)
    assert (
        '<p class="refusal" role="alert" id="refusal">schedule &#39;reports/nightly&#39; is not paused</p>'
        in row
    )

    assert post(operator_client, "/schedules/reports/nightly/run-now").status_code == 302
    response = post(operator_client, "/schedules/reports/nightly/run-now", htmx=True)
    assert response.status_code == 409
    assert "still ready (overlap=skip)" in response.get_data(as_text=True)
    assert '"ok": false' in response.headers["HX-Trigger"]
    # Nothing partial: one run, the refused tick not counted as skipped.
    row_after = _reload("reports/nightly")
    assert (row_after.ticks_created, row_after.ticks_skipped) == (1, 0)

    refused = [
        a for a in _audit("schedule_run_now") + _audit("schedule_resume") if a.result == "refused"
    ]
    assert {(a.action, a.workflow_id) for a in refused} == {
        ("schedule_run_now", None),
        ("schedule_resume", None),
    }

    response = post(operator_client, "/schedules/no-such/pause")
    assert response.status_code == 404
    assert _audit("schedule_pause") == []


def test_viewers_see_no_buttons_and_are_refused(
    viewer_client: Any, operator_client: Any, nightly: ScheduleRow
) -> None:
    html = viewer_client.get("/schedules").get_data(as_text=True)
    assert "reports/nightly" in html
    assert ">Pause</button>" not in html and "Actions</th>" not in html
    assert post(viewer_client, "/schedules/reports/nightly/pause").status_code == 403
    # Without the CSRF token an operator's POST is refused too.
    assert operator_client.post("/schedules/reports/nightly/pause").status_code in (400, 403)
    assert _reload("reports/nightly").paused is False


def test_htmx_poll_renders_the_list_alone(operator_client: Any, nightly: ScheduleRow) -> None:
    response = operator_client.get("/schedules", headers={"HX-Request": "true"})
    html = response.get_data(as_text=True)
    assert html.lstrip().startswith('<div id="schedules"')
    assert 'hx-trigger="every' in html


def test_a_disabled_schedule_is_shown_without_actions(
    operator_client: Any, geneva_session: Any, nightly: ScheduleRow
) -> None:
    geneva_session.execute(
        update(ScheduleRow).where(ScheduleRow.id == nightly.id).values(disabled_at=utcnow())
    )
    geneva_session.commit()
    row = _row_html(operator_client.get("/schedules").get_data(as_text=True), nightly.id)
    assert '<span class="badge tone-muted">disabled</span>' in row
    assert "none: it never fires again" in row
    response = post(operator_client, "/schedules/reports/nightly/run-now")
    assert response.status_code == 409
    assert "is disabled (removed from the code)" in response.get_data(as_text=True)


def test_an_empty_page_says_how_to_add_one(operator_client: Any) -> None:
    html = operator_client.get("/schedules").get_data(as_text=True)
    assert 'id="schedules-empty"' in html
