"""Dashboard configuration: defaults, then ``GENEVA_*`` environment variables, then the mapping
passed to :func:`app.create_app`.

Every key below can be set from the environment with the ``GENEVA_`` prefix
(``GENEVA_DEMO=true``, ``GENEVA_BULK_CAP=500``, ``GENEVA_SECRET_KEY=...``). Values are parsed
as JSON when they are valid JSON (Flask's ``from_prefixed_env``), so users are configured as::

    GENEVA_USERS='{"alice": {"password_hash": "scrypt:...", "role": "operator"},
                   "bob":   {"password_hash": "scrypt:...", "role": "viewer"}}'

with hashes made by ``werkzeug.security.generate_password_hash``.
"""

from __future__ import annotations

import math
import secrets
import string
from collections import Counter
from collections.abc import Mapping
from typing import Any

from flask import Flask

import geneva_drive.db
from geneva_drive.errors import ConfigurationError
from geneva_drive.tracing import trace_id_of

__all__ = [
    "ConfigurationError",
    "check_host_secret_key",
    "check_secret_key",
    "for_host",
    "key_strength_bits",
    "load",
]

#: A key published in this repository's history: sessions signed with it are forgeable (and so
#: is their CSRF token, which lives in the session), so it is refused like no key at all.
DEV_SECRET_KEY = "dev-only-change-me"
#: Keys published in documentation and examples (this project's, Flask's and well-known
#: tutorials'): a session signed with one is forgeable by anyone who read them. Compared as
#: :func:`_published_form` writes them (case, spaces, punctuation and quotes aside), so
#: ``You will never guess`` is ``you-will-never-guess``. Short ones are refused by length anyway;
#: listed so that the message says what is wrong.
PUBLIC_SECRET_KEYS = frozenset(
    {
        DEV_SECRET_KEY,
        "change-me",
        "changeme",
        "shop-dev-secret",
        "host-secret",
        "test-secret",
        "secret",
        "dev",
        "development",
        "your-secret-key",
        "your-secret-key-here",
        "super-secret-key",
        "supersecretkey",
        # Flask's quickstart (``app.secret_key = b'_5#y2L"F4Q8z\n\xec]/'``): as bytes or text,
        # and as copied into an environment variable with its escapes still written out.
        '_5#y2L"F4Q8z\n\xec]/',
        '_5#y2L"F4Q8z\\n\\xec]/',
        # The key Flask's quickstart prints as an example of secrets.token_hex().
        "192b9bdd22ab9ed4d12e236c78afcb9a393ec15f71bbf5dc987d54727823bcbf",
        # Flask's early sessions example.
        "A0Zr98j/3yX R~XHH!jmN]LWX/,?RT",
        # Flask's tutorial (flaskr) and the Mega-Tutorial's and Flask Web Development's.
        "development key",
        "you-will-never-guess",
        "hard to guess string",
        "super secret key",
        "secret key",
        "secret_key",
        "my-secret-key",
        "mysecretkey",
        "keyboard cat",
        "replace-me",
        "insecure",
    }
)
#: Shortest secret key accepted: a key short enough to guess signs sessions anyone can forge.
MIN_SECRET_KEY_LENGTH = 16
#: Fewest bits a key must carry by :func:`key_strength_bits`' estimate: ``"a" * 32`` is long
#: and still guessed at once. ``secrets.token_urlsafe(32)`` carries about 200.
MIN_SECRET_KEY_BITS = 64
HOW_TO_MAKE_A_KEY = (
    "Set GENEVA_SECRET_KEY to a long random value, the same for every process of the "
    "dashboard, e.g. the output of: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
)


