"""The signal inbox's bulk deliver: select waiters, type the signal once, preview
(only rows still waiting for it count), confirm; mistakes come back in the form, in place,
with what was typed; every delivery goes through the engine's audited signal action."""

from __future__ import annotations

import contextlib

import pytest
from sqlalchemy import select

from geneva_drive.models import OperatorAction, Signal, StepExecution
from geneva_drive.testing import speedrun_workflow
from tests.app.conftest import DashPayment, post, run_to_finish


def _parked(make_workflow) -> DashPayment:
    wf = make_workflow()
    DashPayment.fail_charge = False
    with contextlib.suppress(RuntimeError):
        speedrun_workflow(wf)  # stops at the confirm gate
    assert wf.state == "ready"
    return wf


def _waiting(session, wf_id: int) -> bool:
    session.expire_all()
    return (
        session.scalar(
            select(StepExecution.id).where(
                StepExecution.workflow_id == wf_id, StepExecution.state == "waiting"
            )
        )
        is not None
    )


def _signals(session, wf_id: int) -> list[Signal]:
    session.expire_all()
    return list(session.scalars(select(Signal).where(Signal.workflow_id == wf_id)))


def _actions(session) -> list[OperatorAction]:
    session.expire_all()
    return list(session.scalars(select(OperatorAction).order_by(OperatorAction.id)))


def _form(ids, name="payment_confirmed", payload='{"ok": true}', key="", **extra):
    return {
        "action": "signal",
        "origin": "signals",
        "scope": "selected",
        "ids": [str(i) for i in ids],
        "name": name,
        "payload": payload,
        "idempotency_key": key,
        **extra,
    }


@pytest.fixture
def mixed(make_workflow, geneva_session):
    """Two ready waiters, one paused waiter, a ready workflow not parked, a finished one."""
    first, second, held = (_parked(make_workflow) for _ in range(3))
    held.pause()
    geneva_session.commit()
    DashPayment.fail_charge = True
    not_parked = make_workflow()
    done = make_workflow()
    run_to_finish(done)
    geneva_session.commit()
    return first, second, held, not_parked, done


def test_the_inbox_offers_row_boxes_and_one_form_to_operators_only(
    operator_client, viewer_client, make_workflow
):
    wf = _parked(make_workflow)
    html = operator_client.get("/signals").get_data(as_text=True)
    assert 'id="inbox-bulk-form"' in html
    assert f'name="ids" value="{wf.id}" form="inbox-bulk-form"' in html
    # The only awaited signal fills the Name.
    assert 'id="bulk-sig-name" name="name" required' in html
    assert 'value="payment_confirmed"' in html
    viewer = viewer_client.get("/signals").get_data(as_text=True)
    assert "inbox-bulk-form" not in viewer and 'name="ids"' not in viewer


def test_preview_over_a_mixed_selection_counts_only_rows_still_waiting(
    operator_client, mixed, geneva_session
):
    first, second, held, not_parked, done = mixed
    ids = [first.id, second.id, held.id, not_parked.id, done.id, 999999]
    response = post(operator_client, "/signals/bulk", _form(ids), htmx=True)
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    assert "3 workflows will receive <code>payment_confirmed</code>" in html
    assert "1 of them is paused" in html
    assert "3 will not be done" in html
    assert "1 no longer waiting for a signal (ready)" in html
    assert "1 finished (a finished or canceled workflow takes no signals)" in html
    assert "1 no longer exists" in html
    assert "Send payment_confirmed to 3 workflows" in html
    # The form comes along out of band, without a previous try's errors, as typed.
    form = html[html.index('id="inbox-bulk"') - 60 :]
    assert 'hx-swap-oob="true"' in form[:200] and "bulk-error-" not in form
    # The confirmation carries the signal as typed.
    assert 'name="payload" value="{&#34;ok&#34;: true}"' in html
    # A preview changes nothing and records nothing.
    assert all(_signals(geneva_session, i) == [] for i in (first.id, second.id, held.id))
    assert _actions(geneva_session) == [] or all(
        a.action != "signal" and not a.action.startswith("bulk_") for a in _actions(geneva_session)
    )
    assert _waiting(geneva_session, first.id)


