"""The operations of the HTTP API, and the OpenAPI 3.1 document built from them.

Each view is declared once with :func:`operation`: its method and path, the scope it needs,
the pydantic models of its body, its query and its answer. The same declaration registers the
Flask route, validates the request before the view runs, and becomes the operation in
``openapi.json`` — nothing about a request is written twice.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flask import Blueprint
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from geneva_drive.dashboard.api import schemas

VERSION = "1"
_PARAM = re.compile(r"<(?:(\w+):)?(\w+)>")


@dataclass(frozen=True)
class Operation:
    method: str
    #: The Flask rule, e.g. ``/workflows/<int:workflow_id>``.
    rule: str
    operation_id: str
    summary: str
    #: ``read``, ``operate``, ``signal``, or None (no token needed).
    scope: str | None
    body: type[schemas.Body] | None
    query: type[schemas.Body] | None
    reply: type[BaseModel]
    #: The statuses other than 200 it may answer (besides 401/403/429 of every secured one).
    errors: tuple[int, ...]
    description: str = ""
    #: The operator action its refusals are audited as (``pause``, ``signal``, …).
    audit: str | None = None

    @property
    def path(self) -> str:
        """The OpenAPI path: ``/workflows/{workflow_id}``."""
        return _PARAM.sub(lambda m: "{" + m.group(2) + "}", self.rule)

    def integer_parameters(self) -> set[str]:
        return {name for converter, name in _PARAM.findall(self.rule) if converter == "int"}

    def path_parameters(self) -> list[dict[str, Any]]:
        found = []
        for converter, name in _PARAM.findall(self.rule):
            schema: dict[str, Any] = (
                {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}
                if converter == "int"
                else {"type": "string", "minLength": 1, "maxLength": 255}
            )
            found.append({"name": name, "in": "path", "required": True, "schema": schema})
        return found


OPERATIONS: list[Operation] = []


def operation(
    bp: Blueprint,
    method: str,
    rule: str,
    *,
    summary: str,
    scope: str | None,
    reply: type[BaseModel],
    body: type[schemas.Body] | None = None,
    query: type[schemas.Body] | None = None,
    errors: tuple[int, ...] = (),
    description: str = "",
    audit: str | None = None,
    handle: Callable[[Operation, Callable[..., Any]], Callable[..., Any]],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare an operation: ``handle`` wraps the view with the checks the declaration asks
    for (scope, body, query), and the route is added to ``bp``."""

    def decorator(view: Callable[..., Any]) -> Callable[..., Any]:
        op = Operation(
            method=method,
            rule=rule,
            operation_id=view.__name__,
            summary=summary,
            scope=scope,
            body=body,
            query=query,
            reply=reply,
            errors=errors,
            description=description or (view.__doc__ or "").strip(),
            audit=audit,
        )
        OPERATIONS.append(op)
        wrapped = functools.wraps(view)(handle(op, view))
        # Flask matches ids as any segment and the handler converts them: a number out of an
        # id's range then gets the API's JSON 404, not the app's own page for an unmatched URL.
        plain = _PARAM.sub(lambda m: f"<{m.group(2)}>" if m.group(1) == "int" else m.group(0), rule)
        bp.add_url_rule(plain, endpoint=view.__name__, view_func=wrapped, methods=[method])
        return view

    return decorator


_STATUS_TEXT = {
    400: "Bad input: the message names the field.",
    401: "No token, or a token that is not configured.",
    403: "The token lacks the scope this operation needs.",
    404: "No such workflow, schedule or route.",
    409: "The engine refused: the workflow's state does not allow it.",
    413: "The request body is over 64 KiB.",
    415: "The body is not `application/json`.",
    429: "Too many requests from this token (or too many wrong tokens): see `Retry-After`.",
}


def document(server_url: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of every declared operation."""
    models: list[type[BaseModel]] = [schemas.Error]
    for op in OPERATIONS:
        for model in (op.body, op.reply):
            if model is not None and model not in models:
                models.append(model)
    keyed, definitions = models_json_schema(
        [(m, "serialization" if issubclass(m, schemas.Reply) else "validation") for m in models],
        ref_template="#/components/schemas/{model}",
    )
    components = dict(definitions.get("$defs", {}))
    refs = {model: keyed[(model, mode)] for (model, mode) in keyed}
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        entry: dict[str, Any] = {
            "operationId": op.operation_id,
            "summary": op.summary,
            "description": op.description,
            "parameters": op.path_parameters() + _query_parameters(op),
            "responses": {
                "200": {
                    "description": "OK",
                    "content": {"application/json": {"schema": refs[op.reply]}},
                }
            },
        }
        if op.scope is not None:
            entry["security"] = [{"bearer": []}]
            entry["description"] = (
                f"{op.description}\n\nNeeds a token with the `{op.scope}` scope."
            ).strip()
        if op.body is not None:
            entry["requestBody"] = {
                "required": op.body is not schemas.ActionBody,
                "content": {"application/json": {"schema": refs[op.body]}},
            }
        statuses = set(op.errors) | ({401, 403, 429} if op.scope else set())
        if op.body is not None:
            statuses |= {400, 413, 415}
        for status in sorted(statuses):
            entry["responses"][str(status)] = {
                "description": _STATUS_TEXT[status],
                "content": {"application/json": {"schema": refs[schemas.Error]}},
            }
        paths.setdefault(op.path, {})[op.method.lower()] = entry
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "GenevaDrive API",
            "version": VERSION,
            "description": "Workflows, operator actions and signals over HTTP "
            '(docs/MANUAL.md, "Automating operations").',
        },
        "servers": [{"url": server_url}],
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _query_parameters(op: Operation) -> list[dict[str, Any]]:
    if op.query is None:
        return []
    schema = op.query.model_json_schema(by_alias=True)
    required = set(schema.get("required", []))
    found = []
    for name, prop in schema.get("properties", {}).items():
        # A parameter left out is the "null" of an optional field: the query string has no
        # null to send.
        options = [o for o in prop.get("anyOf", []) if o.get("type") != "null"]
        if len(options) == 1:
            prop = {**{k: v for k, v in prop.items() if k != "anyOf"}, **options[0]}
        if "default" in prop and prop["default"] is None:
            del prop["default"]
        found.append({"name": name, "in": "query", "required": name in required, "schema": prop})
    return found
