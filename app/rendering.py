"""The dashboard's own Jinja environment.

Mounted in a host application, the dashboard must neither see the host's templates (a host's
``base.html`` or ``error.html`` would replace ours: Flask's loader prefers the application's
folder to any blueprint's) nor add filters and globals to the host's environment. So it renders
with an environment of its own, made per Flask app from the app's Jinja options: our template
folder, our filters, ``url_for`` that knows our endpoint names, and ``config`` bound to the
dashboard's settings. Context processors (the app's and the blueprint's) run as usual.
"""

from __future__ import annotations

from collections.abc import Hashable
from types import CodeType
from typing import Any

from flask import Flask, current_app, get_flashed_messages
from flask.signals import before_render_template, template_rendered
from flask.templating import Environment
from jinja2 import BytecodeCache, FileSystemLoader
from jinja2.bccache import Bucket

from geneva_drive.dashboard import csrf, formatting, package_data, urls
from geneva_drive.dashboard.state import state

#: Found the same way in every install mode (see package_data).
TEMPLATES = package_data.locate("templates")
_ENV_KEY = "geneva_drive.jinja_env"


class CompiledTemplates(BytecodeCache):
    """Compiled templates kept in memory and shared by every dashboard app of the process
    whose Jinja options are the same.

    Compiling the overview's templates took 84 of the 240 ms of a new app's first render
    (bench/NOTES.md), in every app: each worker, each test. A template is compiled
    once per process now. Jinja hands over the source's checksum with each lookup, so an
    edited template (``TEMPLATES_AUTO_RELOAD``) is compiled again, never served stale.
    """

    def __init__(self) -> None:
        self._code: dict[str, tuple[str, CodeType]] = {}

    def load_bytecode(self, bucket: Bucket) -> None:
        found = self._code.get(bucket.key)
        if found is not None and found[0] == bucket.checksum:
            bucket.code = found[1]

    def dump_bytecode(self, bucket: Bucket) -> None:
        if bucket.code is not None:
            self._code[bucket.key] = (bucket.checksum, bucket.code)


#: One cache per set of Jinja options: the options (delimiters, extensions, autoescape…)
#: shape the compiled code, and Jinja's key is only the template's name and file.
_COMPILED: dict[Hashable, CompiledTemplates] = {}


def _fingerprint(value: Any) -> Hashable:
    """``value`` as a dictionary key: functions and bound methods by their function, so two
    apps' ``select_jinja_autoescape`` match; anything unhashable by its repr."""
    if callable(value):
        return getattr(value, "__func__", value)  # type: ignore[no-any-return]
    if isinstance(value, list | tuple):
        return tuple(_fingerprint(v) for v in value)
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value  # type: ignore[no-any-return]


def environment(app: Flask) -> Environment:
    env: Environment | None = app.extensions.get(_ENV_KEY)
    if env is None:
        options: dict[str, Any] = dict(app.jinja_options)
        options.setdefault("autoescape", app.select_jinja_autoescape)
        auto_reload = app.config.get("TEMPLATES_AUTO_RELOAD")
        options.setdefault("auto_reload", app.debug if auto_reload is None else auto_reload)
        if "bytecode_cache" not in options:
            key = tuple(sorted((k, _fingerprint(v)) for k, v in options.items()))
            options["bytecode_cache"] = _COMPILED.setdefault(key, CompiledTemplates())
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
