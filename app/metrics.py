"""``GET /metrics``: the Prometheus exposition of the dashboard process.

It serves the database gauges (:class:`geneva_drive.prometheus.DatabaseCollector`, cached for a few
seconds) and the event counters and histograms of this process, or, in multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR``), of every process writing to that directory: gunicorn workers
and, on the same host, Celery workers.

It requires ``Authorization: Bearer <token>`` with ``GENEVA_METRICS_TOKEN`` (the
``METRICS_TOKEN`` config key), and answers 401 while no token is set, unless it is opened
explicitly with ``GENEVA_METRICS_PUBLIC=1`` (``METRICS_PUBLIC``). That holds in demo mode and
under a host's prefix too: the counts are not secrets, but workflow class and step names, error
rates and queue depths are a map of the business, and a page of another site in the operator's
browser could read them through a rebinding ``Host``. Both settings at once, a
``METRICS_PUBLIC`` that is not a yes/no, or a token shorter than
:data:`MIN_METRICS_TOKEN_LENGTH`, refuse to start naming the setting.

Wrong tokens are throttled per client address (:class:`~geneva_drive.dashboard.ratelimit.
TokenThrottle`): after ``METRICS_MAX_FAILURES`` (``GENEVA_METRICS_MAX_FAILURES``, default 10)
within ``LOGIN_WINDOW_SECONDS``, that address gets 429 with ``Retry-After`` for a while, its
token not even compared; an address that presented the right token keeps being served.
"""

from __future__ import annotations

import hmac
from typing import Any

from flask import Blueprint, Flask, Response, current_app, request
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from geneva_drive import metrics as engine_metrics
from geneva_drive import prometheus
from geneva_drive.config import process_variable
from geneva_drive.dashboard.ratelimit import Limits, TokenThrottle
from geneva_drive.dashboard.state import dashboard_config, state
from geneva_drive.errors import ConfigurationError

bp = Blueprint("metrics", __name__)

_REGISTRY_KEY = "geneva_drive.metrics_registry"
#: Where the app's :class:`TokenThrottle` lives (``app.extensions``).
THROTTLE_KEY = "geneva_drive.metrics_throttle"
#: Shortest ``GENEVA_METRICS_TOKEN`` accepted: a bearer token is a password sent on every
#: scrape, and a short one is guessed.
MIN_METRICS_TOKEN_LENGTH = 16
#: Wrong tokens one address may send within the window before it waits.
DEFAULT_MAX_FAILURES = 10


def init_app(app: Flask) -> None:
    """Install the event metrics and the registry ``/metrics`` serves for ``app``.

    ``METRICS_CACHE_SECONDS`` (``GENEVA_METRICS_CACHE_SECONDS``, default 5) sets how long the
    database gauges are served from memory before one refresh.
    """
    settings = state(app).config
    if metrics_public(settings) and _token_of(settings) is not None:
        raise ConfigurationError(
            "GENEVA_METRICS_PUBLIC=1 and GENEVA_METRICS_TOKEN are both set: /metrics is either "
            "open to anyone or behind the token. Unset one of them."
        )
    check_token(_token_of(settings))
    prometheus.install()
    cache_seconds = state(app).config.get("METRICS_CACHE_SECONDS")
    if cache_seconds is not None:
        engine_metrics.configure_cache(max_age=float(cache_seconds))
    app.extensions[_REGISTRY_KEY] = prometheus.exposition_registry(database=True)
    app.extensions[THROTTLE_KEY] = TokenThrottle()


def check_token(token: str | None) -> None:
    """Refuse a token shorter than :data:`MIN_METRICS_TOKEN_LENGTH` (naming the setting, never
    echoing the token)."""
    if token is not None and len(token) < MIN_METRICS_TOKEN_LENGTH:
        raise ConfigurationError(
            f"GENEVA_METRICS_TOKEN is shorter than {MIN_METRICS_TOKEN_LENGTH} characters: a "
            "scraper's bearer token that short is guessed. Set it to a long random value, e.g. "
            "the output of: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )


_YES = frozenset({"1", "true", "yes", "on"})
_NO = frozenset({"", "0", "false", "no", "off"})


def metrics_public(settings: Any) -> bool:
    """``METRICS_PUBLIC`` as a yes/no; anything else refuses to start, naming the setting."""
    value = settings.get("METRICS_PUBLIC")
    if value is None or isinstance(value, bool):
        return bool(value)
    text = str(value).strip().lower()
    if isinstance(value, int | str) and text in _YES | _NO:
        return text in _YES
    raise ConfigurationError(
        f"GENEVA_METRICS_PUBLIC={value!r} is not a yes/no: set it to 1 to serve /metrics to "
        "anyone, or leave it unset and give scrapers GENEVA_METRICS_TOKEN as a bearer token"
    )


def _configured_token() -> str | None:
    return _token_of(dashboard_config())


def _token_of(settings: Any) -> str | None:
    # from_prefixed_env parses GENEVA_METRICS_TOKEN as JSON ("123" becomes 123): prefer the raw
    # environment value when it is the one in the config.
    value = settings.get("METRICS_TOKEN")
    raw = process_variable("GENEVA_METRICS_TOKEN") or None
    if value is not None and not isinstance(value, str) and raw is not None:
        value = raw
    return str(value) if value not in (None, "") else None


def _authorized(token: str) -> bool:
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


def _limits() -> Limits:
    settings = dashboard_config()
    return Limits(
        pair=int(settings.get("METRICS_MAX_FAILURES") or DEFAULT_MAX_FAILURES),
        window=float(settings.get("LOGIN_WINDOW_SECONDS") or 300),
        backoff=float(settings.get("LOGIN_BACKOFF_SECONDS") or 2),
    )


def _refused(message: str, status: int = 401, retry_after: int = 0) -> Response:
    headers = {"Retry-After": str(retry_after)} if retry_after else {}
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return Response(message, status=status, mimetype="text/plain", headers=headers)


@bp.get("/metrics")
def metrics() -> Response:
    token = _configured_token()
    if token is None and not metrics_public(dashboard_config()):
        return _refused(
            "/metrics needs a bearer token: set GENEVA_METRICS_TOKEN and give it to the "
            "scraper (Prometheus: authorization: {credentials: ...}), or open it to anyone "
            "with GENEVA_METRICS_PUBLIC=1.\n"
        )
    if token is not None:
        throttle: TokenThrottle = current_app.extensions[THROTTLE_KEY]
        address, limits = request.remote_addr, _limits()
        wait = throttle.retry_after(address, limits)
        if wait:
            # Not compared while it waits: a right guess now would tell the guesser nothing.
            return _refused(
                "Too many wrong tokens for /metrics; try again later.\n", 429, retry_after=wait
            )
        if not _authorized(token):
            if "Authorization" in request.headers:  # a guess; a missing token is not one
                throttle.failed(address, limits)
            return _refused("A bearer token is required to read /metrics.\n")
        throttle.succeeded(address)
    registry: CollectorRegistry = current_app.extensions[_REGISTRY_KEY]
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    response = Response(encoder(registry), status=200, content_type=content_type)
    response.headers["Cache-Control"] = "no-store"
    return response
