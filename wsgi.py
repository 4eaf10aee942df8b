"""``gunicorn wsgi:app``: the dashboard application."""

from app import create_app

app = create_app()
