"""The rules a produce must pass before anything is queued, the same for every front door (the
fast path, the ASGI routes, REST Proxy v2, the CLI) and every shape (one message, a list, a batch
held as columns). In this order, the first broken rule answering:

1. the request holds a message (422);
2. each message's key, value and headers fit the topic's `max_message_bytes` (413);
3. an explicit partition exists (422);
4. `producer_id` and `sequence` come together (422);
5. the backlog (bytes accepted and not yet in Delta, all held in memory) is under
   `max_backlog_bytes` (429, with Retry-After). The async shapes (`admit`, `admit_columns`)
   first wait, up to `backpressure_wait_ms`, for a commit to make room: a flood is slowed to the
   pace of the Delta commits instead of refused, and the node's memory stays bounded by bytes.
   Only a request that passes rules 1-4 waits.

A single message and a columnar batch are screened with a cheaper test first; only one that might
break a rule runs the rules one by one, for the precise error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from lakebroker.ingest_api.chunks import ColumnarBatch, message_sizes
from lakebroker.ingest_api.messages import NewMessage
from lakebroker.ingest_api.metrics import IngestMetrics
from lakebroker.ingest_api.records import message_bytes
from lakebroker.tables.errors import Backpressure, InvalidRequest, LakebrokerError, MessageTooLarge, NoSuchPartition
from lakebroker.tables.topics import TopicConfig


class Admission:
    def __init__(self, max_backlog_bytes: int, backlog_bytes: Callable[[], int], metrics: IngestMetrics,
                 wait_s: float = 0.0) -> None:
        self.max_backlog_bytes = max_backlog_bytes
        self._backlog_bytes = backlog_bytes
        self._metrics = metrics
        self._wait_s = wait_s
        self._room = asyncio.Event()

    async def admit(self, topic: TopicConfig, messages: Sequence[NewMessage]) -> list[int]:
        """`check`, waiting for room before the backlog's rule; each message's size."""
        sizes = self._rules(topic, messages)
        await self._wait_for_room()
        self.check_backlog()
        return sizes

    async def admit_columns(self, topic: TopicConfig, batch: ColumnarBatch) -> pa.Array:
        """`admit` of a batch held as columns (whose shape holds no producer_id or sequence)."""
        explicit = batch.partitions
        sizes = message_sizes(batch.columns)
        if (len(sizes) and int(sizes.max()) > topic.max_message_bytes) or (
                explicit.null_count < len(explicit) and pc.max(explicit).as_py() >= topic.partitions):
            self._rules(topic, batch.messages())
        await self._wait_for_room()
        self.check_backlog()
        return sizes

    async def _wait_for_room(self) -> None:
        """Wait, at most `wait_s`, while the backlog is over its bound; `check_backlog` then refuses
        what still finds none. Each commit makes room (`made_room`) within its own time."""
        if self._backlog_bytes() <= self.max_backlog_bytes:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait_s
        self._metrics.backpressure_waits.inc()
        while self._backlog_bytes() > self.max_backlog_bytes and (left := deadline - loop.time()) > 0:
            try:
                await asyncio.wait_for(self._room.wait(), left)
            except TimeoutError:
                return

    def made_room(self) -> None:
        """A commit took bytes out of the backlog: every waiter looks again."""
        self._room.set()
        self._room = asyncio.Event()

    def check(self, topic: TopicConfig, messages: Sequence[NewMessage]) -> list[int]:
        """Every rule, message by message, without waiting; returns each message's size (key, value
        and headers)."""
        sizes = self._rules(topic, messages)
        self.check_backlog()
        return sizes

    def _rules(self, topic: TopicConfig, messages: Sequence[NewMessage]) -> list[int]:
        try:
            return _check_messages(topic, messages)
        except LakebrokerError as exc:
            self._metrics.rejected_for(exc.code).inc()
            raise

    def refusals(self, topic: TopicConfig, messages: Sequence[NewMessage]) -> list[LakebrokerError | None]:
        """Rules 2-4 message by message, for a door that answers each message apart (REST Proxy v2):
        each message's first broken rule, or None for one that may be produced."""
        out = [_refusal(topic, i, m, message_bytes(m.key, m.value, m.headers)) for i, m in enumerate(messages)]
        for refusal in out:
            if refusal is not None:
                self._metrics.rejected_for(refusal.code).inc()
        return out

    def check_one(self, topic: TopicConfig, message: NewMessage) -> int:
        """`check` of a single message; returns its size (key, value and headers)."""
        size = message_bytes(message.key, message.value, message.headers)
        if size > topic.max_message_bytes or message.partition is not None or message.sequence is not None \
                or message.producer_id is not None:
            self.check(topic, (message,))
        else:
            self.check_backlog()
        return size

    def check_backlog(self) -> None:
        backlog = self._backlog_bytes()
        if backlog > self.max_backlog_bytes:
            self._metrics.rejected_for("backpressure").inc()
            raise Backpressure(
                f"{backlog} bytes wait to be committed to Delta (limit {self.max_backlog_bytes}); retry after "
                "the indicated delay",
                retry_after_s=1.0,
            )


def _check_messages(topic: TopicConfig, messages: Sequence[NewMessage]) -> list[int]:
    if not messages:
        raise InvalidRequest("no messages to produce")
    sizes = []
    for i, m in enumerate(messages):
        size = message_bytes(m.key, m.value, m.headers)
        sizes.append(size)
        refusal = _refusal(topic, i, m, size)
        if refusal is not None:
            raise refusal
    return sizes


def _refusal(topic: TopicConfig, i: int, m: NewMessage, size: int) -> LakebrokerError | None:
    """The first of rules 2-4 message `i` breaks, or None."""
    if size > topic.max_message_bytes:
        return MessageTooLarge(
            f"message {i} is {size} bytes (key, value and headers), over topic {topic.name!r}'s "
            f"max_message_bytes {topic.max_message_bytes}", size, topic.max_message_bytes)
    if m.partition is not None:
        try:
            topic.check_partition(m.partition)
        except NoSuchPartition as exc:
            return exc
    if (m.producer_id is None) != (m.sequence is None) and m.message_id is None:
        return InvalidRequest(f"message {i}: producer_id and sequence must be given together")
    return None
