"""A tenant floods a limit (docs/MANUAL.md, "Concurrency and rate limits"): /limits lists the
keys with the most waiting *and* the most deferred, the due executions no worker has tried
yet included, with the oldest wait and the time to drain at the recent pace; the overview
names the limits that defer most; a deferred execution's detail names its limit and key and
is "waiting for a slot", never "overdue"."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from sqlalchemy import update

from geneva_drive import ConcurrencyLimit, Workflow, executor, step
from geneva_drive.models import StepExecution, utcnow
from tests.engine.helpers import executions, make_order


class FloodDash(Workflow):
    concurrency_limit = ConcurrencyLimit("flood-dash", limit=1, key=lambda wf: wf.hero.status)

    @step
    def pull(self) -> None:
        pass


def _create(session: Any, status: str) -> Any:
    workflow = FloodDash.create(hero=make_order(session, status))
    session.commit()
    return workflow


def _flood(session: Any) -> dict[str, Any]:
    """megacorp: 3 pulled lately, 1 running, 2 deferred 17 min ago, 4 due 17 min ago and not
    tried; smallco: 1 deferred just now (its slot held)."""
    ago = utcnow() - timedelta(minutes=17)
    done = [_create(session, "megacorp") for _ in range(3)]
    for workflow in done:
        executor.execute(executions(session, workflow)[0].id)
    holder = _create(session, "megacorp")
    small_holder = _create(session, "smallco")
    for running in (holder, small_holder):
        session.execute(
            update(StepExecution)
            .where(StepExecution.workflow_id == running.id)
            .values(state="in_progress", started_at=ago)
        )
        session.execute(
            update(Workflow).where(Workflow.id == running.id).values(state="performing")
        )
    session.commit()
    deferred = [_create(session, "megacorp") for _ in range(2)]
    small = _create(session, "smallco")
    for workflow in [*deferred, small]:
        executor.execute(executions(session, workflow)[0].id)
    for workflow in deferred:
        session.execute(
            update(StepExecution)
            .where(StepExecution.workflow_id == workflow.id)
            .values(deferred_since=ago)
        )
    due = [_create(session, "megacorp") for _ in range(4)]
    for workflow in due:
        session.execute(
            update(StepExecution)
            .where(StepExecution.workflow_id == workflow.id)
            .values(scheduled_for=ago)
        )
    session.commit()
    return {"deferred": deferred, "due": due, "small": small}


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html)).strip()


def _cells(row: str) -> str:
    return " | ".join(_text(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S))


def test_limits_page_lists_the_flooding_key_with_its_due_and_deferred_wait_and_drain(
    operator_client: Any, geneva_session: Any
) -> None:
    _flood(geneva_session)
    html = operator_client.get("/limits").get_data(as_text=True)
    text = _text(html)
    assert "2 in use · 7 waiting (4 due, 3 deferred, 2 late)" in text
    row = re.search(r'<tr id="limit-flood-dash-key-1">.*?</tr>', html, re.S)
    assert row is not None
    cells = _cells(row.group(0))
    # megacorp first: 6 waiting (4 due and 2 deferred, both late), 1 in use, waiting since
    # 17 min, 3 finished in 10 min: 6 / 0.3 a minute = about 20 min to drain.
    assert (
        cells == "megacorp | 6 | 2 (2 late) | 1 | 17 min ago | about 20 min (3 finished in 10 min)"
    )
    assert 'href="/workflows?limit=flood-dash&amp;limit_key=megacorp"' in row.group(0)
    small = re.search(r'<tr id="limit-flood-dash-key-2">.*?</tr>', html, re.S)
    assert small is not None
    assert _cells(small.group(0)).startswith("smallco | 1 | 1 | 1 |")
    assert "stalled" in small.group(0)
    assert "How these numbers are counted" in html and "finished in the last 10 min" in text


def test_overview_names_the_limits_that_defer_most(
    operator_client: Any, geneva_session: Any
) -> None:
    _flood(geneva_session)
    html = operator_client.get("/").get_data(as_text=True)
    assert 'id="overview-limits"' in html
    assert 'href="/limits#limit-flood-dash"' in html
    text = _text(html)
    assert "flood-dash: 7 waiting, 3 deferred (2 late), the oldest since 17 min ago" in text
    assert "most behind key megacorp (6 waiting)" in text
    assert 'href="/workflows?limit=flood-dash&amp;due=held"' in html
    held = operator_client.get("/workflows?limit=flood-dash&due=held").get_data(as_text=True)
    assert len(re.findall(r'<tr id="wf-', held)) == 2


def test_a_deferred_executions_detail_names_its_limit_and_key_and_is_not_overdue(
    operator_client: Any, geneva_session: Any
) -> None:
    flood = _flood(geneva_session)
    late = flood["deferred"][0]
    html = operator_client.get(f"/workflows/{late.id}").get_data(as_text=True)
    text = _text(html)
    assert "overdue" not in text and "0 ms" not in text
    assert "waiting for a slot of flood-dash [megacorp] (1 of 1 in use) since 17 min (late)" in text
    assert "waiting for a slot of flood-dash [megacorp] since 17 min ago (late)" in text
    assert "late: held by flood-dash for 17 min" in text
    assert "limit flood-dash key megacorp" in text
