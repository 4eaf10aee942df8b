"""iterate_over_records / iterate_over_batches: keyset pagination over a SELECT, never OFFSET."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import DateTime, Integer, String, event, select
from sqlalchemy.orm import Mapped, mapped_column

from geneva_drive import Workflow, db, resumable_step
from geneva_drive.models import Base
from geneva_drive.testing import assert_cursor, perform_next_step, speedrun_workflow
from tests.engine.helpers import make_order


class ResumableItem(Base):
    __tablename__ = "test_resumable_items"
    id: Mapped[int] = mapped_column(primary_key=True)
    grp: Mapped[str] = mapped_column(String(8), default="a")
    position: Mapped[int] = mapped_column(Integer, unique=True)
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    processed: Mapped[int] = mapped_column(Integer, default=0)


@pytest.fixture
def items(geneva_session):
    base = datetime(2026, 1, 1, tzinfo=UTC)
    rows = []
    for n in range(1, 11):
        rows.append(
            ResumableItem(
                id=n,
                grp="a" if n % 5 else "b",  # ids 5 and 10 are in group b
                position=100 - n,  # reverse order of the ids
                created=base + timedelta(hours=n // 3),  # shared timestamps
            )
        )
    geneva_session.add_all(rows)
    geneva_session.commit()
    return rows


class Statements(list):
    """SELECTs on the items table, with their parameters."""

    calls: list

    def assert_keyset_only(self):
        """No page is found by skipping rows: no OFFSET (SQLite's dialect appends a constant
        ``OFFSET 0`` to every LIMIT; any other offset would mean OFFSET pagination)."""
        assert self.calls, "the iteration queried the items table"
        for statement, params in self.calls:
            assert "LIMIT" in statement.upper()
            if "OFFSET" in statement.upper():
                assert statement.rstrip().endswith("LIMIT ? OFFSET ?"), statement
                assert list(params)[-1] == 0, (statement, params)


@pytest.fixture
def item_sql(geneva_database):
    statements = Statements()
    statements.calls = []

    def record(conn, cursor, statement, params, context, executemany):
        if "test_resumable_items" in statement and statement.lstrip().upper().startswith("SELECT"):
            statements.append(statement)
            statements.calls.append((statement, params))

    event.listen(geneva_database.engine, "before_cursor_execute", record)
    yield statements
    event.remove(geneva_database.engine, "before_cursor_execute", record)


def chain(wf, name):
    return [e for e in wf.execution_history if e.step_name == name]


def processed_counts():
    session = db.SessionFactory()
    try:
        return {i.id: i.processed for i in session.scalars(select(ResumableItem))}
    finally:
        session.close()


def test_iterate_over_records_is_keyset_paginated_across_a_chain(order, items, item_sql):
    seen = []

    class RecordsFlow(Workflow):
        @resumable_step(max_iterations=3)
        def walk(self, it):
            def work(item):
                seen.append(item.id)
                item.processed += 1

            it.iterate_over_records(
                select(ResumableItem).where(ResumableItem.grp == "a"), work, batch_size=2
            )

    wf = RecordsFlow.create(hero=order)
    for _ in range(3):
        perform_next_step(wf)
    iteration_sql = list(item_sql)
    item_sql.assert_keyset_only()
    assert seen == [1, 2, 3, 4, 6, 7, 8, 9]
    assert [e.cursor_value for e in chain(wf, "walk")] == [3, 7, 9]
    assert [e.outcome for e in chain(wf, "walk")] == ["continued", "continued", "success"]
    assert processed_counts() == {1: 1, 2: 1, 3: 1, 4: 1, 5: 0, 6: 1, 7: 1, 8: 1, 9: 1, 10: 0}
    for statement in iteration_sql:
        assert "ORDER BY test_resumable_items.id" in statement
    # every page after the first of a chain starts from the cursor
    assert sum("test_resumable_items.id >" in s for s in iteration_sql) >= 3


def test_iterate_over_records_by_another_unique_column(order, items, item_sql):
    seen = []

    class ByPositionFlow(Workflow):
        @resumable_step(max_iterations=4)
        def walk(self, it):
            it.iterate_over_records(
                select(ResumableItem).order_by(ResumableItem.id.desc()),
                lambda item: seen.append(item.position),
                cursor_column="position",
                batch_size=3,
            )

    wf = ByPositionFlow.create(hero=order)
    perform_next_step(wf)
    assert_cursor(wf, 93)
    speedrun_workflow(wf)
    assert seen == list(range(90, 100))
    item_sql.assert_keyset_only()
    # MariaDB/MySQL quote the reserved word: test_resumable_items.`position`
    assert any("test_resumable_items.position >" in s.replace("`", "") for s in item_sql)


def test_iterate_over_batches_yields_lists_and_checkpoints_per_batch(order, items, item_sql):
    batches = []

    class BatchesFlow(Workflow):
        @resumable_step(max_iterations=2)
        def walk(self, it):
            it.iterate_over_batches(
                select(ResumableItem),
                lambda rows: batches.append([r.id for r in rows]),
                batch_size=3,
            )

    wf = BatchesFlow.create(hero=order)
    perform_next_step(wf)
    assert batches == [[1, 2, 3], [4, 5, 6]]
    assert_cursor(wf, 6)
    perform_next_step(wf)
    assert batches == [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10]]
    # the last batch hit max_iterations too: one more (empty) link finds nothing left
    perform_next_step(wf)
    assert batches == [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10]]
    links = chain(wf, "walk")
    assert [(e.outcome, e.cursor_value) for e in links] == [
        ("continued", 6),
        ("continued", 10),
        ("success", 10),
    ]
    item_sql.assert_keyset_only()


def test_batches_of_an_exact_multiple_end_with_an_empty_page(order, items):
    batches = []

    class ExactBatchesFlow(Workflow):
        @resumable_step
        def walk(self, it):
            it.iterate_over_batches(
                select(ResumableItem), lambda rows: batches.append(len(rows)), batch_size=5
            )

    wf = ExactBatchesFlow.create(hero=order)
    speedrun_workflow(wf)
    assert batches == [5, 5]
    assert chain(wf, "walk")[-1].cursor_value == 10


def test_composite_cursor_column_uses_row_values(order, items, item_sql):
    seen = []

    class CompositeFlow(Workflow):
        @resumable_step(max_iterations=4)
        def walk(self, it):
            it.iterate_over_records(
                select(ResumableItem),
                lambda item: seen.append(item.id),
                cursor_column=("created", "id"),
                batch_size=3,
            )

    wf = CompositeFlow.create(hero=order)
    perform_next_step(wf)
    # created is shared by several rows; (created, id) is unique and ordered
    expected_cursor = [datetime(2026, 1, 1, 1, tzinfo=UTC), 4]
    links = chain(wf, "walk")
    stored = links[0].cursor_value
    assert stored[1] == 4
    assert stored[0].astimezone(UTC) == expected_cursor[0]
    speedrun_workflow(wf)
    assert seen == list(range(1, 11))
    keyset = [s for s in item_sql if ">" in s]
    assert keyset
    item_sql.assert_keyset_only()
    assert any("(test_resumable_items.created, test_resumable_items.id) >" in s for s in keyset)


def test_bad_cursor_column_and_batch_size_fail_the_step(order, items):
    class BadColumnFlow(Workflow):
        @resumable_step
        def walk(self, it):
            it.iterate_over_records(select(ResumableItem), print, cursor_column="nope")

    wf = BadColumnFlow.create(hero=order)
    with pytest.raises(ValueError, match="cursor_column 'nope' is not an attribute"):
        perform_next_step(wf)

    class BadBatchFlow(Workflow):
        @resumable_step
        def walk(self, it):
            it.iterate_over_batches(select(ResumableItem), print, batch_size=0)

    other_hero = make_order(wf.session)
    wf2 = BadBatchFlow.create(hero=other_hero)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        perform_next_step(wf2)


def test_composite_cursor_must_be_a_list_of_matching_length(order, items):
    class MismatchFlow(Workflow):
        @resumable_step
        def walk(self, it):
            if it.cursor is None:
                it.skip_to(5)
            it.iterate_over_records(select(ResumableItem), print, cursor_column=("created", "id"))

    wf = MismatchFlow.create(hero=order)
    perform_next_step(wf)
    with pytest.raises(ValueError, match="composite keyset cursor is a list of 2 values"):
        perform_next_step(wf)


def test_uuid_primary_keys_page_by_keyset_across_a_chain(order, geneva_session):
    from tests.conftest import Account

    accounts = [Account(email=f"{n}@example.com") for n in range(7)]
    geneva_session.add_all(accounts)
    geneva_session.commit()
    # The keyset follows the database's order of the key: Python's on PostgreSQL and SQLite;
    # MariaDB's native UUID type sorts by its time fields first (not by the text form).
    expected = list(geneva_session.scalars(select(Account.id).order_by(Account.id)))
    assert sorted(expected) == sorted(a.id for a in accounts)
    if db.backend(geneva_session) != "mariadb":
        assert expected == sorted(a.id for a in accounts)
    seen = []

    class UuidRecordsFlow(Workflow):
        @resumable_step(max_iterations=3)
        def walk(self, it):
            it.iterate_over_records(select(Account), lambda a: seen.append(a.id), batch_size=2)

    wf = UuidRecordsFlow.create(hero=order)
    perform_next_step(wf)
    assert_cursor(wf, expected[2])
    speedrun_workflow(wf)
    assert seen == expected
