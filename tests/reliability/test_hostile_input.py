"""Hostile input, property-based: every bad value gets a clear engine error and writes nothing.

Engine entry points (signal names, idempotency keys and payloads; cursors; job options;
resume_at step names) here; the dashboard's forms and query parameters in
test_hostile_dashboard.py.
"""

from __future__ import annotations

import math
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from sqlalchemy import func, select

from geneva_drive import IterableStep, Workflow, resumable_step, step
from geneva_drive.config import settings
from geneva_drive.errors import (
    CursorTooLargeError,
    EngineError,
    SignalPayloadTooLargeError,
    StepConfigurationError,
    StepNotDefinedError,
)
from geneva_drive.job_options import validate_job_options
from geneva_drive.models import Signal, StepExecution
from geneva_drive.serialization import deserialize, serialize_cursor, serialize_payload
from tests.reliability.harness import drain, new_workflow, session_scope, workflow_state
from tests.reliability.invariants import assert_invariants

CLEAR_ERRORS = (TypeError, ValueError, EngineError)

HYPO = hsettings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


class HostileGate(Workflow):
    @step(wait_for="never-delivered")
    def gate(self):
        pass


class HostileCursor(Workflow):
    hostile: Any = None

    @resumable_step
    def walk(self, it: IterableStep):
        it.set(1)
        it.checkpoint()
        it.set(type(self).hostile)
        it.checkpoint()


class HostilePaused(Workflow):
    @step
    def one(self):
        self.pause()

    @step
    def two(self):
        pass

    gone_step = None


# --- strategies ----------------------------------------------------------------------------

weird_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40
) | st.sampled_from(
    [
        "",
        " ",
        "\u202e",
        "\ufeff",
        "😀" * 20,
        "<script>alert(1)</script>",
        "'; DROP TABLE x;--",
        "\u0301",
        "a\u200db",
        "%s%n",
        "{{7*7}}",
        "\\",
        "\n\r\t",
    ]
)

json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**62), max_value=2**62)
    | st.floats(allow_nan=False, allow_infinity=False)
    | weird_text
)
json_value = st.recursive(
    json_leaf,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(weird_text, children, max_size=5)
    ),
    max_leaves=25,
)


class Opaque:
    def __repr__(self) -> str:
        return "<Opaque>"


def _deep(n: int) -> Any:
    value: Any = "bottom"
    for _ in range(n):
        value = {"x": [value]}
    return value


unstorable_leaf = st.sampled_from(
    [
        float("nan"),
        float("inf"),
        float("-inf"),
        b"bytes",
        bytearray(b"x"),
        {1, 2},
        frozenset({"a"}),
        Opaque(),
        complex(1, 2),
        object(),
        lambda: None,
        ...,
        "nul\x00inside",
        "lone \ud800 surrogate",
        range(3),
    ]
)
bad_keys = st.sampled_from([None, (1, 2), b"k", frozenset(), Opaque()])


@st.composite
def unstorable(draw: Any) -> Any:
    """A JSON-ish structure with exactly one thing JSON cannot hold buried somewhere in it."""
    kind = draw(st.sampled_from(["leaf", "key", "deep", "collide", "nulkey"]))
    if kind == "leaf":
        bad: Any = draw(unstorable_leaf)
    elif kind == "key":
        bad = {draw(bad_keys): 1}
    elif kind == "deep":
        bad = _deep(draw(st.integers(min_value=300, max_value=3000)))
    elif kind == "collide":
        bad = {1: "int key", "1": "str key"}
    else:
        bad = {"k\x00": 1}
    wrapper = draw(st.sampled_from(["bare", "list", "dict", "nested"]))
    if wrapper == "list":
        return [draw(json_value), bad]
    if wrapper == "dict":
        return {"ok": draw(json_value), "bad": bad}
    if wrapper == "nested":
        return {"a": [{"b": bad}]}
    return bad


# --- helpers ---------------------------------------------------------------------------------


def counts() -> tuple[int, int, list[tuple[int, str]]]:
    with session_scope() as session:
        signals = session.scalar(select(func.count()).select_from(Signal)) or 0
        executions = session.scalar(select(func.count()).select_from(StepExecution)) or 0
        states = [
            (e.id, e.state)
            for e in session.scalars(select(StepExecution).order_by(StepExecution.id))
        ]
    return signals, executions, states


