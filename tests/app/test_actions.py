"""Operator actions: each calls the engine, commits, writes one audit row and shows in the
timeline; engine refusals come back as 409 (400 for malformed input) with the engine's message
inline and change nothing; bulk actions preview, cap and record a batch."""

from __future__ import annotations

import contextlib

import pytest
from sqlalchemy import select, update

from geneva_drive.models import OperatorAction, Signal, StepExecution
from geneva_drive.testing import speedrun_workflow
from geneva_drive.workflow import Workflow
from tests.app.conftest import DashPayment, login, post, run_to_finish

HTMX = {"HX-Request": "true"}


def _reload(session, wf_id: int) -> Workflow:
    session.expire_all()
    workflow = session.get(Workflow, wf_id)
    assert workflow is not None
    return workflow


def _audit(session, wf_id: int) -> list[OperatorAction]:
    session.expire_all()
    return list(
        session.scalars(
            select(OperatorAction)
            .where(OperatorAction.workflow_id == wf_id)
            .order_by(OperatorAction.id)
        )
    )


def _parked(make_workflow) -> DashPayment:
    wf = make_workflow()
    DashPayment.fail_charge = False
    with contextlib.suppress(RuntimeError):
        speedrun_workflow(wf)  # stops at the confirm gate
    return wf


# (how to prepare the workflow, action, form data, state after, what the next step is)
ACTIONS = [
    ("ready", "pause", {}, "paused", "authorize"),
    ("paused", "resume", {}, "ready", "charge"),
    ("paused", "skip", {}, "ready", "confirm"),
    ("ready", "cancel", {}, "canceled", "authorize"),
    ("paused", "cancel", {}, "canceled", "charge"),
    ("paused", "reattempt", {}, "ready", "charge"),
    ("paused", "resume_at", {"step": "ship"}, "ready", "ship"),
]


@pytest.mark.parametrize(("prepare", "action", "data", "state", "next_step"), ACTIONS)
def test_action_changes_the_workflow_and_is_audited(
    operator_client, make_workflow, geneva_session, prepare, action, data, state, next_step
):
    wf = make_workflow(run=prepare == "paused")
    before = wf.state
    response = post(operator_client, f"/workflows/{wf.id}/{action}", data)
    # Without HTMX: POST/redirect/GET back to the workflow.
    assert response.status_code == 302
    assert response.headers["Location"].endswith(f"/workflows/{wf.id}")

    reloaded = _reload(geneva_session, wf.id)
    assert reloaded.state == state
    assert reloaded.next_step_name == next_step
    [row] = _audit(geneva_session, wf.id)
    assert (row.actor, row.action, row.result) == ("olga", action, "ok")
    assert (row.from_state, row.to_state) == (before, state)
    if data:
        assert row.params == data

    page = operator_client.get(f"/workflows/{wf.id}").get_data(as_text=True)
    timeline = page.split('id="timeline"', 1)[1]
    assert "by olga" in timeline and f"{before} → {state}" in timeline


def test_htmx_action_answers_with_the_live_region_and_a_toast(operator_client, make_workflow):
    wf = make_workflow()
    response = post(operator_client, f"/workflows/{wf.id}/pause", htmx=True)
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    assert html.lstrip().startswith('<div id="wf-live"') or 'id="wf-live"' in html[:200]
    assert "<html" not in html
    assert "Paused." in html
    assert "geneva:toast" in response.headers["HX-Trigger"]
    # Now paused: Resume is offered, Pause is not.
    assert ">Resume</button>" in html and ">Pause</button>" not in html


def test_send_signal_wakes_the_parked_step(operator_client, make_workflow, geneva_session):
    wf = _parked(make_workflow)
    response = post(
        operator_client,
        f"/workflows/{wf.id}/signals",
        {"name": "payment_confirmed", "payload": '{"amount_cents": 1200}', "idempotency_key": "k1"},
        htmx=True,
    )
    assert response.status_code == 200
    assert "Signal <code>payment_confirmed</code> delivered" in response.get_data(as_text=True)
    geneva_session.expire_all()
    [signal] = geneva_session.scalars(select(Signal).where(Signal.workflow_id == wf.id)).all()
    assert signal.payload == {"amount_cents": 1200}
    assert signal.idempotency_key == "k1"
    assert signal.state == "claimed"  # attached to the woken confirm execution
    [row] = _audit(geneva_session, wf.id)
    assert row.action == "signal" and row.params["payload"] == {"amount_cents": 1200}

    # The same key again is a duplicate delivery: reported, nothing new stored.
    again = post(
        operator_client,
        f"/workflows/{wf.id}/signals",
        {"name": "payment_confirmed", "payload": "{}", "idempotency_key": "k1"},
        htmx=True,
    )
    assert "already delivered" in again.get_data(as_text=True)
    assert len(geneva_session.scalars(select(Signal).where(Signal.workflow_id == wf.id)).all()) == 1

    html = operator_client.get(f"/workflows/{wf.id}").get_data(as_text=True)
    assert "&#34;amount_cents&#34;: 1200" in html or '"amount_cents": 1200' in html


