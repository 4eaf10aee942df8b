"""The HTTP API: JSON under ``<prefix>/api/v1/`` for automation and webhooks.

A Blueprint of its own, registered on the app (never inside the dashboard's Blueprint, whose
hooks read the session cookie and check CSRF tokens): every request here is authenticated by
its bearer token alone (:mod:`.tokens`), answered in JSON, errors included, and never with a
500 for a client's mistake. The operations themselves are the engine's: the operator actions,
signals and schedule actions of :mod:`geneva_drive.operator_actions`, audited with the actor
``api:<token name>`` (docs/MANUAL.md, "Automating operations").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from flask import Blueprint, Flask, Response, current_app, jsonify, request, url_for
from pydantic import BaseModel, ValidationError
from sqlalchemy import select
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound
from werkzeug.routing import PathConverter

from geneva_drive import health, limits, operator_actions
from geneva_drive.dashboard import presenters, queries
from geneva_drive.dashboard import schedules as schedule_views
from geneva_drive.dashboard.api import schemas, tokens
from geneva_drive.dashboard.api.openapi import Operation, document, operation
from geneva_drive.dashboard.extensions import db, session
from geneva_drive.dashboard.limits_page import KeyBacklog, backlog
from geneva_drive.dashboard.ratelimit import Limits, TokenThrottle
from geneva_drive.dashboard.state import dashboard_config
from geneva_drive.logsafe import escape
from geneva_drive.models import Signal, StepExecution, utcnow
from geneva_drive.operator_actions import ActionResult
from geneva_drive.workflow import Workflow

log = logging.getLogger(__name__)

PREFIX = "/api/v1"
#: Largest request body accepted (413 above it): a signal's payload, with room to spare.
MAX_BODY = 64 * 1024
#: Executions and signals a workflow's answer carries at most (the newest).
DETAIL_ROWS = 500
#: The page size's ceiling.
MAX_PAGE = 500

bp = Blueprint("geneva_drive_api", __name__)

_EXTENSION = "geneva_drive.api"


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.field = field
        self.headers = headers or {}


_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    429: "too_many_requests",
}


def _error(status: int, message: str, field: str | None = None) -> ApiError:
    return ApiError(status, _CODES.get(status, "server_error"), message, field=field)


def _answer(model: BaseModel) -> Response:
    return jsonify(model.model_dump(mode="json", by_alias=True))


# --- set-up -----------------------------------------------------------------------------------


class ApiState:
    """What the API of one app knows: its tokens (parsed at start-up: a malformed entry refuses
    to start), the host's own check, and the throttles."""

    def __init__(self, settings: Any, api_auth: tokens.ApiAuth | None) -> None:
        self.tokens = tokens.parse_tokens(settings.get("API_TOKENS"))
        self.per_minute = tokens.per_minute(settings)
        self.api_auth = api_auth
        self.budget = tokens.RequestBudget()
        self.wrong_tokens = TokenThrottle()


class AnyText(PathConverter):
    """A path's rest, whatever it holds: the path converter stops at a newline (its regex has
    no DOTALL), and an unmatched URL would get the app's HTML page, not the API's JSON."""

    regex = r"[\s\S]*?"
    part_isolating = False  # it spans slashes, as the path converter does


def init_app(app: Flask, prefix: str = "", api_auth: tokens.ApiAuth | None = None) -> None:
    """Serve the API at ``<prefix>/api/v1`` on ``app``."""
    app.url_map.converters["any_text"] = AnyText
    app.extensions[_EXTENSION] = ApiState(dashboard_config_of(app), api_auth)
    app.register_blueprint(bp, url_prefix=prefix.rstrip("/") + PREFIX)


def dashboard_config_of(app: Flask) -> Any:
    with app.app_context():
        return dashboard_config()


def _state() -> ApiState:
    found: ApiState = current_app.extensions[_EXTENSION]
    return found


# --- every request ------------------------------------------------------------------------------


@bp.before_request
def _limit_body() -> None:
    # Werkzeug enforces it while the body is read (a chunked body too), as a 413.
    request.max_content_length = MAX_BODY
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise _error(413, f"The request body is over {MAX_BODY // 1024} KiB.")


@bp.after_request
def _headers(response: Response) -> Response:
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


