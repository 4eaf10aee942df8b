"""The ledger of committed writes: a test table that step bodies write one row to per attempt,
through ``self.session``, so what committed can be counted against the executions that
succeeded (tests/reliability/invariants.py, ``check_writes``). Its own module, free of test
fixtures, because worker processes import it with the workflows (crash_flows.py).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Column, Integer, MetaData, String, Table, insert

WRITES_METADATA = MetaData()
WRITES = Table(
    "gd_test_writes",
    WRITES_METADATA,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("workflow_id", Integer, nullable=False),
    Column("step_name", String(100), nullable=False),
    Column("execution_id", Integer, nullable=False),
)


def write_ledger_row(workflow: Any, step_name: str, execution_id: int | None = None) -> None:
    """In a step body (or hook): insert this attempt's ledger row through ``self.session``.

    A Core INSERT, so the statement is on the server at once (not a pending ORM change).
    ``execution_id``: the execution running (from ``before_step_execution``); by default the
    workflow's current one, which is only right while no operator has moved it."""
    if execution_id is None:
        execution = workflow.current_execution
        assert execution is not None, "write_ledger_row() belongs in a step body"
        execution_id = execution.id
    workflow.session.execute(
        insert(WRITES).values(
            workflow_id=workflow.id, step_name=step_name, execution_id=execution_id
        )
    )
