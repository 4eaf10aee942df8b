"""Workflow pages (list, detail, hero) and the operator actions on them."""

from __future__ import annotations

from flask import Blueprint

bp = Blueprint("workflows", __name__)

from geneva_drive.dashboard.workflows import actions, views  # noqa: E402,F401  (routes register on bp)
