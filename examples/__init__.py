"""Example workflows for ``geneva-drive up --demo``.

Importing this package registers the five demo workflow classes and maps their hero models:

- :mod:`examples.onboarding` — waits of seconds to days, a ``skip_if`` and a gravestone;
- :mod:`examples.payment` — parks until a ``payment_confirmed`` signal arrives;
- :mod:`examples.campaign` — a ``resumable_step`` over a collection of records;
- :mod:`examples.flaky` — reattempts on timeouts, pauses on a malformed feed;
- :mod:`examples.erasure` — a 30-day grace period, ``cancel_if`` and a last step deleting the hero.

:mod:`examples.seed` creates a few hundred instances in every state and keeps new ones coming.
"""

from __future__ import annotations

from examples import campaign, erasure, flaky, onboarding, payment
from examples.models import DEMO_TABLES

__all__ = ["DEMO_TABLES", "campaign", "erasure", "flaky", "onboarding", "payment"]
