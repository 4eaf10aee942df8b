"""The bounded Celery-fleet chaos run (``tests/reliability/chaos.py``), once per stack.

Each stack runs on private servers the harness starts itself, so the suite's database choice
only decides in which pass it runs: PostgreSQL + Redis in the PostgreSQL pass, MariaDB +
RabbitMQ in the MariaDB pass, neither in the SQLite pass (``scripts/test`` runs the suite
three times; the chaos run must not run three times). Each injects every fault once - pool
child and worker SIGKILLs, server-side connection cuts, a flood of 400 workflows, a broker
that loses its queue, broker restart and kill -9, database restart and kill -9, connection
exhaustion - while operators act through the dashboard, then requires: the invariants hold,
the ledger has no lost and no doubled write, no signal was lost, the dashboard's counts equal
SQL's, no workflow is stuck, the concurrency and rate limits held at every moment, each wait
went one way and timed out on time, each join ran once, killed workers' steps were recovered
within the lease, every lost message was resent, stuck-scheduled recoveries stayed few, and
progress resumed after every fault (the recovery times are printed, not asserted: timing
belongs in bench/).

The full form: ``python -m tests.reliability.chaos --stack all --full`` (CONTRIBUTING).
"""

from __future__ import annotations

import os

import pytest

from tests.backends import url_backend
from tests.reliability.chaos import MissingServer, Plan, run_stack

# The bounded run takes 2-4 min on a loaded 2-core box (RabbitMQ alone starts in 10-30 s): the
# suite's 300 s default would cut it short under load.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def _run(stack: str) -> None:
    try:
        report = run_stack(stack, Plan.bounded())
    except MissingServer as error:
        if os.environ.get("GENEVA_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{error} and GENEVA_REQUIRE_SERVICES=1")
        pytest.skip(str(error))
    print("\n" + report.summary())
    never = [fault.kind for fault in report.faults if fault.recovery is None]
    assert not never, f"no step completed after these faults: {never}"
    assert report.ok, "\n".join(report.problems()[:60])


@pytest.mark.skipif(
    url_backend() != "postgresql", reason="runs once, in the suite's PostgreSQL pass"
)
def test_chaos_postgresql_redis() -> None:
    _run("pg-redis")


@pytest.mark.skipif(url_backend() != "mysql", reason="runs once, in the suite's MariaDB pass")
def test_chaos_mariadb_rabbitmq() -> None:
    _run("mariadb-rabbitmq")