def test_confirm_delivers_to_the_waiters_refuses_the_rest_and_audits_each(
    operator_client, mixed, geneva_session
):
    first, second, held, not_parked, _done = mixed
    # Between preview and confirm, `first` got its signal from elsewhere: no longer waiting.
    first.signal("payment_confirmed", {"from": "webhook"})
    geneva_session.commit()
    ids = [first.id, second.id, held.id, not_parked.id]
    response = post(operator_client, "/workflows/bulk", _form(ids, key="ops-2026-12-01"), htmx=True)
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    assert "Send signal to selected: 2 done, 2 refused." in html
    assert f"#{first.id}: Workflow #{first.id} is no longer waiting for a signal (ready)" in html
    # The inbox behind the dialog is brought up to date in the same answer.
    assert 'id="signals-inbox"' in html and 'hx-swap-oob="true"' in html

    # The rows: the ready waiter woke with the payload; the paused one holds it pending;
    # the one that moved on keeps only the webhook's signal; the unparked one has none.
    [woken] = _signals(geneva_session, second.id)
    assert (woken.state, woken.payload, woken.idempotency_key) == (
        "claimed",
        {"ok": True},
        "ops-2026-12-01",
    )
    assert not _waiting(geneva_session, second.id)
    [stored] = _signals(geneva_session, held.id)
    assert stored.state == "pending" and _waiting(geneva_session, held.id)
    assert [s.payload for s in _signals(geneva_session, first.id)] == [{"from": "webhook"}]
    assert _signals(geneva_session, not_parked.id) == []

    # The audit: one batch row, one row per workflow, each with the actor.
    actions = _actions(geneva_session)
    [batch] = [a for a in actions if a.action == "bulk_signal"]
    assert (batch.actor, batch.result) == ("olga", "partial")
    assert sorted(batch.params["done_ids"]) == sorted([second.id, held.id])
    assert sorted(batch.params["refused_ids"]) == sorted([first.id, not_parked.id])
    rows = {a.workflow_id: a for a in actions if a.action == "signal"}
    assert set(rows) == set(ids)
    assert all(r.actor == "olga" and r.params["batch"] == batch.id for r in rows.values())
    assert rows[second.id].result == "ok" and rows[first.id].result == "refused"
    # The audit page names the batch as the inbox's button did, and links to its workflows.
    audit = operator_client.get("/audit").get_data(as_text=True)
    assert "Send signal to selected" in audit and f"batch={batch.id}" in audit


@pytest.mark.parametrize(
    ("form", "status", "field", "reason"),
    [
        ({"payload": '{"amount_cents": 12'}, 400, "payload", "not valid JSON"),
        (
            {"name": "payment_confirmd"},
            409,
            "name",
            "waiting for <code>payment_confirmed</code>, not <code>payment_confirmd</code>",
        ),
        ({"name": "  "}, 400, "name", "A signal needs a Name"),
        ({"ids": []}, 400, "selection", "Select the waiters"),
    ],
)
def test_a_mistake_comes_back_in_the_form_with_what_was_typed(
    operator_client, make_workflow, geneva_session, form, status, field, reason
):
    wf = _parked(make_workflow)
    data = _form([wf.id], key="typed-key")
    data.update(form)
    response = post(operator_client, "/signals/bulk", data, htmx=True)
    assert response.status_code == status
    # In place of the inbox's form (not in the dialog), never a 500.
    assert response.headers["HX-Retarget"] == "#inbox-bulk"
    assert response.headers["HX-Reswap"] == "outerHTML"
    html = response.get_data(as_text=True)
    assert html.lstrip().startswith("<details") and 'id="inbox-bulk"' in html
    assert f'id="bulk-error-{field}"' in html and reason in html
    # Everything typed is still there.
    assert "typed-key" in html
    if "payload" in form:
        assert "{&#34;amount_cents&#34;: 12</textarea>" in html
    if form.get("name", "").strip():
        assert f'value="{form["name"]}"' in html
    # Nothing delivered, nothing written.
    assert _signals(geneva_session, wf.id) == [] and _waiting(geneva_session, wf.id)
    assert not any(a.action in ("signal", "bulk_signal") for a in _actions(geneva_session))


