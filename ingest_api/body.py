"""Parses produce bodies: JSON, NDJSON or raw bytes, into broker messages.

No framework and no model per message: the body is parsed by pydantic-core's JSON parser
(jiter: it keeps integers beyond 64 bits exact and refuses NaN), and each message is checked
field by field against the rules `schemas.MessageIn` documents (a test holds the two to the
same answers). Malformed JSON is a 400, a well-formed body of the wrong shape a 422, an
unsupported content type a 415.

A batch headed for the columnar path is parsed by orjson first, which builds the same objects
faster but turns an integer beyond 64 bits into a float. The columnar path takes strings and
64-bit partitions only, so that loss can only send a batch the per-message way, and
`BatchItems.messages` parses such a body again, exactly; malformed JSON too gets jiter's message
(docs/decisions/0006-orjson-parses-batches-for-the-columnar-path.md).
"""

from __future__ import annotations

import binascii
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic_core import from_json

from lakebroker.ingest_api.messages import NewMessage
from lakebroker.ingest_api.schemas import MAX_INT
from lakebroker.tables.errors import InvalidRequest, LakebrokerError
from lakebroker.tables.message_format import from_base64, from_json_value
from lakebroker.tables.topics import MAX_PARTITIONS

MAX_BATCH = 100_000
# Blank lines are allowed between messages, but not without bound: counted in C before anything is
# split, so a body of millions of newlines is refused without a list of millions of lines.
MAX_NDJSON_LINES = 2 * MAX_BATCH
MAX_KEY_CHARS = 64 * 1024
_FIELDS = frozenset({"key", "value", "value_b64", "headers", "partition", "id", "producer_id", "sequence"})
RAW_QUERY_FIELDS = ("key", "id", "partition", "producer_id", "sequence")  # of an application/octet-stream body
NDJSON_TYPES = frozenset({"application/x-ndjson", "application/jsonl", "application/ndjson"})


class UnsupportedMediaType(LakebrokerError):
    status = 415
    code = "unsupported_media_type"


class InvalidShape(LakebrokerError):
    status = 422
    code = "invalid_request"


def media_type(content_type: str) -> str:
    return content_type.split(";")[0].strip().lower()


def parse_json(data: bytes, where: str = "") -> Any:
    try:
        return from_json(data, allow_inf_nan=False)
    except ValueError as exc:
        raise InvalidRequest(f"malformed JSON{where}: {exc}") from None


def parse_message(kind: str, query: Mapping[str, str], body: bytes) -> NewMessage:
    if kind == "application/json":
        stray = [name for name in RAW_QUERY_FIELDS if name in query] if query else None
        if stray:  # silently ignoring ?partition=2 would put the message elsewhere than asked
            raise InvalidRequest(f"query parameters {', '.join(stray)} apply to an application/octet-stream "
                                 "body only: put them in the JSON body")
        return message_from_json(parse_json(body))
    if kind == "application/octet-stream":
        return NewMessage(value=body, format="binary",
                          key=_query_str(query.get("key"), "key", 0, MAX_KEY_CHARS),
                          partition=_query_int(query.get("partition"), "partition", MAX_PARTITIONS - 1),
                          message_id=_query_str(query.get("id"), "id", 1, 256),
                          producer_id=_query_str(query.get("producer_id"), "producer_id", 1, 256),
                          sequence=_query_int(query.get("sequence"), "sequence", MAX_INT))
    raise UnsupportedMediaType(
        f"content type {kind or '(none)'!r} is not accepted here: send application/json, "
        "or application/octet-stream for a raw-bytes value"
    )


def parse_batch(kind: str, body: bytes) -> list[NewMessage]:
    return batch_items(kind, body).messages()


@dataclass(slots=True)
class BatchItems:
    """A batch body parsed as JSON, each message not yet checked: for the per-message path
    (`messages`), or for the columnar one (ingest_api/columnar.py)."""

    items: list[Any]
    ndjson: bool
    body: bytes = b""  # when parsed by orjson: the body, for `messages` to parse again exactly
    kind: str = ""

    def messages(self) -> list[NewMessage]:
        if self.body:
            return batch_items(self.kind, self.body).messages()
        if self.ndjson:
            return [message_from_json(m, f" on line {i + 1}") for i, m in enumerate(self.items)]
        return [message_from_json(m, f" {i}") for i, m in enumerate(self.items)]


    def rebuilt(self) -> Callable[[], list[NewMessage]]:
        """`messages` as a function that does not keep the parsed items alive, where it can."""
        return functools.partial(_exact_messages, self.kind, self.body) if self.body else self.messages


def _exact_messages(kind: str, body: bytes) -> list[NewMessage]:
    return batch_items(kind, body).messages()


def fast_batch_items(kind: str, body: bytes) -> BatchItems:
    """`batch_items` parsed by orjson, for the columnar path; see the module's note."""
    try:
        if kind == "application/json":
            batch = orjson.loads(body)
            if type(batch) is dict and batch.keys() == {"messages"}:
                items = batch["messages"]
                if type(items) is list and 1 <= len(items) <= MAX_BATCH:
                    return BatchItems(items, False, body, kind)
        elif kind in NDJSON_TYPES:
            lines = ndjson_lines(body)
            if 1 <= len(lines) <= MAX_BATCH:
                return BatchItems([orjson.loads(line) for line in lines], True, body, kind)
    except orjson.JSONDecodeError:
        pass
    return batch_items(kind, body)  # the exact parse, and its precise error for a bad body


