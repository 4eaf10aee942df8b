"""Cross-workflow pages: overview, signal inbox, definitions, stranded, failures, limits,
workers, schedules, audit."""

from __future__ import annotations

from flask import Blueprint

bp = Blueprint("dashboard", __name__)

# The routes register on bp.
from geneva_drive.dashboard.dashboard import schedule_views, views  # noqa: E402,F401
