"""Flask extensions, bound to the engine's metadata (one schema, one set of migrations)."""

from __future__ import annotations

from flask_migrate import Migrate
from flask_sqlalchemy import SQLAlchemy
from htmx_flask import Htmx

from engine.models import Base

db = SQLAlchemy(metadata=Base.metadata)
migrate = Migrate()
htmx = Htmx()
