"""Confluent REST Proxy v2: what its producers call, so they switch by URL.

- `POST /topics/{topic}` and `POST /topics/{topic}/partitions/{partition}`: produce;
- `GET /topics` and `GET /topics/{topic}`: the topic names, and one topic's configs and partitions.

Embedded formats `json` and `binary` are accepted; `avro`/`protobuf`/`jsonschema` need a schema
registry and are refused with 415. As in the proxy, a record that cannot be written (too large,
bad base64, a partition out of range) gets its error in its own slot of `offsets` while the
others are written. Errors of the whole request answer `{error_code, message}`
(ingest_api/errors.py maps them on every path under /topics).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from lakebroker.ingest_api.auth import PrincipalDep
from lakebroker.ingest_api.body import parse_json
from lakebroker.ingest_api.deps import BrokerDep, TopicPath
from lakebroker.ingest_api.errors import V2_MEDIA, V2_PARTITION_NOT_FOUND, v2_error
from lakebroker.ingest_api.forwarding import Caller
from lakebroker.ingest_api.local_produce import ProduceResult
from lakebroker.ingest_api.messages import AckMode, NewMessage
from lakebroker.ingest_api.produce_core import ProduceCore, ProduceRequest
from lakebroker.ingest_api.proxy_records import RecordError, base64_bytes, kafka_text, key_of_bytes, key_of_json
from lakebroker.ingest_api.responses import JSONBytes
from lakebroker.ingest_api.schemas import inline_schema
from lakebroker.tables.errors import InvalidRequest, LakebrokerError, NoSuchPartition
from lakebroker.tables.message_format import from_json_value
from lakebroker.tables.tokens import ApiToken
from lakebroker.tables.topics import MAX_PARTITIONS, TopicConfig

produce_router = APIRouter(tags=["kafka-rest-v2"])
metadata_router = APIRouter(tags=["kafka-rest-v2"])

JSON_V2 = "application/vnd.kafka.json.v2+json"
BINARY_V2 = "application/vnd.kafka.binary.v2+json"
MAX_RECORDS = 100_000
# The proxy's per-record codes (kafka-rest's producer errors): this record can never be written as sent.
RECORD_NOT_RETRIABLE = 50002
BROKER_ID = 0  # one broker owns every partition


# -- the documented shapes (the produce path checks records field by field, with no model per record) --
class V2Record(BaseModel):
    model_config = ConfigDict(extra="ignore")
    key: Any = None
    value: Any = None
    partition: int | None = Field(None, ge=0, le=MAX_PARTITIONS - 1)


class V2PartitionRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")
    key: Any = None
    value: Any = None


class V2Produce(BaseModel):
    records: list[V2Record] = Field(min_length=1, max_length=MAX_RECORDS)


class V2PartitionProduce(BaseModel):
    records: list[V2PartitionRecord] = Field(min_length=1, max_length=MAX_RECORDS)


class V2Offset(BaseModel):
    partition: int | None
    offset: int | None
    error_code: int | None
    error: str | None


class V2ProduceResult(BaseModel):
    key_schema_id: int | None
    value_schema_id: int | None
    offsets: list[V2Offset]


class V2Replica(BaseModel):
    broker: int
    leader: bool
    in_sync: bool


class V2Partition(BaseModel):
    partition: int
    leader: int
    replicas: list[V2Replica]


class V2Topic(BaseModel):
    name: str
    configs: dict[str, str]
    partitions: list[V2Partition]


class V2Error(BaseModel):
    error_code: int
    message: str


class V2Response(JSONBytes):
    media_type = V2_MEDIA


def _v2_content(model: type[BaseModel], description: str) -> dict[str, Any]:
    return {"description": description, "content": {V2_MEDIA: {"schema": inline_schema(model)}}}


_ERROR = "An error in the proxy's format: {error_code, message}."
AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: _v2_content(V2Error, "No token, or an unknown, revoked or expired one (error_code 40101)."),
    403: _v2_content(V2Error, "The token lacks the scope or the topic (error_code 40301)."),
}
_PRODUCE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: _v2_content(V2ProduceResult, "One slot per record, in request order: its partition and offset, or "
                                      "its error_code and error."),
    **{code: _v2_content(V2Error, _ERROR) for code in (400, 404, 408, 413, 415, 422, 429, 507)},
}
_READ_RESPONSES: dict[int | str, dict[str, Any]] = {code: _v2_content(V2Error, _ERROR) for code in (400, 404)}


# -- produce ------------------------------------------------------------------------------------------
def _to_message(record: dict[str, Any], binary: bool, partition: int | None) -> NewMessage:
    """A record as a message; its size and partition are the core's rules (ProduceCore.produce_each)."""
    raw_key, raw_value = record.get("key"), record.get("value")
    if binary:
        return NewMessage(value=base64_bytes(raw_value, "value"), format="binary",
                          key=key_of_bytes(base64_bytes(raw_key, "key")), partition=partition)
    try:
        value, fmt = from_json_value(raw_value)
    except InvalidRequest as exc:
        raise RecordError(exc.message) from None
    return NewMessage(value=value, format=fmt, key=key_of_json(raw_key), partition=partition)


def _refused(text: str) -> dict[str, Any]:
    return {"partition": None, "offset": None, "error_code": RECORD_NOT_RETRIABLE, "error": text}


