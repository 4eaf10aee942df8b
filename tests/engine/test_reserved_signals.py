"""The engine's own signal names (``geneva_drive.…``) cannot be sent from outside: an operator
or a webhook could otherwise tell a parent that a child ended which did not."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from geneva_drive import Workflow, step
from geneva_drive.children import CHILD_ENDED
from geneva_drive.errors import ReservedSignalNameError
from geneva_drive.models import Signal
from tests.engine.helpers import make_order


class ReservedKid(Workflow):
    @step
    def work(self) -> None:
        pass


class ReservedParent(Workflow):
    @step
    def split(self) -> None:
        self.start_child(ReservedKid, hero=self.hero)

    @step(wait_for_children=True)
    def join(self) -> None:
        pass


@pytest.mark.parametrize("name", [CHILD_ENDED, "geneva_drive.anything"])
def test_an_engine_signal_name_is_refused_and_stores_nothing(geneva_session: Any, name: str):
    parent = ReservedParent.create(hero=make_order(geneva_session), session=geneva_session)
    geneva_session.commit()
    with pytest.raises(ReservedSignalNameError, match="are the engine's own") as refused:
        parent.signal(name, idempotency_key="forged-child-1")
    assert isinstance(refused.value, ValueError)  # caught wherever bad input is
    geneva_session.rollback()
    assert geneva_session.scalars(select(Signal).where(Signal.workflow_id == parent.id)).all() == []
    parent.signal("geneva_drive_but_not_the_prefix")  # only the dotted prefix is reserved
    geneva_session.commit()
