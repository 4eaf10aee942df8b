"""Flask extensions, bound to the engine's metadata (one schema, one set of migrations)."""

from __future__ import annotations

from typing import cast

from flask_migrate import Migrate  # type: ignore[import-untyped]
from flask_sqlalchemy import SQLAlchemy
from htmx_flask import Htmx
from sqlalchemy.orm import Session
from werkzeug.local import LocalProxy

from geneva_drive.dashboard.state import state
from geneva_drive.models import Base

#: The standalone dashboard's own Flask-SQLAlchemy (``create_app()``).
own_db = SQLAlchemy(metadata=Base.metadata)


def _current_db() -> SQLAlchemy:
    return state().db


#: The Flask-SQLAlchemy of the app serving this request: ``own_db``, or a host's
#: (``GenevaDrive(app, db=db)``). Dashboard code writes ``db.session`` either way.
db = cast(SQLAlchemy, LocalProxy(_current_db))
migrate = Migrate()
htmx = Htmx()


def session() -> Session:
    """This request's session (``db.session`` is a scoped-session proxy; engine and query
    functions take a plain ``Session``)."""
    return db.session()
