"""The HTTP API fuzzed from its own OpenAPI document: schemathesis generates requests for
every operation — valid ones, and ones that break the schema (wrong types, missing and unknown
fields, odd strings) — and they are sent over real HTTP to a running server, with a token that
has every scope. Whatever the input, the answer is never a 500, always JSON, and every error
has the documented ``{"error": {"code", "message"}}`` shape (docs/MANUAL.md, "Automating
operations")."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from geneva_drive.dashboard.api.openapi import OPERATIONS
from tests.app.conftest import DashPayment
from tests.app.test_api import TOKENS, Served, token_setting

#: Examples per operation and generation mode.
EXAMPLES = 12


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_input_makes_the_api_fail(app_factory, make_workflow, mode):  # type: ignore[no-untyped-def]
    DashPayment.fail_charge = True
    for run in (False, True, False):
        make_workflow(run=run)
    served = Served(app_factory(API_TOKENS=token_setting(), API_REQUESTS_PER_MINUTE=100_000))
    try:
        schema = schemathesis.openapi.from_url(f"{served.url}/api/v1/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) == len(OPERATIONS)  # every declared one is in the document
        seen: dict[str, set[int]] = {}
        for operation in operations:
            _fuzz(operation, mode, seen)
        # The fuzzing reached the operations: not everything was turned away at the door.
        assert any(200 in statuses for statuses in seen.values()), seen
        if mode is GenerationMode.NEGATIVE:
            assert any(400 in statuses for statuses in seen.values()), seen
    finally:
        served.stop()


def _fuzz(operation: Any, mode: GenerationMode, seen: dict[str, set[int]]) -> None:
    label = f"{operation.method.upper()} {operation.path}"

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def check(case: Any) -> None:
        response = case.call(headers={"Authorization": f"Bearer {TOKENS['all'][0]}"})
        seen.setdefault(label, set()).add(response.status_code)
        assert response.status_code < 500, (label, case.path_parameters, case.body, response.text)
        body = response.json()
        if response.status_code >= 400:
            assert set(body) == {"error"}, (label, body)
            assert {"code", "message"} <= set(body["error"]), (label, body)

    check()