DEFAULTS: dict[str, Any] = {
    #: No default: outside demo and tests the factory refuses to start without one.
    "SECRET_KEY": None,
    #: Open access as operator "demo" for loopback clients (``geneva-drive up --demo``).
    "DEMO": False,
    #: ``{username: {"password_hash": ..., "role": "viewer" | "operator"}}``.
    "USERS": {},
    #: The host application's login: a callable ``(request) -> DashboardUser | None`` or a
    #: ``"module:attribute"`` string naming one. When set it replaces the built-in login.
    "USER_LOADER": None,
    #: ``/metrics`` without a bearer token: only when set (1/true); otherwise it needs
    #: ``METRICS_TOKEN`` (``GENEVA_METRICS_TOKEN``) and answers 401 while none is set.
    "METRICS_PUBLIC": False,
    #: Wrong ``/metrics`` tokens allowed per client address within LOGIN_WINDOW_SECONDS; after
    #: that the address gets 429 for a while (the login's backoff; see app.ratelimit).
    "METRICS_MAX_FAILURES": 10,
    #: Paths served without a login (liveness probes and Prometheus scrapes).
    "PUBLIC_PATHS": ("/healthz", "/metrics", "/static/", "/login"),
    #: Rows per page on lists (keyset pages; never an OFFSET).
    "PAGE_SIZE": 50,
    #: Most workflows one bulk action may touch (Oban Web's default; Mission Control uses 3000).
    "BULK_CAP": 1000,
    #: Seconds between polls of live regions.
    "POLL_SECONDS": 5,
    #: Seconds the overview's grouped counts are cached per process.
    "COUNTS_CACHE_SECONDS": 5,
    #: Largest request body accepted (413 above it); signal payloads are capped far lower by
    #: the engine (``max_signal_payload_size``), this stops a huge body before it is parsed.
    "MAX_CONTENT_LENGTH": 1024 * 1024,
    #: Failed logins allowed per (username, client address) within the window; after that
    #: each further attempt of that pair waits longer (see app.ratelimit).
    "LOGIN_MAX_FAILURES": 5,
    "LOGIN_WINDOW_SECONDS": 300,
    #: The first wait after LOGIN_MAX_FAILURES; it doubles with each further failure, up to the
    #: window.
    "LOGIN_BACKOFF_SECONDS": 2,
    #: Failed logins allowed per username from all addresses together, and per address for all
    #: usernames together, within the window (looser than the per-pair limit: an attacker who
    #: rotates addresses is slowed down without a handful of guesses locking the user out).
    "LOGIN_MAX_FAILURES_PER_USER": 50,
    "LOGIN_MAX_FAILURES_PER_ADDRESS": 50,
    #: Seconds a login lasts, however active the session: after that the user logs in again.
    "SESSION_LIFETIME_SECONDS": 12 * 3600,
    "SESSION_COOKIE_HTTPONLY": True,
    "SESSION_COOKIE_SAMESITE": "Lax",
    "SESSION_COOKIE_SECURE": False,
    "SQLALCHEMY_TRACK_MODIFICATIONS": False,
    #: ``GENEVA_TRACE_URL_TEMPLATE``: where a workflow's trace is shown, with ``{trace_id}``
    #: (``http://jaeger:16686/trace/{trace_id}``); the detail page links to it (docs/MANUAL.md,
    #: "Tracing"). Unset: no link.
    "TRACE_URL_TEMPLATE": None,
    #: Where ``GenevaDrive(app, db=db)`` mounts the dashboard in a host app (``url_prefix=``
    #: wins). The standalone app serves it at the root.
    "URL_PREFIX": "/geneva",
    #: The HTTP API's bearer tokens: ``name:sha256-hex-of-token:scopes;…`` (docs/MANUAL.md,
    #: "Automating operations"). Unset: every API request is refused with a 401.
    "API_TOKENS": None,
    #: Requests one API token may make per minute (429 with Retry-After beyond).
    "API_REQUESTS_PER_MINUTE": 600,
}

