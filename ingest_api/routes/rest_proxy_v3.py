"""Confluent REST Proxy v3: the cluster, and produce to a topic.

- `GET /v3/clusters` and `GET /v3/clusters/{cluster_id}`: the one cluster, `lakebroker`;
- `POST /v3/clusters/{cluster_id}/topics/{topic}/records`: one record, or a stream of records
  (JSON objects one after another, as a chunked upload sends them). The answer streams one
  result per record, in order, each as soon as its record is written: `error_code` 200 with the
  record's partition and offset, or the record's own error code and message. Records that arrive
  together go to the produce core together.

A record is `{"partition_id", "headers": [{"name", "value"}], "key": {"type", "data"},
"value": {"type", "data"}, "timestamp"}`; types `BINARY` (base64), `JSON` (the default) and
`STRING`. `AVRO`, `PROTOBUF` and `JSONSCHEMA` need a schema registry and are refused per record.
Header values are base64 and must decode to UTF-8 text, each name once (the table's headers are
a map of strings). The stored timestamp is the broker's log-append time.

Errors of the whole request (an unknown cluster or topic, a token without the scope, a content
type other than JSON) answer `{"error_code", "message"}` with that HTTP status, before any record
is read. A stream is one request: its records together stay within `max_request_bytes` and
arrive within `body_read_timeout_s`; past either, a last result carries the error and the stream
ends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import APIRouter, Request
from pydantic import BaseModel
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from lakebroker.ingest_api.auth import PrincipalDep
from lakebroker.ingest_api.body import parse_json
from lakebroker.ingest_api.deps import BrokerDep, TopicPath
from lakebroker.ingest_api.forwarding import Caller
from lakebroker.ingest_api.json_objects import ObjectSplitter
from lakebroker.ingest_api.local_produce import ProduceResult
from lakebroker.ingest_api.messages import AckMode, NewMessage
from lakebroker.ingest_api.node_identity import CLUSTER_ID
from lakebroker.ingest_api.produce_core import ProduceCore, ProduceRequest
from lakebroker.ingest_api.proxy_records import RecordError, base64_bytes, kafka_text, key_of_bytes, key_of_json
from lakebroker.ingest_api.responses import JSONBytes
from lakebroker.ingest_api.schemas import inline_schema
from lakebroker.tables.errors import Backpressure, InvalidRequest, LakebrokerError, NotFound
from lakebroker.tables.message_format import from_json_value
from lakebroker.tables.tokens import ApiToken
from lakebroker.tables.topics import MAX_PARTITIONS, TopicConfig

produce_router = APIRouter(prefix="/v3/clusters", tags=["kafka-rest-v3"])
cluster_router = APIRouter(prefix="/v3/clusters", tags=["kafka-rest-v3"])

JSON = "application/json"
SCHEMA_FORMATS = frozenset({"AVRO", "PROTOBUF", "JSONSCHEMA"})
SCHEMA_FIELDS = ("schema", "schema_id", "schema_version", "subject", "subject_name_strategy")
_RECORD_FIELDS = frozenset({"partition_id", "headers", "key", "value", "timestamp"})


class V3Error(BaseModel):
    error_code: int
    message: str


class V3Data(BaseModel):
    type: str
    size: int


class V3ProduceResult(BaseModel):
    """One record's result: error_code 200 with where it was written, or its error."""

    error_code: int
    message: str | None = None
    retry_after_s: int | None = None  # with 429 and 503: when to send the record again
    cluster_id: str | None = None
    topic_name: str | None = None
    partition_id: int | None = None
    offset: int | None = None
    timestamp: str | None = None
    key: V3Data | None = None
    value: V3Data | None = None


def _v3_content(description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": inline_schema(V3Error)}}}


AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: _v3_content("No token, or an unknown, revoked or expired one."),
    403: _v3_content("The token lacks the scope or the topic."),
}
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: _v3_content("The request's own error (no record was read).") for code in (404, 413, 415)}


def _cluster(cluster_id: str) -> dict[str, Any]:
    if cluster_id != CLUSTER_ID:
        raise NotFound(f"cluster {cluster_id!r} does not exist: this broker is cluster {CLUSTER_ID!r}")
    return {"kind": "KafkaCluster", "metadata": {"self": f"/v3/clusters/{CLUSTER_ID}"}, "cluster_id": CLUSTER_ID}


@cluster_router.get("")
async def list_clusters() -> JSONBytes:
    """The clusters this proxy serves: one."""
    return JSONBytes({"kind": "KafkaClusterList", "metadata": {"self": "/v3/clusters"},
                      "data": [_cluster(CLUSTER_ID)]})


