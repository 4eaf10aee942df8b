"""What the dashboard knows about the Flask app serving it (one record per app).

The same Blueprint serves the standalone dashboard (``create_app()``) and a host application
(``GenevaDrive(app, db=db)``). Everything that differs between the two lives here: where the
settings come from, which Flask-SQLAlchemy instance holds the session, the URL prefix, and who
the user is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flask import Flask, current_app

from geneva_drive.dashboard.ratelimit import FailureLimiter
from geneva_drive.errors import UsageError

if TYPE_CHECKING:
    from flask_sqlalchemy import SQLAlchemy

KEY = "geneva_drive"


@dataclass
class DashboardState:
    #: The dashboard's settings: ``app.config`` itself for the standalone app (every key is the
    #: dashboard's there); for a host, a mapping of its own built from ``GENEVA_*`` keys.
    config: Mapping[str, Any]
    #: The Flask-SQLAlchemy instance whose session the dashboard's requests use.
    db: SQLAlchemy
    url_prefix: str = ""
    mounted: bool = False
    #: ``(request) -> DashboardUser | None`` given by the host (or Flask-Login's adapter).
    user_loader: Callable[[Any], Any] | None = None
    #: ``(next_url) -> login URL`` of the host's login page, when it has one.
    login_url: Callable[[str], str | None] | None = None
    login_limiter: FailureLimiter = field(default_factory=FailureLimiter)


def state(app: Flask | None = None) -> DashboardState:
    target = app if app is not None else current_app
    found: DashboardState | None = target.extensions.get(KEY)
    if found is None:
        raise UsageError(
            "GenevaDrive's dashboard is not set up on this Flask app: call "
            "GenevaDrive(app, db=db) (or init_app), or build it with create_app()"
        )
    return found


def dashboard_config() -> Mapping[str, Any]:
    """The dashboard's settings for the current app (see :attr:`DashboardState.config`)."""
    return state().config
