"""``celery -A app.celery_app worker`` / ``beat``: the shop's Celery app, with GenevaDrive's
step task and dispatcher schedule registered on it by ``GenevaDrive.init_app(celery=...)``."""

from __future__ import annotations

from app import create_app

flask_app = create_app()
celery = flask_app.extensions["celery"]
