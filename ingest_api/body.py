"""Parses produce bodies: JSON, NDJSON or raw bytes, into broker messages.

Bodies are validated straight from bytes by pydantic-core (no stdlib json on the hot path).
Malformed JSON is a 400, a well-formed body of the wrong shape a 422, an unsupported
content type a 415.
"""

from __future__ import annotations

import binascii
from typing import Any

from fastapi import Request
from pydantic import TypeAdapter, ValidationError

from ingest_api.broker import NewMessage
from ingest_api.schemas import MAX_INT, BatchIn, MessageIn
from tables.errors import InvalidRequest, LakebrokerError
from tables.message_format import from_base64, from_json_value
from tables.topics import MAX_PARTITIONS

_MESSAGE = TypeAdapter(MessageIn)
_BATCH = TypeAdapter(BatchIn)


class UnsupportedMediaType(LakebrokerError):
    status = 415
    code = "unsupported_media_type"


class InvalidShape(LakebrokerError):
    status = 422
    code = "invalid_request"


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def _validate(adapter: TypeAdapter[Any], data: bytes, where: str = "") -> Any:
    try:
        return adapter.validate_json(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        if any(e["type"] == "json_invalid" for e in errors):
            raise InvalidRequest(f"malformed JSON{where}: {errors[0]['msg']}") from None
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" if e["loc"] else e["msg"] for e in errors[:5]
        )
        raise InvalidShape(f"invalid message{where}: {problems}") from None


def to_new_message(m: MessageIn) -> NewMessage:
    if m.value_b64 is not None:
        try:
            value: bytes | None = from_base64(m.value_b64)
        except (binascii.Error, ValueError):
            raise InvalidRequest("value_b64 is not valid base64") from None
        fmt = "binary"
    else:
        value, fmt = from_json_value(m.value)
    return NewMessage(value=value, format=fmt, key=m.key, headers=m.headers, partition=m.partition,
                      message_id=m.id, producer_id=m.producer_id, sequence=m.sequence)


RAW_QUERY_FIELDS = ("key", "id", "partition", "producer_id", "sequence")  # of an application/octet-stream body


async def parse_message(request: Request) -> NewMessage:
    kind = media_type(request)
    body = await request.body()
    if kind == "application/json":
        stray = [name for name in RAW_QUERY_FIELDS if name in request.query_params]
        if stray:  # silently ignoring ?partition=2 would put the message elsewhere than asked
            raise InvalidRequest(f"query parameters {', '.join(stray)} apply to an application/octet-stream "
                                 "body only: put them in the JSON body")
        return to_new_message(_validate(_MESSAGE, body))
    if kind == "application/octet-stream":
        q = request.query_params
        return NewMessage(value=body, format="binary", key=_query_str(q.get("key"), "key", 0, 64 * 1024),
                          partition=_query_int(q.get("partition"), "partition", MAX_PARTITIONS - 1),
                          message_id=_query_str(q.get("id"), "id", 1, 256),
                          producer_id=_query_str(q.get("producer_id"), "producer_id", 1, 256),
                          sequence=_query_int(q.get("sequence"), "sequence", MAX_INT))
    raise UnsupportedMediaType(
        f"content type {kind or '(none)'!r} is not accepted here: send application/json, "
        "or application/octet-stream for a raw-bytes value"
    )


def _query_str(text: str | None, name: str, shortest: int, longest: int) -> str | None:
    """The limits MessageIn puts on the same field of a JSON body."""
    if text is not None and not shortest <= len(text) <= longest:
        raise InvalidRequest(f"query parameter {name} must be {shortest} to {longest} characters")
    return text


def _query_int(text: str | None, name: str, most: int) -> int | None:
    if text is None:
        return None
    # ASCII digits only: str.isdigit() also takes '²', which int() refuses
    if not (text.isascii() and text.isdigit() and len(text) <= 19 and int(text) <= most):
        raise InvalidRequest(f"query parameter {name} must be an integer from 0 to {most}")
    return int(text)


async def parse_batch(request: Request) -> list[NewMessage]:
    kind = media_type(request)
    body = await request.body()
    if kind == "application/json":
        batch: BatchIn = _validate(_BATCH, body)
        return [to_new_message(m) for m in batch.messages]
    if kind in ("application/x-ndjson", "application/jsonl", "application/ndjson"):
        lines = [line for line in body.split(b"\n") if line.strip()]
        if not lines:
            raise InvalidRequest("the NDJSON body holds no messages")
        if len(lines) > 100_000:
            raise InvalidShape("a batch holds at most 100000 messages")
        return [to_new_message(_validate(_MESSAGE, line, f" on line {i + 1}")) for i, line in enumerate(lines)]
    raise UnsupportedMediaType(
        f"content type {kind or '(none)'!r} is not accepted here: send application/json "
        '({"messages": [...]}) or application/x-ndjson (one message per line)'
    )
