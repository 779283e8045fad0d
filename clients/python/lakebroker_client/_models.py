"""What the client hands back: produce results, messages (pulled or pushed) and webhook deliveries."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, NamedTuple, TypeVar


class AckMode(StrEnum):
    NONE = "none"  # answered once queued; lost if the broker dies before its WAL fsync; no offset
    WAL = "wal"  # answered after the WAL fsync: durable (the default)
    TABLE = "table"  # answered after the Delta commit: durable and visible to readers


AckLike = AckMode | Literal["none", "wal", "table"]
Format = Literal["json", "text", "binary"]
_FORMATS = ("json", "text", "binary")
T = TypeVar("T")


class TopicPartition(NamedTuple):
    """A partition of a topic, as in Kafka clients: the key of positions, commits and lag."""

    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class SendResult:
    """Where the broker put a message (Kafka's RecordMetadata).

    `timestamp`: the log-append time stored with the message (UTC). `offset` and `timestamp`
    are None only with ack="none". `duplicate`: a retry (or a repeated id) answered from the
    broker's dedup index with the original partition, offset and timestamp; nothing was written twice.
    """

    topic: str
    partition: int
    offset: int | None
    timestamp: datetime | None
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class Message:
    """One message, as the pull API returns it and as a webhook envelope carries it (Kafka's ConsumerRecord).

    `value` is what was produced: the JSON value for format json, a str for text, bytes for
    binary, None for a tombstone; or, with a consumer's `value_deserializer`, what it returned.
    `data` is the value as bytes for every format (compact JSON for json). `key` is a str, or
    what the `key_deserializer` returned. `timestamp` is the log-append time (UTC).
    """

    topic: str
    partition: int
    offset: int
    timestamp: datetime
    key: Any
    value: Any
    format: Format
    data: bytes | None
    headers: dict[str, str] | None = None
    id: str | None = None  # the producer's message id, if it gave one
    producer_id: str | None = None
    sequence: int | None = None

    @classmethod
    def from_json(cls, obj: Any, topic: str | None = None) -> Message:
        """A message from the API's JSON object; ValueError (or TypeError) if it is not one."""
        if not isinstance(obj, dict):
            raise ValueError(f"a message is a JSON object, not {type(obj).__name__}")
        fmt = obj.get("format", "json")
        if fmt not in _FORMATS:
            raise ValueError(f"unknown message format {fmt!r}")
        value, b64 = obj.get("value"), obj.get("value_b64")
        if b64 is not None:
            data: bytes | None = base64.b64decode(_typed(b64, str, "value_b64"), validate=True)
            value = data
        elif value is None:
            data = None
        elif fmt == "text" and isinstance(value, str):
            data = value.encode()
        else:
            data = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
        headers = obj.get("headers")
        if headers is not None and not (isinstance(headers, dict)
                                        and all(isinstance(v, str) for v in headers.values())):
            raise ValueError("headers must map str to str")
        return cls(
            topic=_typed(obj["topic"] if topic is None else topic, str, "topic"),
            partition=_typed(obj["partition"], int, "partition"),
            offset=_typed(obj["offset"], int, "offset"),
            timestamp=datetime.fromisoformat(_typed(obj["timestamp"], str, "timestamp")),
            key=_optional(obj.get("key"), str, "key"),
            value=value,
            format=fmt,
            data=data,
            headers=headers,
            id=_optional(obj.get("id"), str, "id"),
            producer_id=_optional(obj.get("producer_id"), str, "producer_id"),
            sequence=_optional(obj.get("sequence"), int, "sequence"),
        )


def _typed(value: Any, kind: type[T], name: str) -> T:
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{name} must be {kind.__name__}, not {type(value).__name__}")
    return value


def _optional(value: Any, kind: type[T], name: str) -> T | None:
    return None if value is None else _typed(value, kind, name)


@dataclass(frozen=True)
class Delivery:
    """One verified webhook request: a single message, or a batch (subscriptions with batch_size > 1).

    `id` (the `webhook-id` header) is the same on every retry of this delivery: a receiver that
    has processed it can acknowledge a redelivery without processing it again.
    """

    id: str
    timestamp: datetime  # webhook-timestamp: when this attempt was signed
    messages: list[Message]
    batch: bool

    @property
    def message(self) -> Message:
        """The message of a single delivery (the first of a batch)."""
        return self.messages[0]
