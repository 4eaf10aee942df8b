"""The dashboard's own Jinja environment.

Mounted in a host application, the dashboard must neither see the host's templates (a host's
``base.html`` or ``error.html`` would replace ours: Flask's loader prefers the application's
folder to any blueprint's) nor add filters and globals to the host's environment. So it renders
with an environment of its own, made per Flask app from the app's Jinja options: our template
folder, our filters, ``url_for`` that knows our endpoint names, and ``config`` bound to the
dashboard's settings. Context processors (the app's and the blueprint's) run as usual.
"""

from __future__ import annotations

from typing import Any

from flask import Flask, current_app, get_flashed_messages
from flask.signals import before_render_template, template_rendered
from flask.templating import Environment
from jinja2 import FileSystemLoader

from geneva_drive.dashboard import csrf, formatting, package_data, urls
from geneva_drive.dashboard.state import state

#: Found the same way in every install mode (see package_data).
TEMPLATES = package_data.locate("templates")
_ENV_KEY = "geneva_drive.jinja_env"


def environment(app: Flask) -> Environment:
    env: Environment | None = app.extensions.get(_ENV_KEY)
    if env is None:
        options: dict[str, Any] = dict(app.jinja_options)
        options.setdefault("autoescape", app.select_jinja_autoescape)
        auto_reload = app.config.get("TEMPLATES_AUTO_RELOAD")
        options.setdefault("auto_reload", app.debug if auto_reload is None else auto_reload)
        env = Environment(app, loader=FileSystemLoader(str(TEMPLATES)), **options)
        env.globals.update(
            url_for=urls.url_for,
            get_flashed_messages=get_flashed_messages,
            config=state(app).config,
            csrf_token=csrf.csrf_token,
        )
        env.filters.update(formatting.FILTERS)
        env.policies["json.dumps_function"] = app.json.dumps
        app.extensions[_ENV_KEY] = env
    return env


def render_template(name: str, **context: Any) -> str:
    """Flask's ``render_template`` on the dashboard's environment (signals included)."""
    app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
    template = environment(app).get_template(name)
    app.update_template_context(context)
    before_render_template.send(
        app, _async_wrapper=app.ensure_sync, template=template, context=context
    )
    rendered = template.render(context)
    template_rendered.send(app, _async_wrapper=app.ensure_sync, template=template, context=context)
    return rendered