# (prepare, action, data, status, text of the refusal)
REFUSALS = [
    ("ready", "resume", {}, 409, "Only a paused workflow can be resumed."),
    ("ready", "resume_at", {"step": "ship"}, 409, "pause it first"),
    ("paused", "resume_at", {"step": "legacy_capture"}, 409, "that step is a removed_step"),
    ("paused", "resume_at", {"step": "nope"}, 409, "that step is not defined"),
    ("paused", "resume_at", {"step": ""}, 400, "Choose the Step to resume at."),
    ("paused", "pause", {}, 409, "Only a ready or performing workflow can be paused."),
    ("finished", "cancel", {}, 409, "Cannot cancel a finished workflow"),
    ("finished", "signals", {"name": "x"}, 409, "Cannot deliver signal"),
    ("ready", "signals", {"name": "x", "payload": "{not json"}, 400, "not valid JSON"),
    ("ready", "signals", {"name": ""}, 400, "A signal needs a Name."),
    # The engine's own signal (a child's end reaching its parent) cannot be sent from outside.
    ("ready", "signals", {"name": "geneva_drive.child_ended"}, 400, "cannot be sent to workflow"),
]


@pytest.mark.parametrize(("prepare", "action", "data", "status", "text"), REFUSALS)
@pytest.mark.parametrize("htmx", [True, False])
def test_engine_refusal_is_shown_inline_and_changes_nothing(
    operator_client, make_workflow, geneva_session, prepare, action, data, status, text, htmx
):
    wf = make_workflow(run=prepare == "paused")
    if prepare == "finished":
        run_to_finish(wf)
    before = _reload(geneva_session, wf.id)
    state, next_step = before.state, before.next_step_name
    executions = len(before.execution_history)

    response = post(operator_client, f"/workflows/{wf.id}/{action}", data, htmx=htmx)
    assert response.status_code == status
    html = response.get_data(as_text=True)
    refusal = html.split('class="refusal"', 1)[1].split("</p>", 1)[0]
    assert text in refusal
    assert ("<html" in html) is not htmx

    after = _reload(geneva_session, wf.id)
    assert (after.state, after.next_step_name) == (state, next_step)
    assert len(after.execution_history) == executions
    [row] = _audit(geneva_session, wf.id)
    assert row.result == "refused" and text in (row.message or "")


def test_action_on_a_missing_workflow_is_404(operator_client):
    assert post(operator_client, "/workflows/424242/pause").status_code == 404


def test_bulk_preview_counts_the_selection_and_changes_nothing(
    operator_client, make_workflow, geneva_session
):
    a, b, c = make_workflow(), make_workflow(), make_workflow()
    preview = operator_client.get(f"/workflows/bulk?action=pause&ids={a.id}&ids={b.id}")
    html = preview.get_data(as_text=True)
    assert preview.status_code == 200
    assert "2 workflows will be paused." in html
    # Its one confirm button names what it will do.
    assert ">Pause 2 workflows</button>" in html
    everything = operator_client.get("/workflows/bulk?action=pause&scope=all&class=DashPayment")
    assert "3 workflows will be paused." in everything.get_data(as_text=True)
    assert {_reload(geneva_session, w.id).state for w in (a, b, c)} == {"ready"}


