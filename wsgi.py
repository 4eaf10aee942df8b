"""``gunicorn wsgi:app``: the dashboard application."""

from geneva_drive.dashboard import create_app

app = create_app()