def deliver(workflow_id: int, *args: Any, **kwargs: Any) -> Any:
    with session_scope() as session:
        workflow = session.get(Workflow, workflow_id)
        return workflow.signal(*args, **kwargs)


@pytest.fixture
def gate_id(rdb):
    workflow_id = new_workflow(HostileGate)
    drain()  # parked at the gate
    return workflow_id


# --- signals ----------------------------------------------------------------------------------


@HYPO
@given(payload=unstorable())
def test_unstorable_payloads_are_refused_and_write_nothing(gate_id, payload):
    before = counts()
    with pytest.raises(CLEAR_ERRORS) as caught:
        deliver(gate_id, "evt", payload)
    assert not isinstance(caught.value, RecursionError)
    assert str(caught.value)
    assert counts() == before


@HYPO
@given(payload=json_value, name=weird_text, key=st.none() | weird_text)
def test_storable_payloads_round_trip_exactly(gate_id, payload, name, key):
    assume(name.strip() and name != "never-delivered")
    before = counts()
    signal = deliver(gate_id, name, payload, idempotency_key=key)
    with session_scope() as session:
        stored = session.get(Signal, signal.id)
        assert stored.name == name
        assert stored.idempotency_key == key
        expected = {} if payload is None else payload
        if not signal.duplicate_delivery:  # a repeated key keeps the first payload
            assert _same(stored.payload, expected), (stored.payload, expected)
    after = counts()
    assert after[1:] == before[1:]  # a signal that matches nothing wakes nothing
    assert after[0] in (before[0], before[0] + 1)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, int | float) and isinstance(b, int | float) and math.isclose(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b and type(a) is type(b)


@HYPO
@given(
    name=st.sampled_from([None, "", "   ", "\t\n"])
    | st.text(min_size=256, max_size=2000).filter(lambda s: s.strip())
    | st.sampled_from(["nul\x00name", "\ud800", "x" * 256]),
)
def test_bad_signal_names_are_refused_and_write_nothing(gate_id, name):
    before = counts()
    with pytest.raises(CLEAR_ERRORS):
        deliver(gate_id, name, {"a": 1})
    assert counts() == before


@HYPO
@given(key=st.text(min_size=256, max_size=1000) | st.sampled_from(["k\x00", "\udfff", "k" * 300]))
def test_bad_idempotency_keys_are_refused_and_write_nothing(gate_id, key):
    before = counts()
    with pytest.raises(CLEAR_ERRORS):
        deliver(gate_id, "evt", {"a": 1}, idempotency_key=key)
    assert counts() == before


def test_oversize_payload_and_unknown_options(gate_id):
    settings.max_signal_payload_size = 1024
    before = counts()
    with pytest.raises(SignalPayloadTooLargeError):
        deliver(gate_id, "evt", {"blob": "x" * 2000})
    with pytest.raises(SignalPayloadTooLargeError):
        deliver(gate_id, "evt", ["é" * 600])  # bytes, not characters, count
    with pytest.raises(TypeError, match="timeout"):
        deliver(gate_id, "evt", {}, timeout=5)
    assert counts() == before
    deliver(gate_id, "evt", {"blob": "x" * 900})  # under the limit is fine
    assert_invariants(rdb_engine())


def rdb_engine():
    from geneva_drive import db

    return db.get_engine()


def test_payload_shaped_like_an_internal_tag_comes_back_as_sent(gate_id):
    """A sender cannot forge the engine's typed-value tags (nor crash the step reading it)."""
    forged = [
        {"_gd": "datetime", "v": "2020-01-01T00:00:00"},
        {"_gd": "uuid", "v": "not-a-uuid"},
        {"_gd": "decimal", "v": "zzz"},
        {"_gd": "date", "v": 5},
        {"_gd": "dict", "v": {"a": 1}},
        {"_gd": "weird", "v": 1},
    ]
    for payload in forged:
        signal = deliver(gate_id, "evt", payload)
        with session_scope() as session:
            assert session.get(Signal, signal.id).payload == payload


def test_typed_values_round_trip():
    value = {
        "when": datetime(2024, 5, 1, 12, 30, tzinfo=UTC),
        "day": date(2024, 5, 1),
        "id": uuid.UUID(int=7),
        "amount": Decimal("12.50"),
        "nested": [{"_gd": "uuid", "v": "x"}],
    }
    assert deserialize(serialize_payload(value)) == value
    assert deserialize(serialize_cursor(value)) == value


# --- cursors ----------------------------------------------------------------------------------


@HYPO
@given(value=unstorable())
def test_unstorable_cursors_raise_clear_errors(rdb, value):
    with pytest.raises(CLEAR_ERRORS) as caught:
        serialize_cursor(value)
    assert not isinstance(caught.value, RecursionError)


def test_cursor_too_large(rdb):
    settings.max_cursor_size = 64
    with pytest.raises(CursorTooLargeError):
        serialize_cursor({"ids": list(range(100))})
    assert serialize_cursor(list(range(10))) == list(range(10))


@pytest.mark.parametrize("hostile", [{"big": "x" * 500}, float("nan"), {1, 2}, b"raw"])
def test_hostile_cursor_in_a_step_fails_the_step_and_keeps_the_last_good_cursor(rdb, hostile):
    settings.max_cursor_size = 256
    HostileCursor.hostile = hostile
    workflow_id = new_workflow(HostileCursor)
    drain()
    assert workflow_state(workflow_id) == "paused"  # the default policy
    with session_scope() as session:
        execution = session.scalars(
            select(StepExecution).where(StepExecution.workflow_id == workflow_id)
        ).one()
        assert execution.state == "failed"
        # Typed: too large, or a value JSON cannot hold (docs/MANUAL.md, "Errors").
        assert execution.error_class_name.rsplit(".", 1)[-1] in (
            "CursorTooLargeError",
            "InvalidInputError",
        )
        assert execution.cursor_value == 1  # the last good checkpoint
    assert_invariants(rdb, quiescent=True)


# --- job options ------------------------------------------------------------------------------

_NUMERIC_JUNK = ["soon", [], {}, True, float("nan"), float("inf"), float("-inf"), 1e20, b"x"]
BAD_OPTION_VALUES = {
    "wait": [*_NUMERIC_JUNK, -1, -0.5, timedelta(seconds=-1)],
    "wait_until": [*_NUMERIC_JUNK, timedelta(hours=1), "2030-01-01"],
    "priority": ["1", 1.0, True, False, [1], 2**0.5],
    "queue": ["", "   ", 5, b"q", ["q"], True],
}
bad_job_options = st.one_of(
    st.sampled_from([[], "queue", 5, ("queue", "x"), {1: 2}, {"Queue": "x"}]),
    st.sampled_from(sorted(BAD_OPTION_VALUES)).flatmap(
        lambda key: st.sampled_from(BAD_OPTION_VALUES[key]).map(lambda value: {key: value})
    ),
    st.dictionaries(
        weird_text.filter(lambda k: k not in BAD_OPTION_VALUES),
        st.integers(),
        min_size=1,
        max_size=2,
    ),
)


@HYPO
@given(options=bad_job_options)
def test_bad_job_options_raise_step_configuration_error(options):
    with pytest.raises(StepConfigurationError):
        validate_job_options(options, "HostileWorkflow.step_job_options")


@HYPO
@given(options=bad_job_options.filter(bool))  # empty options mean "none" to create()
def test_bad_instance_job_options_refuse_create_and_write_nothing(rdb, options):
    before = counts()
    with pytest.raises(StepConfigurationError):
        new_workflow(HostileGate, step_job_options=options)
    assert counts() == before


@pytest.mark.parametrize("priority", [-1, 0, 10**6])
def test_integer_priorities_are_accepted(priority):
    assert validate_job_options({"priority": priority}, "x") == {"priority": priority}


# --- resume_at step names --------------------------------------------------------------------


@HYPO
@given(
    name=weird_text.filter(lambda s: s not in ("one", "two"))
    | st.sampled_from([None, 5, "../two", "two\x00", "TWO", "two ", "gone_step", "__init__"])
)
def test_resume_at_unknown_steps_changes_nothing(rdb, name):
    workflow_id = new_workflow(HostilePaused)
    drain()
    before = counts()
    with pytest.raises(StepNotDefinedError), session_scope() as session:
        session.get(Workflow, workflow_id).resume_at(name)
    assert counts() == before
    assert workflow_state(workflow_id) == "paused"
