"""The HTTP API's request and response bodies, as pydantic models.

One definition serves twice: it validates what a client sends (a wrong field is a 400 naming
it) and it is the JSON Schema of the OpenAPI document (``openapi.py``), so the document cannot
drift from what the server accepts. Pydantic was chosen over marshmallow + apispec, spectree
and flask-smorest because its JSON Schema is draft 2020-12, the dialect OpenAPI 3.1 uses as is,
it is the most used and best kept of them, and it needs no framework around the views:
the views stay plain Flask (docs/MANUAL.md, "Automating operations").
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: Longest name, key or class accepted (the columns hold 255 characters).
Name = Annotated[str, Field(min_length=1, max_length=255)]
Key = Annotated[str, Field(min_length=1, max_length=255)]


class Body(BaseModel):
    """A request body: unknown fields are refused, so a typo is an error, not a no-op."""

    model_config = ConfigDict(extra="forbid")


class Reply(BaseModel):
    """A response body (documented; extra fields may be added in later versions)."""


# --- requests ------------------------------------------------------------------------------


class ActionBody(Body):
    """``pause``, ``resume``, ``skip``, ``cancel`` and ``reattempt`` take no fields."""


class ResumeAtBody(Body):
    step: Name = Field(description="The step to resume at (a step the class defines).")


class SignalBody(Body):
    name: Name = Field(description="The signal's name, e.g. `payment_confirmed`.")
    payload: Any = Field(default=None, description="Any JSON value; `{}` when left out.")
    idempotency_key: Key | None = Field(
        default=None,
        description="A delivery with a key already delivered to this workflow changes "
        "nothing and answers `duplicate_delivery: true`.",
    )


class HeroSignalBody(SignalBody):
    """A webhook's shape: the ongoing workflow of ``workflow`` for that hero gets the signal."""

    workflow: Name = Field(description="The workflow class, e.g. `OrderWorkflow`.")
    hero_type: Name = Field(description="The hero's class name, e.g. `Order`.")
    hero_id: Annotated[str, Field(min_length=1, max_length=64)] = Field(
        description="The hero's id, as a string."
    )


class ListQuery(Body):
    """``GET workflows``: the list page's filters and its keyset cursor."""

    cls: Name | None = Field(default=None, alias="class", description="A workflow class.")
    state: Literal["ready", "performing", "paused", "finished", "canceled"] | None = None
    step: Name | None = Field(default=None, description="The next step.")
    hero_type: Name | None = None
    hero_id: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    parent: Annotated[int, Field(ge=1, le=2**63 - 1)] | None = Field(
        default=None, description="A parent workflow's id: its children."
    )
    error: Name | None = Field(default=None, description="An error class (or its last part).")
    concurrency_limit: Name | None = Field(
        default=None, description="A concurrency or rate limit: the workflows counting against it."
    )
    after: Annotated[int, Field(ge=1, le=2**63 - 1)] | None = Field(
        default=None, description="The `next` cursor of the previous page."
    )
    limit: Annotated[int, Field(ge=1)] = Field(default=50, description="Page size; clamped to 500.")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# --- responses -----------------------------------------------------------------------------


class WorkflowItem(Reply):
    id: int
    workflow_class: str = Field(serialization_alias="class")
    state: str
    hero_type: str | None
    hero_id: str | None
    next_step: str | None
    why: str = Field(description="Why it waits, in words (the dashboard's why-line).")
    badges: list[str]
    parent_id: int | None
    error_message: str | None
    created_at: datetime
    updated_at: datetime


class WorkflowList(Reply):
    items: list[WorkflowItem]
    next: int | None = Field(description="Pass as `after` for the next page; null on the last.")


class Execution(Reply):
    id: int
    step_name: str
    state: str
    outcome: str | None
    scheduled_for: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error_class_name: str | None
    error_message: str | None
    metadata: dict[str, Any] | None


class SignalRow(Reply):
    id: int
    name: str
    state: str
    idempotency_key: str | None
    payload: Any
    created_at: datetime | None
    consumed_at: datetime | None


class WorkflowDetail(WorkflowItem):
    current_step: str | None
    executions: list[Execution] = Field(description="Oldest first.")
    signals: list[SignalRow] = Field(description="Oldest first.")


class ActionReply(Reply):
    message: str
    workflow: WorkflowDetail


class SignalReply(Reply):
    message: str
    duplicate_delivery: bool
    signal_id: int
    signal_state: str
    workflow_id: int


class LimitKey(Reply):
    key: str
    waiting: int
    deferred: int
    oldest_wait_since: datetime | None
    drain_seconds: float | None = Field(description="Estimated; null when nothing drained lately.")


class Limit(Reply):
    name: str
    kind: str
    in_use: int
    waiting: int
    deferred: int
    late: int
    keys: list[LimitKey]


class LimitList(Reply):
    items: list[Limit]


class ScheduleList(Reply):
    items: list[dict[str, Any]] = Field(
        description="Each schedule as `geneva-drive schedules list --json` prints it."
    )


class ScheduleReply(Reply):
    message: str
    workflow_id: int | None = Field(description="The workflow Run now created.")


class Finding(Reply):
    workflow_id: int
    workflow_class: str
    rule: str
    problem: str
    fix: str
    execution_id: int | None


class Health(Reply):
    unexplained: list[Finding]


class ErrorDetail(Reply):
    code: str = Field(
        description="`bad_request`, `unauthorized`, `forbidden`, `not_found`, "
        "`method_not_allowed`, `conflict`, `too_large`, `unsupported_media_type`, "
        "`too_many_requests` or `server_error`."
    )
    message: str
    field: str | None = Field(default=None, description="The field a 400 is about.")


class Error(Reply):
    error: ErrorDetail
