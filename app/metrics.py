"""``GET /metrics``: the Prometheus exposition of the dashboard process.

It serves the database gauges (:class:`geneva_drive.prometheus.DatabaseCollector`, cached for a few
seconds) and the event counters and histograms of this process, or, in multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR``), of every process writing to that directory: gunicorn workers
and, on the same host, Celery workers.

Set ``GENEVA_METRICS_TOKEN`` (or the ``METRICS_TOKEN`` config key) to require
``Authorization: Bearer <token>``; without it the endpoint is open, like ``/healthz``
(it shows counts only, never ids or payloads).
"""

from __future__ import annotations

import hmac
import os

from flask import Blueprint, Flask, Response, current_app, request
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from geneva_drive import metrics as engine_metrics
from geneva_drive import prometheus
from geneva_drive.dashboard.state import dashboard_config, state

bp = Blueprint("metrics", __name__)

_REGISTRY_KEY = "geneva_drive.metrics_registry"


def init_app(app: Flask) -> None:
    """Install the event metrics and the registry ``/metrics`` serves for ``app``.

    ``METRICS_CACHE_SECONDS`` (``GENEVA_METRICS_CACHE_SECONDS``, default 5) sets how long the
    database gauges are served from memory before one refresh.
    """
    prometheus.install()
    cache_seconds = state(app).config.get("METRICS_CACHE_SECONDS")
    if cache_seconds is not None:
        engine_metrics.configure_cache(max_age=float(cache_seconds))
    app.extensions[_REGISTRY_KEY] = prometheus.exposition_registry(database=True)


def _configured_token() -> str | None:
    # from_prefixed_env parses GENEVA_METRICS_TOKEN as JSON ("123" becomes 123): prefer the raw
    # environment value when it is the one in the config.
    value = dashboard_config().get("METRICS_TOKEN")
    raw = os.environ.get("GENEVA_METRICS_TOKEN")
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
