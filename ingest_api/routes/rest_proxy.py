"""Confluent REST Proxy v2 produce (`POST /topics/{topic}`), so its producers switch by URL.

Embedded formats `json` and `binary` are accepted; `avro`/`protobuf`/`jsonschema` need a
schema registry and are refused with 415. Errors use the proxy's `{error_code, message}`.
"""

from __future__ import annotations

import binascii
from typing import Any

import orjson
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from ingest_api.broker import AckMode, NewMessage
from ingest_api.deps import BrokerDep, TopicPath
from ingest_api.responses import JSONBytes
from ingest_api.schemas import ErrorPublic, inline_schema
from tables.errors import LakebrokerError
from tables.message_format import from_base64, from_json_value
from tables.topics import MAX_PARTITIONS

router = APIRouter(tags=["kafka-rest-v2"])
V2 = "application/vnd.kafka.v2+json"


class V2Record(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    key: Any = None
    value: Any = None
    partition: int | None = Field(None, ge=0, le=MAX_PARTITIONS - 1)


class V2Produce(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    records: list[V2Record] = Field(min_length=1, max_length=100_000)


class V2Offset(BaseModel):
    partition: int
    offset: int
    error_code: int | None
    error: str | None


class V2ProduceResult(BaseModel):
    key_schema_id: int | None
    value_schema_id: int | None
    offsets: list[V2Offset]


class V2Error(BaseModel):
    error_code: int
    message: str


class V2Response(JSONBytes):
    media_type = V2


_V2 = TypeAdapter(V2Produce)
_V2_ERROR = {"schema": inline_schema(V2Error)}
_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": V2ProduceResult},
    **{code: {"description": "An error in the proxy's format.", "content": {V2: _V2_ERROR}}
       for code in (400, 404, 415, 422, 429, 507)},
    413: {"description": "Too large: the proxy's format, or ours when Content-Length is over the server limit.",
          "content": {V2: _V2_ERROR, "application/json": {"schema": inline_schema(ErrorPublic)}}},
}


def _proxy_error(status: int, message: str) -> JSONBytes:
    return JSONBytes({"error_code": status * 100 + 1, "message": message}, status_code=status, media_type=V2)


def _decode(text: Any, what: str) -> bytes | None:
    if text is None:
        return None
    if not isinstance(text, str):
        raise ValueError(f"{what} must be a base64 string in the binary format")
    try:
        return from_base64(text)
    except (binascii.Error, ValueError):
        raise ValueError(f"{what} is not valid base64") from None


def _to_message(record: V2Record, binary: bool) -> NewMessage:
    if binary:
        raw_key = _decode(record.key, "key")
        try:
            key = None if raw_key is None else raw_key.decode()
        except UnicodeDecodeError:
            raise ValueError("key must decode to UTF-8 text: lakebroker keys are strings") from None
        return NewMessage(value=_decode(record.value, "value"), format="binary", key=key,
                          partition=record.partition)
    value, fmt = from_json_value(record.value)
    key = record.key if isinstance(record.key, str) or record.key is None else orjson.dumps(record.key).decode()
    return NewMessage(value=value, format=fmt, key=key, partition=record.partition)


@router.post(
    "/topics/{topic}",
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/vnd.kafka.json.v2+json": {"schema": inline_schema(V2Produce)},
        "application/vnd.kafka.binary.v2+json": {"schema": inline_schema(V2Produce)},
    }}},
    responses=_RESPONSES,
    response_class=V2Response,
)
async def produce_v2(topic: TopicPath, request: Request, broker: BrokerDep) -> JSONBytes:
    """Kafka REST Proxy v2 produce, answered in that API's format."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in ("application/vnd.kafka.json.v2+json", "application/vnd.kafka.binary.v2+json"):
        return _proxy_error(415, f"content type {kind or '(none)'!r} is not supported: use "
                            "application/vnd.kafka.json.v2+json or application/vnd.kafka.binary.v2+json")
    try:
        broker.topic(topic)
        body = _V2.validate_json(await request.body())
        messages = [_to_message(r, kind.endswith("binary.v2+json")) for r in body.records]
        results = await broker.produce(topic, messages, AckMode.WAL)
    except ValidationError as exc:
        invalid_json = any(e["type"] == "json_invalid" for e in exc.errors())
        return _proxy_error(400 if invalid_json else 422, str(exc.errors(include_url=False)[0]["msg"]))
    except ValueError as exc:
        return _proxy_error(422, str(exc))
    except LakebrokerError as exc:
        return _proxy_error(exc.status, exc.message)
    offsets = [{"partition": r.partition, "offset": r.offset, "error_code": None, "error": None} for r in results]
    return JSONBytes({"key_schema_id": None, "value_schema_id": None, "offsets": offsets}, media_type=V2)
