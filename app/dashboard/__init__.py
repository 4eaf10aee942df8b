"""Cross-workflow pages: overview, signal inbox, definitions, stranded, failures, limits,
workers, audit."""

from __future__ import annotations

from flask import Blueprint

bp = Blueprint("dashboard", __name__)

from geneva_drive.dashboard.dashboard import views  # noqa: E402,F401  (routes register on bp)
