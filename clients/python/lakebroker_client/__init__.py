"""The lakebroker Python client: produce, consume, and verify webhook deliveries.

    from lakebroker_client import Producer, Consumer, WebhookVerifier

- `Producer`: batched sends over `/v1/topics/{topic}/batch`, retried with backoff (connection
  errors, 429 with Retry-After, 5xx) and idempotent (every message carries an id);
  `send_arrow` sends a table's rows (Arrow, pandas, Polars) as Arrow IPC streams.
- `Consumer`: pulls the partitions of one or more topics in offset order and commits positions
  to a consumer group on the broker or to an `OffsetStore` of the caller's.
- `WebhookVerifier`: checks Standard Webhooks signatures and hands back the typed `Delivery`
  (`lakebroker_client.fastapi.WebhookDependency` is the same as a FastAPI dependency).

Needs only httpx, standardwebhooks and tenacity (and pyarrow for `send_arrow`, the `arrow`
extra); imports nothing of the broker.
Errors: see `lakebroker_client._exceptions` for the tree; all are `ClientError`s.
"""

from lakebroker_client._batching import Batching
from lakebroker_client._consumer import Consumer
from lakebroker_client._exceptions import (
    BrokerUnavailable,
    BufferFull,
    ClientClosed,
    ClientError,
    InvalidDelivery,
    RequestRefused,
    SignatureInvalid,
)
from lakebroker_client._models import AckMode, Delivery, Message, SendResult, TopicPartition
from lakebroker_client._offsets import FileOffsetStore, OffsetStore
from lakebroker_client._producer import Producer, ProducerStats
from lakebroker_client._retry import Retry
from lakebroker_client._webhooks import WebhookVerifier

__version__ = "0.1.0"

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
    "TopicPartition",
    "WebhookVerifier",
]
