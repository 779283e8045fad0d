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
from ingest_api.schemas import BatchIn, MessageIn
from tables.errors import InvalidRequest, LakebrokerError
from tables.message_format import from_base64, from_json_value

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


async def parse_message(request: Request) -> NewMessage:
    kind = media_type(request)
    body = await request.body()
    if kind == "application/json":
        return to_new_message(_validate(_MESSAGE, body))
    if kind == "application/octet-stream":
        q = request.query_params
        partition = q.get("partition")
        if partition is not None and not partition.isdigit():
            raise InvalidRequest("query parameter partition must be a non-negative integer")
        sequence = q.get("sequence")
        if sequence is not None and not sequence.isdigit():
            raise InvalidRequest("query parameter sequence must be a non-negative integer")
        return NewMessage(value=body, format="binary", key=q.get("key"), partition=None if partition is None
                          else int(partition), message_id=q.get("id"), producer_id=q.get("producer_id"),
                          sequence=None if sequence is None else int(sequence))
    raise UnsupportedMediaType(
        f"content type {kind or '(none)'!r} is not accepted here: send application/json, "
        "or application/octet-stream for a raw-bytes value"
    )


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
