"""``/workflows?limit=NAME`` without a key lists the workflows of every key of that limit
(docs/MANUAL.md, "Concurrency and rate limits"), whatever the collation of the slot columns: the
slots ``NAME/<key>`` are matched by prefix, not by a range that relies on byte order."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from geneva_drive import ConcurrencyLimit, Workflow, step
from tests.engine.helpers import make_order


class LimFleetSync(Workflow):
    # "_" is a LIKE wildcard: the filter must escape it (LimFleetLookalike's slots match
    # "lim_fleet/%" unescaped).
    concurrency_limit = ConcurrencyLimit("lim_fleet", limit=5, key=lambda wf: wf.hero.status)

    @step
    def sync(self) -> None:
        pass


class LimFleetLookalike(Workflow):
    concurrency_limit = ConcurrencyLimit("limXfleet", limit=5, key=lambda wf: wf.hero.status)

    @step
    def sync(self) -> None:
        pass


#: ICU's "shifted" alternate handling ignores punctuation at the first levels, as glibc's
#: en_US.UTF-8 does: "lim_fleet/acme" sorts after "lim_fleet0" under it.
SHIFTED = "CREATE COLLATION gd_test_shifted (provider = icu, locale = 'en-u-ka-shifted')"
SLOT_COLUMNS = ("limit_slot", "step_limit_slot", "rate_slot")


def _punctuation_blind_slots(session: Any) -> None:
    """On PostgreSQL, give the slot columns of this test's database a collation that does not
    keep byte order (the shared test server's databases are C.UTF-8, which does)."""
    session.commit()
    session.execute(text(SHIFTED))
    for column in SLOT_COLUMNS:
        session.execute(
            text(
                f"ALTER TABLE geneva_drive_step_executions ALTER COLUMN {column} "
                "TYPE varchar(255) COLLATE gd_test_shifted"
            )
        )
    session.commit()
    # The premise: under this collation the old range "lim_fleet/" .. "lim_fleet0" misses.
    assert not session.scalar(
        text("SELECT CAST('lim_fleet/acme' AS varchar) < ('lim_fleet0' COLLATE gd_test_shifted)")
    )


def test_the_limit_filter_without_a_key_lists_every_key(
    operator_client: Any, geneva_session: Any
) -> None:
    if geneva_session.get_bind().dialect.name == "postgresql":
        _punctuation_blind_slots(geneva_session)
    listed_ids = []
    for status in ("acme", "globex", "north-east.1"):
        workflow = LimFleetSync.create(hero=make_order(geneva_session, status))
        geneva_session.commit()
        listed_ids.append(workflow.id)
    lookalike = LimFleetLookalike.create(hero=make_order(geneva_session, "acme"))
    geneva_session.commit()

    html = operator_client.get("/workflows?limit=lim_fleet").get_data(as_text=True)
    for workflow_id in listed_ids:
        assert f'href="/workflows/{workflow_id}"' in html
    assert f'href="/workflows/{lookalike.id}"' not in html

    one_key = operator_client.get("/workflows?limit=lim_fleet&limit_key=globex").get_data(
        as_text=True
    )
    assert f'href="/workflows/{listed_ids[1]}"' in one_key
    assert f'href="/workflows/{listed_ids[0]}"' not in one_key
