"""A workflow class attribute named like a column of every workflow would replace that
column for the class (its rows could not be written): refused when the class is defined,
with the way to set it per workflow (docs/MANUAL.md, "Defining steps")."""

from __future__ import annotations

import pytest

from geneva_drive import StepConfigurationError, Workflow, step

pytestmark = pytest.mark.sqlite_pass


def test_allow_multiple_as_a_class_attribute_is_refused_with_the_way_out():
    with pytest.raises(StepConfigurationError, match=r"allow_multiple=True"):

        class Doubled(Workflow):
            allow_multiple = True

            @step
            def one(self) -> None:
                pass


def test_any_other_column_is_refused_too():
    with pytest.raises(StepConfigurationError, match=r"Stateful\.state: `state` is a column"):

        class Stateful(Workflow):
            state = "ready"

            @step
            def one(self) -> None:
                pass
