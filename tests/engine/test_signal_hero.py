"""``Workflow.signal_hero`` and ``ongoing_for_hero``: a webhook's way to reach the one ongoing
workflow of a class for a hero, by the object or by its ``(hero_type, hero_id)``
(docs/MANUAL.md, "Signals and webhooks")."""

from __future__ import annotations

import pytest

from geneva_drive import (
    InvalidInputError,
    InvalidStateError,
    NoOngoingWorkflowError,
    Workflow,
    step,
)
from tests.engine.helpers import make_order


class HeroPayment(Workflow):
    @step(wait_for="paid")
    def capture(self) -> None:
        pass


class HeroPaymentMany(Workflow):
    @step(wait_for="paid")
    def capture(self) -> None:
        pass


def test_by_the_object_or_by_type_and_id(geneva_session, geneva_transport):
    order = make_order(geneva_session)
    workflow = HeroPayment.create(hero=order, session=geneva_session)
    assert HeroPayment.ongoing_for_hero(geneva_session, order) is workflow
    assert HeroPayment.ongoing_for_hero(geneva_session, ("Order", str(order.id))) is workflow
    assert HeroPayment.ongoing_for_hero(geneva_session, ("Order", order.id)) is workflow
    first = HeroPayment.signal_hero(
        geneva_session, ("Order", order.id), "paid", {"n": 1}, idempotency_key="e1"
    )
    # Read now: a duplicate delivery returns the same row, and so the same object.
    assert first.workflow_id == workflow.id and not first.duplicate_delivery
    first_id = first.id
    again = HeroPayment.signal_hero(geneva_session, order, "paid", {"n": 1}, idempotency_key="e1")
    assert again.id == first_id and again.duplicate_delivery


def test_a_hero_without_an_ongoing_workflow_is_a_lookup_error(geneva_session, geneva_transport):
    order = make_order(geneva_session)
    with pytest.raises(
        NoOngoingWorkflowError, match=f"No ongoing HeroPayment for Order {order.id}"
    ):
        HeroPayment.signal_hero(geneva_session, order, "paid")
    workflow = HeroPayment.create(hero=order, session=geneva_session)
    workflow.cancel()
    with pytest.raises(LookupError):
        HeroPayment.ongoing_for_hero(geneva_session, order)


def test_several_ongoing_ones_need_an_id(geneva_session, geneva_transport):
    order = make_order(geneva_session)
    one = HeroPaymentMany.create(hero=order, session=geneva_session, allow_multiple=True)
    two = HeroPaymentMany.create(hero=order, session=geneva_session, allow_multiple=True)
    with pytest.raises(InvalidStateError, match=f"#{one.id}, #{two.id}"):
        HeroPaymentMany.signal_hero(geneva_session, order, "paid")


def test_a_malformed_hero_pair_says_what_to_give(geneva_session):
    with pytest.raises(InvalidInputError, match=r"\(hero_type, hero_id\) pair"):
        HeroPayment.ongoing_for_hero(geneva_session, ("Order", "1", "extra"))
