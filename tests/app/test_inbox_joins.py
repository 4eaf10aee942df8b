"""A join (``wait_for_children=True``) parks in ``waiting`` like a signal waiter,
but waits for its children: the signal inbox leaves it out (its rows, its counts, its limit),
and a signal sent from the inbox (``waiting_only``) is refused with the children's words."""

from __future__ import annotations

import contextlib
import re
from datetime import timedelta

import pytest
from sqlalchemy import select

from geneva_drive import Workflow, step
from geneva_drive.dashboard import queries
from geneva_drive.models import OperatorAction, Signal
from geneva_drive.testing import speedrun_workflow
from tests.app.conftest import DashPayment, post
from tests.engine.helpers import make_order


class InboxJoinLine(Workflow):
    @step
    def pack(self) -> None:
        pass


class InboxJoinOrder(Workflow):
    @step
    def fan_out(self) -> None:
        for _ in range(3):
            self.start_child(InboxJoinLine, hero=self.hero, allow_multiple=True)

    # A time-out sorts a parked execution first in the inbox's query: a join with one would
    # take the first rows of the limit if the inbox counted it.
    @step(wait_for_children=True, timeout=timedelta(hours=1), on_timeout="skip")
    def invoice(self) -> None:
        pass


def _join(session) -> InboxJoinOrder:
    parent = InboxJoinOrder.create(hero=make_order(session))
    speedrun_workflow(parent)  # the join parks on its 3 children
    session.commit()
    assert parent.state == "ready" and parent.children_open == 3
    return parent


def _signal_waiter(make_workflow) -> DashPayment:
    wf = make_workflow()
    DashPayment.fail_charge = False
    with contextlib.suppress(RuntimeError):
        speedrun_workflow(wf)  # stops at the confirm gate
    assert wf.state == "ready"
    return wf


def test_the_inbox_lists_signal_waiters_and_not_a_parent_waiting_on_its_children(
    operator_client, make_workflow, geneva_session, monkeypatch
):
    parent = _join(geneva_session)
    waiter = _signal_waiter(make_workflow)
    html = operator_client.get("/signals").get_data(as_text=True)
    assert f'href="/workflows/{waiter.id}"' in html
    assert "<code>payment_confirmed</code> · 1 waiting" in html
    assert f'href="/workflows/{parent.id}"' not in html
    assert "(stranded: " not in html and "<code>invoice</code>" not in html

    # The limit counts signal waiters only: with room for one row, the join (which times out
    # first) does not push the signal waiter off the page; with room for two, the one signal
    # waiter does not fill the page (the join would).
    monkeypatch.setattr(queries, "INBOX_LIMIT", 1)
    html = operator_client.get("/signals").get_data(as_text=True)
    assert f'href="/workflows/{waiter.id}"' in html
    assert f'href="/workflows/{parent.id}"' not in html
    monkeypatch.setattr(queries, "INBOX_LIMIT", 2)
    html = operator_client.get("/signals").get_data(as_text=True)
    assert "Showing the oldest" not in html

    # The overview's card is the inbox behind it: the signal waiter, not the join.
    overview = operator_client.get("/").get_data(as_text=True)
    card = re.search(r'id="stat-waiting">\s*<span class="n">([\d,]+)</span>', overview)
    assert card is not None and card.group(1) == "1", overview


def test_a_signal_from_the_inbox_to_a_join_is_refused_in_the_childrens_words(
    operator_client, geneva_session
):
    parent = _join(geneva_session)
    # The row form (waiting_only): refused, nothing buffered, the refusal audited.
    response = post(
        operator_client,
        f"/workflows/{parent.id}/signals",
        {"name": "payment_confirmed", "payload": "{}", "back": "signals"},
        htmx=True,
    )
    assert response.status_code == 409
    html = response.get_data(as_text=True)
    assert (
        f"Workflow #{parent.id} is waiting for its child workflows (3 open), not for a signal"
        in html
    )
    assert "no longer waits for a signal" not in html

    # The bulk form: its preview groups the refusal, its confirm says it per workflow.
    form = {
        "action": "signal",
        "origin": "signals",
        "scope": "selected",
        "ids": [str(parent.id)],
        "name": "payment_confirmed",
        "payload": "{}",
        "idempotency_key": "",
    }
    preview = post(operator_client, "/signals/bulk", form, htmx=True).get_data(as_text=True)
    assert "1 waiting for its child workflows, not for a signal" in preview
    done = post(operator_client, "/workflows/bulk", form, htmx=True)
    assert done.status_code == 200
    answer = done.get_data(as_text=True)
    assert (
        f"#{parent.id}: Workflow #{parent.id} is waiting for its child workflows (3 open), "
        "not for a signal" in answer
    )
    geneva_session.expire_all()
    assert list(geneva_session.scalars(select(Signal).where(Signal.workflow_id == parent.id))) == []
    rows = geneva_session.scalars(
        select(OperatorAction).where(
            OperatorAction.workflow_id == parent.id, OperatorAction.action == "signal"
        )
    ).all()
    assert rows and all(r.result == "refused" for r in rows)
    assert parent.state == "ready" and parent.children_open == 3


@pytest.fixture(autouse=True)
def _reset_payment():
    yield
    DashPayment.fail_charge = True
