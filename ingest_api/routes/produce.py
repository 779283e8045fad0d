"""Produce: one message or a batch, acknowledged per the `ack` query parameter.

The hot path: each route is documented by FastAPI (its stub's signature and `openapi_extra`)
and served by a plain ASGI handler (ingest_api/asgi_route.py), with no dependency solving and
no model per message."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter, Query
from starlette.types import Receive, Scope, Send

from lakebroker.ingest_api.arrow_batch import ARROW_STREAM, parse_arrow_batch, results_arrow, wants_arrow
from lakebroker.ingest_api.asgi_route import AsgiRoute, header, query_of, read_body, served_by
from lakebroker.ingest_api.auth import admitted
from lakebroker.ingest_api.body import media_type, parse_message
from lakebroker.ingest_api.chunks import BatchResults, ColumnarBatch
from lakebroker.ingest_api.columnar import parse_batch_body
from lakebroker.ingest_api.deps import TopicPath
from lakebroker.ingest_api.errors import error_response
from lakebroker.ingest_api.forwarding import Caller
from lakebroker.ingest_api.local_produce import ProduceResult
from lakebroker.ingest_api.messages import AckMode
from lakebroker.ingest_api.produce_core import ProduceCore, ProduceRequest
from lakebroker.ingest_api.produce_wire import ack_of, produce_target, produced
from lakebroker.ingest_api.responses import JSON_TYPE, send_answer, send_body
from lakebroker.ingest_api.results_json import batch_results_json
from lakebroker.ingest_api.schemas import (
    MAX_INT,
    BatchIn,
    BatchResultPublic,
    ErrorPublic,
    MessageIn,
    ProduceResultPublic,
    inline_schema,
)
from lakebroker.tables.errors import LakebrokerError
from lakebroker.tables.topics import MAX_PARTITIONS

router = APIRouter(prefix="/v1/topics", tags=["produce"], route_class=AsgiRoute)

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
FORWARDED_TO = b"lakebroker-forwarded-to"  # on a batch's answer: the owners some of it was forwarded to


def _body(model: type[MessageIn] | type[BatchIn], ndjson: bool) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": inline_schema(model)}}
    if ndjson:
        content["application/x-ndjson"] = {"schema": {"type": "string", "description": "One message per line."}}
        content[ARROW_STREAM] = {"schema": {"type": "string", "format": "binary", "description": (
            "An Arrow IPC stream, one row per message: value (binary or string; null is a tombstone, with a key), "
            "and optionally key (string), headers (map of string to string), partition (integer), id (string).")}}
    else:
        content["application/octet-stream"] = {"schema": {"type": "string", "format": "binary"}}
    return {"requestBody": {"required": True, "content": content}}


def _caller(scope: Scope) -> Caller:
    return Caller.of(lambda name: header(scope, name))


async def produce_one(scope: Scope, receive: Receive, send: Send) -> None:
    core: ProduceCore = scope["app"].state.core
    topic = scope["path_params"]["topic"]
    try:
        query, ack = produce_target(core.broker, topic, scope["query_string"])
        message = parse_message(media_type(header(scope, b"content-type")), query, await read_body(receive))
        result = await core.produce_one(ProduceRequest(topic, message, ack, admitted(scope), _caller(scope)))
    except LakebrokerError as exc:
        await error_response(exc)(scope, receive, send)
        return
    await send_answer(send, produced(result, ack))


async def produce_batch(scope: Scope, receive: Receive, send: Send) -> None:
    core: ProduceCore = scope["app"].state.core
    topic = scope["path_params"]["topic"]
    try:
        core.broker.topic(topic)
        ack = ack_of(query_of(scope))
        body = await read_body(receive)
        await core.batch_turn()
        kind = media_type(header(scope, b"content-type"))
        parsed = parse_arrow_batch(body, core.broker.settings.max_request_bytes) if kind == ARROW_STREAM \
            else parse_batch_body(kind, body)
        answer = await core.produce_batch(ProduceRequest(
            topic, parsed if isinstance(parsed, ColumnarBatch) else parsed.messages(), ack, admitted(scope),
            _caller(scope)))
    except LakebrokerError as exc:
        await error_response(exc)(scope, receive, send)
        return
    status = 202 if ack is AckMode.NONE else 200
    placed = answer.results
    # A client that sends each partition's messages to its owner reads the owners again on this.
    extra = [(FORWARDED_TO, ", ".join(answer.forwarded_to).encode())] if answer.forwarded_to else []
    if wants_arrow(header(scope, b"accept")):
        await send_body(send, status, ARROW_STREAM.encode(), results_arrow(
            placed if isinstance(placed, BatchResults) else _as_arrays(placed)), extra)
    elif isinstance(placed, BatchResults):
        await send_body(send, status, JSON_TYPE, batch_results_json(placed), extra)
    else:
        await send_body(send, status, JSON_TYPE, orjson.dumps({"results": _batch_results(placed)}), extra)


def _as_arrays(results: list[ProduceResult]) -> BatchResults:
    def column(values: list[int | None], dtype: type) -> np.ndarray:
        return np.array([-1 if v is None else v for v in values], dtype)

    return BatchResults(column([r.partition for r in results], np.int32), column([r.offset for r in results], np.int64),
                        np.array([r.duplicate for r in results], np.bool_),
                        column([r.timestamp_us for r in results], np.int64))


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


@router.post(
    "/{topic}/messages",
    responses={**_ERRORS, 200: {"model": ProduceResultPublic}, 202: {"model": ProduceResultPublic}},
    openapi_extra={**_body(MessageIn, ndjson=False), "parameters": _RAW_QUERY},
)
@served_by(produce_one)
async def produce_one_doc(topic: TopicPath, ack: AckMode = _ACK) -> ProduceResultPublic:
    """Produce one message. A raw-bytes body (application/octet-stream) takes key, id, partition,
    producer_id and sequence as query parameters."""
    raise NotImplementedError  # served by produce_one


@router.post(
    "/{topic}/batch",
    responses={**_ERRORS, **{status: {"model": BatchResultPublic, "content": {ARROW_STREAM: {"schema": {
        "type": "string", "format": "binary", "description": "With Accept: application/vnd.apache.arrow.stream: an "
        "Arrow IPC stream of partition (int32), offset (int64), duplicate (bool) and timestamp (timestamp[us, UTC]), "
        "one row per message in request order; offset and timestamp null while not known (ack=none)."}}}}
        for status in (200, 202)}},
    openapi_extra=_body(BatchIn, ndjson=True),
)
@served_by(produce_batch)
async def produce_batch_doc(topic: TopicPath, ack: AckMode = _ACK) -> BatchResultPublic:
    """Produce many messages (JSON, NDJSON or an Arrow IPC stream); results come back in request order,
    as JSON or, with Accept: application/vnd.apache.arrow.stream, as Arrow."""
    raise NotImplementedError  # served by produce_batch
