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
browser could read them through a rebinding ``Host``. Both settings at once, or a
``METRICS_PUBLIC`` that is not a yes/no, refuse to start naming the setting.
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
from geneva_drive.dashboard.state import dashboard_config, state
from geneva_drive.errors import ConfigurationError

bp = Blueprint("metrics", __name__)

_REGISTRY_KEY = "geneva_drive.metrics_registry"


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
    prometheus.install()
    cache_seconds = state(app).config.get("METRICS_CACHE_SECONDS")
    if cache_seconds is not None:
        engine_metrics.configure_cache(max_age=float(cache_seconds))
    app.extensions[_REGISTRY_KEY] = prometheus.exposition_registry(database=True)


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


@bp.get("/metrics")
def metrics() -> Response:
    token = _configured_token()
    if token is None and not metrics_public(dashboard_config()):
        return Response(
            "/metrics needs a bearer token: set GENEVA_METRICS_TOKEN and give it to the "
            "scraper (Prometheus: authorization: {credentials: ...}), or open it to anyone "
            "with GENEVA_METRICS_PUBLIC=1.\n",
            status=401,
            mimetype="text/plain",
            headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
        )
    if token is not None and not _authorized(token):
        return Response(
            "A bearer token is required to read /metrics.\n",
            status=401,
            mimetype="text/plain",
            headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
        )
    registry: CollectorRegistry = current_app.extensions[_REGISTRY_KEY]
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    response = Response(encoder(registry), status=200, content_type=content_type)
    response.headers["Cache-Control"] = "no-store"
    return response
