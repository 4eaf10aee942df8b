"""Who may call the HTTP API: bearer tokens with scopes, and their throttles.

``GENEVA_API_TOKENS`` lists the tokens as ``name:sha256-hex-of-token:scopes`` separated by
``;`` (scopes comma-separated: ``read``, ``operate``, ``signal``). Only the hash is configured,
so the settings, a config dump or a leaked environment never hold a usable token. A host app may
instead pass ``GenevaDrive(api_auth=callable)``: ``callable(request)`` returns an
:class:`ApiClient` (its name and scopes) or None.

The API never reads the session cookie: a browser signed in to the dashboard is not signed in
to the API, so a forged cross-site request carries nothing that works, and the API needs no
CSRF token (docs/MANUAL.md, "Automating operations").
"""

from __future__ import annotations

import hashlib
import hmac
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from geneva_drive.errors import ConfigurationError

SCOPES = ("read", "operate", "signal")
SETTING = "GENEVA_API_TOKENS"
_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
_HEX = re.compile(r"[0-9a-f]{64}")
#: Requests one token may make per minute (``GENEVA_API_REQUESTS_PER_MINUTE``).
DEFAULT_PER_MINUTE = 600


@dataclass(frozen=True)
class ApiClient:
    """An authenticated caller: its name (the audit's actor is ``api:<name>``) and scopes."""

    name: str
    scopes: frozenset[str]


@dataclass(frozen=True)
class _Token:
    client: ApiClient
    digest: bytes


ApiAuth = Callable[[Any], ApiClient | None]


def parse_tokens(value: Any) -> list[_Token]:
    """The configured tokens; a malformed entry refuses to start, naming the setting and the
    form expected (never a silent skip: a typo would lock a pipeline out, or let it in)."""
    if value is None or value == "":
        return []
    if not isinstance(value, str):
        raise ConfigurationError(f"{SETTING} must be a string of name:sha256-hex:scopes entries")
    tokens: list[_Token] = []
    names: set[str] = set()
    for number, entry in enumerate((e.strip() for e in value.split(";")), start=1):
        if not entry:
            continue
        parts = entry.split(":")
        if len(parts) != 3:
            raise ConfigurationError(
                f"{SETTING} entry {number} is not name:sha256-hex:scopes (e.g. "
                "deploy:9f86d0…:read,operate; make the hash with "
                '`printf %s "$TOKEN" | sha256sum`)'
            )
        name, hex_digest, scope_text = (part.strip() for part in parts)
        if not _NAME.fullmatch(name):
            raise ConfigurationError(
                f"{SETTING} entry {number}: the name {name!r} must be 1-64 letters, digits or "
                "._@- (it appears in the audit as api:<name>)"
            )
        if name in names:
            raise ConfigurationError(f"{SETTING}: the name {name!r} is used twice")
        names.add(name)
        if not _HEX.fullmatch(hex_digest.lower()):
            raise ConfigurationError(
                f"{SETTING} entry {name!r}: the second part must be the token's SHA-256 as 64 "
                'hex digits, not the token itself (`printf %s "$TOKEN" | sha256sum`)'
            )
        scopes = frozenset(s.strip() for s in scope_text.split(",") if s.strip())
        unknown = sorted(scopes - set(SCOPES))
        if not scopes or unknown:
            raise ConfigurationError(
                f"{SETTING} entry {name!r}: scopes {scope_text!r} must be a comma-separated "
                f"subset of {', '.join(SCOPES)}"
                + (f" (unknown: {', '.join(unknown)})" if unknown else "")
            )
        tokens.append(_Token(ApiClient(name, scopes), bytes.fromhex(hex_digest.lower())))
    return tokens


def per_minute(settings: Mapping[str, Any]) -> int:
    value = settings.get("API_REQUESTS_PER_MINUTE", DEFAULT_PER_MINUTE)
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1 or isinstance(value, bool):
        raise ConfigurationError(
            f"GENEVA_API_REQUESTS_PER_MINUTE={value!r} is not a positive whole number"
        )
    return number


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None without one)."""
    scheme, _, given = (header or "").partition(" ")
    token = given.strip()
    return token if scheme.lower() == "bearer" and token else None


def client_for(tokens: list[_Token], token: str) -> ApiClient | None:
    """The client whose hash matches ``token``; every entry is compared, so the time taken
    does not tell which one (or how many) came close."""
    digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
    found: ApiClient | None = None
    for entry in tokens:
        if hmac.compare_digest(digest, entry.digest):
            found = entry.client
    return found


class RequestBudget:
    """At most ``limit`` requests per client per sliding minute (per process, as every
    throttle of the dashboard is). Bounded memory: one deque per client name."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, deque[float]] = {}

    def retry_after(self, name: str, limit: int) -> int:
        """0 and the request is counted; else whole seconds to wait."""
        now = self.clock()
        with self._lock:
            seen = self._seen.setdefault(name, deque())
            while seen and now - seen[0] >= 60.0:
                seen.popleft()
            if len(seen) >= limit:
                return max(1, int(60.0 - (now - seen[0])) + 1)
            seen.append(now)
            return 0