def test_bulk_pause_selected_runs_each_and_records_a_batch(
    operator_client, make_workflow, geneva_session
):
    a, b = make_workflow(), make_workflow(run=True)  # b is paused already: refused
    response = post(
        operator_client,
        "/workflows/bulk",
        {"action": "pause", "scope": "selected", "ids": [str(a.id), str(b.id)]},
        htmx=True,
    )
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    assert "Pause selected: 1 done, 1 refused." in html
    assert 'id="results"' in html and 'hx-swap-oob="true"' in html
    assert _reload(geneva_session, a.id).state == "paused"
    assert [r.result for r in _audit(geneva_session, a.id)] == ["ok"]
    assert [r.result for r in _audit(geneva_session, b.id)] == ["refused"]
    batch = geneva_session.scalars(
        select(OperatorAction).where(OperatorAction.action == "bulk_pause")
    ).one()
    assert batch.result == "partial"
    assert batch.params["done"] == 1 and batch.params["refused"] == 1


def test_bulk_resume_at_over_the_filtered_selection(operator_client, make_workflow, geneva_session):
    paused = [make_workflow(run=True) for _ in range(2)]
    ready = make_workflow()
    response = post(
        operator_client,
        "/workflows/bulk",
        {
            "action": "resume_at",
            "scope": "all",
            "class": "DashPayment",
            "state": "paused",
            "target_step": "ship",
        },
    )
    assert response.status_code == 302
    for wf in paused:
        reloaded = _reload(geneva_session, wf.id)
        assert (reloaded.state, reloaded.next_step_name) == ("ready", "ship")
    assert _audit(geneva_session, ready.id) == []


def test_bulk_over_the_cap_runs_in_the_background_with_progress(
    app_factory, make_workflow, geneva_session
):
    app = app_factory(BULK_CAP=2)
    client = login(app.test_client(), "olga")
    made = [make_workflow() for _ in range(3)]
    preview = client.get("/workflows/bulk?action=cancel&scope=all")
    assert preview.status_code == 200
    assert "More than 2 workflows will be canceled." in preview.get_data(as_text=True)

    # Over the cap it asks for "all" to be typed: without it nothing changes.
    refused = post(client, "/workflows/bulk", {"action": "cancel", "scope": "all"})
    assert refused.status_code == 400
    assert "Type all to confirm" in refused.get_data(as_text=True)
    assert {_reload(geneva_session, w.id).state for w in made} != {"canceled"}

    response = post(
        client, "/workflows/bulk", {"action": "cancel", "scope": "all", "typed_count": "all"}
    )
    assert response.status_code == 302
    progress_url = response.headers["Location"]
    batch_id = int(progress_url.rsplit("/", 1)[1])
    app.extensions["geneva_bulk_threads"][batch_id].join(timeout=30)

    assert {_reload(geneva_session, w.id).state for w in made} == {"canceled"}
    batch = geneva_session.get(OperatorAction, batch_id)
    geneva_session.refresh(batch)
    assert (batch.action, batch.result) == ("bulk_cancel", "ok")
    assert batch.params["done"] == 3 and batch.params["refused"] == 0
    assert all(_audit(geneva_session, w.id)[0].params["batch"] == batch_id for w in made)

    page = client.get(progress_url, headers=HTMX)
    assert page.status_code == 286  # finished: the progress region stops polling
    assert "3 done" in page.get_data(as_text=True)


def test_bulk_of_selected_rows_over_the_cap_is_refused(app_factory, make_workflow, geneva_session):
    client = login(app_factory(BULK_CAP=2).test_client(), "olga")
    made = [make_workflow() for _ in range(3)]
    ids = [str(w.id) for w in made]
    response = post(client, "/workflows/bulk", {"action": "cancel", "ids": ids})
    assert response.status_code == 400
    assert "select at most 2 rows" in response.get_data(as_text=True)
    assert {_reload(geneva_session, w.id).state for w in made} == {"ready"}
    assert not geneva_session.scalars(select(OperatorAction)).all()


def test_bulk_progress_of_an_unknown_batch_is_404(operator_client):
    assert operator_client.get("/workflows/bulk/99999").status_code == 404


def test_bulk_without_a_selection_or_with_an_unknown_action_is_400(operator_client):
    assert post(operator_client, "/workflows/bulk", {"action": "pause"}).status_code == 400
    assert post(operator_client, "/workflows/bulk", {"action": "explode"}).status_code == 400


def test_the_action_precedes_what_it_caused_in_the_timeline(operator_client, make_workflow):
    wf = make_workflow(run=True)
    post(operator_client, f"/workflows/{wf.id}/resume_at", {"step": "ship"})
    html = operator_client.get(f"/workflows/{wf.id}").get_data(as_text=True)
    timeline = html.split('id="timeline"', 1)[1]
    assert timeline.index("<strong>Resume at</strong> by olga") < timeline.index(
        "<strong><code>ship</code></strong>"
    )