def test_without_script_a_mistake_renders_the_inbox_with_the_boxes_still_ticked(
    operator_client, make_workflow
):
    wf = _parked(make_workflow)
    response = post(operator_client, "/signals/bulk", _form([wf.id], payload="[1, 2,"))
    assert response.status_code == 400
    html = response.get_data(as_text=True)
    assert "<html" in html and "not valid JSON" in html
    assert f'name="ids" value="{wf.id}" form="inbox-bulk-form" data-signal' in html
    assert f'aria-label="Select workflow #{wf.id}" checked' in html
    assert "[1, 2,</textarea>" in html


def test_without_script_a_preview_is_a_page_and_the_confirm_redirects_to_the_inbox(
    operator_client, make_workflow, geneva_session
):
    wf = _parked(make_workflow)
    preview = post(operator_client, "/signals/bulk", _form([wf.id]))
    assert preview.status_code == 200
    assert "1 workflow will receive" in preview.get_data(as_text=True)
    done = post(operator_client, "/workflows/bulk", _form([wf.id]))
    assert done.status_code == 302 and done.headers["Location"].endswith("/signals")
    assert not _waiting(geneva_session, wf.id)


def test_above_the_typed_confirmation_threshold_the_count_must_be_typed(
    operator_client, make_workflow, geneva_session, monkeypatch
):
    from geneva_drive.dashboard import presenters

    # The rule is "above 100"; the threshold is lowered so three waiters cross it.
    monkeypatch.setattr(presenters, "TYPED_CONFIRM_OVER", 2)
    ids = [_parked(make_workflow).id for _ in range(3)]
    preview = post(operator_client, "/signals/bulk", _form(ids), htmx=True)
    html = preview.get_data(as_text=True)
    assert "Type <strong>3</strong> to confirm" in html
    refused = post(operator_client, "/workflows/bulk", _form(ids, expected_count="3"), htmx=True)
    assert refused.status_code == 400
    assert "Type 3 to confirm" in refused.get_data(as_text=True)
    assert all(_waiting(geneva_session, i) for i in ids)
    done = post(
        operator_client,
        "/workflows/bulk",
        _form(ids, expected_count="3", typed_count="3"),
        htmx=True,
    )
    assert "3 done." in done.get_data(as_text=True)
    assert not any(_waiting(geneva_session, i) for i in ids)


def test_a_row_form_refuses_a_wrong_name_next_to_the_field_and_buffers_nothing(
    operator_client, make_workflow, geneva_session
):
    wf = _parked(make_workflow)
    response = post(
        operator_client,
        f"/workflows/{wf.id}/signals",
        {"name": "payment_confirmd", "payload": '{"a": 1}', "back": "signals"},
        htmx=True,
    )
    assert response.status_code == 409
    html = response.get_data(as_text=True)
    # The reason sits right after the Name field, and the typed values are kept.
    name_field = html[html.index(f'id="sig-name-{wf.id}"') :]
    assert name_field.index(f'id="signal-error-{wf.id}"') < name_field.index("Payload (JSON)")
    assert 'value="payment_confirmd"' in html and "{&#34;a&#34;: 1}</textarea>" in html
    assert _signals(geneva_session, wf.id) == [] and _waiting(geneva_session, wf.id)


def test_a_row_form_refuses_a_waiter_that_moved_on(operator_client, make_workflow, geneva_session):
    wf = _parked(make_workflow)
    wf.signal("payment_confirmed")
    geneva_session.commit()
    response = post(
        operator_client,
        f"/workflows/{wf.id}/signals",
        {"name": "payment_confirmed", "payload": "{}", "back": "signals"},
        htmx=True,
    )
    assert response.status_code == 409
    assert "no longer waiting for a signal (ready)" in response.get_data(as_text=True)
    assert len(_signals(geneva_session, wf.id)) == 1
    [row] = [a for a in _actions(geneva_session) if a.action == "signal"]
    assert (row.actor, row.result) == ("olga", "refused")
