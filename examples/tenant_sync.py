"""Tenant sync, the limited one (docs/MANUAL.md, "Concurrency and rate limits"): each customer's
data is pulled from its tenant's system and pushed to a partner API. At most two syncs of one tenant
run at once (a backlog of one tenant never starves the others), and the partner API takes at most
five calls a second across the fleet, whichever worker makes them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from geneva_drive import ConcurrencyLimit, RateLimit, Workflow, step
from geneva_drive.examples._work import work


def tenant(workflow: Any) -> str:
    """The tenant of a customer: its e-mail domain."""
    return str(workflow.hero.email).rpartition("@")[2]


class TenantSyncWorkflow(Workflow):
    concurrency_limit = ConcurrencyLimit("tenant-sync", limit=2, key=tenant)

    @step
    def pull(self) -> None:
        work()

    @step(rate_limit=RateLimit("partner-api", limit=5, per=timedelta(seconds=1)))
    def push(self) -> None:
        work()
