"""How a produce is acknowledged, for every shape alike (one message, a list, a columnar batch):

- `ack=none` answers once the messages are queued for the WAL;
- `ack=wal` once their WAL group is durable (the producer awaits its futures);
- `ack=table` once the flusher has committed each partition's highest offset to the Delta table.

And what every answer counts: messages queued, duplicates answered, and the produce latency.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping

from lakebroker.ingest_api.flusher import Flusher
from lakebroker.ingest_api.messages import AckMode
from lakebroker.ingest_api.metrics import IngestMetrics

# Bound once: an enum member lookup per request is hot-path CPU
# (docs/decisions/0002-single-produce-answered-below-asgi.md).
_TABLE = AckMode.TABLE


class Acks:
    def __init__(self, flusher: Flusher, metrics: IngestMetrics) -> None:
        self._flusher = flusher
        self._metrics = metrics

    def queued(self, topic: str, ack: str, messages: int) -> None:
        # (`ack` may be the enum or its str value: both label metrics the same.)
        self._metrics.produced_to(topic, ack).inc(messages)

    async def in_table(self, topic_id: bytes, highest: Mapping[int, int]) -> None:
        """Until each partition's `highest` offset is committed to the table (ack=table)."""
        if len(highest) == 1:
            [(partition, offset)] = highest.items()
            await self._flusher.wait_committed((topic_id, partition), offset)
        else:
            await asyncio.gather(*(self._flusher.wait_committed((topic_id, p), o) for p, o in highest.items()))

    def answered(self, topic: str, ack: str, started: float, duplicates: int, *, timed: bool = True) -> None:
        """An awaited produce's answer: its duplicates, and its latency since `started` unless the
        caller times it later (`timed=False`: a single message with ack=table, once in the table)."""
        if duplicates:
            self._metrics.duplicates_to(topic).inc(duplicates)
        if timed:
            self.timed(ack, started)

    def timed(self, ack: str, started: float) -> None:
        self._metrics.produce_latency_of(ack).observe(time.perf_counter() - started)


def highest_offsets(placed: Iterable[tuple[int, int]]) -> dict[int, int]:
    """Each partition's highest offset among (partition, offset) pairs."""
    highest: dict[int, int] = {}
    for partition, offset in placed:
        if offset > highest.get(partition, -1):
            highest[partition] = offset
    return highest
