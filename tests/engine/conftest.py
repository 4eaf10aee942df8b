"""Fixtures shared by the engine tests."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session

from tests.conftest import Order
from tests.engine.helpers import make_order


@pytest.fixture
def order(geneva_session: Session) -> Order:
    """A new order (the usual hero), flushed in the test's session."""
    return make_order(geneva_session)
