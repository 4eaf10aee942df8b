"""Endpoint names of the dashboard, wherever it is mounted.

The dashboard is one Blueprint, ``geneva_drive``, with its pages in nested blueprints
(``dashboard``, ``workflows``, ``auth``, ``metrics``), so a host application may have blueprints
of the same short names. The dashboard's own code and templates keep writing the short names
(``url_for("workflows.detail", ...)``); :func:`url_for` adds the parent's name. A host template
links to a dashboard page with the full name: ``url_for("geneva_drive.dashboard.overview")``.
"""

from __future__ import annotations

from typing import Any

import flask

#: The name of the dashboard's Blueprint (and the prefix of its endpoints).
BLUEPRINT = "geneva_drive"
_OWN = ("dashboard.", "workflows.", "auth.", "metrics.")


def endpoint_name(endpoint: str) -> str:
    """The full endpoint of one of the dashboard's own short names; any other name as given."""
    if endpoint == "static" or endpoint.startswith(_OWN):
        return f"{BLUEPRINT}.{endpoint}"
    return endpoint


def url_for(endpoint: str, **values: Any) -> str:
    return flask.url_for(endpoint_name(endpoint), **values)


def current_endpoint() -> str:
    """This request's endpoint as the dashboard names it (``workflows.index``), or ``""``."""
    endpoint = flask.request.endpoint or ""
    return endpoint.removeprefix(f"{BLUEPRINT}.")