def test_operator_actions_feed_the_prometheus_counter(operator_client, make_workflow):
    from prometheus_client import REGISTRY

    from geneva_drive import prometheus

    prometheus.install()
    before = REGISTRY.get_sample_value("geneva_drive_operator_actions_total", {"action": "pause"})
    wf = make_workflow()
    response = post(operator_client, f"/workflows/{wf.id}/pause")
    assert response.status_code in (200, 302, 303)
    after = REGISTRY.get_sample_value("geneva_drive_operator_actions_total", {"action": "pause"})
    assert (after or 0.0) == (before or 0.0) + 1


def test_bulk_preview_counts_only_the_rows_that_will_be_done(
    operator_client, make_workflow, geneva_session
):
    """The preview must not promise what the action refuses: "3 workflows will be resumed" then
    "0 done, 3 refused" must not happen."""
    ready = [make_workflow() for _ in range(3)]
    query = "&".join(f"ids={w.id}" for w in ready)
    nothing = operator_client.get(f"/workflows/bulk?action=resume&{query}")
    html = nothing.get_data(as_text=True)
    assert nothing.status_code == 200
    assert "0 workflows will be resumed." in html
    assert "3 will not be done: 3 ready (only a paused workflow can be resumed)." in html
    assert ">Resume 0 workflows</button>" not in html  # no button that could only be refused
    form = html.split('id="bulk-confirm"')[1].split("</form>")[0]
    assert 'type="submit"' not in form

    paused = make_workflow(run=True)
    mixed = operator_client.get(f"/workflows/bulk?action=resume&{query}&ids={paused.id}")
    html = mixed.get_data(as_text=True)
    assert "1 workflow will be resumed." in html and ">Resume 1 workflow</button>" in html
    assert "3 will not be done: 3 ready" in html
    assert {_reload(geneva_session, w.id).state for w in ready} == {"ready"}

    done = post(
        operator_client,
        "/workflows/bulk",
        {"action": "resume", "ids": [str(w.id) for w in [*ready, paused]]},
        htmx=True,
    )
    # What the preview said is what happened.
    assert "Resume selected: 1 done, 3 refused." in done.get_data(as_text=True)


def test_the_engine_preview_agrees_with_the_bulk_outcome(make_workflow, geneva_session):
    """The preview's rules are the engine's: for each action over a mixed selection (ready,
    paused, canceled, stranded, a stale id) it predicts exactly what perform_bulk then does."""
    from geneva_drive import operator_actions

    session = geneva_session
    for action, params in [
        ("pause", {}),
        ("resume", {}),
        ("skip", {}),
        ("cancel", {}),
        ("reattempt", {}),
        ("resume_at", {"step": "ship"}),
        ("resume_at", {"step": "nosuchstep"}),
    ]:
        ready, paused = make_workflow(), make_workflow(run=True)
        canceled = make_workflow()
        canceled.cancel()
        stranded = make_workflow(run=True)  # paused on a step its class no longer defines
        session.execute(
            update(Workflow).where(Workflow.id == stranded.id).values(next_step_name="gone")
        )
        # Paused while parked on a step the deploy renamed without renamed_step: resume
        # refuses it (nothing could wake it), so the preview must too.
        parked = _parked(make_workflow)
        DashPayment.fail_charge = True
        parked.pause()
        # Ready, its scheduled step gone from the class: a reattempt has nothing to run.
        ready_stranded = make_workflow()
        for wf, gone in [(parked, "gone_wait"), (ready_stranded, "gone_step")]:
            session.execute(
                update(Workflow).where(Workflow.id == wf.id).values(next_step_name=gone)
            )
            session.execute(
                update(StepExecution)
                .where(StepExecution.workflow_id == wf.id, StepExecution.state != "completed")
                .values(step_name=gone)
            )
        session.commit()
        session.expire_all()
        ids = [ready.id, paused.id, canceled.id, stranded.id, parked.id, ready_stranded.id]
        ids.append(987654321)
        preview = operator_actions.preview_bulk(session, ids, action, params)
        outcome = operator_actions.perform_bulk(session, "t", ids, action, params, {})
        assert (len(preview.eligible), preview.refused_count, len(preview.gone)) == (
            outcome.done,
            outcome.refused,
            outcome.gone,
        ), (action, params, preview, outcome)
