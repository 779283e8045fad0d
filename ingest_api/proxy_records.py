"""What Confluent's REST Proxy doors (v2 and v3) share: a record's key and value turned into a
message's fields, and a refusal in the proxy's words (Kafka's names for a topic's settings).

A record that cannot be turned into a message raises `RecordError`: its own slot of the answer
carries the error, and the request's other records are still written."""

from __future__ import annotations

import binascii
from typing import Any

import orjson

from lakebroker.tables.errors import LakebrokerError, MessageTooLarge, NoSuchPartition
from lakebroker.tables.message_format import from_base64
from lakebroker.tables.topics import TopicConfig


class RecordError(ValueError):
    """One record cannot be written; the others still are."""


def base64_bytes(text: Any, what: str) -> bytes | None:
    """`text` (None, or a base64 string) as bytes."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise RecordError(f"{what} must be a base64 string in the binary format")
    try:
        return from_base64(text)
    except (binascii.Error, ValueError):
        raise RecordError(f"{what} is not valid base64") from None


def key_of_bytes(key: bytes | None) -> str | None:
    try:
        return None if key is None else key.decode()
    except UnicodeDecodeError:
        raise RecordError("key must decode to UTF-8 text: lakebroker keys are strings") from None


def key_of_json(key: Any) -> str | None:
    """A JSON key as the key's text: a string as it is, anything else as its JSON."""
    try:
        return key if key is None or isinstance(key, str) else orjson.dumps(key).decode()
    except orjson.JSONEncodeError as exc:  # an integer beyond 64 bits
        raise RecordError(f"key cannot be stored as JSON text ({exc}): send it as a string") from None


def kafka_text(error: LakebrokerError, topic: TopicConfig) -> str:
    """A refusal in the proxy's words (Kafka's names for the topic's settings)."""
    if isinstance(error, MessageTooLarge):
        return (f"the record is {error.size} bytes (key and value), over topic {topic.name!r}'s "
                f"max.message.bytes {error.limit}")
    if isinstance(error, NoSuchPartition):
        return (f"partition {error.partition} does not exist in topic {topic.name!r} "
                f"(partitions 0-{error.partitions - 1})")
    return error.message
