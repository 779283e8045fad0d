"""The lakebroker Python client: produce, consume, and verify webhook deliveries.

    from lakebroker.client import Producer, Consumer, WebhookVerifier

- `Producer`: batched sends over `/v1/topics/{topic}/batch`, retried with backoff (connection
  errors, 429 with Retry-After, 5xx) and idempotent (every message carries an id).
- `Consumer`: pulls partitions in offset order and commits positions to a consumer group on
  the broker or to an `OffsetStore` of the caller's.
- `WebhookVerifier`: a FastAPI dependency (or plain `verify()`) that checks Standard Webhooks
  signatures and hands back the typed `Delivery`.

Errors: see `lakebroker.client._exceptions` for the tree; all are `ClientError`s.
"""

from lakebroker.client._batching import Batching
from lakebroker.client._consumer import Consumer
from lakebroker.client._exceptions import (
    BrokerUnavailable,
    BufferFull,
    ClientClosed,
    ClientError,
    InvalidDelivery,
    RequestRefused,
    SignatureInvalid,
)
from lakebroker.client._models import AckMode, Delivery, Message, SendResult
from lakebroker.client._offsets import FileOffsetStore, OffsetStore
from lakebroker.client._producer import Producer, ProducerStats
from lakebroker.client._retry import Retry
from lakebroker.client._webhooks import WebhookVerifier

__all__ = [
    "AckMode",
    "Batching",
    "BrokerUnavailable",
    "BufferFull",
    "ClientClosed",
    "ClientError",
    "Consumer",
    "Delivery",
    "FileOffsetStore",
    "InvalidDelivery",
    "Message",
    "OffsetStore",
    "Producer",
    "ProducerStats",
    "RequestRefused",
    "Retry",
    "SendResult",
    "SignatureInvalid",
    "WebhookVerifier",
]
