"""Login throttling: failed logins are counted per client address and per username.

After ``LOGIN_MAX_FAILURES`` failures within ``LOGIN_WINDOW_SECONDS`` (defaults 5 in 300 s)
further login attempts from that address, or for that username, are answered 429 with
``Retry-After`` until the oldest failure leaves the window; the password is not even checked,
so guessing gains nothing. A successful login clears the counters of its address and name.

The counters live in process memory: each gunicorn worker counts on its own, so the effective
limit is the configured one times the number of workers - still a small number of guesses.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

DEFAULT_MAX_FAILURES = 5
DEFAULT_WINDOW_SECONDS = 300.0


class FailureLimiter:
    """Sliding-window failure counts per key (thread-safe)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: dict[str, deque[float]] = {}

    def _trim(self, key: str, window: float, now: float) -> deque[float]:
        stamps = self._failures.get(key)
        if stamps is None:
            return deque()
        while stamps and now - stamps[0] >= window:
            stamps.popleft()
        if not stamps:
            del self._failures[key]
        return stamps

    def retry_after(self, keys: list[str], limit: int, window: float) -> int:
        """Seconds until any of ``keys`` may try again (0 when none is blocked)."""
        now = self._clock()
        wait = 0.0
        with self._lock:
            for key in keys:
                stamps = self._trim(key, window, now)
                if len(stamps) >= limit:
                    wait = max(wait, window - (now - stamps[-limit]))
        return int(wait) + (1 if wait > int(wait) else 0)

    def fail(self, keys: list[str]) -> None:
        now = self._clock()
        with self._lock:
            for key in keys:
                self._failures.setdefault(key, deque()).append(now)
                if len(self._failures) > 100_000:  # bounded memory under a spray of names
                    self._failures.pop(next(iter(self._failures)))

    def clear(self, keys: list[str]) -> None:
        with self._lock:
            for key in keys:
                self._failures.pop(key, None)
