"""Produce: one message or a batch, acknowledged per the `ack` query parameter."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Query, Request

from ingest_api.body import parse_batch, parse_message
from ingest_api.broker import AckMode, ProduceResult
from ingest_api.deps import BrokerDep, TopicPath
from ingest_api.responses import JSONBytes
from ingest_api.schemas import (
    MAX_INT,
    BatchIn,
    BatchResultPublic,
    ErrorPublic,
    MessageIn,
    ProduceResultPublic,
    inline_schema,
)
from tables.topics import MAX_PARTITIONS

router = APIRouter(prefix="/v1/topics", tags=["produce"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorPublic} for code in (400, 404, 413, 415, 422, 429, 507)
}
_RAW = "With an application/octet-stream body only (a JSON body carries it itself)."
_RAW_QUERY = [{"name": name, "in": "query", "required": False, "description": _RAW, "schema": schema}
              for name, schema in (
                  ("key", {"type": "string", "maxLength": 64 * 1024}),
                  ("id", {"type": "string", "minLength": 1, "maxLength": 256}),
                  ("partition", {"type": "integer", "minimum": 0, "maximum": MAX_PARTITIONS - 1}),
                  ("producer_id", {"type": "string", "minLength": 1, "maxLength": 256}),
                  ("sequence", {"type": "integer", "minimum": 0, "maximum": MAX_INT}),
              )]
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ACK = Query(AckMode.WAL, description="none: when queued; wal: after the WAL fsync; table: after the Delta commit.")


def _body(model: type[MessageIn] | type[BatchIn], ndjson: bool) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": inline_schema(model)}}
    if ndjson:
        content["application/x-ndjson"] = {"schema": {"type": "string", "description": "One message per line."}}
    else:
        content["application/octet-stream"] = {"schema": {"type": "string", "format": "binary"}}
    return {"requestBody": {"required": True, "content": content}}


@router.post(
    "/{topic}/messages",
    responses={**_ERRORS, 200: {"model": ProduceResultPublic}, 202: {"model": ProduceResultPublic}},
    openapi_extra={**_body(MessageIn, ndjson=False), "parameters": _RAW_QUERY},
    response_class=JSONBytes,
)
async def produce_one(topic: TopicPath, request: Request, broker: BrokerDep, ack: AckMode = _ACK) -> JSONBytes:
    """Produce one message. A raw-bytes body (application/octet-stream) takes key, id, partition,
    producer_id and sequence as query parameters."""
    broker.topic(topic)
    message = await parse_message(request)
    (result,) = await broker.produce(topic, [message], ack)
    return JSONBytes(
        {"partition": result.partition, "offset": result.offset, "duplicate": result.duplicate},
        status_code=202 if ack is AckMode.NONE else 200,
    )


@router.post(
    "/{topic}/batch",
    responses={**_ERRORS, 200: {"model": BatchResultPublic}, 202: {"model": BatchResultPublic}},
    openapi_extra=_body(BatchIn, ndjson=True),
    response_class=JSONBytes,
)
async def produce_batch(topic: TopicPath, request: Request, broker: BrokerDep, ack: AckMode = _ACK) -> JSONBytes:
    """Produce many messages; results come back in request order."""
    broker.topic(topic)
    messages = await parse_batch(request)
    results = await broker.produce(topic, messages, ack)
    return JSONBytes({"results": _batch_results(results)}, status_code=202 if ack is AckMode.NONE else 200)


def _batch_results(results: list[ProduceResult]) -> list[dict[str, Any]]:
    # A group commit gives its records one timestamp, so a batch has few distinct ones: convert each once.
    times: dict[int | None, datetime | None] = {None: None}
    out = []
    for r in results:
        when = times.get(r.timestamp_us)
        if when is None and r.timestamp_us is not None:
            when = times[r.timestamp_us] = _EPOCH + timedelta(microseconds=r.timestamp_us)
        out.append({"partition": r.partition, "offset": r.offset, "duplicate": r.duplicate, "timestamp": when})
    return out
