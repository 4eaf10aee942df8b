"""``gunicorn wsgi:app`` from a checkout: the same app as ``geneva_drive.dashboard.wsgi:app``."""

from geneva_drive.dashboard.wsgi import app

__all__ = ["app"]