@cluster_router.get("/{cluster_id}", responses={404: _ERRORS[404]})
async def get_cluster(cluster_id: str) -> JSONBytes:
    return JSONBytes(_cluster(cluster_id))


@produce_router.post("/{cluster_id}/topics/{topic}/records", responses={
    200: {"description": "One result per record, in order, streamed as JSON objects one per line.",
          "content": {JSON: {"schema": inline_schema(V3ProduceResult)}}}, **_ERRORS},
    openapi_extra={"requestBody": {"required": True, "content": {JSON: {"schema": {
        "description": "One record object, or several one after another (streamed)", "type": "object"}}}}})
async def produce_records(cluster_id: str, topic: TopicPath, request: Request, broker: BrokerDep,
                          principal: PrincipalDep) -> Response:
    """Produce records to a topic, streamed: a result per record as it is written."""
    _cluster(cluster_id)
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != JSON:
        return JSONBytes({"error_code": 415, "message": f"content type {kind or '(none)'!r} is not supported: "
                          f"send records as {JSON}"}, status_code=415)
    config = broker.topic(topic)  # NotFound: 404
    core: ProduceCore = request.app.state.core
    caller = Caller.of(lambda name: request.headers.get(name.decode()))
    results = _results(core, config, principal, caller, request, broker.settings.max_request_bytes)
    return ResultStream(results)


class ResultStream(Response):
    """Streams the results as they come. Unlike Starlette's StreamingResponse it does not also
    listen for a disconnect: the results are made while the request body is still being read,
    and that read is what sees the client leave."""

    media_type = JSON

    def __init__(self, results: AsyncIterator[bytes]) -> None:  # no body now, so no content-length
        self.status_code = 200
        self.background = None
        self.raw_headers = [(b"content-type", JSON.encode())]
        self.results = results

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        async for chunk in self.results:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _results(core: ProduceCore, topic: TopicConfig, principal: ApiToken, caller: Caller, request: Request,
                   max_bytes: int) -> AsyncIterator[bytes]:
    splitter = ObjectSplitter(max_bytes)
    try:
        async for data in request.stream():
            objects = splitter.feed(data)
            if objects:
                yield await _written(core, topic, principal, caller, objects)
            if splitter.broken is not None:
                break
        else:
            splitter.finish()
    except LakebrokerError as exc:  # the body over its bound, or late: the stream ends here
        yield _line({"error_code": exc.status, "message": exc.message})
    except ClientDisconnect:
        return
    if splitter.broken is not None:
        yield _line({"error_code": 400, "message": splitter.broken})


async def _written(core: ProduceCore, topic: TopicConfig, principal: ApiToken, caller: Caller,
                   objects: list[bytes]) -> bytes:
    """The records of `objects` written as one request to the core; a result line for each."""
    slots: list[dict[str, Any] | None] = []
    messages: list[NewMessage] = []
    sizes: list[tuple[dict[str, Any] | None, dict[str, Any] | None]] = []
    for raw in objects:
        try:
            message, shown = _message(raw)
            messages.append(message)
            sizes.append(shown)
            slots.append(None)
        except (RecordError, InvalidRequest) as exc:
            slots.append({"error_code": 400, "message": exc.message if isinstance(exc, InvalidRequest) else str(exc)})
    if messages:
        try:
            placed: list[ProduceResult | LakebrokerError] = await core.produce_each(
                ProduceRequest(topic.name, messages, AckMode.WAL, principal, caller))
        except LakebrokerError as exc:  # a rule of the whole request (the backlog, say): each record's answer
            placed = [exc] * len(messages)
        answers = iter(zip(placed, sizes, strict=True))
        slots = [slot or _result(topic, *next(answers)) for slot in slots]
    return b"".join(_line(slot) for slot in slots if slot is not None)


