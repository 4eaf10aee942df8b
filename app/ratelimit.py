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

Each attempt is recorded as a failure *before* its password is checked (:meth:`attempt`, one
lock around the check and the record) and taken back when it succeeds: with check-then-record,
30 parallel guesses were all checked against a limit of 5.

**Lockout by strangers.** A per-user counter lets anyone who knows a name lock its owner out
(55 failures from 11 addresses did, against the per-user limit of 50). So the per-user counter
does not apply to an address from which that user logged in successfully within
``KNOWN_ADDRESS_SECONDS`` (30 days, in process memory): the owner, at their usual address, is
never locked out by others' failures, while an attacker rotating addresses still meets the
per-user limit everywhere else (and the per-pair limit at the owner's address, as anyone does).
What is left: an owner at a new address during such an attack waits out the backoff (at most
the window). The choice of our own code over Flask-Limiter is in README "Security".

Memory is bounded (``max_keys``): when full, keys whose failures have all left the window go
first, then keys that are not blocking anyone, fewest failures and oldest first; a key that
is blocking is evicted only when every key is, the one whose wait ends soonest first. So a
spray of fresh names (one failure each) cannot push a victim's block or count out of the table.

The counters live in process memory: each worker process of a multi-process server counts on
its own, so the effective limits are the configured ones times the number of processes.

The same counters, keyed by client address alone, throttle wrong ``/metrics`` bearer tokens
(:class:`TokenThrottle`).
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
#: Seconds an address that logged in as a user stays exempt from that user's per-user limit.
KNOWN_ADDRESS_SECONDS = 30 * 24 * 3600.0
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


@dataclass(frozen=True)
class Attempt:
    """One login attempt as :meth:`FailureLimiter.attempt` recorded it."""

    keys: dict[str, str]
    #: Whole seconds to wait (the attempt was refused and not recorded), or 0.
    wait: int
    stamp: float = 0.0


def _known_key(keys: dict[str, str]) -> str:
    return keys["pair"].removeprefix("pair:")


class FailureLimiter:
    """Sliding-window failure counts per key, with exponential backoff (thread-safe)."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, max_keys: int = DEFAULT_MAX_KEYS
    ) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: dict[str, deque[float]] = {}
        #: "name\x00address" -> last successful login from there (insertion-ordered: oldest first).
        self._known: dict[str, float] = {}
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

    def attempt(self, keys: dict[str, str], limits: Limits) -> Attempt:
        """Check and record one login attempt at once (under one lock): refused with the wait
        while any counter says wait, else counted as a failure until :meth:`succeed` says
        otherwise. The user's counter is not checked from an address known to be theirs."""
        now = self._clock()
        with self._lock:
            known_at = self._known.get(_known_key(keys))
            known = known_at is not None and now - known_at < KNOWN_ADDRESS_SECONDS
            wait = 0.0
            for kind, key in keys.items():
                if kind == "user" and known:
                    continue
                stamps = self._trim(key, limits.window, now)
                wait = max(wait, self._wait(stamps, self._limit_of(key, limits), limits, now))
            if wait:
                return Attempt(keys, int(wait) + (1 if wait > int(wait) else 0))
            self._record(list(keys.values()), limits, now)
            return Attempt(keys, 0, now)

    def succeed(self, attempt: Attempt) -> None:
        """The attempt's password was right: clear its pair and user, take its failure back
        from the address, and remember the address as the user's."""
        with self._lock:
            self._failures.pop(attempt.keys["pair"], None)
            self._failures.pop(attempt.keys["user"], None)
            self._unrecord(attempt.keys["address"], attempt.stamp)
            known = _known_key(attempt.keys)
            self._known.pop(known, None)
            self._known[known] = self._clock()
            while len(self._known) > self.max_keys:
                del self._known[next(iter(self._known))]

    def withdraw(self, attempt: Attempt) -> None:
        """Take the attempt back entirely (its password was never checked)."""
        with self._lock:
            for key in attempt.keys.values():
                self._unrecord(key, attempt.stamp)

    def _unrecord(self, key: str, stamp: float) -> None:
        stamps = self._failures.get(key)
        if stamps is None:
            return
        try:
            stamps.remove(stamp)
        except ValueError:
            return
        if not stamps:
            del self._failures[key]

    def failures(self, key: str, window: float) -> int:
        with self._lock:
            return len(self._trim(key, window, self._clock()))

    def fail(self, keys: list[str], limits: Limits | None = None) -> None:
        limits = limits or Limits()
        now = self._clock()
        with self._lock:
            self._record(keys, limits, now)

    def _record(self, keys: list[str], limits: Limits, now: float) -> None:
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


# --- bearer tokens (/metrics) ---------------------------------------------------------------------

#: Seconds an address that presented the right token stays exempt from its throttle.
KNOWN_TOKEN_ADDRESS_SECONDS = 24 * 3600.0


class TokenThrottle:
    """Wrong bearer tokens counted per client address, with the login throttle's backoff.

    After ``limits.pair`` wrong tokens from one address within the window, that address waits
    (``limits.backoff``, doubling per further failure, up to the window) and is answered 429
    without its token being compared, so guessing gains nothing. A missing token is not a guess
    and is not counted. An address that presented the right token within
    :data:`KNOWN_TOKEN_ADDRESS_SECONDS` is not throttled: a scraper behind the same proxy as a
    guesser keeps scraping (the guesser there meets the token's length instead). Memory is
    bounded as :class:`FailureLimiter`'s is; counts are per process.
    """

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, max_keys: int = DEFAULT_MAX_KEYS
    ) -> None:
        self.clock = clock
        self._failures = FailureLimiter(lambda: self.clock(), max_keys)
        self._lock = threading.Lock()
        #: address -> when it last presented the right token (insertion-ordered: oldest first).
        self._known: dict[str, float] = {}

    @staticmethod
    def _key(address: str | None) -> str:
        return f"token:{address or '?'}"

    def _is_known(self, address: str | None, now: float) -> bool:
        seen = self._known.get(address or "?")
        return seen is not None and now - seen < KNOWN_TOKEN_ADDRESS_SECONDS

    def retry_after(self, address: str | None, limits: Limits) -> int:
        """Whole seconds ``address`` must wait before its token is compared again (0: now)."""
        with self._lock:
            if self._is_known(address, self.clock()):
                return 0
        return self._failures.retry_after([self._key(address)], limits)

    def failed(self, address: str | None, limits: Limits) -> None:
        self._failures.fail([self._key(address)], limits)

    def succeeded(self, address: str | None) -> None:
        with self._lock:
            name = address or "?"
            self._known.pop(name, None)
            self._known[name] = self.clock()
            while len(self._known) > self._failures.max_keys:
                del self._known[next(iter(self._known))]
