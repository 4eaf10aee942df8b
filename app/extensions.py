"""Flask extensions, bound to the engine's metadata (one schema, one set of migrations)."""

from __future__ import annotations

from flask_migrate import Migrate  # type: ignore[import-untyped]
from flask_sqlalchemy import SQLAlchemy
from htmx_flask import Htmx
from sqlalchemy.orm import Session

from geneva_drive.models import Base

db = SQLAlchemy(metadata=Base.metadata)
migrate = Migrate()
htmx = Htmx()


def session() -> Session:
    """This request's session (``db.session`` is a scoped-session proxy; engine and query
    functions take a plain ``Session``)."""
    return db.session()
