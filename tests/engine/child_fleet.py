"""One parent with N children, shared by test_children.py (200 ending at once) and
test_children_scale.py (10,000): the parent's first step starts ``fleet["size"]`` children;
its join appends the parent's id to ``joined`` each time it runs."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from geneva_drive import Workflow, step
from geneva_drive.testing import speedrun_workflow
from tests.engine.helpers import executions

#: How many children KidFleetOrder's step starts (start_fleet sets it).
fleet = {"size": 0}
#: The ids of the parents whose join ran, in order (one entry per run; start_fleet clears it).
joined: list[int] = []


class KidTiny(Workflow):
    @step
    def work(self) -> None:
        pass


class KidFleetOrder(Workflow):
    @step
    def fan_out(self) -> None:
        for _ in range(fleet["size"]):
            self.start_child(KidTiny, hero=self.hero, allow_multiple=True)

    @step(wait_for_children=True, on_child_failure="continue")
    def invoice(self) -> None:
        joined.append(self.id)


def start_fleet(session: Session, order: object, size: int) -> tuple[Workflow, list[int]]:
    """A parent whose one step started ``size`` children, parked on its join; the children's
    ids in order."""
    fleet["size"] = size
    joined.clear()
    parent = KidFleetOrder.create(hero=order)
    speedrun_workflow(parent)
    assert parent.children_open == size
    assert executions(session, parent, "invoice")[-1].state == "waiting"
    ids = list(
        session.scalars(
            select(Workflow.id).where(Workflow.parent_id == parent.id).order_by(Workflow.id)
        )
    )
    assert len(ids) == size
    return parent, ids