def batch_items(kind: str, body: bytes) -> BatchItems:
    if kind == "application/json":
        batch = parse_json(body)
        if type(batch) is not dict or batch.keys() != {"messages"}:
            raise InvalidShape('invalid batch: send {"messages": [...]} and nothing else')
        items = batch["messages"]
        if type(items) is not list or not 1 <= len(items) <= MAX_BATCH:
            raise InvalidShape(f"invalid batch: messages must be a list of 1 to {MAX_BATCH} messages")
        return BatchItems(items, ndjson=False)
    if kind in NDJSON_TYPES:
        lines = ndjson_lines(body)
        if not lines:
            raise InvalidRequest("the NDJSON body holds no messages")
        if len(lines) > MAX_BATCH:
            raise InvalidShape(f"a batch holds at most {MAX_BATCH} messages")
        try:
            return BatchItems([from_json(line, allow_inf_nan=False) for line in lines], ndjson=True)
        except ValueError:  # the first error in line order, as a bad shape on line 1 comes before bad JSON on line 2
            for i, line in enumerate(lines):
                message_from_json(parse_json(line, f" on line {i + 1}"), f" on line {i + 1}")
            raise
    raise UnsupportedMediaType(
        f"content type {kind or '(none)'!r} is not accepted here: send application/json "
        '({"messages": [...]}), application/x-ndjson (one message per line) or '
        "application/vnd.apache.arrow.stream (an Arrow IPC stream)"
    )


def ndjson_lines(body: bytes) -> list[bytes]:
    """The body's lines that are not blank; InvalidShape for a body of over MAX_NDJSON_LINES lines."""
    if body.count(b"\n") >= MAX_NDJSON_LINES:
        raise InvalidShape(f"an NDJSON body holds at most {MAX_NDJSON_LINES} lines (blank ones included) "
                           f"and {MAX_BATCH} messages")
    return [line for line in body.split(b"\n") if line.strip()]


def message_from_json(m: Any, where: str = "") -> NewMessage:
    """One message of a JSON body, checked as `schemas.MessageIn` documents: strict types
    (true is not 1, "5" is not 5, 5.0 is not an integer), no unknown fields."""
    if type(m) is dict and "value" in m and len(m) <= 2:  # the common shapes: {"value": v}, {"key": "k", "value": v}
        key = m.get("key")
        if len(m) == 1 or (type(key) is str and len(key) <= MAX_KEY_CHARS):
            v = m["value"]
            if type(v) is str:
                return NewMessage(value=v.encode(), format="text", key=key)
            stored, fmt = from_json_value(v)
            return NewMessage(value=stored, format=fmt, key=key)
    if type(m) is not dict:
        raise InvalidShape(f"invalid message{where}: expected a JSON object")
    if not m.keys() <= _FIELDS:
        raise InvalidShape(f"invalid message{where}: unknown fields {', '.join(sorted(m.keys() - _FIELDS))} "
                           f"(allowed: {', '.join(sorted(_FIELDS))})")
    b64 = m.get("value_b64")
    if b64 is not None:
        if m.get("value") is not None:
            raise InvalidShape(f"invalid message{where}: give either value or value_b64, not both")
        if type(b64) is not str:
            raise InvalidShape(f"invalid message{where}: value_b64 must be a string")
        try:
            value: bytes | None = from_base64(b64)
        except (binascii.Error, ValueError):
            raise InvalidRequest(f"value_b64{where} is not valid base64") from None
        fmt = "binary"
    elif "value" in m:
        value, fmt = from_json_value(m["value"])
    else:
        raise InvalidShape(f"invalid message{where}: value is required (JSON null is a tombstone); "
                           "or give value_b64 for raw bytes")
    headers = m.get("headers")
    if headers is not None and (type(headers) is not dict or any(type(v) is not str for v in headers.values())):
        raise InvalidShape(f"invalid message{where}: headers must be an object of string values")
    producer_id = _str(m, "producer_id", 1, 256, where)
    sequence = _int(m, "sequence", MAX_INT, where)
    message_id = _str(m, "id", 1, 256, where)
    if (producer_id is None) != (sequence is None) and message_id is None:
        raise InvalidRequest(f"message{where}: producer_id and sequence must be given together")
    return NewMessage(value=value, format=fmt, key=_str(m, "key", 0, MAX_KEY_CHARS, where), headers=headers,
                      partition=_int(m, "partition", MAX_PARTITIONS - 1, where), message_id=message_id,
                      producer_id=producer_id, sequence=sequence)


def _str(m: dict[str, Any], name: str, shortest: int, longest: int, where: str) -> str | None:
    text = m.get(name)
    if text is None:
        return None
    if type(text) is not str or not shortest <= len(text) <= longest:
        raise InvalidShape(f"invalid message{where}: {name} must be a string of {shortest} to {longest} characters")
    return text


def _int(m: dict[str, Any], name: str, most: int, where: str) -> int | None:
    number = m.get(name)
    if number is None:
        return None
    if type(number) is not int or not 0 <= number <= most:
        raise InvalidShape(f"invalid message{where}: {name} must be an integer from 0 to {most}")
    return number


def _query_str(text: str | None, name: str, shortest: int, longest: int) -> str | None:
    """The limits a JSON body puts on the same field."""
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