async def _produce(request: Request, broker: BrokerDep, principal: ApiToken, topic_name: str,
                   partition: int | None) -> JSONBytes:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in (JSON_V2, BINARY_V2):
        return v2_error(415, f"content type {kind or '(none)'!r} is not supported: use {JSON_V2} or {BINARY_V2}")
    topic = broker.topic(topic_name)  # NotFound: 404, error_code 40401
    if partition is not None:
        try:
            topic.check_partition(partition)
        except NoSuchPartition as exc:
            return v2_error(404, kafka_text(exc, topic), V2_PARTITION_NOT_FOUND)
    body = parse_json(await request.body())  # malformed: 400; integers beyond 64 bits stay exact
    records = body.get("records") if isinstance(body, dict) else None
    if not isinstance(records, list) or not 1 <= len(records) <= MAX_RECORDS:
        return v2_error(422, f"the body must be an object with 'records': an array of 1 to {MAX_RECORDS} records")
    if not all(isinstance(r, dict) for r in records):
        return v2_error(422, "each record must be an object with 'key' and 'value'")
    if partition is not None and any("partition" in r for r in records):
        return v2_error(422, "records sent to /topics/{topic}/partitions/{partition} take no 'partition' field")
    if not all(_valid_partition(r.get("partition")) for r in records):
        return v2_error(422, f"a record's partition must be an integer from 0 to {MAX_PARTITIONS - 1}, or null")
    binary = kind == BINARY_V2
    slots: list[dict[str, Any] | None] = []
    messages: list[NewMessage] = []
    for record in records:
        try:
            messages.append(_to_message(record, binary, record.get("partition", partition)))
            slots.append(None)
        except RecordError as exc:
            slots.append(_refused(str(exc)))
    core: ProduceCore = request.app.state.core
    caller = Caller.of(lambda name: request.headers.get(name.decode()))
    placed = await core.produce_each(
        ProduceRequest(topic.name, messages, AckMode.WAL, principal, caller)) if messages else []
    results = iter(placed)
    offsets = [slot or _written(next(results), topic) for slot in slots]
    return JSONBytes({"key_schema_id": None, "value_schema_id": None, "offsets": offsets}, media_type=V2_MEDIA)


def _valid_partition(partition: Any) -> bool:
    """The schema's rule (a partition the topic lacks is the record's own error, not the request's)."""
    return partition is None or (type(partition) is int and 0 <= partition < MAX_PARTITIONS)


def _written(result: ProduceResult | LakebrokerError, topic: TopicConfig) -> dict[str, Any]:
    if isinstance(result, LakebrokerError):
        return _refused(kafka_text(result, topic))
    return {"partition": result.partition, "offset": result.offset, "error_code": None, "error": None}


def _request_body(model: type[BaseModel]) -> dict[str, Any]:
    schema = inline_schema(model)
    return {"requestBody": {"required": True, "content": {JSON_V2: {"schema": schema}, BINARY_V2: {"schema": schema}}}}


@produce_router.post("/topics/{topic}", openapi_extra=_request_body(V2Produce), responses=_PRODUCE_RESPONSES,
                     response_class=V2Response)
async def produce_v2(topic: TopicPath, request: Request, broker: BrokerDep, principal: PrincipalDep) -> JSONBytes:
    """Kafka REST Proxy v2 produce; a record's `partition` picks its partition, else its key does."""
    return await _produce(request, broker, principal, topic, None)


@produce_router.post("/topics/{topic}/partitions/{partition}", openapi_extra=_request_body(V2PartitionProduce),
                     responses=_PRODUCE_RESPONSES, response_class=V2Response)
async def produce_to_partition_v2(
    topic: TopicPath, partition: int, request: Request, broker: BrokerDep, principal: PrincipalDep
) -> JSONBytes:
    """Kafka REST Proxy v2 produce to one partition (404 with error_code 40402 if it does not exist)."""
    return await _produce(request, broker, principal, topic, partition)


# -- metadata -----------------------------------------------------------------------------------------
def _configs(topic: TopicConfig) -> dict[str, str]:
    """The topic's settings under their Kafka names, as strings (-1: no limit), as the proxy shows them."""
    return {
        "cleanup.policy": topic.cleanup_policy.value,
        "retention.ms": str(-1 if topic.retention_ms is None else topic.retention_ms),
        "retention.bytes": str(-1 if topic.retention_bytes is None else topic.retention_bytes),
        "max.message.bytes": str(topic.max_message_bytes),
        "delete.retention.ms": str(topic.tombstone_retention_ms),
    }


@metadata_router.get("/topics", response_class=V2Response, responses={200: {
    "description": "Topic names.", "content": {V2_MEDIA: {"schema": {"type": "array", "items": {"type": "string"}}}}}})
async def list_topics_v2(broker: BrokerDep, principal: PrincipalDep) -> JSONBytes:
    """The names of every topic the caller's token may use."""
    names = sorted(name for name in broker.topics if principal.allows_topic(name))
    return JSONBytes(names, media_type=V2_MEDIA)


@metadata_router.get("/topics/{topic}", response_class=V2Response,
                     responses={200: _v2_content(V2Topic, "The topic."), **_READ_RESPONSES})
async def get_topic_v2(topic: TopicPath, broker: BrokerDep) -> JSONBytes:
    """One topic: its configs and partitions (this broker, id 0, leads every partition)."""
    config = broker.topic(topic)
    replicas = [{"broker": BROKER_ID, "leader": True, "in_sync": True}]
    partitions = [{"partition": p, "leader": BROKER_ID, "replicas": replicas} for p in range(config.partitions)]
    return JSONBytes({"name": config.name, "configs": _configs(config), "partitions": partitions},
                     media_type=V2_MEDIA)