@bp.errorhandler(ApiError)
def _api_error(error: ApiError) -> Response:
    body = schemas.Error(
        error=schemas.ErrorDetail(code=error.code, message=error.message, field=error.field)
    )
    response = _answer(body)
    response.status_code = error.status
    for name, value in error.headers.items():
        response.headers[name] = value
    if error.status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="geneva_drive"'
    return response


@bp.errorhandler(HTTPException)
def _http_error(error: HTTPException) -> Response:
    status = error.code or 500
    message = error.description or error.name
    if status == 413:
        message = f"The request body is over {MAX_BODY // 1024} KiB."
    return _api_error(_error(status, message))


@bp.errorhandler(Exception)
def _unexpected(error: Exception) -> Response:
    # Ours, not the client's: logged with its traceback, answered without it.
    db.session.rollback()
    log.exception("API %s %s failed", request.method, escape(request.path, 300))
    return _api_error(ApiError(500, "server_error", "Something went wrong on our side."))


def _identify() -> tokens.ApiClient:
    """The caller, by its bearer token (or the host's own check): 401 without one that is
    configured, 429 past its budget or after too many wrong tokens from one address."""
    state = _state()
    address = request.remote_addr
    given = tokens.bearer(request.headers.get("Authorization"))
    client: tokens.ApiClient | None = None
    if state.api_auth is not None:
        client = state.api_auth(request)
    if client is None and given is not None:
        wait = state.wrong_tokens.retry_after(address, WRONG_TOKENS)
        if wait:
            raise ApiError(
                429,
                "too_many_requests",
                "Too many wrong tokens from this address; try again later.",
                headers={"Retry-After": str(wait)},
            )
        client = tokens.client_for(state.tokens, given)
        if client is None:
            state.wrong_tokens.failed(address, WRONG_TOKENS)
        else:
            state.wrong_tokens.succeeded(address)
    if client is None:
        raise _error(
            401,
            "A bearer token is needed: send Authorization: Bearer <token> with a token "
            "configured in GENEVA_API_TOKENS (the dashboard's login does not apply here).",
        )
    wait = state.budget.retry_after(client.name, state.per_minute)
    if wait:
        raise ApiError(
            429,
            "too_many_requests",
            f"Token {client.name!r} made {state.per_minute} requests in the last minute.",
            headers={"Retry-After": str(wait)},
        )
    return client


#: Wrong tokens one address may send before it waits (the login throttle's backoff after).
WRONG_TOKENS = Limits(pair=10)


