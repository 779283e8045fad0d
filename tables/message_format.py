"""How a message value is stored and shown: the `format` column's one owner.

- `json`: any JSON value that is not a string, stored as compact JSON text;
- `text`: a JSON string, stored as its UTF-8 bytes (so SQL sees `hello`, not `"hello"`);
- `binary`: raw bytes (sent as `value_b64`, or as an application/octet-stream body).
"""

from __future__ import annotations

import base64
import math
from typing import Any

import orjson

from lakebroker.tables.errors import InvalidRequest

CONTENT_TYPES = {"json": "application/json", "text": "text/plain; charset=utf-8", "binary": "application/octet-stream"}


def from_json_value(value: Any) -> tuple[bytes | None, str]:
    if value is None:
        return None, "json"  # a tombstone
    if isinstance(value, str):
        return value.encode(), "text"
    try:
        out = orjson.dumps(value)
    except orjson.JSONEncodeError as exc:  # an integer beyond 64 bits, or nesting deeper than 254
        raise InvalidRequest(f"value cannot be stored as JSON ({exc}): send it as a string or value_b64") from None
    # orjson writes a non-finite float (1e400 parses as inf) as null, which would silently turn the
    # value into a tombstone; "null" in the output is the only case that needs the walk.
    if b"null" in out and not _finite(value):
        raise InvalidRequest("value holds a number too large for a 64-bit float (or NaN/Infinity)")
    return out, "json"


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def from_base64(data: str) -> bytes:
    return base64.b64decode(data, validate=True)


def render(value: bytes | None, fmt: str) -> dict[str, Any]:
    """The JSON fields that show a stored value: `value`, or `value_b64` for binary."""
    if value is None:
        return {"value": None}
    if fmt == "json":
        return {"value": orjson.loads(value)}
    if fmt == "text":
        return {"value": value.decode()}
    return {"value": None, "value_b64": base64.b64encode(value).decode()}


def message_json(row: dict[str, Any]) -> dict[str, Any]:
    """A topic-table row as the API and webhooks show it."""
    return {
        "partition": row["partition"],
        "offset": row["offset"],
        "timestamp": row["timestamp"].isoformat(),
        "key": row["key"],
        **render(row["value"], row["format"]),
        "format": row["format"],
        "headers": dict(row["headers"]) if row["headers"] is not None else None,
        "id": row["message_id"],
        "producer_id": row["producer_id"],
        "sequence": row["sequence"],
    }
