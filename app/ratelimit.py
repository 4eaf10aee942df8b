"""Login throttling: failed logins counted per (username, client address), with backoff.

Three counters, each a sliding window of failures (``LOGIN_WINDOW_SECONDS``, default 300 s):

* **the pair** (username, address): after ``LOGIN_MAX_FAILURES`` (5) failures, each further
  attempt of that pair waits ``LOGIN_BACKOFF_SECONDS`` (2 s), doubled for every failure past the
  limit, up to the window. A guesser is slowed to a crawl; nobody is locked out for good;
* **the username** from every address together, ``LOGIN_MAX_FAILURES_PER_USER`` (50): an
  attacker who rotates addresses gains nothing, yet five wrong passwords from strangers do not
  lock the real user out;
* **the address** for every username together, ``LOGIN_MAX_FAILURES_PER_ADDRESS`` (50): one
  address spraying many names is slowed the same way.

While any of them says wait, the attempt is answered 429 with ``Retry-After`` and the password
is not even checked (so guessing gains nothing) nor counted (so waiting ends). A successful
login clears its pair and its username (never the address: logging in to one's own account
must not reset a spray from that address).

Memory is bounded (``max_keys``): when full, keys whose failures have all left the window go
first, then keys that are not blocking anyone, fewest failures and oldest first; a key that
is blocking is evicted only when every key is, the one whose wait ends soonest first. So a
spray of fresh names (one failure each) cannot push a victim's block or count out of the table.

The counters live in process memory: each worker process of a multi-process server counts on
its own, so the effective limits are the configured ones times the number of processes.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_MAX_FAILURES = 5
DEFAULT_WINDOW_SECONDS = 300.0
DEFAULT_BACKOFF_SECONDS = 2.0
DEFAULT_MAX_FAILURES_PER_USER = 50
DEFAULT_MAX_FAILURES_PER_ADDRESS = 50
DEFAULT_MAX_KEYS = 100_000
#: Characters of a username a counter's key keeps.
MAX_NAME_IN_KEY = 256


@dataclass(frozen=True)
class Limits:
    """How many failures each kind of key allows within ``window`` before backoff."""

    pair: int = DEFAULT_MAX_FAILURES
    user: int = DEFAULT_MAX_FAILURES_PER_USER
    address: int = DEFAULT_MAX_FAILURES_PER_ADDRESS
    window: float = DEFAULT_WINDOW_SECONDS
    backoff: float = DEFAULT_BACKOFF_SECONDS


def keys_for(user: str, address: str | None) -> dict[str, str]:
    """The three counters of one login attempt, by kind (NUL cannot appear in either part)."""
    # Cut: a key per failure is kept in memory, and the form field may hold a megabyte (no
    # configured name is that long; names past the cut share one counter, which is harmless).
    name = user.lower()[:MAX_NAME_IN_KEY]
    addr = address or "?"
    return {"pair": f"pair:{name}\x00{addr}", "user": f"user:{name}", "address": f"addr:{addr}"}


class FailureLimiter:
    """Sliding-window failure counts per key, with exponential backoff (thread-safe)."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, max_keys: int = DEFAULT_MAX_KEYS
    ) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: dict[str, deque[float]] = {}
        self.max_keys = max_keys

    @staticmethod
    def _limit_of(key: str, limits: Limits) -> int:
        kind = key.partition(":")[0]
        return {"pair": limits.pair, "user": limits.user, "addr": limits.address}.get(
            kind, limits.pair
        )

    def _trim(self, key: str, window: float, now: float) -> deque[float]:
        stamps = self._failures.get(key)
        if stamps is None:
            return deque()
        while stamps and now - stamps[0] >= window:
            stamps.popleft()
        if not stamps:
            del self._failures[key]
        return stamps

    @staticmethod
    def _wait(stamps: deque[float], limit: int, limits: Limits, now: float) -> float:
        """Seconds until the next attempt: 0 under the limit, then backoff after the last
        failure, doubling per failure past the limit (capped at the window)."""
        if len(stamps) < limit:
            return 0.0
        excess = min(len(stamps) - limit, 32)
        delay = min(limits.window, limits.backoff * 2.0**excess)
        return max(0.0, delay - (now - stamps[-1]))

    def retry_after(self, keys: list[str], limits: Limits) -> int:
        """Whole seconds until every one of ``keys`` may try again (0 when none waits)."""
        now = self._clock()
        wait = 0.0
        with self._lock:
            for key in keys:
                stamps = self._trim(key, limits.window, now)
                wait = max(wait, self._wait(stamps, self._limit_of(key, limits), limits, now))
        return int(wait) + (1 if wait > int(wait) else 0)

    def failures(self, key: str, window: float) -> int:
        with self._lock:
            return len(self._trim(key, window, self._clock()))

    def fail(self, keys: list[str], limits: Limits | None = None) -> None:
        limits = limits or Limits()
        now = self._clock()
        with self._lock:
            for key in keys:
                stamps = self._failures.get(key)
                if stamps is None:
                    if len(self._failures) >= self.max_keys:
                        self._make_room(limits, now)
                    stamps = self._failures[key] = deque()
                stamps.append(now)

    def clear(self, keys: list[str]) -> None:
        with self._lock:
            for key in keys:
                self._failures.pop(key, None)

    def __len__(self) -> int:
        return len(self._failures)

    def _make_room(self, limits: Limits, now: float) -> None:
        """Shrink to 90 % of ``max_keys``: expired keys first, then keys blocking nobody
        (fewest failures, then oldest, first), and blocking keys only if nothing else is left."""
        target = max(0, int(self.max_keys * 0.9))
        for key in list(self._failures):
            self._trim(key, limits.window, now)
        excess = len(self._failures) - target
        if excess <= 0:
            return

        def rank(item: tuple[str, deque[float]]) -> tuple[int, float, float]:
            # A spray is many keys of one failure each: those go first, so a victim's counter
            # (several failures) outlives it. Blocking keys last, the soonest to unblock first.
            key, stamps = item
            wait = self._wait(stamps, self._limit_of(key, limits), limits, now)
            return (1, wait, 0.0) if wait > 0 else (0, len(stamps), stamps[-1])

        for key, _stamps in sorted(self._failures.items(), key=rank)[:excess]:
            del self._failures[key]
