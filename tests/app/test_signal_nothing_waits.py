"""A signal sent to a workflow that waits for something else (a parent parked on its child
workflows) is stored as the API stores it, and the operator is told that nothing waits for it,
on the dashboard and on the command line (docs/MANUAL.md, "Signals")."""

from __future__ import annotations

from sqlalchemy import select

from geneva_drive import operator_actions
from geneva_drive.models import Signal
from tests.app.conftest import post
from tests.app.test_children_pages import _parent


def _signals(session, workflow_id: int) -> list[tuple[str, str]]:
    session.expire_all()
    return [
        (s.name, s.state)
        for s in session.scalars(
            select(Signal).where(Signal.workflow_id == workflow_id, Signal.name == "nudge")
        )
    ]


def test_the_dashboard_says_nothing_waits_for_a_signal_sent_to_a_joining_parent(
    operator_client, geneva_session
):
    parent, _ = _parent(geneva_session)
    response = post(
        operator_client, f"/workflows/{parent.id}/signals", {"name": "nudge"}, htmx=True
    )
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    assert "Signal <code>nudge</code> stored (pending), but nothing waits for it" in html
    assert "waiting for its child workflows (3 open), not for a signal" in html
    assert "delivered (pending)" not in html
    assert _signals(geneva_session, parent.id) == [("nudge", "pending")]


def test_the_command_lines_message_says_so_too(geneva_session):
    """The CLI prints the message of the same operator action (app/operator_cli.py)."""
    parent, _ = _parent(geneva_session)
    result = operator_actions.perform(
        geneva_session, "cli:ops", parent.id, "signal", {"name": "nudge", "payload": {}}
    )
    assert result.ok
    assert result.message == (
        f"Signal `nudge` stored (pending), but nothing waits for it: workflow #{parent.id} is "
        "waiting for its child workflows (3 open), not for a signal. It stays pending until a "
        "step that waits for `nudge` is reached."
    )
    assert _signals(geneva_session, parent.id) == [("nudge", "pending")]
