"""What operators see of child workflows (docs/MANUAL.md, "Fan-out and join: child
workflows"): the parent's children line linking to
``/workflows?parent=<id>``, the child's link to its parent, the list filter, bulk actions over
a parent's children, and the why-line of a waiting parent."""

from __future__ import annotations

from sqlalchemy import select

from geneva_drive import Workflow, step
from geneva_drive.models import OperatorAction
from geneva_drive.testing import perform_next_step, speedrun_workflow
from tests.app.conftest import post
from tests.engine.helpers import make_order


class DashShipLine(Workflow):
    @step
    def pick(self) -> None:
        pass

    @step
    def ship(self) -> None:
        pass


class DashFanOrder(Workflow):
    @step
    def ship(self) -> None:
        for _ in range(4):
            self.start_child(DashShipLine, hero=self.hero, allow_multiple=True)

    @step(wait_for_children=True)
    def invoice(self) -> None:
        pass


def _parent(session):
    parent = DashFanOrder.create(hero=make_order(session))
    speedrun_workflow(parent)  # the join parks on 4 children
    kids = parent.children
    speedrun_workflow(kids[0])  # 1 finished
    kids[1].pause()  # 1 paused
    session.commit()
    perform_next_step(kids[2])  # still running (its second step is due)
    return parent, kids


def test_the_parent_shows_its_childrens_progress_and_links_to_them(operator_client, geneva_session):
    parent, kids = _parent(geneva_session)
    html = operator_client.get(f"/workflows/{parent.id}").get_data(as_text=True)
    assert "1 of 4 finished, 1 paused, 2 running" in html
    assert f'href="/workflows?parent={parent.id}"' in html
    assert "waiting for 3 child workflows to end" in html

    listed = operator_client.get(f"/workflows?parent={parent.id}").get_data(as_text=True)
    for kid in kids:
        assert f'href="/workflows/{kid.id}"' in listed
    assert f'href="/workflows/{parent.id}"' in listed  # the filter's badge links back
    other = DashShipLine.create(hero=make_order(geneva_session))
    geneva_session.commit()
    assert f'href="/workflows/{other.id}"' not in listed
    assert operator_client.get("/workflows?parent=abc").status_code == 200


def test_a_child_links_to_its_parent(operator_client, geneva_session):
    parent, kids = _parent(geneva_session)
    html = operator_client.get(f"/workflows/{kids[0].id}").get_data(as_text=True)
    assert f'<a href="/workflows/{parent.id}">#{parent.id}</a>' in html
    own = operator_client.get(f"/workflows/{parent.id}").get_data(as_text=True)
    assert 'id="wf-parent"' not in own


def test_bulk_pause_over_a_parents_children(operator_client, geneva_session):
    parent, kids = _parent(geneva_session)
    preview = operator_client.get(
        f"/workflows/bulk?action=pause&scope=all&parent={parent.id}&state=ready"
    ).get_data(as_text=True)
    assert "2 workflows will be paused." in preview
    response = post(
        operator_client,
        "/workflows/bulk",
        {"action": "pause", "scope": "all", "parent": str(parent.id), "state": "ready"},
    )
    assert response.status_code == 302
    geneva_session.expire_all()
    assert [k.state for k in kids] == ["finished", "paused", "paused", "paused"]
    assert parent.state == "ready"  # the parent itself is not among its children
    batch = geneva_session.scalars(
        select(OperatorAction).where(OperatorAction.action == "bulk_pause")
    ).one()
    assert batch.params["done"] == 2
