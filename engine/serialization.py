"""JSON serialization of cursors and signal payloads, with size limits.

JSON scalars, lists and string-keyed dicts are stored as they are. Dates, datetimes, times,
UUIDs and decimals are stored as tagged objects (``{"_gd": "datetime", "v": "…"}``) and come
back as the same type, so a cursor can be a ``(created_at, id)`` pair without user code.
"""

from __future__ import annotations

import json
import uuid
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

from geneva_drive.config import settings
from geneva_drive.errors import CursorTooLargeError, InvalidInputError, SignalPayloadTooLargeError

TAG = "_gd"
#: Nesting deeper than this is refused (ValueError) instead of exhausting the Python stack.
MAX_DEPTH = 100


def check_text(text: str, path: str) -> str:
    """Refuse strings no backend can store alike: NUL (PostgreSQL rejects it in text and JSONB)
    and lone surrogates (not encodable as UTF-8)."""
    if "\x00" in text:
        raise InvalidInputError(f"{path} contains a NUL character (\\x00), which cannot be stored")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"{path} contains a lone surrogate (position {exc.start}), which is not valid UTF-8"
        ) from None
    return text


def to_json_value(value: Any, *, path: str = "value", _depth: int = 0) -> Any:
    """Turn ``value`` into plain JSON data, tagging the types JSON has no word for.

    A dict that itself holds the tag key is wrapped (``{"_gd": "dict", "v": …}``), so data sent
    from outside can never be mistaken for a tagged value when it is read back.
    """
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, str):
        return check_text(value, path)
    if _depth >= MAX_DEPTH:
        raise InvalidInputError(f"{path} is nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise InvalidInputError(f"{path} is {value!r}, which JSON cannot represent")
        return value
    if isinstance(value, datetime):
        return {TAG: "datetime", "v": value.isoformat()}
    if isinstance(value, date):
        return {TAG: "date", "v": value.isoformat()}
    if isinstance(value, time):
        return {TAG: "time", "v": value.isoformat()}
    if isinstance(value, uuid.UUID):
        return {TAG: "uuid", "v": str(value)}
    if isinstance(value, Decimal):
        return {TAG: "decimal", "v": str(value)}
    if isinstance(value, list | tuple):
        return [
            to_json_value(v, path=f"{path}[{i}]", _depth=_depth + 1) for i, v in enumerate(value)
        ]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str | int | float | bool) or key is None:
                raise InvalidInputError(
                    f"{path} has a key {key!r} of type {type(key).__name__}; use strings"
                )
            text = check_text(str(key), f"{path} key {key!r}")
            if text in out:
                raise InvalidInputError(
                    f"{path} has two keys that are both {text!r} as JSON; use distinct strings"
                )
            out[text] = to_json_value(item, path=f"{path}[{key!r}]", _depth=_depth + 1)
        if TAG in out:
            return {TAG: "dict", "v": out}
        return out
    raise InvalidInputError(
        f"{path} holds a {type(value).__name__} ({value!r}), which cannot be stored as JSON; "
        "use strings, numbers, lists, dicts, dates, datetimes, UUIDs or decimals"
    )


def deserialize(value: Any) -> Any:
    if isinstance(value, list):
        return [deserialize(v) for v in value]
    if isinstance(value, dict):
        tag = value.get(TAG)
        if tag is not None and set(value) == {TAG, "v"}:
            raw = value["v"]
            if tag == "datetime":
                return datetime.fromisoformat(raw)
            if tag == "date":
                return date.fromisoformat(raw)
            if tag == "time":
                return time.fromisoformat(raw)
            if tag == "uuid":
                return uuid.UUID(raw)
            if tag == "decimal":
                return Decimal(raw)
            if tag == "dict" and isinstance(raw, dict):
                return {k: deserialize(v) for k, v in raw.items()}
        return {k: deserialize(v) for k, v in value.items()}
    return value


def compact_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


def serialize_cursor(value: Any) -> Any:
    """The single serialization path for cursor writes; enforces ``max_cursor_size``."""
    if value is None:
        return None
    data = to_json_value(value, path="cursor")
    limit = settings.max_cursor_size
    if limit is not None:
        size = compact_size(data)
        if size > limit:
            raise CursorTooLargeError(
                f"Serialized cursor is {size} bytes, exceeding settings.max_cursor_size ({limit} "
                "bytes). The cursor is a position marker (an id, page number, or token), not a "
                "place to store the data being processed. Set settings.max_cursor_size to None "
                "to disable this check."
            )
    return data


def serialize_payload(value: Any) -> Any:
    """Serialize a signal payload; enforces ``max_signal_payload_size`` (equal is allowed)."""
    if value is None:
        return None
    data = to_json_value(value, path="payload")
    limit = settings.max_signal_payload_size
    if limit is not None:
        size = compact_size(data)
        if size > limit:
            raise SignalPayloadTooLargeError(
                f"Serialized signal payload is {size} bytes, exceeding "
                f"settings.max_signal_payload_size ({limit} bytes). A payload describes the "
                "event, it is not a place to ship the data the step should be working on - write "
                "what matters onto the hero instead. Set settings.max_signal_payload_size to None "
                "to disable this check."
            )
    return data
