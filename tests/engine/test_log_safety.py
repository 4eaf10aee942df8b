"""A step's error message cannot forge log lines, neither in the "Step raised" line nor in the
traceback printed under it (docs/MANUAL.md, "Instrumentation and error reporting")."""

from __future__ import annotations

import io
import logging
from typing import Any

import pytest

from geneva_drive import Workflow, instrumentation, step
from geneva_drive.testing import perform_next_step
from tests.engine.helpers import make_order

FORGED = "INFO geneva_drive.executor: payment 77 captured"


class LoudFlow(Workflow):
    @step
    def charge(self) -> None:
        try:
            raise KeyError(f"inner\n{FORGED}")
        except KeyError as inner:
            raise RuntimeError(f"card declined\r\n{FORGED}\u2028{FORGED}") from inner


def test_a_step_error_prints_one_line_per_real_line_with_its_traceback(geneva_session: Any) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger(instrumentation.log.name)
    logger.disabled = False  # Alembic's fileConfig may have disabled it
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep()
    logger.addHandler(handler)
    logger.addHandler(keep)
    try:
        workflow = LoudFlow.create(hero=make_order(geneva_session), session=geneva_session)
        geneva_session.commit()
        with pytest.raises(RuntimeError):  # the helper re-raises the step's error
            perform_next_step(workflow)
    finally:
        logger.removeHandler(handler)
        logger.removeHandler(keep)
    geneva_session.refresh(workflow)
    assert workflow.state == "paused"
    printed = stream.getvalue()
    assert "Traceback (most recent call last):" in printed  # the traceback is still there
    assert "The above exception was the direct cause" in printed  # and its cause
    lines = printed.splitlines()
    assert not [line for line in lines if line.startswith("INFO ")], printed
    assert "card declined\\x0d\\x0aINFO geneva_drive.executor" in printed
    assert "\\u2028" in printed
    # An error tracker reading the record still gets the exception itself.
    (record,) = [r for r in records if r.getMessage().startswith("Step raised")]
    assert record.exc_info is not None and isinstance(record.exc_info[1], RuntimeError)
