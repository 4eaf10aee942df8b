"""Example workflows for ``geneva-drive up --demo``.

Importing this package registers the seven demo workflow classes and maps their hero models:

- :mod:`geneva_drive.examples.onboarding` — waits of seconds to days, a ``skip_if`` and a gravestone;
- :mod:`geneva_drive.examples.payment` — parks until a ``payment_confirmed`` signal arrives;
- :mod:`geneva_drive.examples.checkout` — the same wait with a time-out: abandoned checkouts are canceled;
- :mod:`geneva_drive.examples.campaign` — a ``resumable_step`` over a collection of records;
- :mod:`geneva_drive.examples.flaky` — reattempts on timeouts, pauses on a malformed feed;
- :mod:`geneva_drive.examples.fulfilment` — a child workflow per order line, joined before the invoice;
- :mod:`geneva_drive.examples.erasure` — a 30-day grace period, ``cancel_if`` and a last step deleting the hero;
- :mod:`geneva_drive.examples.tenant_sync` — a concurrency limit per tenant and a rate limit on a partner API;
- :mod:`geneva_drive.examples.recurring` — schedules firing every 30 s and every minute, a nightly cron, a paused one.

:mod:`geneva_drive.examples.seed` creates a few hundred instances in every state and keeps new ones coming.
"""

from __future__ import annotations

from geneva_drive.examples import (
    campaign,
    checkout,
    erasure,
    flaky,
    fulfilment,
    onboarding,
    payment,
    recurring,
    tenant_sync,
)
from geneva_drive.examples.models import DEMO_TABLES

__all__ = [
    "DEMO_TABLES",
    "campaign",
    "checkout",
    "erasure",
    "flaky",
    "fulfilment",
    "onboarding",
    "payment",
    "recurring",
    "tenant_sync",
]
