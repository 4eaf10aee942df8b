"""The signal inbox's bulk deliver, in Chromium on the demo, in the light and
the dark scheme: tick waiters, type the signal once, a mistake comes back next to its field
with what was typed, preview, confirm; then what the operator sees and the rows that changed.
axe-core runs on the form with its error, on the preview and on the result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from geneva_drive import db
from geneva_drive.models import OperatorAction, Signal, StepExecution
from geneva_drive.workflow import Workflow
from tests.browser.conftest import login, screenshot, watch

pytestmark = pytest.mark.browser

AXE = Path(__file__).parent / "vendor" / "axe-4.14.1.min.js"
SIGNAL = "payment_confirmed"


def _serious(page: Any) -> list[str]:
    found = page.evaluate(
        """async () => {
            const r = await axe.run(document, {resultTypes: ['violations']});
            return r.violations
              .filter(v => v.impact === 'serious' || v.impact === 'critical')
              .map(v => v.id + ': ' + v.nodes.slice(0, 3).map(n => n.target.join(' ')).join(', '));
        }"""
    )
    return [json.dumps(v) for v in found]


def _waiting(workflow_id: int) -> bool:
    with db.new_session() as session:
        return (
            session.scalar(
                select(StepExecution.id).where(
                    StepExecution.workflow_id == workflow_id, StepExecution.state == "waiting"
                )
            )
            is not None
        )


def _signals(workflow_id: int) -> list[Signal]:
    with db.new_session() as session:
        rows = list(session.scalars(select(Signal).where(Signal.workflow_id == workflow_id)))
        session.expunge_all()
        return rows


def _deliver_elsewhere(workflow_id: int) -> None:
    """A webhook answers one waiter while the operator looks at the preview."""
    with db.new_session() as session:
        workflow = session.get(Workflow, workflow_id)
        assert workflow is not None
        workflow.signal(SIGNAL, {"from": "webhook"})
        session.commit()


def test_bulk_deliver_from_the_inbox_in_light_and_dark(live_server, browser):
    from playwright.sync_api import expect

    base = live_server.url
    for scheme in ("light", "dark"):
        context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme=scheme)
        context.add_init_script(path=str(AXE))
        page = context.new_page()
        errors = watch(page)
        login(page, base, "olga")
        page.goto(f"{base}/signals")
        page.evaluate("() => { window.__no_reload = true; }")
        form = page.locator("#inbox-bulk")
        boxes = page.locator(
            f"#signals-inbox section.card:not(.paused-group) input[name=ids][data-signal={SIGNAL}]"
        )
        picked = [int(boxes.nth(i).get_attribute("value") or 0) for i in range(3)]
        for i in range(3):
            boxes.nth(i).check()
        # Ticking a waiter fills the Name with the signal it waits for.
        expect(form.get_by_label("Name")).to_have_value(SIGNAL)

        # A payload that is not JSON: the reason next to the field, everything typed kept.
        form.get_by_label("Payload (JSON)").fill('{"amount_cents": 4200')
        form.get_by_label("Idempotency key").fill(f"ops-{scheme}")
        form.get_by_role("button", name="Send signal to selected").click()
        expect(page.locator("#bulk-error-payload")).to_contain_text("not valid JSON")
        expect(form.get_by_label("Payload (JSON)")).to_have_value('{"amount_cents": 4200')
        expect(form.get_by_label("Idempotency key")).to_have_value(f"ops-{scheme}")
        for workflow_id in picked:
            expect(page.locator(f"#waiter-{workflow_id} input[name=ids]")).to_be_checked()
        assert _serious(page) == [], scheme
        assert all(_signals(i) == [] for i in picked)

        # A signal none of them waits for: said next to the Name.
        form.get_by_label("Name").fill("payment_confirmd")
        form.get_by_label("Payload (JSON)").fill('{"amount_cents": 4200}')
        form.get_by_role("button", name="Send signal to selected").click()
        expect(page.locator("#bulk-error-name")).to_contain_text(
            f"waiting for {SIGNAL}, not payment_confirmd"
        )
        expect(form.get_by_label("Payload (JSON)")).to_have_value('{"amount_cents": 4200}')

        # Fixed: the preview counts the three, in the dialog.
        form.get_by_label("Name").fill(SIGNAL)
        form.get_by_role("button", name="Send signal to selected").click()
        dialog = page.locator("#bulk-dialog")
        expect(dialog.locator("#bulk-count")).to_have_text(f"3 workflows will receive {SIGNAL}.")
        # The Name is right now: the previous try's error is gone, what was typed stays.
        expect(page.locator("#bulk-error-name")).to_have_count(0)
        expect(form.get_by_label("Idempotency key")).to_have_value(f"ops-{scheme}")
        assert _serious(page) == [], scheme
        if scheme == "light":
            screenshot(page, "inbox-bulk-preview", full_page=False)

        # One waiter gets its signal elsewhere before the confirm: refused and counted.
        moved_on = picked[0]
        _deliver_elsewhere(moved_on)
        dialog.get_by_role("button", name=f"Send {SIGNAL} to 3 workflows").click()
        done = page.locator("#bulk-done")
        expect(done).to_contain_text("Send signal to selected: 2 done, 1 refused.")
        expect(done).to_contain_text(f"#{moved_on}: Workflow #{moved_on} is no longer waiting")
        assert _serious(page) == [], scheme
        dialog.get_by_role("button", name="Close").click()
        # The inbox behind it is up to date, without a reload.
        for workflow_id in picked:
            expect(page.locator(f"#waiter-{workflow_id}")).to_have_count(0)
        assert page.evaluate("() => window.__no_reload") is True

        # The rows: each delivered waiter woke with the payload and the key; the one that moved
        # on kept only the webhook's signal; the audit has the batch and a row each, by olga.
        for workflow_id in picked[1:]:
            assert not _waiting(workflow_id)
            [signal] = _signals(workflow_id)
            assert (signal.state, signal.payload_json, signal.idempotency_key) == (
                "claimed",
                {"amount_cents": 4200},
                f"ops-{scheme}",
            )
        assert [s.payload_json for s in _signals(moved_on)] == [{"from": "webhook"}]
        with db.new_session() as session:
            batch = session.scalars(
                select(OperatorAction)
                .where(OperatorAction.action == "bulk_signal")
                .order_by(OperatorAction.id.desc())
            ).first()
            assert batch is not None
            assert (batch.actor, batch.result) == ("olga", "partial")
            assert sorted(batch.params["done_ids"]) == sorted(picked[1:])
            assert batch.params["refused_ids"] == [moved_on]
            rows = session.scalars(
                select(OperatorAction).where(
                    OperatorAction.action == "signal", OperatorAction.workflow_id.in_(picked)
                )
            ).all()
            assert sorted((r.workflow_id, r.result) for r in rows) == sorted(
                [(moved_on, "refused")] + [(i, "ok") for i in picked[1:]]
            )
        context.close()
        assert not errors, f"{scheme}: browser console errors or 5xx answers: {errors}"
