"""What the HTTP produce doors share of the wire: a single-message produce's target (topic, query
and `ack`, checked before its body is read) and its answer. The ASGI route (routes/produce.py) and
the fast path below ASGI (fast_produce.py) both use these, so neither door imports the other."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import orjson

from lakebroker.ingest_api.asgi_route import parse_query
from lakebroker.ingest_api.body import InvalidShape
from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.local_produce import ProduceResult
from lakebroker.ingest_api.messages import AckMode
from lakebroker.ingest_api.responses import Answer, json_answer

_ACKS = {mode.value: mode for mode in AckMode}
# A query string's parse (urllib's parse_qsl: a few µs), by its bytes: producers repeat theirs.
_TARGETS: dict[bytes, tuple[Mapping[str, str], AckMode]] = {}
_MAX_TARGETS = 1024


def ack_of(query: dict[str, str]) -> AckMode:
    text = query.get("ack")
    if text is None:
        return AckMode.WAL
    mode = _ACKS.get(text)
    if mode is None:
        raise InvalidShape(f"query parameter ack must be one of {', '.join(_ACKS)}, not {text!r}")
    return mode


def produce_target(broker: Broker, topic: str, raw_query: bytes) -> tuple[Mapping[str, str], AckMode]:
    """What a single-message produce checks before reading the body, in both doors and in this order:
    the topic (404), the query and its ack mode (422)."""
    broker.topic(topic)
    target = _TARGETS.get(raw_query)
    if target is None:
        query = parse_query(raw_query)
        target = (MappingProxyType(query), ack_of(query))
        if len(_TARGETS) >= _MAX_TARGETS:  # query strings that do not repeat: start over
            _TARGETS.clear()
        _TARGETS[raw_query] = target
    return target


def produced(result: ProduceResult, ack: AckMode) -> Answer:
    body = orjson.dumps({"partition": result.partition, "offset": result.offset, "duplicate": result.duplicate})
    return json_answer(202 if ack == "none" else 200, body)
