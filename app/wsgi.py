"""``gunicorn geneva_drive.dashboard.wsgi:app``: the standalone dashboard and ``/metrics``,
configured from ``GENEVA_*`` environment variables."""

from geneva_drive.dashboard import create_app

app = create_app()