def _message(raw: bytes) -> tuple[NewMessage, tuple[dict[str, Any] | None, dict[str, Any] | None]]:
    """A record as a message, and its key's and value's type and size as the result shows them."""
    record = parse_json(raw, " in a record")
    if not isinstance(record, dict):
        raise RecordError("a record is a JSON object")
    unknown = sorted(set(record) - _RECORD_FIELDS)
    if unknown:
        raise RecordError(f"unknown record field(s) {', '.join(unknown)}: a record has "
                          f"{', '.join(sorted(_RECORD_FIELDS))}")
    partition = record.get("partition_id")
    if partition is not None and not (type(partition) is int and 0 <= partition < MAX_PARTITIONS):
        raise RecordError(f"partition_id must be an integer from 0 to {MAX_PARTITIONS - 1}, or null")
    timestamp = record.get("timestamp")
    if timestamp is not None:
        _check_timestamp(timestamp)
    key_type, key_data = _data(record.get("key"), "key")
    value_type, value_data = _data(record.get("value"), "value")
    key = _key(key_type, key_data)
    value, fmt = _value(value_type, value_data)
    message = NewMessage(value=value, format=fmt, key=key, headers=_headers(record.get("headers")),
                         partition=partition)
    key_shown = None if key is None else {"type": key_type, "size": len(key.encode())}
    value_shown = None if value_data is None else {"type": value_type, "size": 0 if value is None else len(value)}
    return message, (key_shown, value_shown)


def _data(field: Any, what: str) -> tuple[str, Any]:
    """A key's or value's type and data; an absent one is null."""
    if field is None:
        return "JSON", None
    if not isinstance(field, dict):
        raise RecordError(f"{what} must be an object with 'type' and 'data'")
    kind = field.get("type", "JSON")
    if isinstance(kind, str):
        kind = kind.upper()
    if kind in SCHEMA_FORMATS or any(name in field for name in SCHEMA_FIELDS):
        raise RecordError(f"{what}: schema formats (AVRO, PROTOBUF, JSONSCHEMA) need a schema registry, which "
                          "lakebroker does not have: send BINARY, JSON or STRING")
    if kind not in ("BINARY", "JSON", "STRING"):
        raise RecordError(f"{what}: type must be BINARY, JSON or STRING, not {kind!r}")
    return kind, field.get("data")


def _key(kind: str, data: Any) -> str | None:
    if kind == "BINARY":
        return key_of_bytes(base64_bytes(data, "key"))
    if kind == "STRING" and data is not None and not isinstance(data, str):
        raise RecordError("a STRING key's data must be a string")
    return key_of_json(data)


def _value(kind: str, data: Any) -> tuple[bytes | None, str]:
    if kind == "BINARY":
        return base64_bytes(data, "value"), "binary"
    if kind == "STRING":
        if data is not None and not isinstance(data, str):
            raise RecordError("a STRING value's data must be a string")
        return (None, "json") if data is None else (data.encode(), "text")
    return from_json_value(data)  # InvalidRequest: the record's error


def _headers(headers: Any) -> dict[str, str] | None:
    if headers is None:
        return None
    if not isinstance(headers, list) or not all(isinstance(h, dict) and isinstance(h.get("name"), str)
                                                for h in headers):
        raise RecordError("headers must be a list of {\"name\": string, \"value\": base64 string or null}")
    out: dict[str, str] = {}
    for header in headers:
        name = header["name"]
        if name in out:
            raise RecordError(f"header {name!r} is sent twice: lakebroker keeps a header's name once "
                              "(the Kafka listener keeps repeated names)")
        value = base64_bytes(header.get("value"), f"header {name!r}")
        try:
            out[name] = "" if value is None else value.decode()
        except UnicodeDecodeError:
            raise RecordError(f"header {name!r}'s value must decode to UTF-8 text") from None
    return out or None


def _check_timestamp(timestamp: Any) -> None:
    try:
        if not isinstance(timestamp, str):
            raise ValueError
        datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        raise RecordError(f"timestamp must be an ISO 8601 time string, not {timestamp!r}") from None


def _result(topic: TopicConfig, placed: ProduceResult | LakebrokerError,
            shown: tuple[dict[str, Any] | None, dict[str, Any] | None]) -> dict[str, Any]:
    if isinstance(placed, Backpressure):  # a stream has no Retry-After header: the result says it
        return {"error_code": placed.status, "message": placed.message,
                "retry_after_s": max(1, round(placed.retry_after_s))}
    if isinstance(placed, LakebrokerError):
        return {"error_code": placed.status, "message": kafka_text(placed, topic)}
    out: dict[str, Any] = {"error_code": 200, "cluster_id": CLUSTER_ID, "topic_name": topic.name,
                           "partition_id": placed.partition, "offset": placed.offset}
    if placed.timestamp_us is not None and placed.timestamp_us >= 0:
        out["timestamp"] = datetime.fromtimestamp(placed.timestamp_us / 1e6, UTC).isoformat().replace("+00:00", "Z")
    key, value = shown
    if key is not None:
        out["key"] = key
    if value is not None:
        out["value"] = value
    return out


def _line(result: dict[str, Any]) -> bytes:
    return orjson.dumps(result) + b"\n"