#: Keys that belong to Flask (and its extensions), not to the dashboard: a host app keeps its
#: own values for these; only the standalone app takes ours.
FLASK_KEYS = frozenset(
    {
        "SECRET_KEY",
        "MAX_CONTENT_LENGTH",
        "SESSION_COOKIE_HTTPONLY",
        "SESSION_COOKIE_SAMESITE",
        "SESSION_COOKIE_SECURE",
        "SQLALCHEMY_TRACK_MODIFICATIONS",
    }
)


def for_host(app: Flask, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The dashboard's settings inside a host app: defaults, then ``GENEVA_*`` environment
    variables, then the host's ``app.config["GENEVA_*"]``, then ``overrides`` (later wins).

    Prefixed in the host's config so they never collide with the host's own keys; parsed from
    the environment as :func:`load` does (JSON when it is valid JSON).
    """
    scratch = Flask(__name__)  # from_prefixed_env's parsing, without touching the host's config
    scratch.config.clear()
    scratch.config.from_prefixed_env("GENEVA")
    from_host = {k[len("GENEVA_") :]: v for k, v in app.config.items() if k.startswith("GENEVA_")}
    settings: dict[str, Any] = {k: v for k, v in DEFAULTS.items() if k not in FLASK_KEYS}
    for source in (scratch.config, from_host):
        settings.update({k: v for k, v in source.items() if k not in FLASK_KEYS})
    if overrides:
        settings.update(overrides)
    settings["TRACE_URL_TEMPLATE"] = trace_url_template(settings.get("TRACE_URL_TEMPLATE"))
    return settings


def load(app: Flask, overrides: Mapping[str, Any] | None) -> None:
    """Apply defaults, the environment and ``overrides``, in that order (later wins)."""
    app.config.update(DEFAULTS)
    app.config.from_prefixed_env("GENEVA")
    if overrides:
        app.config.update(overrides)
    app.config["TRUSTED_HOSTS"] = trusted_hosts(app.config.get("TRUSTED_HOSTS"))
    app.config["TRACE_URL_TEMPLATE"] = trace_url_template(app.config.get("TRACE_URL_TEMPLATE"))
    if not app.config.get("SQLALCHEMY_DATABASE_URI"):
        # GENEVA_DATABASE_URL (also read above as DATABASE_URL), refused when unset.
        app.config["SQLALCHEMY_DATABASE_URI"] = app.config.get("DATABASE_URL") or (
            geneva_drive.db.database_url()
        )


def trusted_hosts(value: Any) -> list[str] | None:
    """``GENEVA_TRUSTED_HOSTS``: the ``Host`` names the dashboard answers (Flask's
    ``TRUSTED_HOSTS``; others get 400), as a JSON list or a comma-separated string
    (``dash.example.com,.example.org``: a leading dot allows subdomains). Unset: any host."""
    if value is None or value == "":
        return None
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise ConfigurationError(
            f"GENEVA_TRUSTED_HOSTS={value!r} is not a list of host names: use e.g. "
            "GENEVA_TRUSTED_HOSTS=dash.example.com,localhost (a leading dot allows subdomains)"
        )
    hosts = [item.strip() for item in items if item.strip()]
    if not hosts:
        raise ConfigurationError(
            f"GENEVA_TRUSTED_HOSTS={value!r} names no host: unset it to answer any host"
        )
    return hosts


def trace_url_template(value: Any) -> str | None:
    """``GENEVA_TRACE_URL_TEMPLATE``: an http(s) URL (or a path on this host) with one field,
    ``{trace_id}``, where the detail page links a workflow's trace (docs/MANUAL.md,
    "Tracing"). Refused at start when it could not make that link. Unset: None."""
    if value is None or value == "":
        return None
    example = (
        "e.g. GENEVA_TRACE_URL_TEMPLATE=http://jaeger:16686/trace/{trace_id}, or unset it to "
        "show no trace link"
    )
    if not isinstance(value, str):
        raise ConfigurationError(
            f"GENEVA_TRACE_URL_TEMPLATE={value!r} is not a URL: set it to a URL with "
            f"{{trace_id}} in it, {example}"
        )
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(value) if name is not None}
    except ValueError as error:
        raise ConfigurationError(
            f"GENEVA_TRACE_URL_TEMPLATE={value!r} is not a valid template ({error}): write "
            f"braces only around trace_id, {example}"
        ) from None
    if fields != {"trace_id"}:
        others = ", ".join("{" + name + "}" for name in sorted(fields - {"trace_id"}))
        problem = f"names {others}, which the dashboard cannot fill" if others else None
        raise ConfigurationError(
            f"GENEVA_TRACE_URL_TEMPLATE={value!r} "
            f"{problem or 'has no {trace_id}'}: the trace's id goes where "
            f"{{trace_id}} stands and nothing else is filled in, {example}"
        )
    if not value.startswith(("http://", "https://", "/")):
        raise ConfigurationError(
            f"GENEVA_TRACE_URL_TEMPLATE={value!r} is neither an http(s) URL nor a path on this "
            f"host: {example}"
        )
    return value


def trace_url(template: str | None, metadata: Mapping[str, Any] | None) -> str | None:
    """The link to a workflow's trace: ``template`` filled with the trace id stored on its row
    (None without a template or a stored trace)."""
    if template is None:
        return None
    trace_id = trace_id_of(metadata)
    return template.format(trace_id=trace_id) if trace_id is not None else None


def _key_text(key: str | bytes) -> str:
    """The key as text, one character per byte for bytes (``os.urandom`` keys are not UTF-8)."""
    return key.decode("latin-1") if isinstance(key, bytes) else key


def _published_form(text: str) -> str:
    """``text`` compared with :data:`PUBLIC_SECRET_KEYS`: without surrounding quotes (or the
    ``b'...'`` of a bytes literal), lowercase, letters and digits only."""
    text = text.strip()
    if len(text) >= 3 and text[0] == "b" and text[1] in "'\"" and text[-1] == text[1]:
        text = text[1:]
    if len(text) >= 2 and text[0] in "'\"" and text[-1] == text[0]:
        text = text[1:-1]
    return "".join(char for char in text.lower() if char.isalnum())


_PUBLISHED_FORMS = frozenset(_published_form(key) for key in PUBLIC_SECRET_KEYS) - {""}

#: Character classes and how many characters each holds, for :func:`key_strength_bits`.
_CLASSES = (
    (frozenset(string.ascii_lowercase), 26),
    (frozenset(string.ascii_uppercase), 26),
    (frozenset(string.digits), 10),
    (frozenset(string.punctuation + " "), 33),
)
#: What any other character (non-ASCII, control, a raw byte) adds to the pool.
_OTHER_CLASS = 128


def _repeated_unit(text: str) -> str:
    """The shortest prefix that ``text`` repeats (``"abcabcab"`` -> ``"abc"``), else ``text``."""
    for period in range(1, len(text) // 2 + 1):
        if text[period:] == text[:-period]:
            return text[:period]
    return text


def key_strength_bits(key: str | bytes) -> float:
    """An estimate of the bits a key carries, for refusing plainly weak ones (not a proof of
    strength: a long passphrase of words can score well and still be in a wordlist).

    A key that repeats a shorter one counts as that one; a character that continues a run
    (``aaa``, ``abc``, ``321``) counts for nothing. Each remaining character is worth the
    bits of its character classes' pool (lowercase 26, uppercase 26, digits 10, punctuation and
    space 33, anything else 128), scaled down by how unevenly the characters are used (their
    Shannon entropy against the most the key's length and pool allow).
    """
    unit = _repeated_unit(_key_text(key))
    kept = [
        char
        for i, char in enumerate(unit)
        if i < 2
        or not (
            ord(char) - ord(unit[i - 1]) == ord(unit[i - 1]) - ord(unit[i - 2])
            and abs(ord(char) - ord(unit[i - 1])) <= 1
        )
    ]
    count = len(kept)
    if count < 2:
        return 0.0
    present = set(kept)
    pool = sum(size for members, size in _CLASSES if present & members)
    if any(not any(char in members for members, _ in _CLASSES) for char in present):
        pool += _OTHER_CLASS
    spread = -sum(n / count * math.log2(n / count) for n in Counter(kept).values())
    evenness = min(1.0, spread / math.log2(min(pool, count)))
    return count * math.log2(pool) * evenness


def secret_key_problem(key: Any, setting: str = "GENEVA_SECRET_KEY") -> str | None:
    """Why ``key`` cannot sign sessions, or None when it can (``setting`` names where it is
    set: ``GENEVA_SECRET_KEY`` for the standalone dashboard, the host's ``SECRET_KEY``).

    Refused: no key, a key published in documentation (:data:`PUBLIC_SECRET_KEYS`), one shorter
    than :data:`MIN_SECRET_KEY_LENGTH`, and one whose :func:`key_strength_bits` estimate is
    below :data:`MIN_SECRET_KEY_BITS` (repeated or patterned characters)."""
    if not key:
        return f"{setting} is not set"
    if not isinstance(key, str | bytes):
        return f"{setting} must be a string"
    text = _key_text(key)
    if _published_form(text) in _PUBLISHED_FORMS:
        return f"{setting} is a published example key ({text!r}): anyone can forge its sessions"
    if len(key) < MIN_SECRET_KEY_LENGTH:
        return f"{setting} is shorter than {MIN_SECRET_KEY_LENGTH} characters"
    bits = key_strength_bits(key)
    if bits < MIN_SECRET_KEY_BITS:
        return (
            f"{setting} is too predictable to sign sessions: its characters carry about "
            f"{bits:.0f} bits, fewer than the {MIN_SECRET_KEY_BITS} required (repeated, "
            "sequential or few distinct characters)"
        )
    return None


HOW_TO_MAKE_A_HOST_KEY = (
    "Set the host app's SECRET_KEY (app.config['SECRET_KEY']) to a long random value from the "
    "environment, the same for every process, e.g. the output of: python -c 'import secrets; "
    "print(secrets.token_urlsafe(32))'. The dashboard's sessions and CSRF tokens live in the "
    "host's signed session: a guessable key lets anyone sign in as any user and act."
)


def check_host_secret_key(app: Flask) -> None:
    """The standalone dashboard's rules for a host's key (``GenevaDrive.init_app``): refuse a
    missing, short or published one. A host in testing mode signs its own test cookies and is
    left alone, as the standalone app's tests are."""
    if app.testing:
        return
    problem = secret_key_problem(app.config.get("SECRET_KEY"), setting="SECRET_KEY")
    if problem is not None:
        raise ConfigurationError(
            f"Refusing to mount GenevaDrive on {app.import_name}: {problem}. "
            f"{HOW_TO_MAKE_A_HOST_KEY}"
        )


def check_secret_key(app: Flask, *, required: bool) -> None:
    """Refuse a missing or public key outside demo and tests; demo gets a random key per run.

    Sessions are signed cookies holding the user and the CSRF token: whoever knows the key can
    be anyone, so there is no fallback key. A demo's key lives only in its process, so its
    sessions end with it (and it is never the same on two machines).
    """
    problem = secret_key_problem(app.config.get("SECRET_KEY"))
    if problem is None:
        return
    if app.config.get("DEMO"):
        app.config["SECRET_KEY"] = secrets.token_urlsafe(32)
    elif app.testing or not required:
        # Tests set their own key; a factory that only migrates signs nothing. Either way a
        # key nobody can know, never the public one.
        app.config["SECRET_KEY"] = app.config.get("SECRET_KEY") or secrets.token_urlsafe(32)
        if app.config["SECRET_KEY"] == DEV_SECRET_KEY:
            app.config["SECRET_KEY"] = secrets.token_urlsafe(32)
    else:
        raise ConfigurationError(f"Refusing to start: {problem}. {HOW_TO_MAKE_A_KEY}")
