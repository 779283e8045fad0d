"""What the client hands back: produce results, messages (pulled or pushed) and webhook deliveries."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict


class AckMode(StrEnum):
    NONE = "none"  # answered once queued; lost if the broker dies before its WAL fsync; no offset
    WAL = "wal"  # answered after the WAL fsync: durable (the default)
    TABLE = "table"  # answered after the Delta commit: durable and visible to readers


AckLike = AckMode | Literal["none", "wal", "table"]


@dataclass(frozen=True, slots=True)
class SendResult:
    """Where the broker put a message. `duplicate`: a retry (or a repeated id) answered from the
    broker's dedup index with the original partition and offset; nothing was written twice."""

    partition: int
    offset: int | None  # None only with ack="none"
    duplicate: bool = False


class Message(BaseModel):
    """One message, as the pull API returns it and as a webhook envelope carries it.

    `value` is the JSON value that was produced (a string for text, None for a tombstone);
    binary values arrive base64-encoded in `value_b64` (and `value` is None): `data` gives the
    bytes for every format.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    topic: str
    partition: int
    offset: int
    timestamp: datetime  # log-append time (UTC)
    key: str | None = None
    value: Any = None
    value_b64: str | None = None
    format: Literal["json", "text", "binary"] = "json"
    headers: dict[str, str] | None = None
    id: str | None = None  # the producer's message id, if it gave one
    producer_id: str | None = None
    sequence: int | None = None

    @property
    def data(self) -> bytes | None:
        """The value as bytes: raw for binary, UTF-8 for text, compact JSON for json; None for a tombstone."""
        if self.value_b64 is not None:
            return base64.b64decode(self.value_b64)
        if self.value is None:
            return None
        if self.format == "text" and isinstance(self.value, str):
            return self.value.encode()
        return orjson.dumps(self.value)


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
