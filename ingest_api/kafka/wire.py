"""Kafka's framing, with kio's generated message types: a size-prefixed request, its header, its
body; a response in the header version its API and version call for.

kio raises KeyError on a tagged field it does not know (Kafka's rule is to skip it), and its
decode errors are DecodeError: both are a malformed request here, answered by closing the
connection, as a Kafka broker does with a request it cannot parse."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import io
import struct
import sys
from typing import Any

from kio.index import KioIndexError, load_request_schema, load_response_schema
from kio.schema.request_header.v1.header import RequestHeader as HeaderV1
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError

_SIZE = struct.Struct(">i")
_KEY_VERSION = struct.Struct(">hh")


class Malformed(Exception):
    """A request that cannot be read: the connection is closed."""


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    api_key: int
    version: int
    correlation_id: int
    client_id: str | None
    body: Any  # kio's entity; None when the version is not one kio (or this broker) knows


async def read_frame(reader: asyncio.StreamReader, max_bytes: int, idle_s: float, body_s: float) -> bytes | None:
    """The next request's bytes, or None when the client closed the connection between requests or
    left it idle for `idle_s` (Kafka's connections.max.idle.ms). A request, once its size has
    arrived, must arrive whole within `body_s`, or the connection is closed (a slow sender cannot
    hold a buffer)."""
    try:
        head = await asyncio.wait_for(reader.readexactly(4), idle_s)
    except TimeoutError:
        return None
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise Malformed("the connection closed inside a request's size") from None
        return None
    (size,) = _SIZE.unpack(head)
    if size < 8 or size > max_bytes:
        raise Malformed(f"a request of {size} bytes (the limit is {max_bytes})")
    try:
        return await asyncio.wait_for(reader.readexactly(size), body_s)
    except TimeoutError:
        raise Malformed(f"a request of {size} bytes did not arrive within {body_s:g} s") from None
    except asyncio.IncompleteReadError:
        raise Malformed("the connection closed inside a request") from None


@functools.lru_cache(maxsize=1024)  # bounded: the pairs come from clients, hostile ones too
def _request_schema(api_key: int, version: int) -> Any:
    """kio's request class, or None for a version it does not know. Cached: kio resolves the
    class from its module path on every call, a cost each request would pay."""
    try:
        return load_request_schema(api_key, version)
    except KioIndexError:
        return None


def parse(frame: bytes) -> Request:
    api_key, version = _KEY_VERSION.unpack_from(frame, 0)
    schema = _request_schema(api_key, version)
    try:
        if schema is None:  # the first fields of every header version are v1's
            known, _ = entity_reader(HeaderV1)(frame, 0)
            return Request(api_key, version, known.correlation_id, known.client_id, None)
        header, used = entity_reader(schema.__header_schema__)(frame, 0)
        body, _ = entity_reader(schema)(frame, used)
    except (SerialError, KeyError, ValueError) as exc:
        raise Malformed(f"api {api_key} v{version}: {exc!r}") from None
    # Bytes past a whole body are left unread, as Kafka's brokers leave them: librdkafka's admin
    # Metadata v12 carries a field of older versions and an empty tagged field there.
    return Request(api_key, version, header.correlation_id, header.client_id, body)


@functools.cache
def response_schema(api_key: int, version: int) -> Any:
    return load_response_schema(api_key, version)


@functools.cache
def _field_names(schema: Any) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(schema))


def build(schema: Any, **fields: Any) -> Any:
    """An entity of `schema` from the fields it has (a field a version lacks is left out), so one
    handler answers every version of its API."""
    names = _field_names(schema)
    return schema(**{k: v for k, v in fields.items() if k in names})


def nested(schema: Any, name: str) -> Any:
    """A nested entity class of the same version as `schema` (e.g. the Produce response's partitions)."""
    return getattr(sys.modules[schema.__module__], name)


def has_nested(schema: Any, name: str) -> bool:
    """Whether this version of `schema` has the nested entity (one a later version added)."""
    return hasattr(sys.modules[schema.__module__], name)


def frame_of(request: Request, response: Any) -> bytes:
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    entity_writer(response.__header_schema__)(out, response.__header_schema__(correlation_id=request.correlation_id))
    entity_writer(type(response))(out, response)
    data = out.getbuffer()
    _SIZE.pack_into(data, 0, len(data) - 4)
    return bytes(data)