def _parse(model: type[schemas.Body], data: Any, where: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or None
        label = f"{where} field {field!r}" if field else where
        raise _error(400, f"{label}: {first['msg']}", field=field) from None


def _body(op: Operation) -> Any:
    assert op.body is not None
    raw = request.get_data(cache=True)
    if not raw.strip():
        if op.body is schemas.ActionBody:
            return schemas.ActionBody()
        raise _error(400, "The request needs a JSON body.")
    if request.mimetype != "application/json":
        raise _error(415, "Send the body as JSON with Content-Type: application/json.")
    try:
        data = request.get_json(force=True)
    except (ValueError, HTTPException):
        raise _error(400, "The body is not valid JSON.") from None
    if not isinstance(data, dict):
        raise _error(400, "The body must be a JSON object.")
    return _parse(op.body, data, "body")


def _handle(op: Operation, view: Callable[..., Any]) -> Callable[..., Any]:
    def run(**path: Any) -> Any:
        for name in op.integer_parameters():
            path[name] = _id(path[name])
        kwargs: dict[str, Any] = dict(path)
        if op.scope is not None:
            client = _identify()
            kwargs["client"] = client
            if op.scope not in client.scopes:
                refused = _error(
                    403,
                    f"Token {client.name!r} lacks the {op.scope!r} scope this operation needs "
                    f"(it has: {', '.join(sorted(client.scopes))}).",
                )
                _audit_refused(op, client, path, refused)
                raise refused
        if op.query is not None:
            kwargs["query"] = _parse(op.query, request.args.to_dict(), "query")
        if op.body is not None:
            try:
                kwargs["body"] = _body(op)
            except ApiError as refused:
                _audit_refused(op, kwargs.get("client"), path, refused)
                raise
        return view(**kwargs)

    return run


def _id(text: str) -> int:
    """A path's id: digits within the BIGINT range, else nothing here has it (404)."""
    if not text.isascii() or not text.isdigit() or not 0 < int(text) < 2**63:
        raise _error(404, f"No workflow has the id {text[:40]!r}.")
    return int(text)


def _audit_refused(
    op: Operation, client: tokens.ApiClient | None, path: dict[str, Any], refused: ApiError
) -> None:
    """An action or signal refused before it reached the engine (a missing scope, a malformed
    body) is in the audit like the engine's own refusals."""
    if client is None or op.audit is None:
        return
    operator_actions.record(
        session(),
        actor(client),
        op.audit,
        path.get("workflow_id"),
        {k: v for k, v in path.items() if k != "workflow_id"} or None,
        None,
        None,
        "refused",
        refused.message,
    )
    db.session.commit()


def actor(client: tokens.ApiClient) -> str:
    return f"api:{client.name}"


def _decl(
    method: str, rule: str, **options: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return operation(bp, method, rule, handle=_handle, **options)


# --- reading ------------------------------------------------------------------------------------


def _item(row: Any) -> schemas.WorkflowItem:
    return schemas.WorkflowItem(
        id=row.id,
        workflow_class=row.workflow_class,
        state=row.state,
        hero_type=row.hero_type,
        hero_id=row.hero_id,
        next_step=row.next_step,
        why=row.why,
        badges=[badge.label for badge in row.badges],
        parent_id=row.parent_id,
        error_message=row.error_message,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def workflow_detail(workflow_id: int) -> schemas.WorkflowDetail:
    current = session()
    workflow = current.get(Workflow, workflow_id)
    if workflow is None:
        raise _error(404, f"Workflow #{workflow_id} does not exist.")
    (row,) = presenters.workflow_rows(current, [workflow])
    executions = list(
        current.scalars(
            select(StepExecution)
            .where(StepExecution.workflow_id == workflow_id)
            .order_by(StepExecution.id.desc())
            .limit(DETAIL_ROWS)
        )
    )
    signals = list(
        current.scalars(
            select(Signal)
            .where(Signal.workflow_id == workflow_id)
            .order_by(Signal.id.desc())
            .limit(DETAIL_ROWS)
        )
    )
    item = _item(row)
    return schemas.WorkflowDetail(
        **item.model_dump(),
        current_step=workflow.current_step_name,
        executions=[
            schemas.Execution(
                id=e.id,
                step_name=e.step_name,
                state=e.state,
                outcome=e.outcome,
                scheduled_for=e.scheduled_for,
                started_at=e.started_at,
                finished_at=e.finished_at,
                error_class_name=e.error_class_name,
                error_message=e.error_message,
                metadata=e.metadata_,
            )
            for e in reversed(executions)
        ],
        signals=[
            schemas.SignalRow(
                id=s.id,
                name=s.name,
                state=s.state,
                idempotency_key=s.idempotency_key,
                payload=s.payload_json,
                created_at=s.created_at,
                consumed_at=s.consumed_at,
            )
            for s in reversed(signals)
        ],
    )


@_decl(
    "GET",
    "/workflows",
    summary="List workflows",
    scope="read",
    query=schemas.ListQuery,
    reply=schemas.WorkflowList,
    errors=(400,),
)
def list_workflows(client: tokens.ApiClient, query: schemas.ListQuery) -> Response:
    """The dashboard's list: newest first, filtered; page on with `after` = the last `next`."""
    filters = queries.WorkflowFilters(
        cls=query.cls or "",
        state=query.state or "",
        step=query.step or "",
        hero_type=query.hero_type or "",
        hero_id=query.hero_id or "",
        parent=str(query.parent or ""),
        error=query.error or "",
        limit=query.concurrency_limit or "",
    )
    current = session()
    page = queries.keyset_page(
        current,
        queries.filtered_workflows(filters),
        Workflow.id,
        after=query.after,
        limit=min(query.limit, MAX_PAGE),
    )
    rows = presenters.workflow_rows(current, page.items)
    return _answer(schemas.WorkflowList(items=[_item(r) for r in rows], next=page.older))


@_decl(
    "GET",
    "/workflows/<int:workflow_id>",
    summary="A workflow with its executions and signals",
    scope="read",
    reply=schemas.WorkflowDetail,
    errors=(404,),
)
def get_workflow(client: tokens.ApiClient, workflow_id: int) -> Response:
    """The workflow, its newest 500 executions and signals (oldest first)."""
    return _answer(workflow_detail(workflow_id))


# --- operator actions ---------------------------------------------------------------------------


def _refusal(result: ActionResult) -> ApiError:
    return _error(result.status, result.message)


def _act(
    client: tokens.ApiClient, workflow_id: int, action: str, params: dict[str, Any]
) -> Response:
    result = operator_actions.perform(session(), actor(client), workflow_id, action, params)
    if not result.ok:
        raise _refusal(result)
    db.session.expire_all()
    return _answer(
        schemas.ActionReply(message=result.message, workflow=workflow_detail(workflow_id))
    )


def _action_view(verb: str) -> Callable[..., Response]:
    def view(client: tokens.ApiClient, workflow_id: int, body: schemas.ActionBody) -> Response:
        return _act(client, workflow_id, verb, {})

    view.__name__ = f"workflow_{verb}"
    view.__doc__ = f"`{verb}`, as the dashboard's button; answers the workflow after it."
    return view


for _verb in ("pause", "resume", "skip", "cancel", "reattempt"):
    _decl(
        "POST",
        f"/workflows/<int:workflow_id>/actions/{_verb}",
        summary=f"{_verb.capitalize()} a workflow",
        scope="operate",
        body=schemas.ActionBody,
        reply=schemas.ActionReply,
        errors=(404, 409),
        audit=_verb,
    )(_action_view(_verb))


@_decl(
    "POST",
    "/workflows/<int:workflow_id>/actions/resume_at",
    summary="Resume a workflow at a step",
    scope="operate",
    body=schemas.ResumeAtBody,
    reply=schemas.ActionReply,
    errors=(404, 409),
    audit="resume_at",
)
def workflow_resume_at(
    client: tokens.ApiClient, workflow_id: int, body: schemas.ResumeAtBody
) -> Response:
    """`resume_at`: the named step runs next (now)."""
    return _act(client, workflow_id, "resume_at", {"step": body.step})


# --- signals ------------------------------------------------------------------------------------


def _signal_params(body: schemas.SignalBody) -> dict[str, Any]:
    return {
        "name": body.name,
        "payload": {} if body.payload is None else body.payload,
        "idempotency_key": body.idempotency_key,
    }


def _signal_reply(result: ActionResult, workflow_id: int) -> Response:
    if not result.ok:
        raise _refusal(result)
    return _answer(
        schemas.SignalReply(
            message=result.message,
            duplicate_delivery=bool(result.data.get("duplicate_delivery")),
            signal_id=int(result.data["signal_id"]),
            signal_state=str(result.data["signal_state"]),
            workflow_id=workflow_id,
        )
    )


@_decl(
    "POST",
    "/workflows/<int:workflow_id>/signals",
    summary="Send a signal to a workflow",
    scope="signal",
    body=schemas.SignalBody,
    reply=schemas.SignalReply,
    errors=(404, 409),
    audit="signal",
)
def signal_workflow(
    client: tokens.ApiClient, workflow_id: int, body: schemas.SignalBody
) -> Response:
    """Deliver a signal; with an `idempotency_key` a retry changes nothing."""
    result = operator_actions.perform(
        session(), actor(client), workflow_id, "signal", _signal_params(body)
    )
    return _signal_reply(result, workflow_id)


@_decl(
    "POST",
    "/signals",
    summary="Send a signal to a hero's ongoing workflow (webhooks)",
    scope="signal",
    body=schemas.HeroSignalBody,
    reply=schemas.SignalReply,
    errors=(404, 409),
    audit="signal",
)
def signal_hero(client: tokens.ApiClient, body: schemas.HeroSignalBody) -> Response:
    """The ongoing workflow of `workflow` for the hero `hero_type`/`hero_id` gets the signal;
    404 when there is none."""
    current = session()
    result = operator_actions.perform_hero_signal(
        current,
        actor(client),
        body.workflow,
        body.hero_type,
        body.hero_id,
        _signal_params(body),
    )
    if not result.ok:
        raise _refusal(result)
    delivered = current.get(Signal, int(result.data["signal_id"]))
    assert delivered is not None
    return _signal_reply(result, delivered.workflow_id)


# --- limits, schedules, health --------------------------------------------------------------


def _limit_key(key: KeyBacklog) -> schemas.LimitKey:
    drain = key.drain()
    return schemas.LimitKey(
        key=key.key,
        waiting=key.waiting,
        deferred=key.deferred,
        oldest_wait_since=key.oldest,
        drain_seconds=None if drain is None else drain.total_seconds(),
    )


@_decl(
    "GET", "/limits", summary="Concurrency and rate limits", scope="read", reply=schemas.LimitList
)
def list_limits(client: tokens.ApiClient) -> Response:
    """Each limit with what it holds and holds back, and its busiest keys."""
    items = []
    for entry in backlog(session()):
        use: limits.LimitUse = entry.use
        items.append(
            schemas.Limit(
                name=use.name,
                kind=use.kind,
                in_use=use.in_use,
                waiting=entry.total.waiting,
                deferred=entry.total.deferred,
                late=entry.total.late,
                keys=[_limit_key(k) for k in entry.keys],
            )
        )
    return _answer(schemas.LimitList(items=items))


@_decl("GET", "/schedules", summary="Recurring schedules", scope="read", reply=schemas.ScheduleList)
def list_schedules(client: tokens.ApiClient) -> Response:
    """Every schedule, as `geneva-drive schedules list --json` prints it."""
    view = schedule_views.schedules_view(session())
    now = utcnow()
    return _answer(
        schemas.ScheduleList(items=[schedule_views.as_dict(row, now) for row in view.rows])
    )


_SCHEDULE_VERBS = {
    "pause": "schedule_pause",
    "resume": "schedule_resume",
    "run_now": "schedule_run_now",
}


def _schedule_view(verb: str) -> Callable[..., Response]:
    def view(client: tokens.ApiClient, name: str, body: schemas.ActionBody) -> Response:
        result = operator_actions.perform_schedule(
            session(), actor(client), name, _SCHEDULE_VERBS[verb]
        )
        if not result.ok:
            raise _refusal(result)
        return _answer(
            schemas.ScheduleReply(message=result.message, workflow_id=result.workflow_id)
        )

    view.__name__ = f"schedule_{verb}"
    view.__doc__ = f"`{verb}` the schedule, as the Schedules page's button."
    return view


for _verb in _SCHEDULE_VERBS:
    _decl(
        "POST",
        # <any_text:…>: a schedule's name may hold a slash ("reports/nightly").
        f"/schedules/<any_text:name>/actions/{_verb}",
        summary=f"{_verb.replace('_', ' ').capitalize()} a schedule",
        scope="operate",
        body=schemas.ActionBody,
        reply=schemas.ScheduleReply,
        errors=(404, 409),
        audit=_SCHEDULE_VERBS[_verb],
    )(_schedule_view(_verb))


@_decl("GET", "/health", summary="Workflows that break a rule", scope="read", reply=schemas.Health)
def get_health(client: tokens.ApiClient) -> Response:
    """The unexplained workflows: each with the rule it breaks and the fix."""
    findings = health.unexplained(session())
    return _answer(
        schemas.Health(
            unexplained=[
                schemas.Finding(
                    workflow_id=f.workflow_id,
                    workflow_class=f.workflow_class,
                    rule=f.rule,
                    problem=f.problem,
                    fix=f.fix,
                    execution_id=f.execution_id,
                )
                for f in findings
            ]
        )
    )


# --- the document, and what matches no operation ---------------------------------------------


@bp.get("/openapi.json")
def openapi_document() -> Response:
    """Needs no token: the document says what exists, never what is stored."""
    server = url_for("geneva_drive_api.openapi_document", _external=True).rsplit("/", 1)[0]
    return jsonify(document(server))


_ANY = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]


@bp.route("/", defaults={"rest": ""}, methods=_ANY)
@bp.route("/<any_text:rest>", methods=_ANY)
def unmatched(rest: str) -> Response:
    """A path (or method) the API does not have: JSON, like every other answer here."""
    adapter = current_app.url_map.bind_to_environ(request.environ)
    allowed = []
    for method in ("GET", "POST"):
        try:
            endpoint, _ = adapter.match(request.path, method=method)
        except (NotFound, MethodNotAllowed):
            continue
        if endpoint != request.endpoint:
            allowed.append(method)
    if allowed:
        raise ApiError(
            405,
            "method_not_allowed",
            f"{request.method} is not allowed here; use {' or '.join(allowed)}.",
            headers={"Allow": ", ".join(allowed)},
        )
    raise _error(404, f"No API operation at {request.path[:200]}; see {PREFIX}/openapi.json.")
